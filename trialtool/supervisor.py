"""The per-call supervisor: a forked child of trial-tool that owns the command's whole tree.

Why a separate process: to be a child subreaper (every orphan of the command
comes back to it), to call waitpid(-1) without stealing another call's child,
and to outlive trial-tool just long enough to kill the tree if trial-tool is
SIGKILLed (its parent-death signal). It is a fork, not an exec, because a new
interpreter would cost ~20 ms a call; trial-tool forks it before any threads
exist.

It runs the command in a new session with stdin from /dev/null, resource
limits and (where possible) its own cgroup; moves both output pipes into the
spools; waits in one `select` on the pipes, a pidfd for the command's exit, the
deadline, trial-tool's stop requests and its own signals; stops the tree when
a deadline, the output cap or the process cap is reached; and, whatever
happened, kills and reaps every descendant before writing one JSON result line
to trial-tool and exiting.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import selectors
import signal
import sys
import time
from typing import Any, NamedTuple, NoReturn

from . import reaper
from .capture import Spool
from .cgroups import CallGroup
from .spawn import spawn

#: exec errors that mean "found, but cannot be run" (exit 126).
_NOT_EXECUTABLE = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG}
)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
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


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return bool(_libc().prctl(option, value, 0, 0, 0) == 0)


_LIBC: Any = None


def _libc() -> Any:
    """The C library, loaded once per process (the fork server loads it for all its supervisors)."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def preload() -> None:
    """Import and load now what every supervisor needs, for a process that forks many (forkserver.py)."""
    import hashlib  # noqa: F401  (the spools hash what they keep)

    if sys.platform.startswith("linux"):
        _libc()


class _Signals:
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


class _Ready(NamedTuple):
    """A supervisor set up and waiting for a call."""

    signals: _Signals
    subreaper: bool
    group: CallGroup


def _get_ready(parent_pid: int) -> _Ready:
    """Signals, subreaper, death signal and the call's cgroup: everything that needs no orders."""
    signals = _Signals(parent_pid)
    subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the death signal was armed; nothing was started
    # TRIALTOOL_CGROUPS=off forces the fallbacks (subreaper sweep, rlimits): for tests, and
    # for hosts where touching cgroups is unwelcome.
    use_cgroups = sys.platform.startswith("linux") and os.environ.get("TRIALTOOL_CGROUPS") != "off"
    group = CallGroup.prepare() if use_cgroups else CallGroup()
    # Loaded now, while trial-tool reserves the call, rather than after the orders.
    preload()
    return _Ready(signals, subreaper, group)


def serve(spool_fds: tuple[int, int], result_fd: int, control_fd: int, parent_pid: int) -> NoReturn:
    """The supervisor's whole life; it reports on `result_fd` and exits, never returns.

    Forked before the call is reserved, it gets ready (subreaper, death signal,
    cgroup) while trial-tool takes the ledger lock, then waits for its orders:
    one JSON line on `control_fd` with the Spec, or EOF if the call was refused.
    Any later byte on `control_fd` asks it to stop the command.
    """
    try:
        ready = _get_ready(parent_pid)
    except BaseException as exc:
        _report_and_exit(result_fd, {"fatal": f"{type(exc).__name__}: {exc}"}, 1)
    _serve_call(spool_fds, result_fd, control_fd, ready)


def serve_spare(call_socket: int, parent_pid: int) -> NoReturn:
    """A supervisor made ready ahead of any call (forkserver.py), then given one.

    Joining a cgroup costs 10-20 ms on some kernels (cgroup v1 waits for an RCU
    grace period), so the fork server keeps one supervisor ready at all times.
    It waits for the call's four descriptors on `call_socket`; EOF there, or its
    parent's death, ends it with nothing started.
    """
    import socket

    try:
        ready = _get_ready(parent_pid)
        sock = socket.socket(fileno=call_socket)
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ)
            selector.register(ready.signals.read_fd, selectors.EVENT_READ)
            fds: list[int] = []
            while not fds:
                for key, _ in selector.select():
                    if key.fd == ready.signals.read_fd:
                        ready.signals.drain()
                        if ready.signals.orphaned or ready.signals.stop:
                            raise SystemExit
                        continue
                    _, fds, _, _ = socket.recv_fds(sock, 16, 4)
                    if not fds:
                        raise SystemExit  # the fork server is shutting down
        sock.close()
    except BaseException:
        try:
            ready.group.remove()
        except BaseException:
            pass
        os._exit(0)
    out, err, result_fd, control_fd = fds
    _serve_call((out, err), result_fd, control_fd, ready)


def _serve_call(spool_fds: tuple[int, int], result_fd: int, control_fd: int, ready: _Ready) -> NoReturn:
    code = 1
    try:
        orders = _read_orders(control_fd, ready.signals)
        if orders is None:
            ready.group.remove()
            os._exit(0)  # the call was refused or failed before it started
        spec = Spec(**orders)
        spools = (Spool(spool_fds[0], spec.capture_cap), Spool(spool_fds[1], spec.capture_cap))
        result = _supervise(spec, spools, control_fd, ready.signals, ready.subreaper, ready.group)
        code = 0
    except BaseException as exc:
        # The one broad except: whatever failed, trial-tool must hear of it, and this
        # forked copy of trial-tool must never return into trial-tool's own code.
        result = {"fatal": f"{type(exc).__name__}: {exc}"}
        try:
            reaper.kill_all()
        except BaseException:
            pass
    _report_and_exit(result_fd, result, code)


def _report_and_exit(result_fd: int, result: dict[str, Any], code: int) -> NoReturn:
    try:
        view = memoryview(json.dumps(result).encode() + b"\n")
        while view:
            view = view[os.write(result_fd, view) :]
        os.close(result_fd)  # the call is over: trial-tool need not wait for this process to go
    finally:
        os._exit(code)


def _read_orders(control_fd: int, signals: _Signals) -> dict[str, Any] | None:
    """The Spec sent by trial-tool, or None on EOF or if trial-tool died meanwhile.

    A stop request may follow the orders in the same read (trial-tool interrupted
    at once): it is kept as `signals.stop`, so the command is stopped as it starts.
    """
    data = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(control_fd, selectors.EVENT_READ)
        selector.register(signals.read_fd, selectors.EVENT_READ)
        while b"\n" not in data:
            for key, _ in selector.select():
                if key.fd == signals.read_fd:
                    signals.drain()
                    if signals.orphaned or signals.stop:
                        return None  # trial-tool died, or gave up on the call before sending it
                    continue
                chunk = os.read(control_fd, 65536)
                if not chunk:
                    return None
                data += chunk
    line, _, after = bytes(data).partition(b"\n")
    if after:
        signals.stop = True
    orders: dict[str, Any] = json.loads(line)
    return orders


def _supervise(
    spec: Spec,
    spools: tuple[Spool, Spool],
    control_fd: int,
    signals: _Signals,
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
    signals: _Signals,
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


__all__ = ["Spec", "serve", "serve_spare"]
