"""Fork the call's supervisor early, send it its orders, wait for its result.

trial-tool forks a supervisor per call (_supervisor.py) as soon as it knows where
the trial lives, before it imports the rest of trialtool or reserves the call,
so that the supervisor's set-up (prctl, its cgroup) overlaps that work. Hence
this module imports nothing heavy at load time. Then it sends the orders and
waits, in one `select` with no polling interval, for three things: the
supervisor's result line, the supervisor's exit (a pidfd on Linux), and an
interrupt descriptor (a signal wakeup pipe, from _interrupts.py). An interrupt
is passed on as a stop request; the supervisor then stops the tree and reports
as usual, so an interrupted call is still recorded.

A threaded or long-lived caller (the API) gets its supervisor from a fork
server instead (_forkserver.py). The rest is the same, except that the
supervisor is then not our child: its closing the result pipe, which it does
once everything is reaped, ends the wait, not its exit.
"""

from __future__ import annotations

import os
import sys

from ..errors import StorageError, TrialToolError
from ..osio import require_directory, write_all
from ._capture import open_unlinked

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._forkserver import ForkServer
    from ._orders import Report, Spec
    from ._outcome import Outcome


class Launcher:
    """A supervisor forked ahead of the call, getting ready while trial-tool reserves it.

    Use as a context manager around the reservation: `run` sends the orders and
    waits for the outcome; leaving without `run` (a refused call, an error) sends
    EOF and the supervisor exits having started nothing.
    """

    def __init__(self, spool_dir: str, forkserver: ForkServer | None = None) -> None:
        self.spool_dir = spool_dir
        #: Where the supervisor comes from: a fork of this process, or of a fork server
        #: (for threaded callers, see _forkserver.py).
        self.forkserver = forkserver
        self.pid = -1
        self._result_r = self._control_w = self._watch_fd = -1
        self.spools: tuple[int, int] | None = None

    def __enter__(self) -> Launcher:
        require_directory(self.spool_dir)
        # The spools are opened before the fork, so that both sides share them.
        try:
            self.spools = (open_unlinked(self.spool_dir), open_unlinked(self.spool_dir))
        except OSError as exc:
            msg = f"cannot create an output spool in {self.spool_dir}: {exc.strerror or exc}"
            raise StorageError(msg) from exc
        self._result_r, result_w = os.pipe()
        control_r, self._control_w = os.pipe()
        if self.forkserver is not None:
            try:
                self.pid = self.forkserver.fork_supervisor((*self.spools, result_w, control_r))
            except BaseException as exc:
                # Our ends closed: a supervisor that did get the descriptors sees EOF and exits.
                self.__exit__()
                if isinstance(exc, OSError):
                    raise TrialToolError(str(exc)) from exc
                raise
            finally:
                os.close(result_w)
                os.close(control_r)
            # Opened now, while it cannot have exited (it waits for our orders): later,
            # the fork server might have reaped it and its pid be someone else's.
            self._watch_fd = _pidfd(self.pid)
            return self
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the supervisor
            os.close(self._result_r)
            os.close(self._control_w)
            from ._supervisor import run_call

            run_call(self.spools, result_w, control_r, parent)
        os.close(result_w)
        os.close(control_r)
        self._watch_fd = _pidfd(self.pid)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in (self._result_r, self._control_w, self._watch_fd):
            if fd >= 0:
                os.close(fd)
        self._result_r = self._control_w = self._watch_fd = -1
        if self.pid > 0 and self.forkserver is None:
            try:
                os.waitpid(self.pid, 0)  # after EOF on its orders it exits at once
            except ChildProcessError:
                pass
            self.pid = -1
        for fd in self.spools or ():
            os.close(fd)
        self.spools = None

    def run(self, spec: Spec, interrupt_fd: int | None = None) -> Outcome:
        """Run the call `spec` orders until its command exits, reaches the deadline, passes a limit, or is
        interrupted (`interrupt_fd` readable)."""
        from ._orders import encode
        from ._outcome import outcome

        assert self.spools is not None and self.pid > 0, "run() once, inside the with block"
        try:
            write_all(self._control_w, encode(spec))
        except BrokenPipeError:
            pass  # the supervisor is gone: its result (or its absence) says why
        result = self._wait(interrupt_fd)
        if result.fatal is not None:
            msg = f"the call's supervisor failed: {result.fatal}"
            raise TrialToolError(msg)
        return outcome(result, self.spools, spec.limits.max_capture_bytes)

    def _wait(self, interrupt_fd: int | None) -> Report:
        """The supervisor's result line; an interrupt on the way becomes a stop request."""
        import json
        import selectors

        from ._orders import decode_report

        pid, self.pid = self.pid, -1
        own_child = self.forkserver is None
        watch_fd, self._watch_fd = self._watch_fd, -1
        selector = selectors.DefaultSelector()
        data = bytearray()
        try:
            selector.register(self._result_r, selectors.EVENT_READ)
            if watch_fd >= 0 and own_child:
                selector.register(watch_fd, selectors.EVENT_READ)
            if interrupt_fd is not None:
                selector.register(interrupt_fd, selectors.EVENT_READ)
            # Without a pidfd, or for a fork server's supervisor (which closes the pipe
            # once it has reaped everything, then only exits), the result pipe's EOF is the signal.
            exited = watch_fd < 0 or not own_child
            result_done = False
            while not (result_done and exited):
                for key, _ in selector.select():
                    fd = int(key.fd)
                    if fd == self._result_r:
                        chunk = os.read(fd, 65536)
                        if chunk:
                            data += chunk
                        else:
                            result_done = True
                            selector.unregister(fd)
                    elif fd == watch_fd:
                        exited = True
                        selector.unregister(fd)
                    elif fd == interrupt_fd:
                        # Not drained: the descriptor may be shared by several calls
                        # (serve's stop pipe); each asks its own supervisor once.
                        selector.unregister(fd)
                        os.write(self._control_w, b"s")
            if own_child:
                os.waitpid(pid, 0)
        except BaseException:
            # Whatever went wrong here, the supervisor stops the tree; wait for it so
            # nothing outlives the call, then let the error go on.
            _stop_and_wait(pid, watch_fd, own_child)
            raise
        finally:
            selector.close()
            if watch_fd >= 0:
                os.close(watch_fd)
        try:
            return decode_report(json.loads(bytes(data)))
        except (ValueError, TypeError) as exc:
            msg = "the call's supervisor died without reporting (killed from outside?)"
            raise TrialToolError(msg) from exc


def _stop_and_wait(pid: int, watch_fd: int, own_child: bool) -> None:
    """Tell a supervisor to stop (it then stops its tree) and wait until it has."""
    import select
    import signal

    try:
        if watch_fd >= 0:
            # Through the pidfd: a fork server may have reaped it and its pid be reused.
            signal.pidfd_send_signal(watch_fd, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
        if own_child:
            os.waitpid(pid, 0)
        elif watch_fd >= 0:
            select.select([watch_fd], [], [])
    except (ChildProcessError, ProcessLookupError):
        pass


def _pidfd(pid: int) -> int:
    """A descriptor readable when `pid` exits, or -1 (kernel older than 5.3, not Linux)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return -1
    try:
        return int(pidfd_open(pid))
    except OSError:
        return -1


__all__ = ["Launcher"]
