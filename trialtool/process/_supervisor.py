"""The per-call supervisor: a forked child of trial-tool that owns the command's whole tree.

Why a separate process: to be a child subreaper (every orphan of the command
comes back to it), to call waitpid(-1) without stealing another call's child,
and to outlive trial-tool just long enough to kill the tree if trial-tool is
SIGKILLed (its parent-death signal). It is a fork, not an exec, because a new
interpreter would cost an interpreter's start a call: the CLI forks it before any threads
exist; the API gets it from its fork server (_forkserver.py), which keeps one
ready (`run_spare`).

This module is its life around the call: get ready (signals, subreaper, death
signal, cgroup), read the orders, have _running.py run the command, and write
one JSON result line to trial-tool before exiting, whatever happened.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
from typing import NamedTuple, NoReturn

from ..osio import make_undumpable, prctl, write_all
from . import _reaper as reaper
from ._capture import Spool
from ._cgroups import CallGroup
from ._interrupts import SupervisorSignals as Signals
from ._orders import Report, Spec, decode, encode_report, input_size
from ._running import supervise

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def preload() -> None:
    """Import and load now what every supervisor needs, for a process that forks many (_forkserver.py)."""
    import hashlib  # noqa: F401  (the spools hash what they keep)

    # Network "allow": its namespace and proxy, some 9 ms of imports that each call would pay again.
    from ..sandbox.network import CallNetwork, Proxy  # noqa: F401

    prctl(0, 0, load_only=True)


class _Ready(NamedTuple):
    """A supervisor set up and waiting for a call."""

    signals: Signals
    subreaper: bool
    group: CallGroup


def _get_ready(parent_pid: int) -> _Ready:
    """Signals, subreaper, death signal and the call's cgroup: everything that needs no orders."""
    signals = Signals(parent_pid)
    # The caller's stdin, stdout and stderr stay the caller's: a command that opens
    # /proc/PPID/fd/1 finds /dev/null here (and, non-dumpable, not even that).
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    make_undumpable()
    subreaper = prctl(_PR_SET_CHILD_SUBREAPER, 1)
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the death signal was armed; nothing was started
    # TRIALTOOL_CGROUPS=off forces the fallbacks (subreaper sweep, rlimits): for tests, and
    # for hosts where touching cgroups is unwelcome.
    use_cgroups = sys.platform.startswith("linux") and os.environ.get("TRIALTOOL_CGROUPS") != "off"
    group = CallGroup.prepare() if use_cgroups else CallGroup()
    # Loaded now, while trial-tool reserves the call, rather than after the orders.
    preload()
    return _Ready(signals, subreaper, group)


def run_call(spool_fds: tuple[int, int], result_fd: int, control_fd: int, parent_pid: int) -> NoReturn:
    """The supervisor's whole life; it reports on `result_fd` and exits, never returns.

    Forked before the call is reserved, it gets ready (subreaper, death signal,
    cgroup) while trial-tool takes the ledger lock, then waits for its orders:
    one JSON line on `control_fd` with the Spec, or EOF if the call was refused.
    Any later byte on `control_fd` asks it to stop the command.
    """
    try:
        ready = _get_ready(parent_pid)
    except BaseException as exc:
        _report_and_exit(result_fd, Report(fatal=f"{type(exc).__name__}: {exc}"), 1)
    _serve_call(spool_fds, result_fd, control_fd, ready)


def run_spare(call_socket: int, parent_pid: int) -> NoReturn:
    """A supervisor made ready ahead of any call (_forkserver.py), then given one.

    Joining a cgroup is slow on some kernels (cgroup v1 waits for an RCU
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
        spec = _read_orders(control_fd, ready.signals)
        if spec is None:
            ready.group.remove()
            os._exit(0)  # the call was refused or failed before it started
        cap = spec.limits.max_capture_bytes
        spools = (Spool(spool_fds[0], cap), Spool(spool_fds[1], cap))
        result = supervise(spec, spools, control_fd, ready.signals, ready.subreaper, ready.group)
        code = 0
    except BaseException as exc:
        # The one broad except: whatever failed, trial-tool must hear of it, and this
        # forked copy of trial-tool must never return into trial-tool's own code.
        result = Report(fatal=f"{type(exc).__name__}: {exc}")
        try:
            reaper.kill_all()
        except BaseException:
            pass
    _report_and_exit(result_fd, result, code)


def _report_and_exit(result_fd: int, result: Report, code: int) -> NoReturn:
    try:
        write_all(result_fd, encode_report(result))
        os.close(result_fd)  # the call is over: trial-tool need not wait for this process to go
    finally:
        os._exit(code)


def _read_orders(control_fd: int, signals: Signals) -> Spec | None:
    """The Spec sent by trial-tool, or None on EOF or if trial-tool died meanwhile.

    The orders are one JSON line; `stdin_bytes` raw bytes of input follow it,
    read into `stdin`. A stop request may follow them in the same read
    (trial-tool interrupted at once): it is kept as `signals.stop`, so the
    command is stopped as it starts.
    """
    data = bytearray()
    orders: dict[str, object] | None = None
    wanted = 0  # bytes of input, once the orders' line is in
    with selectors.DefaultSelector() as selector:
        selector.register(control_fd, selectors.EVENT_READ)
        selector.register(signals.read_fd, selectors.EVENT_READ)
        while orders is None or len(data) < wanted:
            for key, _ in selector.select():
                if key.fd == signals.read_fd:
                    signals.drain()
                    if signals.orphaned or signals.stop:
                        return None  # trial-tool died, or gave up on the call before sending it
                    continue
                seen = len(data)
                chunk = os.read(control_fd, 1 << 20)
                if not chunk:
                    return None
                data += chunk
                if orders is None and b"\n" in chunk:
                    end = data.index(b"\n", seen)
                    orders = json.loads(bytes(data[:end]))
                    del data[: end + 1]
                    wanted = input_size(orders)
    assert orders is not None
    if len(data) > wanted:
        signals.stop = True
    return decode(orders, bytes(data[:wanted]))


__all__ = ["preload", "run_call", "run_spare"]
