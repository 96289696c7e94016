"""A per-call cgroup, where the machine lets us make one: atomic kill, process cap, memory cap.

Linux only, and always optional: every capability is probed and used only if
its files can be written. What it offers, in order of preference:

* cgroup v2 (`cgroup2` mount): a leaf with `cgroup.kill` (kernel ≥ 5.14), the
  atomic way to kill a whole tree; `pids.max` / `memory.max` where those
  controllers can be enabled for the leaf.
* cgroup v1 `pids` and `memory` hierarchies, for whichever of the two the v2
  leaf lacks (hybrid hosts, such as the machines this project is tested on).

The command joins every leaf from its pre-exec hook, so everything it ever
forks is born inside. Without any of this, the supervisor's subreaper sweep
and resource limits do the work (see _supervisor.py), and the record says which
mechanism enforced each limit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

_PREFIX = "trialtool-"


class _Mount(NamedTuple):
    version: int
    controllers: frozenset[str]
    directory: Path  # our own cgroup in this hierarchy


def _own_cgroups() -> list[_Mount]:
    """Our cgroup in each mounted hierarchy, from /proc/self/cgroup and /proc/self/mountinfo."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            memberships = [line.rstrip("\n").split(":", 2) for line in handle if line.count(":") >= 2]
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            mountinfo = handle.read().splitlines()
    except OSError:
        return []
    found = []
    for line in mountinfo:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, mount_point = fields[3], fields[4]
        if tail[0] == "cgroup2":
            version, controllers = 2, frozenset[str]()
            paths = [path for hierarchy, names, path in memberships if hierarchy == "0" and names == ""]
        else:
            options = set(tail[2].split(","))
            version, controllers = 1, frozenset(options & {"pids", "memory"})
            if not controllers:
                continue
            paths = [path for _, names, path in memberships if controllers & set(names.split(","))]
        if not paths:
            continue
        path = paths[0]
        if root != "/" and path.startswith(root):
            path = path[len(root) :]
        found.append(_Mount(version, controllers, Path(mount_point + path.rstrip("/"))))
    return found


def _write(path: Path, value: str) -> bool:
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(value)
        return True
    except OSError:
        return False


def _read_int_field(path: Path, key: str) -> int | None:
    """The number after `key` in a flat-keyed cgroup file (pids.events, memory.events, ...)."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _enable(directory: Path, controller: str) -> bool:
    """Ask for `controller` in a v2 cgroup's subtree; True if it is enabled there.

    Refused unless we may (the root, or a delegated subtree with no processes of its own).
    """
    _write(directory / "cgroup.subtree_control", f"+{controller}")
    try:
        return controller in (directory / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _offering(controller: str) -> Iterator[_Mount]:
    """Our cgroups that can have a child with `controller`: v1 first (see `CallGroup.prepare`)."""
    for mount in sorted(_own_cgroups(), key=lambda m: m.version):
        if mount.version == 1 and controller not in mount.controllers:
            continue
        if mount.version == 2 and not _enable(mount.directory, controller):
            continue
        yield mount


def _sweep_stale(parent: Path) -> None:
    """Remove empty leaves left by trial-tools that died (rmdir refuses non-empty ones)."""
    try:
        names = [name for name in os.listdir(parent) if name.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        owner = name[len(_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                os.rmdir(parent / name)
            except OSError:
                pass  # still has members, or someone else's: leave it


class CallGroup:
    """The leaves made for one call; empty (all capabilities off) where none can be made."""

    def __init__(self) -> None:
        self.leaves: list[Path] = []
        self.kill_file: Path | None = None
        self.pids: Path | None = None
        self.memory: tuple[int, Path] | None = None
        self.versions: dict[Path, int] = {}
        self._name = ""
        #: Leaves the supervisor itself is in: the command needs no move, and they are
        #: left for the next call's stale sweep, since they cannot be removed while we live.
        self._joined: set[Path] = set()

    @classmethod
    def prepare(cls) -> CallGroup:
        """Make the call's pids leaf and move the calling supervisor into it, before the call's orders.

        Moving a process into a cgroup made for it costs several ms here; done by the
        supervisor while trial-tool reserves the call, it is off the call's path, and
        the command is born inside (a fork inherits its cgroup). The cap itself is set
        by `configure`, once the limits are known; the supervisor counts as one task.
        """
        group = cls()
        group._name = f"{_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        for mount in _offering("pids"):
            leaf = group._make_leaf(mount)
            if leaf is not None and _write(leaf / "cgroup.procs", str(os.getpid())):
                group.pids = leaf
                group._joined.add(leaf)
                break
        return group

    def configure(self, max_procs: int, max_memory: int) -> None:
        """Set the process cap, and make the memory leaf if memory is capped (the command joins it)."""
        if self.pids is not None:
            # The supervisor itself is one of the tasks in the leaf.
            _write(self.pids / "pids.max", str(max_procs + 1) if max_procs else "max")
        if not max_memory:
            return
        for mount in _offering("memory"):
            leaf = self._make_leaf(mount)
            memory_file = "memory.max" if mount.version == 2 else "memory.limit_in_bytes"
            if leaf is not None and _write(leaf / memory_file, str(max_memory)):
                if mount.version == 2:
                    _write(leaf / "memory.swap.max", "0")
                self.memory = (mount.version, leaf)
                return

    def _make_leaf(self, mount: _Mount) -> Path | None:
        leaf = mount.directory / self._name
        if leaf in self.versions:
            return leaf  # one v2 leaf serves both controllers
        _sweep_stale(mount.directory)
        try:
            leaf.mkdir()
        except OSError:
            return None
        self.leaves.append(leaf)
        self.versions[leaf] = mount.version
        if mount.version == 2 and (leaf / "cgroup.kill").exists():
            self.kill_file = leaf / "cgroup.kill"
        return leaf

    def child_must_join(self) -> bool:
        """True when the command must join a leaf the supervisor is not in (the memory leaf)."""
        return any(leaf not in self._joined for leaf in self.leaves)

    def join(self) -> None:
        """Move the calling process into the leaves it is not in yet. Runs in the command's pre-exec hook."""
        pid = str(os.getpid())
        for leaf in self.leaves:
            if leaf not in self._joined:
                _write(leaf / "cgroup.procs", pid)

    def kill(self) -> bool:
        """SIGKILL every member at once (cgroup v2); False where that is not available.

        Not where the supervisor is a member itself: it would kill the supervisor too.
        """
        if self.kill_file is None or self.kill_file.parent in self._joined:
            return False
        return _write(self.kill_file, "1")

    def members(self) -> set[int]:
        pids: set[int] = set()
        for leaf in self.leaves:
            try:
                pids.update(int(line) for line in (leaf / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return pids

    def process_cap_hit(self) -> bool:
        return self.pids is not None and (_read_int_field(self.pids / "pids.events", "max") or 0) > 0

    def oom_kills(self) -> int:
        if self.memory is None:
            return 0
        version, leaf = self.memory
        if version == 2:
            return _read_int_field(leaf / "memory.events", "oom_kill") or 0
        return _read_int_field(leaf / "memory.oom_control", "oom_kill") or 0

    def memory_peak(self) -> int | None:
        if self.memory is None:
            return None
        version, leaf = self.memory
        return _read_int(leaf / ("memory.peak" if version == 2 else "memory.max_usage_in_bytes"))

    def remove(self) -> None:
        """Remove the leaves; they must be empty, which takes the kernel a moment after the last reap."""
        for leaf in self.leaves:
            if leaf in self._joined:
                continue
            for _ in range(50):
                try:
                    leaf.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)

    def describe(self, max_procs: int, max_memory: int) -> dict[str, str]:
        """Which mechanism enforces what, for the record."""
        process_cap = f"cgroup{self.versions[self.pids]}" if self.pids else "sweep"
        memory_cap = f"cgroup{self.memory[0]}" if self.memory else "rlimit_as"
        atomic = self.kill_file is not None and self.kill_file.parent not in self._joined
        return {
            "kill": "cgroup2+sweep" if atomic else "sweep",
            "process_cap": process_cap if max_procs else "none",
            "memory_cap": memory_cap if max_memory else "none",
        }


def kill_leftovers(supervisor_pid: int) -> int:
    """Kill whatever is left in the leaves of a dead supervisor; return how many were killed.

    For a call whose trial-tool and supervisor were both killed (a SIGKILL to the
    whole process group): the leaves are named after the supervisor's pid.
    """
    import signal

    killed = 0
    prefix = f"{_PREFIX}{supervisor_pid}-"
    for mount in _own_cgroups():
        try:
            names = [name for name in os.listdir(mount.directory) if name.startswith(prefix)]
        except OSError:
            continue
        for name in names:
            leaf = mount.directory / name
            group = CallGroup()
            group.leaves.append(leaf)
            members = group.members()
            killed = max(killed, len(members))
            if not _write(leaf / "cgroup.kill", "1"):
                for pid in members:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            group.remove()
    return killed


__all__ = ["CallGroup", "kill_leftovers"]
