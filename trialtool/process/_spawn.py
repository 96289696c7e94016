"""Start a command in a new session, stdin from /dev/null (or a pipe), its output streams on pipes.

The supervisor's own small `subprocess.Popen`. We do not use subprocess itself
because it is a slow import on the path of every call (docs/performance.md), and the
supervisor needs only this. Two ways:

- `os.posix_spawn` (glibc does it with vfork, faster than a fork of a
  Python process) when nothing but the standard set-up is needed. It has no
  working-directory action, so the supervisor, which exists for this one
  command, changes its own directory first.
- fork, run `before_exec` (resource limits, joining a cgroup) in the child, exec,
  and report an exec failure through a close-on-exec pipe. Run from a
  single-threaded process only (the supervisor is one), since the child runs
  Python code between fork and exec.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
from collections.abc import Callable, Sequence

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


def _resolve(program: str, env: dict[str, str] | None) -> str:
    """`program` looked up in the command's own PATH, as execvpe does; OSError if it is not there."""
    if "/" in program:
        return program
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    denied = False
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            denied = True
    number = errno.EACCES if denied else errno.ENOENT
    raise OSError(number, os.strerror(number), program)


def _open_descriptors() -> list[int]:
    """This process's open descriptors (from /proc/self/fd, else /dev/fd, else a scan)."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return sorted(int(name) for name in os.listdir(listing))
        except OSError:
            continue
    import resource

    limit = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 16)
    found = []
    for fd in range(limit):
        try:
            os.fstat(fd)
            found.append(fd)
        except OSError:
            continue
    return found


def close_on_exec_all() -> None:
    """Mark every descriptor but 0, 1 and 2 close-on-exec, so that the command starts with exactly those.

    Whatever this process holds (spools, the result and stop channels received
    from a fork server, descriptors the caller left open, the selector's epoll)
    must not reach the command, which could read a stop request meant for the
    supervisor or write forged results. Runs in the supervisor, which exists for
    this one command and keeps using its own descriptors (close-on-exec only
    matters at the command's exec).
    """
    for fd in _open_descriptors():
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # closed meanwhile (the listing's own descriptor)


def spawn(
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str] | None,
    before_exec: Callable[[], None] | None,
    passed: Sequence[int] = (),
    stdin: int | None = None,
    merge: bool = False,
) -> Child:
    """Start `argv`; OSError (with the exec's errno) if it cannot be executed.

    Without `before_exec` this uses posix_spawn and changes the calling process's
    working directory to `cwd`: call it only from a process that runs one command.
    `passed` become the command's descriptors 3, 4, ... in order (bwrap's status
    channel, then the pinned paths it binds); the command gets no other.
    `stdin`, if given, is the command's standard input (else /dev/null); `merge`
    gives stderr the stdout pipe, so that both arrive in the order written (the
    child's `stderr` is then -1).
    """
    close_on_exec_all()
    # Copies above every target number first: a descriptor dup'd onto itself keeps
    # close-on-exec, and one moved onto another's number would lose that one.
    # (Just above them, not far: a caller's open-files limit may be small.)
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + len(passed)) for fd in passed]
    try:
        if before_exec is None and hasattr(os, "posix_spawn"):
            return _posix_spawn(argv, cwd, env, lifted, stdin, merge)
        return _fork_exec(argv, cwd, env, before_exec, lifted, stdin, merge)
    finally:
        for fd in lifted:
            os.close(fd)


def _fork_exec(
    argv: list[str],
    cwd: str | None,
    env: dict[str, str] | None,
    before_exec: Callable[[], None] | None,
    passed: list[int],
    stdin: int | None,
    merge: bool,
) -> Child:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe() if not merge else (-1, out_w)
    report_r, pipe_w = os.pipe()  # close-on-exec: EOF means the exec happened
    report_w = fcntl.fcntl(pipe_w, fcntl.F_DUPFD_CLOEXEC, 3 + len(passed))  # above every target
    os.close(pipe_w)
    devnull = os.open(os.devnull, os.O_RDONLY) if stdin is None else os.dup(stdin)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for number, fd in enumerate(passed, start=3):
                os.dup2(fd, number)
            os.closerange(3 + len(passed), report_w)
            os.closerange(report_w + 1, 1 << 16)
            for sig in _RESTORE:
                signal.signal(sig, signal.SIG_DFL)
            if cwd is not None:
                os.chdir(cwd)
            if before_exec is not None:
                before_exec()
            if env is None:
                os.execvp(argv[0], argv)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            number = exc.errno if isinstance(exc, OSError) and exc.errno else 0
            os.write(report_w, str(number).encode())
        finally:
            os._exit(127)
    for fd in {out_w, err_w, report_w, devnull}:
        os.close(fd)
    with os.fdopen(report_r, "rb") as report:
        failure = report.read()
    if failure:
        os.waitpid(pid, 0)
        for fd in (out_r, err_r):
            if fd >= 0:
                os.close(fd)
        number = int(failure) or 0
        raise OSError(number, os.strerror(number) if number else "the command could not be started")
    return Child(pid, out_r, err_r)


def _posix_spawn(
    argv: list[str], cwd: str | None, env: dict[str, str] | None, passed: list[int], stdin: int | None, merge: bool
) -> Child:
    if cwd is not None:
        os.chdir(cwd)
    program = _resolve(argv[0], env)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe() if not merge else (-1, out_w)
    stdin_action = (
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0) if stdin is None else (os.POSIX_SPAWN_DUP2, stdin, 0)
    )
    extra = [(os.POSIX_SPAWN_DUP2, fd, number) for number, fd in enumerate(passed, start=3)]
    try:
        # The pipes' write ends and everything else of ours are close-on-exec; the
        # actions give the command exactly stdin, stdout and stderr.
        pid = os.posix_spawn(
            program,
            argv,
            os.environ if env is None else env,
            file_actions=[
                stdin_action,
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                *extra,
            ],
            setsid=True,
            setsigdef=_DEFAULTED,
            setsigmask=(),
        )
    except BaseException:
        for fd in (out_r, err_r):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in {out_w, err_w}:
            os.close(fd)
    return Child(pid, out_r, err_r)


#: Signals set back to their defaults in the command: those CPython ignores, and
#: those the supervisor catches (caught ones are reset by exec anyway).
_DEFAULTED = tuple(sorted({*_RESTORE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD}, key=int))

__all__ = ["Child", "close_on_exec_all", "spawn"]
