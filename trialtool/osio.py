"""The small OS chores every room shares: write a whole buffer, make a directory, tell a process from a
later one reusing its pid, and OS text.

OS text: arguments, paths and environment values may hold any bytes but NUL.
Python hands them over as str with undecodable bytes as surrogate escapes
(PEP 383); `os_text` checks that a value can go back out to the OS, `os_bytes`
gives its bytes, and `shown` gives text that a strict JSON parser and a person
can read (U+FFFD where the bytes are not UTF-8). The audit log records such a
value with `shown` beside a base64 twin of its exact bytes.

Kept apart from ledger/_durable.py (durable writes of the trial's files) because
the process room and the front doors need these too, and must not depend on
the ledger for them.
"""

from __future__ import annotations

import os
import sys

from .errors import StorageError, UsageError

TYPE_CHECKING = False  # typing's own is an import before the CLI's fork (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (os.write may take only part of it); OSError as os.write raises it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


#: glibc's fallocate(2), bound on first use; None where there is none (not Linux).
_FALLOCATE: list[Any] = []
#: fallocate's mode: allocate blocks beyond the end without changing the file's size.
_FALLOC_FL_KEEP_SIZE = 1


def reserve(fd: int, offset: int, size: int) -> None:
    """Allocate `size` bytes of `fd` from `offset` without changing its size; OSError (ENOSPC) if there is no room.

    Writes there later need no new blocks, however full the disk is by then.
    A filesystem that cannot allocate ahead (or a system without fallocate)
    reserves nothing, silently: docs/sandbox.md names the usual ones.
    os.posix_fallocate would change the file's size, which a log and a spool must keep.
    """
    if not _FALLOCATE:
        try:
            import ctypes

            function = ctypes.CDLL(None, use_errno=True).fallocate
            function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            _FALLOCATE.append(function)
        except (OSError, AttributeError, ImportError):
            _FALLOCATE.append(None)
    function = _FALLOCATE[0]
    if function is None or size <= 0 or function(fd, _FALLOC_FL_KEEP_SIZE, offset, size) == 0:
        return
    import ctypes
    import errno

    number = ctypes.get_errno()
    if number not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(number, os.strerror(number))


def ensure_directory(directory: str) -> None:
    """Create `directory` and its parents if missing; StorageError naming it if that fails."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create directory {directory}: {exc.strerror or exc}"
        raise StorageError(msg) from exc


_LIBC: list[Any] = []
_PR_SET_DUMPABLE = 4


def prctl(option: int, value: int, *, load_only: bool = False) -> bool:
    """prctl(2) on Linux (the C library loaded once per process); False elsewhere or on failure."""
    if not sys.platform.startswith("linux"):
        return False
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return not load_only and _LIBC[0].prctl(option, value, 0, 0, 0) == 0


def make_undumpable() -> bool:
    """Make this process non-dumpable (Linux): a process of the same non-root user can then neither
    ptrace it nor open its /proc/PID/fd, so a command cannot reach trial-tool's descriptors that way.

    Commands are not affected: exec makes a program dumpable again.
    """
    return prctl(_PR_SET_DUMPABLE, 0)


def require_directory(directory: str) -> None:
    """StorageError unless `directory` exists: only `init` makes a trial's directories, so a typo fails here."""
    if not os.path.isdir(directory):
        msg = (
            f"directory {shown(directory)} does not exist: create it, "
            "or create the trial with `trial-tool init`, which makes it"
        )
        raise StorageError(msg)


def os_text(value: object, what: str) -> str:
    """`value` if the OS can take it as an argument, a path or an environment value; else UsageError.

    Any bytes but NUL can be passed: text from the OS arrives with undecodable
    bytes as surrogate escapes (PEP 383) and goes back out as those bytes. A
    lone surrogate that stands for no byte (from JSON, say) cannot.
    """
    if not isinstance(value, str):
        msg = f"{what} must be a string, not {type(value).__name__}"
        raise UsageError(msg)
    if "\0" in value:
        msg = f"{what} holds a NUL character, which no command can receive"
        raise UsageError(msg)
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        msg = f"{what} holds a lone surrogate (not a character, and no byte): {plain(value)}"
        raise UsageError(msg) from None
    return value


def plain(value: object) -> str:
    """A value as a message shows it: numbers without exponents or a needless `.0`, the rest as JSON would."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        import json

        return json.dumps(shown(value), ensure_ascii=False)  # quoted, control characters escaped
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"a {type(value).__name__}"


def os_bytes(value: str) -> bytes:
    """The bytes the OS gets for `value` (surrogate escapes back to their bytes; a lone surrogate as '?')."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace")


def process_token(pid: int) -> str | None:
    """Something that tells a live process from a later one reusing its pid; None if there is none.

    On Linux, the start time in clock ticks since boot (field 22 of /proc/PID/stat);
    elsewhere psutil's create time, imported only on that path.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        # Fields after the command name, which may itself hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] == b"Z":
            return None  # a zombie has finished; only its parent's wait is missing
        return fields[19].decode()
    except FileNotFoundError:
        return None
    except OSError:
        pass  # no procfs (macOS)
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{process.create_time():.3f}"
    except psutil.Error:
        return None


def alive(pid: int, recorded: str | None) -> bool:
    """True when `pid` is the very process whose token was `recorded`."""
    return recorded is not None and process_token(pid) == recorded


def shown(value: str) -> str:
    """`value` as text a person or a strict JSON parser can take: bytes that are not UTF-8 become U+FFFD."""
    return value if value.isascii() else os_bytes(value).decode("utf-8", "replace")


__all__ = [
    "alive",
    "ensure_directory",
    "make_undumpable",
    "os_bytes",
    "os_text",
    "plain",
    "prctl",
    "process_token",
    "require_directory",
    "reserve",
    "shown",
    "write_all",
]
