"""Run one command under its own supervisor and collect what happened.

trial-tool forks a supervisor per call (supervisor.py) and waits, in one
`select` with no polling interval, for three things: the supervisor's result
line, the supervisor's exit (a pidfd on Linux), and an interrupt descriptor
(the write end of a signal wakeup pipe, from interrupts.py). An interrupt is
passed on as a stop request; the supervisor then stops the tree and reports as
usual, so an interrupted call is still recorded.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
from pathlib import Path
from typing import Any, NamedTuple

from . import supervisor
from .capture import Spool
from .errors import StorageError, TrialToolError


class Resources(NamedTuple):
    """Per-call resource limits; 0 means none."""

    max_memory: int = 0
    max_cpu_seconds: float = 0.0
    max_file_size: int = 0
    max_open_files: int = 0
    max_procs: int = 0


class Outcome(NamedTuple):
    """What running a command produced."""

    stdout: bytes
    stderr: bytes
    #: Bytes the command wrote to each stream, kept or not.
    stdout_bytes: int
    stderr_bytes: int
    stdout_sha256: str
    stderr_sha256: str
    #: exited, deadline, output_limit, interrupted, process_limit, not_found, not_executable.
    ended: str
    #: The command's exit status when it exited by itself.
    exit_code: int | None
    #: The signal that ended the command, if one did (ours or not).
    signal: int | None
    #: Seconds on the monotonic clock from start to the command's end.
    elapsed: float
    #: Why the command could not start (not_found, not_executable).
    error: str | None = None
    #: The last signal trial-tool sent the tree to stop it (SIGTERM, SIGKILL), if any.
    stop_signal: int | None = None
    #: Processes still alive after the command ended, and killed then.
    killed: int = 0
    #: Processes that could not be killed (should be empty).
    survivors: tuple[int, ...] = ()
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_rss: int = 0
    peak_rss_scope: str = "largest_process"
    oom_kills: int = 0
    process_cap_hit: bool = False
    #: Which mechanism enforced what (cgroup2, cgroup1, sweep, rlimit_as, subreaper).
    containment: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)


def _exit_watch(pid: int) -> tuple[int, bool]:
    """A descriptor readable when `pid` exits; True if it is a pidfd (else the supervisor must be waited)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            return int(pidfd_open(pid)), True
        except OSError:
            pass  # kernel older than 5.3: the result pipe's EOF tells us instead
    return -1, False


def run(
    argv: list[str],
    *,
    deadline: float,
    capture_cap: int,
    kill_grace: float,
    spool_dir: Path,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    resources: Resources | None = None,
    interrupt_fd: int | None = None,
) -> Outcome:
    """Run `argv` until it exits, reaches `deadline` (monotonic), overflows `capture_cap`, or is interrupted."""
    spools = (Spool(spool_dir, capture_cap), Spool(spool_dir, capture_cap))
    try:
        spec = supervisor.Spec(
            argv=argv,
            cwd=cwd,
            env=env,
            deadline=deadline,
            capture_cap=capture_cap,
            kill_grace=kill_grace,
            parent_pid=os.getpid(),
            **(resources or Resources())._asdict(),
        )
        result = _fork_and_wait(spec, spools, interrupt_fd)
        if "fatal" in result:
            msg = f"the call's supervisor failed: {result['fatal']}"
            raise TrialToolError(msg)
        return _outcome(result, spools)
    finally:
        for spool in spools:
            spool.close()


def _fork_and_wait(spec: supervisor.Spec, spools: tuple[Spool, Spool], interrupt_fd: int | None) -> dict[str, Any]:
    result_r, result_w = os.pipe()
    control_r, control_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the supervisor
        os.close(result_r)
        os.close(control_w)
        supervisor.run(spec, spools, result_w, control_r)
    os.close(result_w)
    os.close(control_r)
    watch_fd, is_pidfd = _exit_watch(pid)
    selector = selectors.DefaultSelector()
    data = bytearray()
    asked_to_stop = False
    try:
        selector.register(result_r, selectors.EVENT_READ)
        if watch_fd >= 0:
            selector.register(watch_fd, selectors.EVENT_READ)
        if interrupt_fd is not None:
            selector.register(interrupt_fd, selectors.EVENT_READ)
        exited = False
        result_done = False
        while not (result_done and (exited or not is_pidfd)):
            for key, _ in selector.select():
                fd = int(key.fd)
                if fd == result_r:
                    chunk = os.read(result_r, 65536)
                    if chunk:
                        data += chunk
                    else:
                        result_done = True
                        selector.unregister(result_r)
                elif fd == watch_fd:
                    exited = True
                    selector.unregister(watch_fd)
                elif fd == interrupt_fd:
                    _drain(fd)
                    if not asked_to_stop:
                        os.write(control_w, b"s")
                        asked_to_stop = True
        os.waitpid(pid, 0)
    except BaseException:
        # Whatever went wrong here, the supervisor stops the tree; wait for it so
        # nothing outlives the call, then let the error go on.
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        raise
    finally:
        selector.close()
        for fd in (result_r, control_w, watch_fd):
            if fd >= 0:
                os.close(fd)
    try:
        parsed: dict[str, Any] = json.loads(bytes(data))
    except ValueError as exc:
        msg = "the call's supervisor died without reporting (killed from outside?)"
        raise TrialToolError(msg) from exc
    return parsed


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass


def _outcome(result: dict[str, Any], spools: tuple[Spool, Spool]) -> Outcome:
    containment = result.get("containment", {})
    if result["ended"] in ("not_found", "not_executable"):
        empty = Spool.EMPTY_SHA256
        return Outcome(
            b"", b"", 0, 0, empty, empty, result["ended"], None, None, 0.0, result["error"], containment=containment
        )
    (out_total, out_sha), (err_total, err_sha) = result["streams"]
    returncode = int(result["returncode"])
    try:
        stdout, stderr = spools[0].read(out_total), spools[1].read(err_total)
    except OSError as exc:
        msg = f"cannot read the output spool: {exc}"
        raise StorageError(msg) from exc
    return Outcome(
        stdout=stdout,
        stderr=stderr,
        stdout_bytes=out_total,
        stderr_bytes=err_total,
        stdout_sha256=out_sha,
        stderr_sha256=err_sha,
        ended=result["ended"],
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        elapsed=float(result["elapsed"]),
        stop_signal=result["stop_signal"],
        killed=int(result["killed"]),
        survivors=tuple(result["survivors"]),
        cpu_user=float(result["cpu_user"]),
        cpu_system=float(result["cpu_system"]),
        peak_rss=int(result["peak_rss"]),
        peak_rss_scope=result["peak_rss_scope"],
        oom_kills=int(result["oom_kills"]),
        process_cap_hit=bool(result["process_cap_hit"]),
        containment=containment,
    )


__all__ = ["Outcome", "Resources", "run"]
