"""SIGINT, SIGTERM and SIGHUP to trial-tool, turned into a readable descriptor and a remembered signal;
and the same for a call's supervisor (`SupervisorSignals`), whose SIGTERM is a stop request or its parent's death.

The handlers only record the first signal; the byte the interpreter writes to the
wakeup pipe wakes the call's `select`, which asks the supervisor to stop the
tree. The call is then recorded (status `interrupted`, charged) and the CLI exits
128 + the signal's number, as a shell would. Main thread only, as all Python
signal handling is.
"""

from __future__ import annotations

import os
import signal
from types import FrameType, TracebackType

CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class InterruptWatch:
    """While entered, the first of SIGINT/SIGTERM/SIGHUP is kept in `signum` and wakes `fd`."""

    #: The CLI writes an interrupted call's text before it exits: it is delivered.
    delivers = True

    def __init__(self) -> None:
        self.signum: int | None = None
        self.fd = -1
        self._write_fd = -1
        self._previous: dict[int, object] = {}
        self._previous_wakeup = -1

    @property
    def reason(self) -> str:
        """What stopped the call, for the agent's notice."""
        return "trial-tool received " + signal.Signals(self.signum or signal.SIGINT).name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> InterruptWatch:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in CAUGHT:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self.fd)
        os.close(self._write_fd)


class Cancellation:
    """A call's stop button for a caller in another thread (asyncio cancellation, a server shutting down).

    Same interface as InterruptWatch: `fd` becomes readable and `signum` is set
    (SIGTERM: the caller asked the call to end) once `cancel()` is called. The
    descriptor is never drained, so one Cancellation can stop many calls at once.
    `delivers` says whether the stopped calls' text still reaches the caller.
    """

    def __init__(self, reason: str = "the call was cancelled", *, delivers: bool = False) -> None:
        self.signum: int | None = None
        self.reason = reason
        #: False (the default) when the caller gives up on the result: an asyncio task
        #: cancelled, an MCP request cancelled. Such a call is charged, with nothing delivered.
        self.delivers = delivers
        self.fd, self._write_fd = os.pipe()

    def cancel(self) -> None:
        if self.signum is None:
            self.signum = signal.SIGTERM
            os.write(self._write_fd, b"c")

    def close(self) -> None:
        for fd in (self.fd, self._write_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self._write_fd = -1


class SupervisorSignals:
    """Signals to a call's supervisor, turned into flags and a readable descriptor (the supervisor's own side)."""

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self.orphaned = False
        self.stop = False
        self.read_fd, write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_term)
        # Ctrl-C reaches trial-tool's whole process group, us included; trial-tool
        # decides, and tells us through the control pipe.
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.signal(signal.SIGHUP, lambda *_: None)

    def _on_term(self, *_: object) -> None:
        # SIGTERM is our parent-death signal; from a live parent it is a stop request.
        if os.getppid() != self.parent_pid:
            self.orphaned = True
        else:
            self.stop = True

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 64):
                pass
        except BlockingIOError:
            pass


__all__ = ["CAUGHT", "Cancellation", "InterruptWatch", "SupervisorSignals"]
