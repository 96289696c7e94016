"""Find, kill and reap every descendant of this process. Meant for the supervisor only.

The supervisor is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every
process its command ever started is either still below a live descendant or
was reparented to the supervisor itself: nothing can leave the tree but by
dying. So "kill what is there, reap, look again, until waitpid(-1) says there
are no children" is complete, even against setsid, double forks, SIGSTOP and
fork-and-exit chains. It calls waitpid(-1), which is why it must only run in a
process whose every child belongs to the call.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc/PID/task/*/children (Linux ≥ 3.5)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                found.extend(int(word) for word in handle.read().split())
        except OSError:
            continue
    return found


def _has_proc_children() -> bool:
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def descendants(pid: int | None = None) -> list[int]:
    """Every descendant of `pid` (default: this process), parents before children.

    psutil (a dependency, used here where the kernel has no children files) would do
    it as `Process.children(recursive=True)`, but that reads every process on the
    machine to build a parent map: 2.6 ms against 0.23 ms for this walk of the tree
    alone, with 80 processes on the machine and a tree of 10, and the sweep repeats
    it until nothing is left (and every 50 ms for the fallback process cap). Each
    supervisor is a fresh fork, where importing psutil would cost 20-30 ms more.
    """
    root = os.getpid() if pid is None else pid
    if not _has_proc_children():
        import psutil  # no procfs children files (macOS, old kernels): ask psutil

        try:
            return [child.pid for child in psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            return []
    seen: list[int] = []
    frontier = [root]
    while frontier:
        found = [child for parent in frontier for child in children(parent)]
        seen.extend(found)
        frontier = found
    return seen


def _reap_all() -> bool:
    """Reap every child that has exited; True when no children are left at all."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        if pid == 0:
            return False


def no_children() -> bool:
    """True when this process has no children left, alive or not yet reaped (those exited are reaped)."""
    return _reap_all()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z"
    except (OSError, ValueError):
        return False


def living_descendants() -> set[int]:
    """Descendants that have not exited yet (zombies are already dead)."""
    return {pid for pid in descendants() if not _is_zombie(pid)}


def kill_all(known: set[int] | None = None, timeout: float = 10.0) -> tuple[int, list[int]]:
    """SIGKILL and reap every descendant until none is left.

    `known` are processes already found alive (and perhaps already sent SIGKILL
    by a cgroup or group kill); they count as killed. Returns how many distinct
    processes were killed, and any still alive at the timeout (none, unless
    something is unkillable, e.g. stuck in the kernel).
    """
    killed: set[int] = set(known or ())
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while True:
        if _reap_all():
            return len(killed), []
        for pid in living_descendants():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        if _reap_all():
            return len(killed), []
        if time.monotonic() >= deadline:
            return len(killed), descendants()
        # Children that got SIGKILL are dying; give the kernel a moment before looking again.
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _send(kill: Callable[[int, int], None], target: int, sig: int) -> None:
    """`sig` to a process or group; SIGCONT first when it is SIGTERM, so that stopped ones can act on it."""
    try:
        if sig == signal.SIGTERM:
            kill(target, signal.SIGCONT)
        kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already (or a group whose last member just left)


def signal_tree(pgid: int, sig: int, spare: set[int] | None = None) -> None:
    """Signal the command's process group, then every descendant (those that left the group too).

    With `spare`, the group is not signalled as a whole and those processes not at all.
    """
    if spare is None:
        _send(os.killpg, pgid, sig)
    for pid in descendants():
        if spare is None or pid not in spare:
            _send(os.kill, pid, sig)


__all__ = ["children", "descendants", "kill_all", "living_descendants", "no_children", "signal_tree"]
