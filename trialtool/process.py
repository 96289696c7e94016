"""Run one command under its own supervisor and collect what happened.

trial-tool forks a supervisor per call (supervisor.py) before reserving the
call, so that the supervisor's set-up overlaps the ledger's work; then it sends
the orders and waits, in one `select` with no polling interval, for three
things: the supervisor's result line, the supervisor's exit (a pidfd on Linux),
and an interrupt descriptor (a signal wakeup pipe, from interrupts.py). An
interrupt is passed on as a stop request; the supervisor then stops the tree
and reports as usual, so an interrupted call is still recorded.
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
    #: Seconds between the deadline and the SIGTERM sent for it, and the command's exit.
    deadline_overshoot: float | None = None
    exited_after_deadline: float | None = None
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


class Launcher:
    """A supervisor forked ahead of the call, getting ready while trial-tool reserves it.

    Use as a context manager around the reservation: `run` sends the orders and
    waits for the outcome; leaving without `run` (a refused call, an error) sends
    EOF and the supervisor exits having started nothing.
    """

    def __init__(self, spool_dir: Path) -> None:
        self.spool_dir = spool_dir
        self.pid = -1
        self._result_r = self._control_w = -1
        self.spools: tuple[Spool, Spool] | None = None

    def __enter__(self) -> Launcher:
        # Caps are set when the orders come; the descriptors exist before the fork.
        self.spools = (Spool(self.spool_dir, 0), Spool(self.spool_dir, 0))
        self._result_r, result_w = os.pipe()
        control_r, self._control_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the supervisor
            os.close(self._result_r)
            os.close(self._control_w)
            supervisor.serve(self.spools, result_w, control_r, parent)
        os.close(result_w)
        os.close(control_r)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in (self._result_r, self._control_w):
            if fd >= 0:
                os.close(fd)
        self._result_r = self._control_w = -1
        if self.pid > 0:
            try:
                os.waitpid(self.pid, 0)  # after EOF on its orders it exits at once
            except ChildProcessError:
                pass
            self.pid = -1
        for spool in self.spools or ():
            spool.close()

    def run(
        self,
        argv: list[str],
        *,
        deadline: float,
        capture_cap: int,
        kill_grace: float,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        resources: Resources | None = None,
        interrupt_fd: int | None = None,
    ) -> Outcome:
        """Run `argv` until it exits, reaches `deadline` (monotonic), overflows `capture_cap`, or is interrupted."""
        assert self.spools is not None and self.pid > 0, "run() once, inside the with block"
        spec = supervisor.Spec(
            argv=argv,
            cwd=cwd,
            env=env,
            deadline=deadline,
            capture_cap=capture_cap,
            kill_grace=kill_grace,
            **(resources or Resources())._asdict(),
        )
        for spool in self.spools:
            spool.cap = capture_cap
        _write_all(self._control_w, json.dumps(spec._asdict()).encode() + b"\n")
        result = self._wait(interrupt_fd)
        if "fatal" in result:
            msg = f"the call's supervisor failed: {result['fatal']}"
            raise TrialToolError(msg)
        return _outcome(result, self.spools)

    def _wait(self, interrupt_fd: int | None) -> dict[str, Any]:
        """The supervisor's result line; an interrupt on the way becomes a stop request."""
        pid, self.pid = self.pid, -1
        watch_fd = _pidfd(pid)
        selector = selectors.DefaultSelector()
        data = bytearray()
        asked_to_stop = False
        try:
            selector.register(self._result_r, selectors.EVENT_READ)
            if watch_fd >= 0:
                selector.register(watch_fd, selectors.EVENT_READ)
            if interrupt_fd is not None:
                selector.register(interrupt_fd, selectors.EVENT_READ)
            exited = watch_fd < 0  # without a pidfd, the result pipe's EOF is the signal
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
                        _drain(fd)
                        if not asked_to_stop:
                            os.write(self._control_w, b"s")
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
            if watch_fd >= 0:
                os.close(watch_fd)
        try:
            parsed: dict[str, Any] = json.loads(bytes(data))
        except ValueError as exc:
            msg = "the call's supervisor died without reporting (killed from outside?)"
            raise TrialToolError(msg) from exc
        return parsed


def _pidfd(pid: int) -> int:
    """A descriptor readable when `pid` exits, or -1 (kernel older than 5.3, not Linux)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return -1
    try:
        return int(pidfd_open(pid))
    except OSError:
        return -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
        deadline_overshoot=result["deadline_overshoot"],
        exited_after_deadline=result["exited_after_deadline"],
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


__all__ = ["Launcher", "Outcome", "Resources"]
