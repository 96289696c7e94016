"""The ledger lock: an exclusive flock(2) on a separate lock file, with a timeout.

Why not the filelock package, which the project's design names. With the
per-user server its import (47-68 ms measured on this machine) is paid once
per server rather than per call, so that reason no longer decides; these do,
measured against filelock 3 in one warm process on a 2-core VM:

- an uncontended acquire and release costs 174 us with filelock and 8 us here,
  and a call takes the lock twice;
- a waiter learns of a release by polling: filelock every 50 ms by default,
  this lock after 0.5 ms, backing off to 20 ms, so a handover under contention
  (parallel calls of one trial) is up to 50 ms slower with filelock;
- a wait must end at once when trial-tool is told to stop (`cancelled`), and a
  timeout should name the holder (from /proc/locks): filelock offers neither;
- `TRIALTOOL_SERVER=off` still runs every call in a fresh process, where the
  import would again be most of the overhead.

What we need is one exclusive lock on a side file that the kernel releases when
its holder dies: flock(2) does exactly that on Linux and macOS. The lock file
stays empty: a timeout names the holder from /proc/locks, which the kernel
keeps true, rather than from a pid the file might still hold from an earlier
holder.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from ..errors import LockTimeout, StorageError
from ._durable import open_own

TYPE_CHECKING = False  # not typing's: see cli.py
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

#: Seconds a call waits for the ledger lock before giving up (--lock-timeout).
DEFAULT_LOCK_TIMEOUT = 30.0


class LedgerLock:
    """Exclusive, non-reentrant lock on `path`; use as a context manager."""

    def __init__(self, path: str, timeout: float, cancelled: Callable[[], None] | None = None) -> None:
        self.path = path
        self.timeout = timeout
        #: Called while waiting; raises to give up (trial-tool was told to stop).
        self.cancelled = cancelled
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = open_own(self.path, os.O_RDWR | os.O_CREAT)
        except FileNotFoundError as exc:
            msg = f"cannot open lock file {self.path}: {exc.strerror or exc}"
            raise StorageError(msg) from exc
        # Deadline on the monotonic clock: a stepped wall clock must not shorten or
        # stretch the wait.
        deadline = time.monotonic() + self.timeout
        pause = 0.0005
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                if self.cancelled is not None:
                    self.cancelled()
                left = deadline - time.monotonic()
                if left <= 0:
                    holder = self._holder(fd)
                    msg = (
                        f"ledger lock {self.path} still held{holder} after "
                        f"{self.timeout:g} s (--lock-timeout); is another trial-tool stopped?"
                    )
                    raise LockTimeout(msg)
                # flock has no timed wait; back off from 0.5 ms to 20 ms so an
                # uncontended handover is quick and a long wait costs little CPU.
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.02)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> str:
        """` by pid N` for the process holding the flock on `fd`'s file, from /proc/locks (Linux); else ""."""
        info = os.fstat(fd)
        inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
        try:
            with open("/proc/locks", encoding="ascii", errors="replace") as handle:
                rows = [line.split() for line in handle]
        except OSError:
            return ""
        for row in rows:
            # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters carry a "->" and are skipped.
            if len(row) >= 6 and row[1] == "FLOCK" and row[5] == inode:
                return f" by pid {row[4]}"
        return ""

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Closing the descriptor drops the flock.
            os.close(fd)

    def __enter__(self) -> LedgerLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


__all__ = ["DEFAULT_LOCK_TIMEOUT", "LedgerLock"]
