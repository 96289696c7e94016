"""Run one command to its end inside the supervisor: spawn, watch, stop at a limit, reap the whole tree.

The watch is one `select` on the command's two output pipes, a pidfd for its
exit, the deadline, trial-tool's stop requests (the control pipe) and the
supervisor's own signals; there is no polling interval, except for the
fallback process cap where no pids cgroup could be made. When the command
ends, for whatever reason, every descendant is killed and reaped before the
result is returned (_reaper.py).
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import signal
import time

from .. import sandbox
from ..errors import SandboxError
from ..sandbox import Backend
from . import _reaper as reaper
from ._capture import Spool
from ._cgroups import CallGroup
from ._interrupts import SupervisorSignals as Signals
from ._orders import Report, Spec
from ._rlimits import for_exec, take_callers
from ._spawn import Child, spawn

#: exec errors that mean "found, but cannot be run" (exit 126).
_NOT_EXECUTABLE = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG}
)

#: How often the fallback process cap counts the tree, where no pids cgroup can be made.
_SWEEP_INTERVAL = 0.05


def supervise(
    spec: Spec,
    spools: tuple[Spool, Spool],
    control_fd: int,
    signals: Signals,
    subreaper: bool,
    group: CallGroup,
) -> Report:
    """Run the command of `spec` to its end; the report the supervisor sends."""
    limits = spec.limits
    backend = sandbox.backend(spec.backend)
    if backend.LIMITS_INSIDE:  # a container's: the client here is held to none of them
        limits = limits._replace(max_procs=0, max_memory=0, max_cpu_seconds=0.0, max_file_size=0, max_open_files=0)
    # The backend's own processes (bwrap's monitor and its pid namespace's init) are not the command's.
    extra_procs = backend.OWN_PROCESSES if limits.max_procs else 0
    group.configure(limits.max_procs + extra_procs, limits.max_memory)
    status_r = status_w = feed_w = -1
    feed_r: int | None = None
    take_callers(spec)
    network = None  # network "allow": the command's own namespace, and the proxy that is its one way out
    if spec.egress is not None:
        from ..sandbox.network import CallNetwork  # its socket module is no other call's cost

        network = CallNetwork(spec.egress, spec.started, spec.egress_socket)
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        rlimits = for_exec(limits, group, backend)

        def before_exec() -> None:
            group.join()
            for which, value in rlimits:
                resource.setrlimit(which, value)

        containment = {**group.describe(limits.max_procs, limits.max_memory), "subreaper": subreaper}
        if backend.STATUS_FD is not None:
            status_r, status_w = os.pipe()
        if spec.stdin is not None:
            feed_r, feed_w = os.pipe()
        try:
            argv, bind_fds = backend.descriptors(spec.argv, spec.binds)
        except SandboxError as exc:
            return Report(fatal=exc.message)
        try:
            # Nothing to do between fork and exec (the usual case): the faster posix_spawn.
            plain = not rlimits and not group.child_must_join()
            child = spawn(
                argv,
                cwd=None if backend.SETS_DIRECTORY else spec.cwd,  # bwrap changes to it inside (--chdir)
                env=spec.env,
                before_exec=None if plain else before_exec,
                # bwrap's status, the pinned paths it binds, and (network "allow") the descriptor it waits on.
                passed=[]
                if status_w < 0
                else [status_w, *bind_fds, *([network.block_r] if network and network.block_r >= 0 else [])],
                stdin=feed_r,
                merge=spec.merge,
            )
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return Report("not_found", error=exc.strerror, containment=containment)
            if exc.errno in _NOT_EXECUTABLE:
                return Report("not_executable", error=exc.strerror, containment=containment)
            raise
        finally:
            if status_w >= 0:
                os.close(status_w)
            if feed_r is not None:
                os.close(feed_r)
            for fd in bind_fds:
                os.close(fd)
        try:
            status = b"" if network is None else network.start(status_r, spec.deadline)
        except OSError as exc:
            reaper.kill_all()  # bwrap still waits on us: it must not go on without the proxy
            return Report(fatal=f"the sandbox's network could not be set up: {exc.strerror or exc}")
        watch = _Watch(spec, child, spools, control_fd, signals, group, spec.started, extra_procs, feed_w)
        feed_w = -1  # the watch closes it
        report = watch.run(subreaper)._replace(containment=containment)
        if network is not None:
            report = report._replace(network=network.finish())
        if status_r >= 0:
            # bwrap says why a command never ran on its stderr: the one stream, when merged.
            report = _unwrapped(backend, report, status_r, spools[0] if spec.merge else spools[1], status)
        return report
    finally:
        if status_r >= 0:
            os.close(status_r)
        if feed_w >= 0:
            os.close(feed_w)
        if network is not None:
            network.close()
        group.remove()


def _unwrapped(backend: Backend, report: Report, status_r: int, stderr: Spool, status: bytes) -> Report:
    """A wrapped call's report in the command's terms: its own exit code, or why it never ran.

    bwrap states the command's exit code once the command has ended (a signal
    comes back as 128 + N, as a shell reports it). Without that statement and
    with bwrap's own exit status 1, the command never ran: bwrap said why on
    stderr, which the command had not yet owned. `status`: what was read of it already.
    """
    read = bytearray(status)
    while chunk := os.read(status_r, 65536):
        read += chunk
    code = backend.exit_code(bytes(read), report.returncode)
    if code is not None:
        return report._replace(returncode=code)
    if report.ended != "exited":
        return report  # stopped by us: as it is
    failed = backend.failure(stderr.head(4096), report.returncode)
    if failed is None:
        return report  # the backend itself killed (out of memory): as it is
    kind, reason = failed
    if kind == "sandbox":
        return Report(fatal=f"the sandbox could not be set up: {reason}")
    return Report(kind, error=reason, containment=report.containment)


class _Watch:
    """One command from its spawn to its end: the select loop, the stops, the sweep, the report."""

    def __init__(
        self,
        spec: Spec,
        child: Child,
        spools: tuple[Spool, Spool],
        control_fd: int,
        signals: Signals,
        group: CallGroup,
        started: float,
        extra_procs: int = 0,
        feed_fd: int = -1,
    ) -> None:
        self.spec, self.child, self.spools, self.group = spec, child, spools, group
        self.backend = sandbox.backend(spec.backend)
        self.control_fd, self.signals, self.started = control_fd, signals, started
        self.pipes = {child.stdout: spools[0]}
        if child.stderr >= 0:
            self.pipes[child.stderr] = spools[1]
        self.watch_fd = os.pidfd_open(child.pid) if hasattr(os, "pidfd_open") else -1
        self.selector = selectors.DefaultSelector()
        for fd in self.pipes:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)
        for fd in (self.watch_fd, control_fd, signals.read_fd):
            if fd >= 0:
                self.selector.register(fd, selectors.EVENT_READ)
        #: The command's stdin, written as it reads, never blocking the watch.
        self.feed_fd = feed_fd
        self.feed = memoryview(spec.stdin or b"")
        if feed_fd >= 0:
            os.set_blocking(feed_fd, False)
            if self.feed:
                self.selector.register(feed_fd, selectors.EVENT_WRITE)
            else:
                self._end_feed()
        #: The fallback process cap (no pids cgroup), counted every _SWEEP_INTERVAL.
        self.sweep_cap = (
            spec.limits.max_procs + extra_procs if group.pids is None and not self.backend.LIMITS_INSIDE else 0
        )
        #: Where the command's processes are when not here (a container's), signalled there.
        self.inside = self.backend.stops(spec.argv[0], spec.place, spec.env)
        self.next_sweep = started + _SWEEP_INTERVAL
        self.ended: str | None = None
        self.stop_signal: int | None = None
        self.kill_at: float | None = None
        self.exited_at: float | None = None
        self.overshoot: float | None = None

    def stop(self, reason: str, grace: float) -> None:
        """Stop the tree (SIGTERM now, SIGKILL after `grace`); the first reason is the one reported."""
        if self.ended is None:
            self.ended = reason
            if reason == "deadline":
                self.overshoot = time.monotonic() - self.spec.deadline
        if self.kill_at is None:
            # A backend's own processes (bwrap's monitor and init) would end the sandbox at once
            # (SIGKILL to all in it), leaving the command no grace: the command's processes only.
            if self.inside is not None:
                self.inside.signal("TERM")
            else:
                reaper.signal_tree(
                    self.child.pid, signal.SIGTERM, spare=self.backend.own(self.child.pid, reaper.children) or None
                )
            self.stop_signal = signal.SIGTERM
            self.kill_at = time.monotonic() + grace

    def _end_feed(self) -> None:
        if self.feed_fd >= 0:
            if self.feed_fd in self.selector.get_map():
                self.selector.unregister(self.feed_fd)
            os.close(self.feed_fd)
            self.feed_fd = -1

    def _write_feed(self) -> None:
        """Write what the pipe takes now; done, or the command closed its end: EOF for it."""
        try:
            written = os.write(self.feed_fd, self.feed[: 1 << 16])
        except BlockingIOError:
            return
        except OSError:
            self._end_feed()  # EPIPE: the command will not read the rest
            return
        self.feed = self.feed[written:]
        if not self.feed:
            self._end_feed()

    def kill(self) -> None:
        if self.inside is not None:
            self.inside.signal("KILL")
        self.group.kill()
        reaper.signal_tree(self.child.pid, signal.SIGKILL)

    def run(self, subreaper: bool) -> Report:
        try:
            while self.exited_at is None:
                self._step()
            returncode = self.child.wait()
            if self.inside is not None:
                self.inside.finish()  # a stopped call's last processes in the container, before the client's
            killed, survivors = self._sweep(subreaper)
            # The command is gone: take what was already written to its pipes.
            for fd, spool in self.pipes.items():
                if fd in self.selector.get_map():
                    spool.drain(fd, self.selector)
        finally:
            self._end_feed()
            self.selector.close()
            if self.watch_fd >= 0:
                os.close(self.watch_fd)
            os.close(self.child.stdout)
            if self.child.stderr >= 0:
                os.close(self.child.stderr)
        return self._report(returncode, killed, survivors)

    def _step(self) -> None:
        """Act on the deadline, a stop or the sweep, then wait for the next event."""
        now = time.monotonic()
        limits = self.spec.limits
        if self.signals.orphaned:
            self.kill()
            reaper.kill_all()
            os._exit(1)  # trial-tool is gone: there is no one to report to
        if self.signals.stop:
            self.stop("interrupted", limits.kill_grace)
        if now >= self.spec.deadline:
            self.stop("deadline", limits.kill_grace)
        if self.sweep_cap and now >= self.next_sweep:
            self.next_sweep = now + _SWEEP_INTERVAL
            if len(reaper.living_descendants()) > self.sweep_cap:
                self.stop("process_limit", 0.0)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill()
            self.stop_signal = signal.SIGKILL
            self.kill_at = float("inf")
        if self.watch_fd < 0 and self.child.poll() is not None:
            self.exited_at = now  # no pidfd (not Linux): the short wake-ups below notice the exit
            return
        wakes = [self.spec.deadline if self.kill_at is None else self.kill_at]
        if self.sweep_cap:
            wakes.append(self.next_sweep)
        if self.watch_fd < 0:
            wakes.append(now + 0.01)
        wake = min(wakes)
        for key, _ in self.selector.select(None if wake == float("inf") else max(0.0, wake - now)):
            fd = int(key.fd)
            if fd == self.watch_fd:
                self.exited_at = time.monotonic()
            elif fd == self.feed_fd:
                self._write_feed()
            elif fd == self.control_fd:
                if not os.read(fd, 64):
                    self.selector.unregister(fd)  # trial-tool closed it: it is going away
                self.stop("interrupted", limits.kill_grace)
            elif fd == self.signals.read_fd:
                self.signals.drain()
            elif not self.pipes[fd].read_once(fd, self.selector):
                self.stop("output_limit", limits.kill_grace)

    def _sweep(self, subreaper: bool) -> tuple[int, list[int]]:
        """End what the command left running; (how many were killed, any that could not be)."""
        if subreaper and reaper.no_children():
            # Every orphan of the tree is re-parented to us: with no child left at all,
            # nothing of the tree is (the usual case, and three /proc walks saved).
            return 0, []
        known = reaper.living_descendants()
        self.kill()
        return reaper.kill_all(known)

    def _report(self, returncode: int, killed: int, survivors: list[int]) -> Report:
        assert self.exited_at is not None
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak = self.group.memory_peak()
        return Report(
            ended=self.ended or "exited",
            returncode=returncode,
            elapsed=self.exited_at - self.started,
            stop_signal=self.stop_signal,
            deadline_overshoot=self.overshoot,
            exited_after_deadline=self.exited_at - self.spec.deadline if self.ended == "deadline" else None,
            killed=killed,
            survivors=tuple(survivors),
            oom_kills=self.group.oom_kills(),
            process_cap_hit=self.group.process_cap_hit() or self.ended == "process_limit",
            cpu_user=usage.ru_utime,
            cpu_system=usage.ru_stime,
            # ru_maxrss is in KiB on Linux: the largest single process. A memory cgroup gives the tree's peak.
            peak_rss=peak if peak is not None else usage.ru_maxrss * 1024,
            peak_rss_scope="tree" if peak is not None else "largest_process",
            streams=((self.spools[0].total, self.spools[0].sha256()), (self.spools[1].total, self.spools[1].sha256())),
        )


__all__ = ["supervise"]
