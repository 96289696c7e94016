"""trial-tool's own files: what this process runs and imports, which no command may change.

A sandboxed command may write its workspace. Where trial-tool itself lives
there (a virtualenv in the repository, an editable install of a checkout that
is the workspace), a command could plant a `.pth` file or edit a module, and
the harness's next call would run it on the host. So every such path is bound
read-only inside the sandbox (_layout.py): the interpreter and its prefixes,
every directory on this process's import path, the trialtool package, the
pycache prefix, the rank file. A path outside every writable path needs
nothing: the sandbox sees the host's root read-only. An import path entry
that does not exist yet is as dangerous (a command could make it, and the
next interpreter would import from it): inside a writable path trial-tool
makes it, empty, and binds it read-only like the rest.

An import path entry that *is* a writable path (a harness run with `python -c`
or `python harness.py` in its workspace) cannot be made read-only without
taking the workspace away: such a harness imports whatever a command leaves
there, its own modules as much as trial-tool's. docs/sandbox.md says so; the
CLI, the per-user server and the shims never have one (`-P`, __main__.py).
"""

from __future__ import annotations

import os
import sys

#: The candidates last computed, by what they were computed from: sys.path rarely changes.
_CACHE: dict[tuple[object, ...], list[str]] = {}


def _candidates(rank_file: str | None, caller: tuple[str, ...] = ()) -> list[str]:
    """Every path trial-tool runs or imports from, or would import from were it there, canonical.

    `caller` adds the interpreter, prefixes and import path of the process the call is
    made for, when that is another one (the per-user server's CLI callers).
    """
    import site

    import trialtool

    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    key = (tuple(sys.path), sys.executable, sys.prefix, sys.pycache_prefix, rank_file, user_site, os.getcwd(), caller)
    found = _CACHE.get(key)
    if found is None:
        names = [
            sys.executable,
            sys.prefix,
            sys.exec_prefix,
            sys.base_prefix,
            sys.base_exec_prefix,
            os.path.dirname(os.path.abspath(trialtool.__file__)),
            *(entry or os.getcwd() for entry in sys.path),
            *(name for name in (sys.pycache_prefix, rank_file, user_site) if name),
            *(name for name in caller if name),
        ]
        found = sorted({os.path.realpath(path) for name in names for path in (os.path.abspath(name), name)})
        _CACHE.clear()
        _CACHE[key] = found
    return found


def paths(rank_file: str | None, caller: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(the paths trial-tool runs or imports from that exist now, those that do not yet)."""
    existing: list[str] = []
    missing: list[str] = []
    for path in _candidates(rank_file, caller):
        (existing if os.path.exists(path) else missing).append(path)
    return existing, missing


__all__ = ["paths"]
