"""The one seam through which trial-tool touches its own files: opened safely, written durably.

Opening: every file of the trial (state, log, lock) is opened by `open_own`,
never through a symbolic link (O_NOFOLLOW on the last component), never
blocking (O_NONBLOCK, so a FIFO cannot hang a call), and only if it is a
regular file. Inputs the user names (the key file, the rank file) may be links,
as secrets mounts use them, but must lead to a regular file too. Anything else
is a StorageError naming the file and what it is, raised before a call is
charged.

Writing: every write is followed by fsync, and an fsync error is never retried:
after a failed fsync the kernel may have dropped the dirty pages, so a retry
can report success for data that is gone (https://lwn.net/Articles/752063/).
Failures surface as StorageError naming the file and the step.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import StateError, StorageError
from ..osio import ensure_directory, reserve, write_all

TYPE_CHECKING = False  # collections.abc costs 2.5 ms on the CLI's path (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Iterable


class NoRoom(OSError):
    """The disk (or the user's quota) has not the room asked for: ENOSPC or EDQUOT."""


def _fail(step: str, path: str, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc)
    return StorageError(f"cannot {step} {path}: {reason}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def open_own(path: str, flags: int, *, follow: bool = False, mode: int = 0o644) -> int:
    """A descriptor on the regular file `path`; StorageError for a link (unless `follow`), a FIFO, a directory.

    FileNotFoundError passes through, so that callers can tell "absent" apart.
    """
    extra = os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags | extra, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow and os.path.islink(path):
            msg = f"{path} is a symbolic link; trial-tool opens its own files only directly (name the file itself)"
            raise StorageError(msg) from exc
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            try:
                what = _kind(os.stat(path).st_mode)
            except OSError:
                what = "not a regular file"
            msg = f"{path} is {what}, not a regular file"
            raise StorageError(msg) from exc
        raise _fail("open", path, exc) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        msg = f"{path} is {_kind(info.st_mode)}, not a regular file"
        raise StorageError(msg)
    return fd


def check_regular(path: str) -> None:
    """StorageError if `path` exists and is anything but a regular file (a link, a directory, a FIFO)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _fail("inspect", path, exc) from exc
    if stat.S_ISLNK(info.st_mode):
        msg = f"{path} is a symbolic link; trial-tool opens its own files only directly (name the file itself)"
        raise StorageError(msg)
    if not stat.S_ISREG(info.st_mode):
        msg = f"{path} is {_kind(info.st_mode)}, not a regular file"
        raise StorageError(msg)


def read_bytes(path: str, *, follow: bool = False) -> bytes | None:
    """The regular file's bytes, or None when it does not exist."""
    try:
        fd = open_own(path, os.O_RDONLY, follow=follow)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise _fail("read", path, exc) from exc
    finally:
        os.close(fd)


def read_input(path: str) -> bytes:
    """A file the user names (a key, a rank file): links followed, as secrets mounts use them, but
    never a FIFO or a directory; StorageError if it is missing or cannot be read."""
    data = read_bytes(path, follow=True)
    if data is None:
        msg = f"{path} does not exist"
        raise StorageError(msg)
    return data


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


def _temporary_of(path: str) -> str:
    """A new temporary name beside `path`, of the form mending.sweep_temporaries removes once its writer is dead."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def atomic_write(path: str, data: bytes, *, sync_directory: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves the old file or the new, never a mix.

    Temp file in the same directory, write, fsync, os.replace, and (unless told
    not to) fsync the directory, which makes the replacement itself durable.
    Without it, after a power loss the file is the new version or an older whole
    one, never a torn or empty one (the data was fsynced before the rename).
    """
    directory = os.path.dirname(path)
    temporary = _temporary_of(path)
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


def append(path: str, data: bytes | Iterable[bytes], *, only_at: int | None = None) -> int:
    """Append `data` (bytes, or parts written one after another) to `path`, created if missing,
    and fsync it; return the new size.

    `only_at`: append only if the file is exactly that long, checked and written under
    an exclusive flock of the file itself, so that of two writers racing to make the
    first line of one log (two trials given the same log), one wins and the other gets
    StateError. Every trial-tool takes that lock for a log's first line.

    On failure the file is cut back to its old size, so that a failed append leaves
    no partial line behind; if even that fails the caller sees the original error
    and the next reader finds a torn tail.
    """
    try:
        fd = open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except FileNotFoundError as exc:
        raise _fail("open", path, exc) from exc
    created = False
    try:
        if only_at is not None:
            import fcntl  # only a trial's first record pays for it

            fcntl.flock(fd, fcntl.LOCK_EX)
        old_size = os.fstat(fd).st_size
        if only_at is not None and old_size != only_at:
            msg = (
                f"log {path} was claimed by another trial (it has {old_size} bytes, this trial expected {only_at}): "
                "refusing to run a call whose record could not be kept; give each trial its own log"
            )
            raise StateError(msg)
        created = old_size == 0
        step = "append to"
        written = 0
        try:
            for part in [data] if isinstance(data, bytes) else data:
                write_all(fd, part)
                written += len(part)
            step = "fsync"
            os.fsync(fd)
        except BaseException as exc:
            # Whatever stopped it (a full disk, the parts' own failure, an interrupt),
            # no partial line stays behind.
            try:
                os.ftruncate(fd, old_size)
            except OSError:
                pass  # reported through the original error below
            if isinstance(exc, OSError):
                raise _fail(step, path, exc) from exc
            raise
        new_size = old_size + written
    finally:
        os.close(fd)
    if created:
        fsync_directory(os.path.dirname(path) or ".")
    return new_size


def reserve_tail(path: str, size: int) -> None:
    """Allocate `size` bytes past the end of `path` (created if missing), without changing its size.

    A later append of up to that much then needs no new blocks: a command that
    fills the disk meanwhile cannot starve it. NoRoom if the space is not there
    now (the caller says what needed it), StorageError for any other failure.
    """
    try:
        fd = open_own(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except FileNotFoundError as exc:
        raise _fail("open", path, exc) from exc
    try:
        reserve(fd, os.fstat(fd).st_size, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoRoom(exc.errno, exc.strerror) from exc
        raise _fail("reserve space for the call's record in", path, exc) from exc
    finally:
        os.close(fd)


def release_tail(path: str) -> None:
    """Give back what `reserve_tail` allocated past the end of `path` (a truncation to its own size).

    Without it each log would keep its last reservation (a few MB: a call's record at
    its largest) for good. A failure leaves the space reserved, which costs disk, not
    correctness: it is not reported.
    """
    try:
        fd = open_own(path, os.O_WRONLY)
    except OSError:
        return
    try:
        os.ftruncate(fd, os.fstat(fd).st_size)
    except OSError:
        pass
    finally:
        os.close(fd)


def stamp(path: str) -> list[int] | None:
    """What changes whenever the file's bytes do (device, inode, size, mtime, ctime), or None if absent."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _stamp_of(info)


def _stamp_of(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def stamped_range(path: str, start: int, end: int) -> tuple[list[int], bytes] | None:
    """The file's stamp and its bytes from `start` to `end`, both of the one file opened (None if absent)."""
    try:
        fd = open_own(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        found = _stamp_of(os.fstat(fd))
        chunks, at = [], start
        while at < end and (chunk := os.pread(fd, min(end - at, 1 << 20), at)):
            chunks.append(chunk)
            at += len(chunk)
        return found, b"".join(chunks)
    except OSError as exc:
        raise _fail("read", path, exc) from exc
    finally:
        os.close(fd)


def truncate(path: str, size: int) -> None:
    """Cut `path` back to `size` bytes, durably (repairing a torn append)."""
    try:
        fd = open_own(path, os.O_WRONLY)
    except FileNotFoundError as exc:
        raise _fail("open", path, exc) from exc
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError as exc:
        raise _fail("truncate", path, exc) from exc
    finally:
        os.close(fd)


def touch(path: str) -> None:
    """Create `path` empty if it does not exist (an empty log is a log of no records); StorageError if that fails."""
    try:
        os.close(open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
    except FileNotFoundError as exc:
        raise _fail("create", path, exc) from exc


def preflight_append(path: str) -> None:
    """StorageError now, rather than after a command ran, if `path` cannot take an append; creates nothing."""
    try:
        os.close(open_own(path, os.O_WRONLY | os.O_APPEND))
    except FileNotFoundError:
        directory = os.path.dirname(path) or "."
        if not os.access(directory, os.W_OK):
            msg = f"cannot create {path}: its directory is not writable"
            raise StorageError(msg) from None


__all__ = [
    "NoRoom",
    "append",
    "atomic_write",
    "check_regular",
    "ensure_directory",
    "fsync_directory",
    "open_own",
    "preflight_append",
    "read_bytes",
    "read_input",
    "release_tail",
    "reserve_tail",
    "stamp",
    "stamped_range",
    "touch",
    "truncate",
]
