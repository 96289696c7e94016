"""What a sandbox over the host's root keeps from one call's command (_layout.py): for bwrap and gVisor alike.

The trial's files, the per-user servers' directories (wherever a writable path
brings them back: the sandbox has its own /tmp and /run), trial-tool's own
files and what the caller names read-only. An import path entry yet to be made
inside a writable path is made now, empty, so that it is protected too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ..errors import SandboxError
from ..osio import plain
from ..server import directory as serverdir
from . import _ownfiles as ownfiles
from . import _pinned as pinned
from ._layout import Layout, inside, layout


def hidden(
    roots: tuple[str, ...],
    files: list[str],
    rank_file: str | None,
    environ: Mapping[str, str] | None = None,
    read_only: Sequence[str] = (),
    caller: tuple[str, ...] = (),
) -> Layout:
    """The call's layout; SandboxError if an import path entry cannot be made safely."""
    own, missing = ownfiles.paths(rank_file, caller)
    own += [path for path in read_only if os.path.exists(path)]
    for path in missing:
        if any(inside(path, root) for root in roots):
            # An import path entry yet to be made, where a command could make it: made now, empty.
            try:
                pinned.make_directories(path)
            except OSError as exc:
                msg = f"trial-tool's import path entry {plain(path)} cannot be made safely: {exc.strerror}"
                raise SandboxError(msg) from exc
            own.append(path)
    servers = {serverdir.directory(os.environ), serverdir.directory(environ or os.environ)}
    # Those under /tmp and /run need nothing, unless a writable path brings them back:
    # the sandbox has its own of each.
    directories = [
        d
        for d in servers
        if os.path.isdir(d) and (any(inside(d, root) for root in roots) or not (inside(d, "/tmp") or inside(d, "/run")))
    ]
    return layout(roots, files, directories=directories, own=own)


__all__ = ["hidden"]
