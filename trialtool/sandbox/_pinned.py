"""Open a pinned path without following a symlink anywhere on the way, and check it is the pinned one.

A workspace or writable path is pinned by (device, inode) when the trial is
created (sandbox/_settings.py). A command can rename what it may write and leave a
symlink in its place; resolving the path again by name would then bind
whatever the link points to. So each call opens the path one component at a
time with O_PATH|O_NOFOLLOW from the root, compares what it reached with the
pin, and hands bwrap that descriptor (`--bind-fd`): a rename between the check
and the mount changes nothing.

openat2's RESOLVE_NO_SYMLINKS would do the walk in one call, but Python does
not bind it and the walk gives the same guarantee for the canonical absolute
paths that are pinned (no "..", every component checked): a few µs a path.
"""

from __future__ import annotations

import os
import stat

from ..errors import SandboxError
from ..osio import plain
from ._settings import Pin

_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def open_nofollow(path: str) -> int:
    """An O_PATH descriptor of canonical absolute `path`, reached without following any symlink.

    OSError (ELOOP, ENOTDIR, ENOENT) where a component is a symlink or missing.
    """
    parts = [part for part in path.split("/") if part]
    fd = os.open("/", _FLAGS | os.O_DIRECTORY)
    try:
        for part in parts:
            if part in (".", ".."):
                raise OSError(22, "not a canonical path", path)
            following = os.open(part, _FLAGS, dir_fd=fd)
            os.close(fd)
            fd = following
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(40, os.strerror(40), path)  # ELOOP: O_PATH|O_NOFOLLOW opens the link itself
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_pinned(pin: Pin) -> int:
    """An O_PATH descriptor of the file `pin` names, which must still be that file; SandboxError if not."""
    try:
        fd = open_nofollow(pin.path)
    except OSError as exc:
        msg = (
            f"the trial's pinned path {plain(pin.path)} cannot be reached without following a symlink "
            f"({exc.strerror}): it was moved or replaced since the trial was created; refusing it"
        )
        raise SandboxError(msg) from exc
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) != (pin.device, pin.inode):
        os.close(fd)
        msg = (
            f"the trial's pinned path {plain(pin.path)} is no longer the directory the trial was created with "
            "(replaced, or moved and another put in its place); refusing it"
        )
        raise SandboxError(msg)
    return fd


def make_directories(path: str) -> None:
    """Make canonical absolute `path` and its missing parents (0755), never through a symlink; OSError if one is."""
    parts = [part for part in path.split("/") if part]
    fd = os.open("/", _FLAGS | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            following = os.open(part, _FLAGS | os.O_DIRECTORY, dir_fd=fd)  # ENOTDIR/ELOOP on a symlink
            os.close(fd)
            fd = following
    finally:
        os.close(fd)


def check(pins: tuple[Pin, ...]) -> None:
    """Every pin still reachable and the same file; SandboxError naming the first that is not."""
    for pin in pins:
        os.close(open_pinned(pin))


def own_directory(path: str, what: str) -> tuple[Pin, bool]:
    """A directory of this user's at `path` (made 0700 if missing, never a link), pinned; and whether it was made.

    SandboxError when something else is there: `what` names it in the message.
    """
    made = False
    try:
        os.mkdir(path, 0o700)
        made = True
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        msg = f"{what} {plain(path)} is not a directory of this user's (replaced?)"
        raise SandboxError(msg)
    return Pin(path, info.st_dev, info.st_ino), made


__all__ = [
    "check",
    "make_directories",
    "open_nofollow",
    "open_pinned",
    "own_directory",
]
