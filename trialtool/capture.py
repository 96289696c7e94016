"""One output stream's bounded spool: the first `cap` bytes on disk, a count and a hash.

The spool is an unlinked file (O_TMPFILE on Linux) in the directory given, so a
crash leaves nothing behind and a full disk fails the call rather than memory.
It never holds more than `cap` bytes: bytes past the cap are counted and dropped.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import StorageError


def _open_unlinked(directory: Path) -> int:
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            return os.open(directory, flags | tmpfile, 0o600)
        except OSError:
            pass  # filesystem without O_TMPFILE (or not Linux): fall back below
    path = directory / f".trialtool-spool.{os.getpid()}.{os.urandom(6).hex()}"
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    return fd


class Spool:
    """The first `cap` bytes of a stream, spooled to an unlinked file.

    The supervisor (a fork sharing the descriptor) feeds it; trial-tool reads it
    back with `read`, told the total by the supervisor.
    """

    EMPTY_SHA256 = hashlib.sha256().hexdigest()

    def __init__(self, directory: Path, cap: int) -> None:
        #: Set before the first `feed` (the supervisor learns it with its orders).
        self.cap = cap
        #: Bytes the command wrote to the stream, kept or not.
        self.total = 0
        self._hash = hashlib.sha256()
        try:
            self._fd = _open_unlinked(directory)
        except OSError as exc:
            msg = f"cannot create an output spool in {directory}: {exc.strerror or exc}"
            raise StorageError(msg) from exc

    @property
    def kept(self) -> int:
        return min(self.total, self.cap)

    @property
    def full(self) -> bool:
        """More bytes arrived than the cap keeps."""
        return self.total > self.cap

    def feed(self, data: bytes) -> None:
        room = self.cap - self.total
        self.total += len(data)
        if room <= 0:
            return
        chunk = data[:room]
        self._hash.update(chunk)
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            msg = f"cannot write the output spool: {exc.strerror or exc}"
            raise StorageError(msg) from exc

    def sha256(self) -> str:
        """SHA-256 of the kept bytes."""
        return self._hash.hexdigest()

    def read(self, total: int | None = None) -> bytes:
        """The kept bytes; `total` is the stream's byte count when another process fed the spool."""
        kept = self.kept if total is None else min(total, self.cap)
        try:
            return os.pread(self._fd, kept, 0) if kept else b""
        except OSError as exc:
            msg = f"cannot read the output spool: {exc.strerror or exc}"
            raise StorageError(msg) from exc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["Spool"]
