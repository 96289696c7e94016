"""Run one command to its end inside the supervisor: spawn, watch, stop at a limit, reap the whole tree.

The watch is one `select` on the command's two output pipes, a pidfd for its
exit, the deadline, trial-tool's stop requests (the control pipe) and the
supervisor's own signals; there is no polling interval, except for the
fallback process cap where no pids cgroup could be made. When the command
ends, for whatever reason, every descendant is killed and reaped before the
result is returned (reaper.py).
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import signal
import time
from typing import Any, NamedTuple

from . import reaper
from .capture import Spool
from .cgroups import CallGroup
from .spawn import spawn

#: exec errors that mean "found, but cannot be run" (exit 126).
_NOT_EXECUTABLE = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG}
)

#: How often the fallback process cap counts the tree, where no pids cgroup can be made.
_SWEEP_INTERVAL = 0.05


class Spec(NamedTuple):
    """Everything the supervisor needs to run one command."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    #: time.monotonic() value at which the command is stopped (the clock is system wide).
    deadline: float
    capture_cap: int
    kill_grace: float
    max_memory: int
    max_cpu_seconds: float
    max_file_size: int
    max_open_files: int
    max_procs: int


class Signals:
    """Signals to the supervisor, turned into flags and a readable descriptor."""

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

    def _on_term(self, *_: Any) -> None:
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


def _limits_for_exec(spec: Spec, group: CallGroup) -> list[tuple[int, tuple[int, int]]]:
    """The command's resource limits; no core dumps is set on the supervisor itself, and inherited."""
    limits = []
    if spec.max_cpu_seconds:
        # The soft limit sends SIGXCPU; one second later the hard limit sends SIGKILL.
        soft = max(1, int(spec.max_cpu_seconds + 0.999))
        limits.append((resource.RLIMIT_CPU, (soft, soft + 1)))
    if spec.max_file_size:
        limits.append((resource.RLIMIT_FSIZE, (spec.max_file_size, spec.max_file_size)))
    if spec.max_open_files:
        limits.append((resource.RLIMIT_NOFILE, (spec.max_open_files, spec.max_open_files)))
    if spec.max_memory and group.memory is None:
        # No memory cgroup: a per-process address-space cap is the fallback.
        limits.append((resource.RLIMIT_AS, (spec.max_memory, spec.max_memory)))
    return limits


def supervise(
    spec: Spec,
    spools: tuple[Spool, Spool],
    control_fd: int,
    signals: Signals,
    subreaper: bool,
    group: CallGroup,
) -> dict[str, Any]:
    group.configure(spec.max_procs, spec.max_memory)
    try:
        return _run_command(spec, spools, control_fd, signals, group, subreaper)
    finally:
        group.remove()


def _run_command(
    spec: Spec,
    spools: tuple[Spool, Spool],
    control_fd: int,
    signals: Signals,
    group: CallGroup,
    subreaper: bool,
) -> dict[str, Any]:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    rlimits = _limits_for_exec(spec, group)

    def before_exec() -> None:
        group.join()
        for which, value in rlimits:
            resource.setrlimit(which, value)

    started = time.monotonic()
    described = group.describe(spec.max_procs, spec.max_memory)
    base: dict[str, Any] = {"containment": {**described, "subreaper": subreaper}}
    try:
        # Nothing to do between fork and exec (the usual case): the faster posix_spawn.
        plain = not rlimits and not group.child_must_join()
        child = spawn(spec.argv, cwd=spec.cwd, env=spec.env, before_exec=None if plain else before_exec)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return {**base, "ended": "not_found", "error": exc.strerror}
        if exc.errno in _NOT_EXECUTABLE:
            return {**base, "ended": "not_executable", "error": exc.strerror}
        raise
    pgid = child.pid
    pipes = {child.stdout: spools[0], child.stderr: spools[1]}
    watch_fd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else -1
    selector = selectors.DefaultSelector()
    for fd in pipes:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    for fd in (watch_fd, control_fd, signals.read_fd):
        if fd >= 0:
            selector.register(fd, selectors.EVENT_READ)
    sweep_cap = spec.max_procs if group.pids is None else 0
    ended: str | None = None
    stop_signal: int | None = None
    kill_at: float | None = None
    exited_at: float | None = None
    next_sweep = started + _SWEEP_INTERVAL
    overshoot: float | None = None

    def stop(reason: str, grace: float) -> None:
        nonlocal ended, kill_at, stop_signal, overshoot
        if ended is None:
            ended = reason
            if reason == "deadline":
                overshoot = time.monotonic() - spec.deadline
        if kill_at is None:
            _signal_tree(pgid, signal.SIGTERM)
            stop_signal = signal.SIGTERM
            kill_at = time.monotonic() + grace

    try:
        while exited_at is None:
            now = time.monotonic()
            if signals.orphaned:
                _kill_tree(pgid, group)
                reaper.kill_all()
                os._exit(1)  # trial-tool is gone: there is no one to report to
            if signals.stop:
                stop("interrupted", spec.kill_grace)
            if now >= spec.deadline:
                stop("deadline", spec.kill_grace)
            if sweep_cap and now >= next_sweep:
                next_sweep = now + _SWEEP_INTERVAL
                if len(reaper.living_descendants()) > sweep_cap:
                    stop("process_limit", 0.0)
            if kill_at is not None and now >= kill_at:
                _kill_tree(pgid, group)
                stop_signal = signal.SIGKILL
                kill_at = float("inf")
            if watch_fd < 0 and child.poll() is not None:
                exited_at = now  # no pidfd (not Linux): the short wake-ups below notice the exit
                break
            wakes = [spec.deadline if kill_at is None else kill_at]
            if sweep_cap:
                wakes.append(next_sweep)
            if watch_fd < 0:
                wakes.append(now + 0.01)
            wake = min(wakes)
            timeout = None if wake == float("inf") else max(0.0, wake - now)
            for key, _ in selector.select(timeout):
                fd = int(key.fd)
                if fd == watch_fd:
                    exited_at = time.monotonic()
                elif fd == control_fd:
                    if not os.read(control_fd, 64):
                        selector.unregister(control_fd)  # trial-tool closed it: it is going away
                    stop("interrupted", spec.kill_grace)
                elif fd == signals.read_fd:
                    signals.drain()
                elif not pipes[fd].read_once(fd, selector):
                    stop("output_limit", spec.kill_grace)
        returncode = child.wait()
        # The command is gone. End what it left, then take what was already written.
        if subreaper and reaper.no_children():
            # Every orphan of the tree is re-parented to us: with no child left at all,
            # nothing of the tree is (the usual case, and three /proc walks saved).
            killed, survivors = 0, list[int]()
        else:
            known = reaper.living_descendants()
            _kill_tree(pgid, group)
            killed, survivors = reaper.kill_all(known)
        for fd, spool in pipes.items():
            if fd in selector.get_map():
                spool.drain(fd, selector)
    finally:
        selector.close()
        if watch_fd >= 0:
            os.close(watch_fd)
        os.close(child.stdout)
        os.close(child.stderr)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = group.memory_peak()
    return {
        **base,
        "ended": ended or "exited",
        "returncode": returncode,
        "elapsed": exited_at - started,
        "stop_signal": stop_signal,
        "deadline_overshoot": overshoot,
        "exited_after_deadline": exited_at - spec.deadline if ended == "deadline" else None,
        "killed": killed,
        "survivors": survivors,
        "oom_kills": group.oom_kills(),
        "process_cap_hit": group.process_cap_hit() or ended == "process_limit",
        "cpu_user": usage.ru_utime,
        "cpu_system": usage.ru_stime,
        # ru_maxrss is in KiB on Linux: the largest single process. A memory cgroup gives the tree's peak.
        "peak_rss": peak if peak is not None else usage.ru_maxrss * 1024,
        "peak_rss_scope": "tree" if peak is not None else "largest_process",
        "streams": [[spool.total, spool.sha256()] for spool in spools],
    }


def _signal_tree(pgid: int, sig: int) -> None:
    """Signal the command's group and every other descendant (those that left the group)."""
    try:
        if sig == signal.SIGTERM:
            os.killpg(pgid, signal.SIGCONT)
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    reaper.signal_all(sig)


def _kill_tree(pgid: int, group: CallGroup) -> None:
    group.kill()
    _signal_tree(pgid, signal.SIGKILL)


__all__ = ["Signals", "Spec", "supervise"]
