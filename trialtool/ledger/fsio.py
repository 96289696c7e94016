"""Durable file writes: the one seam through which the ledger and the log touch the disk.

Every write here is followed by fsync, and an fsync error is never retried: after a
failed fsync the kernel may have dropped the dirty pages, so a retry can report
success for data that is gone (https://lwn.net/Articles/752063/). Failures surface
as StorageError naming the file and the step.
"""

from __future__ import annotations

import os

from ..errors import StorageError
from ..fdio import ensure_directory, write_all


def _fail(step: str, path: str, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc)
    return StorageError(f"cannot {step} {path}: {reason}")


def read_bytes(path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _fail("read", path, exc) from exc


def fsync_directory(directory: str) -> None:
    """Make a rename or a file creation in `directory` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise _fail("open directory", directory, exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _fail("fsync directory", directory, exc) from exc
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, *, sync_directory: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves the old file or the new, never a mix.

    Temp file in the same directory, write, fsync, os.replace, and (unless told
    not to) fsync the directory, which makes the replacement itself durable.
    Without it, after a power loss the file is the new version or an older whole
    one, never a torn or empty one (the data was fsynced before the rename).
    """
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise _fail("create", temporary, exc) from exc
    step = "write"
    try:
        try:
            write_all(fd, data)
            step = "fsync"
            os.fsync(fd)
        finally:
            os.close(fd)
        step = "replace"
        os.replace(temporary, path)
    except OSError as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # the original error is the one worth reporting
        raise _fail(step, path if step == "replace" else temporary, exc) from exc
    if sync_directory:
        fsync_directory(directory or ".")


def append(path: str, data: bytes) -> int:
    """Append `data` to `path` (created if missing) and fsync it; return the new size.

    On failure the file is cut back to its old size, so that a failed append leaves
    no partial line behind; if even that fails the caller sees the original error
    and the next reader finds a torn tail.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise _fail("open", path, exc) from exc
    created = False
    try:
        old_size = os.fstat(fd).st_size
        created = old_size == 0
        step = "append to"
        try:
            write_all(fd, data)
            step = "fsync"
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, old_size)
            except OSError:
                pass  # reported through the original error below
            raise _fail(step, path, exc) from exc
        new_size = old_size + len(data)
    finally:
        os.close(fd)
    if created:
        fsync_directory(os.path.dirname(path) or ".")
    return new_size


def stamp(path: str) -> list[int] | None:
    """What changes whenever the file's bytes do (device, inode, size, mtime, ctime), or None if absent."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def truncate(path: str, size: int) -> None:
    """Cut `path` back to `size` bytes, durably (repairing a torn append)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise _fail("open", path, exc) from exc
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError as exc:
        raise _fail("truncate", path, exc) from exc
    finally:
        os.close(fd)


__all__ = ["append", "atomic_write", "ensure_directory", "fsync_directory", "read_bytes", "stamp", "truncate"]
