"""Start a command in a new session, stdin from /dev/null, its two output streams on pipes.

The supervisor's own small `subprocess.Popen`: fork, set the child up, exec,
and report an exec failure through a close-on-exec pipe. We do not use
subprocess itself because importing it costs ~8 ms here, on the path of every
call, and the supervisor needs only this. Run from a single-threaded process
only (the supervisor is one), since the child runs Python code between fork and
exec.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

# CPython ignores these at start-up; ignored dispositions survive exec, so the
# command would inherit them (SIGPIPE ignored breaks `yes | head`).
_RESTORE = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(signal, name))


class Child:
    """The started command: its pid and the read ends of its stdout and stderr pipes."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (negative: the signal that killed it) once it has exited; never blocks."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        """Reap the command and return its exit code (negative: the signal that killed it)."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def spawn(
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str] | None,
    before_exec: Callable[[], None],
) -> Child:
    """Fork and exec `argv`; OSError (with the exec's errno) if it cannot be executed."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    report_r, report_w = os.pipe()  # close-on-exec: EOF means the exec happened
    devnull = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, report_w)
            os.closerange(report_w + 1, 1 << 16)
            for sig in _RESTORE:
                signal.signal(sig, signal.SIG_DFL)
            if cwd is not None:
                os.chdir(cwd)
            before_exec()
            if env is None:
                os.execvp(argv[0], argv)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            number = exc.errno if isinstance(exc, OSError) and exc.errno else 0
            os.write(report_w, str(number).encode())
        finally:
            os._exit(127)
    for fd in (out_w, err_w, report_w, devnull):
        os.close(fd)
    with os.fdopen(report_r, "rb") as report:
        failure = report.read()
    if failure:
        os.waitpid(pid, 0)
        os.close(out_r)
        os.close(err_r)
        number = int(failure) or 0
        raise OSError(number, os.strerror(number) if number else "the command could not be started")
    return Child(pid, out_r, err_r)


__all__ = ["Child", "spawn"]
