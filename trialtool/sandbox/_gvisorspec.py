"""What a gVisor sandbox is made of and runs (_gvisor.py): its OCI spec, its first process, a call's loader.

The spec lays bwrap's view over the host's root, read-only (docs/sandbox.md).
The programs run inside are this module's text, run by a Python from the
host's read-only root (`interpreter`): never a file a command could write.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from ..errors import SandboxError
from ._layout import Layout

if TYPE_CHECKING:
    from ..types import Limits
    from ._settings import Sandbox

#: The sandbox's first process, and its waiting child: what a call's processes are counted beside.
KEEPER = ["/bin/sh", "-c", "trap '' TERM HUP INT; while :; do sleep infinity & wait; done"]
KEEPERS = 2
#: Where, in a sandbox of network "allow", the directory of the proxy's socket is bound.
NET = "/run/trialtool-net"
#: The first process of a sandbox of network "allow", run by `python -I -S -B -c`: it waits, as `KEEPER`
#: does, reaping what is left to it, and forwards each connection made inside to the proxy's address
#: (network/_netns.py's) to the call's proxy on the socket argv[1] names. The command is of its uid and could
#: end it or take its port: it would gain nothing, since the socket is the one way out, and it is the proxy.
FORWARDER = r"""
import signal, socket, sys, threading
for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(number, signal.SIG_IGN)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((sys.argv[2], int(sys.argv[3])))
listener.listen(512)
def relay(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(client):
    up = socket.socket(socket.AF_UNIX)
    try:
        up.connect(sys.argv[1])
    except OSError:
        client.close()
        up.close()
        return
    back = threading.Thread(target=relay, args=(up, client), daemon=True)
    back.start()
    relay(client, up)
    back.join()
    client.close()
    up.close()
while True:
    try:
        client, _ = listener.accept()
    except OSError:
        continue
    threading.Thread(target=serve, args=(client,), daemon=True).start()
""".strip()

#: Run by `python -I -S -B -c` inside the sandbox: argv[1] the filter's program (hex), argv[2] the limits
#: ("NAME=SOFT:HARD,..."), the rest the command to become. Exit 125 (and why) when the filter cannot be set.
LOADER = r"""
import ctypes, os, resource, sys
a = sys.argv
for item in filter(None, a[2].split(",")):
    name, _, pair = item.partition("=")
    soft, _, hard = pair.partition(":")
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
program = bytes.fromhex(a[1])
libc = ctypes.CDLL(None, use_errno=True)
code = ctypes.create_string_buffer(program, len(program))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(len(program) // 8, ctypes.addressof(code))
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
    why = os.strerror(ctypes.get_errno())
    sys.stderr.write("trial-tool: the system-call filter cannot be set in gVisor: %s\n" % why)
    sys.exit(125)
os.execv(a[3], a[3:])
""".strip()


def reachable(path: str) -> bool:
    """Whether any user may reach `path` (every directory above it searchable by others) and read or run it."""
    try:
        if not os.stat(path).st_mode & 0o005:
            return False
        directory = os.path.dirname(path)
        while directory != "/":
            if not os.stat(directory).st_mode & 0o001:
                return False
            directory = os.path.dirname(directory)
    except OSError:
        return False
    return True


def interpreter(uid: int) -> str:
    """The Python the loader runs on, from the host's read-only root: this one, unless the sandbox's user
    cannot reach it or its library (a root's own installation under /root), then the system's."""
    here = os.path.realpath(sys.executable)
    if uid == 0 or (reachable(here) and reachable(os.path.realpath(sys.base_prefix))):
        return here
    system = os.path.realpath("/usr/bin/python3")
    if reachable(system):
        return system
    raise SandboxError(f"no Python that uid {uid} can run, for gVisor's loader (install python3)")


def spec(
    args: list[str], ids: tuple[int, int], mounts: list[dict[str, object]], notes: dict[str, str], network: str = "none"
) -> dict[str, object]:
    """An OCI spec over the host's root, read-only: `args` as its first process, `mounts` on top; the
    host's network namespace under network "host" (gVisor then reaches it through the host's sockets)."""
    kinds = ("pid", "ipc", "uts", "mount") if network == "host" else ("pid", "network", "ipc", "uts", "mount")
    no: dict[str, list[str]] = {name: [] for name in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    base: list[dict[str, object]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]},
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": ids[0], "gid": ids[1]},
            "args": args,
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "cwd": "/",
            "capabilities": no,
            "noNewPrivileges": True,
        },
        "root": {"path": "/", "readonly": True},
        "hostname": "trial",
        "mounts": base + mounts,
        "annotations": notes,
        "linux": {"namespaces": [{"type": kind} for kind in kinds]},
    }


def mounts(sandbox: Sandbox, hide: Layout) -> list[dict[str, object]]:
    """What goes over the host's root: a /tmp of its own, the writable paths, and what is hidden, parents first."""

    def bind(path: str, source: str, mode: str) -> dict[str, object]:
        return {"destination": path, "type": "bind", "source": source, "options": ["rbind", mode, "nosuid", "nodev"]}

    def empty(path: str) -> dict[str, object]:
        return {
            "destination": path,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["ro", "nosuid", "nodev", "size=4k"],
        }

    rows = [(path, 0, empty(path)) for path in hide.covered]
    rows += [(root, 1, bind(root, root, "rw")) for root in sandbox.roots]
    # Held: every directory between a writable path and what is kept inside it, bound onto itself, so that
    # the command cannot rename the way to it (a mount point cannot be renamed), as under bwrap.
    rows += [(path, 2, bind(path, path, "rw")) for path in hide.held]
    rows += [(path, 3, empty(path)) for path in hide.masked]
    rows += [(path, 3, bind(path, path, "ro")) for path in hide.protected]
    # The sandbox's /tmp first (kept while it lives): a workspace under the host's /tmp goes on top of it.
    tmp: dict[str, object] = {
        "destination": "/tmp",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=1777"],
    }
    return [tmp] + [row for *_, row in sorted(rows, key=lambda r: (len(r[0]), r[1], r[0]))]


def limits_of(limits: Limits) -> str:
    """The loader's per-process limits: those the trial sets, as the container backend sets them."""
    wanted: list[tuple[str, int, int]] = []
    if limits.max_cpu_seconds:
        soft = max(1, int(limits.max_cpu_seconds + 0.999))
        wanted.append(("CPU", soft, soft + 1))
    if limits.max_file_size:
        wanted.append(("FSIZE", limits.max_file_size, limits.max_file_size))
    if limits.max_open_files:
        wanted.append(("NOFILE", limits.max_open_files, limits.max_open_files))
    if limits.max_procs:
        wanted.append(("NPROC", limits.max_procs + KEEPERS, limits.max_procs + KEEPERS))
    return ",".join(f"{name}={soft}:{hard}" for name, soft, hard in wanted)


__all__ = ["FORWARDER", "KEEPER", "KEEPERS", "LOADER", "NET", "interpreter", "limits_of", "mounts", "reachable", "spec"]
