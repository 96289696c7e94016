"""trial-tool's own files: what this process runs and imports, which no command may change.

A sandboxed command may write its workspace. Where trial-tool itself lives
there (a virtualenv in the repository, an editable install of a checkout that
is the workspace), a command could plant a `.pth` file or edit a module, and
the harness's next call would run it on the host. So every such path is bound
read-only inside the sandbox (layout.py): the interpreter and its prefixes,
every directory on this process's import path, the trialtool package, the
pycache prefix, the rank file. A path outside every writable path needs
nothing: the sandbox sees the host's root read-only.

An import path entry that *is* a writable path (a harness run with `python -c`
or `python harness.py` in its workspace) cannot be made read-only without
taking the workspace away: such a harness imports whatever a command leaves
there, its own modules as much as trial-tool's. docs/sandbox.md says so; the
CLI, the per-user server and the shims never have one (`-P`, __main__.py).
"""

from __future__ import annotations

import os
import sys


def paths(rank_file: str | None) -> list[str]:
    """Every file and directory trial-tool runs or imports from, canonical, that exists now."""
    import trialtool

    names = [
        sys.executable,
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.abspath(trialtool.__file__)),
        *(entry or os.getcwd() for entry in sys.path),
    ]
    if sys.pycache_prefix:
        names.append(sys.pycache_prefix)
    if rank_file:
        names.append(rank_file)
    found = set()
    for name in names:
        for path in {os.path.abspath(name), os.path.realpath(name)}:
            if os.path.exists(path):
                found.add(os.path.realpath(path))
    return sorted(found)


__all__ = ["paths"]
