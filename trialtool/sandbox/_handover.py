"""A root caller's workspace handed to the unprivileged id its container's commands run as.

A container's command runs as the trial's `run_as` id (docker's `--user`); the
engine maps no ids, so a workspace that a root harness made is root's and the
command could not write it. Before each call, then, what the workspace and the
writable paths hold that is not that id's becomes that id's: what the harness
put there between calls too. The files a command makes are its id's already,
so a call's walk only reads, unless something new came.

The walk holds each directory by a descriptor and changes what it holds by
name relative to it without following a symbolic link, so that a link planted
in the workspace never leads it out. A file with more than one link is left as
it is: its other name may lie outside (`git clone --local` links objects from
the repository cloned), and its owner is not the workspace's to give away.
Between calls nothing of the trial runs (the container's processes end with the
call), so nothing moves beneath the walk.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from ._pinned import open_pinned
from ._settings import Pin


def hand_over(pins: Sequence[Pin], uid: int, gid: int) -> int:
    """Give the pinned paths and what they hold to `uid`:`gid`; the number of entries changed.

    SandboxError if a pinned path is no longer the file pinned.
    """
    changed = 0
    for pin in pins:
        fd = open_pinned(pin)
        try:
            info = os.fstat(fd)
            # The pinned file itself, through its descriptor's own name (the descriptor is O_PATH).
            changed += _give(f"/proc/self/fd/{fd}", info, uid, gid, None, follow=True)
            if not stat.S_ISDIR(info.st_mode):
                continue
            for _, directories, files, at in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
                for name in (*directories, *files):
                    try:
                        entry = os.stat(name, dir_fd=at, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    changed += _give(name, entry, uid, gid, at)
        finally:
            os.close(fd)
    return changed


def _give(name: str, info: os.stat_result, uid: int, gid: int, fd: int | None, follow: bool = False) -> bool:
    if (info.st_uid, info.st_gid) == (uid, gid):
        return False
    if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
        return False
    os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=follow)
    return True


__all__ = ["hand_over"]
