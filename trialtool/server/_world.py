"""The world a process lives in: its namespaces, cgroup, credentials and privileges.

The per-user server runs calls for other processes, so it must run them only
for processes that could have run them themselves, exactly as the server
would: a sandboxed command (other namespaces), a harness that dropped a
capability or set no_new_privs, a job in another cgroup are each a world of
their own. A uid says none of that; bwrap even maps a sandbox's user back to
the same uid. So the server compares the peer's world with its own, and the
client names its server by its world (`digest`), so that each world has one.

Linux only: every fact comes from /proc. Imports stay light (the client
reads this on every call, ~60 µs).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

#: The namespaces compared: all but the *_for_children ones, which a process may set for its
#: children without being in them. `time` too: the server and its callers exchange
#: monotonic clock readings, which a time namespace offsets.
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time")
#: The lines of /proc/PID/status that say who a process is and what it may do.
STATUS_FIELDS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")


def of(pid: int | str = "self") -> dict[str, str]:
    """The world of process `pid` (default: this one); OSError if it cannot be read (gone, or not ours to see)."""
    base = f"/proc/{pid}"
    world: dict[str, str] = {}
    for name in NAMESPACES:
        try:
            world[f"ns:{name}"] = os.readlink(f"{base}/ns/{name}")
        except FileNotFoundError:
            world[f"ns:{name}"] = "absent"  # a kernel without this namespace type
    with open(f"{base}/cgroup", "rb") as handle:
        world["cgroup"] = handle.read().decode("utf-8", "replace")
    with open(f"{base}/status", "rb") as handle:
        status = handle.read().decode("utf-8", "replace")
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in STATUS_FIELDS:
            world[name] = " ".join(value.split())
    return world


def difference(mine: dict[str, str], theirs: dict[str, str]) -> str | None:
    """What differs between two worlds, said in a few words; None when they are the same."""
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            label = name.replace("ns:", "") + (" namespace" if name.startswith("ns:") else "")
            return f"its {label} differs from the server's"
    return None


def digest(world: dict[str, str]) -> str:
    """A short name for a world, for the server's socket name."""
    import zlib

    text = "\0".join(f"{name}={world[name]}" for name in sorted(world))
    return f"{zlib.crc32(text.encode()):08x}"


#: getsockopt's SO_PEERPIDFD (Linux 6.5): a pidfd of the very process that connected.
_SO_PEERPIDFD = 77


def foreign_peer(conn: socket.socket, pid: int) -> str | None:
    """Why the peer `pid` on `conn` is not of this process's world, or None when it is.

    The peer is read from /proc while a pidfd holds it: SO_PEERPIDFD's where the
    kernel has it, else one opened on the pid at once. If the process is still
    alive after the reading, its pid was not reused meanwhile, so what was read
    was that process's.
    """
    import select
    import socket  # not at import: the CLI's every call reads this module (userwire.identity)

    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return "it could not be identified"
    try:
        try:
            theirs = of(pid)
        except OSError:
            return "it could not be identified"
        if select.select([pidfd], [], [], 0)[0]:
            return "it exited before it could be identified"
    finally:
        os.close(pidfd)
    return difference(of(), theirs)


__all__ = ["NAMESPACES", "STATUS_FIELDS", "difference", "digest", "foreign_peer", "of"]
