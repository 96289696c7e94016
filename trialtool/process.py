"""Run one command in its own session, capture its streams within their caps, stop it on time.

The wait is event driven, with no polling interval: one `select` over the two
output pipes and a descriptor that becomes readable when the command exits (a
pidfd on Linux ≥ 5.3; elsewhere a waiter thread's pipe), with the deadline as
its timeout. So the command is signalled at its deadline to within scheduling
noise, and the call returns as soon as the command exits, even while a
background child still holds its stdout open.

Stopping: SIGCONT then SIGTERM to the process group (a stopped process cannot
act on SIGTERM), `kill_grace` seconds, then SIGKILL. After the command ends,
for whatever reason, what is left of its process group gets SIGKILL.
"""

from __future__ import annotations

import errno
import hashlib
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

from .capture import Spool

_READ_SIZE = 65536


class Outcome(NamedTuple):
    """What running a command produced."""

    stdout: bytes
    stderr: bytes
    #: Bytes the command wrote to each stream, kept or not.
    stdout_bytes: int
    stderr_bytes: int
    stdout_sha256: str
    stderr_sha256: str
    #: How the command ended: exited, deadline, output_limit, not_found, not_executable.
    ended: str
    #: The command's exit status when it exited by itself.
    exit_code: int | None
    #: The signal that ended the command, if one did (ours or not).
    signal: int | None
    #: Seconds on the monotonic clock from start to the command's end.
    elapsed: float
    #: Why the command could not start (not_found, not_executable).
    error: str | None = None


def _exit_watch(process: subprocess.Popen[bytes]) -> tuple[int, object]:
    """A descriptor that becomes readable when `process` exits, and what keeps it alive."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd: int = pidfd_open(process.pid)
            return fd, None
        except OSError:
            pass  # kernel older than 5.3, or seccomp: use the thread below
    import threading

    read_end, write_end = os.pipe()

    def wait() -> None:
        process.wait()
        os.close(write_end)

    thread = threading.Thread(target=wait, name=f"trialtool-wait-{process.pid}", daemon=True)
    thread.start()
    return read_end, thread


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already empty
    except PermissionError:
        pass  # a member changed credentials (setuid): nothing we can do from here


def _not_started(ended: str, exc: OSError, started: float) -> Outcome:
    empty = hashlib.sha256().hexdigest()
    elapsed = time.monotonic() - started
    return Outcome(b"", b"", 0, 0, empty, empty, ended, None, None, elapsed, exc.strerror or str(exc))


def run(
    argv: list[str],
    *,
    deadline: float,
    capture_cap: int,
    kill_grace: float,
    spool_dir: Path,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Run `argv` until it exits, reaches `deadline` (monotonic) or overflows `capture_cap`."""
    spools = {1: Spool(spool_dir, capture_cap), 2: Spool(spool_dir, capture_cap)}
    started = time.monotonic()
    try:
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                cwd=cwd,
                env=env,
            )
        except FileNotFoundError as exc:
            return _not_started("not_found", exc, started)
        except PermissionError as exc:
            return _not_started("not_executable", exc, started)
        except OSError as exc:
            if exc.errno in (errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.EACCES):
                return _not_started("not_executable", exc, started)
            raise
        return _supervise(process, spools, deadline, kill_grace, started)
    finally:
        for spool in spools.values():
            spool.close()


def _supervise(
    process: subprocess.Popen[bytes],
    spools: dict[int, Spool],
    deadline: float,
    kill_grace: float,
    started: float,
) -> Outcome:
    assert process.stdout is not None and process.stderr is not None
    pgid = process.pid  # start_new_session: the command leads its own group
    pipes = {process.stdout.fileno(): spools[1], process.stderr.fileno(): spools[2]}
    watch_fd, _waiter = _exit_watch(process)
    selector = selectors.DefaultSelector()
    try:
        for fd in pipes:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        selector.register(watch_fd, selectors.EVENT_READ)
        ended: str | None = None
        kill_at: float | None = None
        exited_at: float | None = None
        while exited_at is None:
            now = time.monotonic()
            if ended is None and now >= deadline:
                ended = "deadline"
            if ended is not None and kill_at is None:
                _signal_group(pgid, signal.SIGCONT)
                _signal_group(pgid, signal.SIGTERM)
                kill_at = now + kill_grace
            if kill_at is not None and now >= kill_at:
                _signal_group(pgid, signal.SIGKILL)
                kill_at = float("inf")
            wake = kill_at if kill_at is not None else deadline
            # After SIGKILL there is nothing left to time: wait for the exit itself.
            timeout = None if wake == float("inf") else max(0.0, wake - now)
            for key, _ in selector.select(timeout):
                fd = int(key.fd)
                if fd == watch_fd:
                    exited_at = time.monotonic()
                elif not _read_once(fd, pipes[fd], selector) and ended is None:
                    ended = "output_limit"
        # Prompt return: end what is left of the group, then take what its
        # members had already written (a pipe keeps its data after its writers die).
        _signal_group(pgid, signal.SIGKILL)
        for fd, spool in pipes.items():
            if fd in selector.get_map():
                _drain(fd, spool, selector)
        returncode = process.wait()
    except BaseException:
        # Whatever went wrong here, the command must not outlive the call.
        _signal_group(pgid, signal.SIGKILL)
        process.wait()
        raise
    finally:
        selector.close()
        os.close(watch_fd)
        process.stdout.close()
        process.stderr.close()
    out, err = spools[1], spools[2]
    return Outcome(
        stdout=out.read(),
        stderr=err.read(),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        stdout_sha256=out.sha256(),
        stderr_sha256=err.sha256(),
        ended=ended or "exited",
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        elapsed=exited_at - started,
    )


def _read_once(fd: int, spool: Spool, selector: selectors.BaseSelector) -> bool:
    """Move one read's worth of `fd` into `spool`; False once the spool is over its cap.

    One read per wake-up, so a writer faster than us cannot keep us from the deadline.
    """
    try:
        data = os.read(fd, _READ_SIZE)
    except BlockingIOError:
        return not spool.full
    if data:
        spool.feed(data)
    else:
        selector.unregister(fd)
    return not spool.full


def _drain(fd: int, spool: Spool, selector: selectors.BaseSelector) -> None:
    """Read what `fd` holds until it is empty or closed, or the spool is over its cap.

    Bounded even if an escaped process keeps writing: it stops at the cap.
    """
    while fd in selector.get_map() and not spool.full:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        if data:
            spool.feed(data)
        else:
            selector.unregister(fd)


__all__ = ["Outcome", "run"]
