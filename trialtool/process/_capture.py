"""One output stream's bounded spool: the first `cap` bytes on disk, a count and a hash.

The spool is an unlinked file (O_TMPFILE on Linux) in the directory given, so a
crash leaves nothing behind and a full disk fails the call rather than memory.
It never holds more than `cap` bytes: bytes past the cap are counted and dropped.
"""

from __future__ import annotations

import os

from ..errors import StorageError
from ..osio import write_all

TYPE_CHECKING = False  # not typing's: see cli.py
if TYPE_CHECKING:
    import selectors

_READ_SIZE = 65536

#: SHA-256 of nothing: the hash of an empty stream.
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def open_unlinked(directory: str) -> int:
    """A read-write descriptor on a file with no name in `directory` (OSError if it cannot be made)."""
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            return os.open(directory, flags | tmpfile, 0o600)
        except OSError:
            pass  # filesystem without O_TMPFILE (or not Linux): fall back below
    path = os.path.join(directory, f".trialtool-spool.{os.getpid()}.{os.urandom(6).hex()}")
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    return fd


class Spool:
    """The first `cap` bytes of a stream, spooled to an unlinked file.

    The supervisor (a fork sharing the descriptor) feeds it; trial-tool reads the
    kept bytes back from the descriptor, told the total by the supervisor.
    """

    def __init__(self, fd: int, cap: int) -> None:
        import hashlib  # in the supervisor only: trial-tool's side reads the spool with pread

        self._fd = fd
        self.cap = cap
        #: Bytes the command wrote to the stream, kept or not.
        self.total = 0
        self._hash = hashlib.sha256()

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
        try:
            write_all(self._fd, chunk)
        except OSError as exc:
            msg = f"cannot write the output spool: {exc.strerror or exc}"
            raise StorageError(msg) from exc

    def head(self, size: int) -> bytes:
        """The first `size` kept bytes."""
        return os.pread(self._fd, min(size, self.total, self.cap), 0)

    def sha256(self) -> str:
        """SHA-256 of the kept bytes."""
        return self._hash.hexdigest()

    def read_once(self, fd: int, selector: selectors.BaseSelector) -> bool:
        """Move one read's worth of pipe `fd` into the spool; False once it is over its cap.

        One read per wake-up, so a writer faster than us cannot keep the supervisor
        from its deadline. At EOF the pipe leaves `selector`.
        """
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return not self.full
        if data:
            self.feed(data)
        else:
            selector.unregister(fd)
        return not self.full

    def drain(self, fd: int, selector: selectors.BaseSelector) -> None:
        """Read what pipe `fd` holds until it is empty or closed, or the spool is over its cap.

        Bounded even if something kept writing: it stops at the cap.
        """
        while fd in selector.get_map() and not self.full:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                return
            if data:
                self.feed(data)
            else:
                selector.unregister(fd)


__all__ = ["EMPTY_SHA256", "Spool", "open_unlinked"]
