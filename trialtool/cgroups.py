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
and resource limits do the work (see supervisor.py), and the record says which
mechanism enforced each limit.
"""

from __future__ import annotations

import os
import time
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

    @classmethod
    def create(cls, max_procs: int, max_memory: int) -> CallGroup:
        """Make the leaves this call needs: always one for killing, pids and memory only when capped.

        Each leaf costs a migration when the command joins it (~1-2 ms here), so
        nothing is made that would not enforce something.
        """
        group = cls()
        name = f"{_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        # v1 first: on hybrid hosts moving a process into a v2 cgroup costs ~18 ms here
        # (a v1 move, well under 1 ms), and the v2 leaf would add only cgroup.kill, which
        # the subreaper sweep does without. So a v2 leaf is made only for a controller
        # v1 does not offer.
        for mount in sorted(_own_cgroups(), key=lambda m: m.version):
            need_pids = max_procs > 0 and group.pids is None
            need_memory = max_memory > 0 and group.memory is None
            if mount.version == 1 and not (
                ("pids" in mount.controllers and need_pids) or ("memory" in mount.controllers and need_memory)
            ):
                continue
            if mount.version == 2:
                if not (need_pids or need_memory):
                    continue
                # Ask for the controllers in our subtree; refused unless we may (root of a
                # delegated subtree with no processes of our own).
                _write(mount.directory / "cgroup.subtree_control", "+pids +memory")
                try:
                    enabled = set((mount.directory / "cgroup.subtree_control").read_text().split())
                except OSError:
                    continue
                if not ((need_pids and "pids" in enabled) or (need_memory and "memory" in enabled)):
                    continue
            _sweep_stale(mount.directory)
            leaf = mount.directory / name
            try:
                leaf.mkdir()
            except OSError:
                continue
            group.leaves.append(leaf)
            group.versions[leaf] = mount.version
            if mount.version == 2 and (leaf / "cgroup.kill").exists():
                group.kill_file = leaf / "cgroup.kill"
            if need_pids and _write(leaf / "pids.max", str(max_procs)):
                group.pids = leaf
            memory_file = "memory.max" if mount.version == 2 else "memory.limit_in_bytes"
            if need_memory and _write(leaf / memory_file, str(max_memory)):
                if mount.version == 2:
                    _write(leaf / "memory.swap.max", "0")
                group.memory = (mount.version, leaf)
        return group

    def join(self) -> None:
        """Move the calling process into every leaf. Runs in the command's pre-exec hook."""
        pid = str(os.getpid())
        for leaf in self.leaves:
            _write(leaf / "cgroup.procs", pid)

    def kill(self) -> bool:
        """SIGKILL every member at once (cgroup v2 only); False where that is not available."""
        return self.kill_file is not None and _write(self.kill_file, "1")

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
        return {
            "kill": "cgroup2+sweep" if self.kill_file else "sweep",
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
