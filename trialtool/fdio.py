"""The two I/O chores every room shares: write a whole buffer to a descriptor, make a directory.

Kept apart from ledger/fsio.py (durable writes of the trial's files) because
the process room and the front doors need them too, and must not depend on
the ledger for them.
"""

from __future__ import annotations

import os

from .errors import StorageError


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (os.write may take only part of it); OSError as os.write raises it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def ensure_directory(directory: str) -> None:
    """Create `directory` and its parents if missing; StorageError naming it if that fails."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create directory {directory}: {exc.strerror or exc}"
        raise StorageError(msg) from exc


__all__ = ["ensure_directory", "write_all"]
