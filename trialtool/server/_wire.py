"""The per-user server's wire: where its socket is, what names it, and the frames both ends exchange.

Protocol, frames of a 4-byte length and a marshalled dict: the request, with
a `request_id` the caller made up, which the call's record keeps; the server's
`{"accepted": True}` once it has taken the call (before that, a vanished server
is simply started again), or `{"other_world": reason}` when the caller's world
is not its own (world.py), and the caller runs the call itself; `{"signal": N}`
from us when SIGINT, SIGTERM or SIGHUP arrives; `{"held": {"stdout": ...,
"stderr": ...}}`, what the call will deliver, before the server commits its
record, and our `{"got": True}` once we hold it (a call we never got is recorded
withheld); the answer, `{"exit": N, "result": {...}}` (the call's result as
`serve` gives it, without the output we already hold) or `{"exit": N, "error":
..., "error_json": {...}}`. A server that dies after "accepted" leaves us to
find our call's record by its `request_id` and say what became of it.

Light at import, like the client that loads it on every CLI call (server/_client.py
says why): `marshal`, not `json`.
"""

from __future__ import annotations

import marshal
import os
import sys

from ..errors import TrialToolError
from ._directory import directory

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket
    from collections.abc import Mapping
    from typing import TypedDict

    class CallFrame(TypedDict):
        """A call as the CLI sends it: its flags, which the server reads as the CLI's own `request_of` would
        (parsing them here instead would cost every CLI call the call types' imports, some 6 ms), and the
        caller's world: its directory, environment, umask and limits, what it imports, its input."""

        flags: dict[str, object]
        command: list[str]
        cwd: str
        env: dict[str, str]
        umask: int
        rlimits: list[list[int]]
        stdin: bytes | None
        imports: list[str]
        request_id: str | None


#: Off (in-process calls, as without a server) when set to "off".
SERVER_ENV = "TRIALTOOL_SERVER"
#: Seconds the server waits idle before it exits.
IDLE_ENV = "TRIALTOOL_SERVER_IDLE"


#: What the server takes from the environment of the caller that starts it, and nothing more: the
#: settings its own work reads (where bwrap and the container clients are found, its socket's directory,
#: the encoder's file, the docker and podman clients' config). Each is part of the server's name (`identity`), so a
#: caller is served only by a server started with the very same values. Nothing that makes a program
#: run code of someone's choosing is among them (PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD, BASH_ENV, ...):
#: the caller's environment is its command's alone, sent with each call.
SERVER_KEEPS = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "TRIALTOOL_CGROUPS",
    "TRIALTOOL_O200K_FILE",
    "TRIALTOOL_SERVER_DIR",
    "TRIALTOOL_SERVER_IDLE",
    "TIKTOKEN_CACHE_DIR",
    "DATA_GYM_CACHE_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
)


def server_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment a server started by a caller with `environ` runs in (SERVER_KEEPS)."""
    return {name: environ[name] for name in SERVER_KEEPS if name in environ}


def checked_directory(path: str) -> str:
    """`path`, made 0700 if missing; TrialToolError unless it is a real directory of ours that no one else can open."""
    import stat

    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TrialToolError(f"cannot make the server's directory {path}: {exc.strerror}") from exc
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        msg = (
            f"the server's directory {path} is not a directory of this user's that only it can open "
            f"(mode {stat.S_IMODE(info.st_mode):o}, owner {info.st_uid}): refusing it; "
            f"remove it, or set {SERVER_ENV}=off"
        )
        raise TrialToolError(msg)
    return path


def identity(environ: Mapping[str, str] = os.environ) -> str:
    """What names one server: the version, this installation, this process's world, and settings fixed at its start.

    The interpreter is named by its resolved path and prefix, so that `python` and
    `python3` of one installation reach one server. The world (world.py) gives each
    set of namespaces, cgroup, credentials and privileges a server of its own, and the
    environment it keeps (`server_environment`) one per set of values.
    """
    import zlib

    from .._version import __version__
    from . import _world as world

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    interpreter = os.path.realpath(sys.executable)
    kept = "\0".join(f"{name}={value}" for name, value in server_environment(environ).items())
    settings = f"{here}\0{interpreter}\0{sys.prefix}\0{kept}\0{world.digest(world.of())}"
    return f"{__version__}-{zlib.crc32(settings.encode()):08x}"


def socket_path(environ: Mapping[str, str] = os.environ) -> str:
    return os.path.join(checked_directory(directory(environ)), f"server-{identity(environ)}.sock")


#: The longest path a Unix socket address can hold (sun_path, less its NUL).
MAX_SOCKET_PATH = 107


def reach(sock: _socket.socket, path: str, bind: bool = False) -> None:
    """`sock.connect(path)` (or `bind`), for a socket path of any length.

    A path longer than sun_path (a deep TMPDIR, say) is reached through the
    socket directory opened as a descriptor, `/proc/self/fd/N/NAME`: the kernel
    then goes to the directory already opened, never by its name again. Linux
    only, like the server.
    """
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        sock.bind(path) if bind else sock.connect(path)
        return
    parent, name = os.path.split(path)
    fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        sock.bind(short) if bind else sock.connect(short)
    finally:
        os.close(fd)


def frame(message: Mapping[str, object]) -> bytes:
    """One message as it travels: its length, then the marshalled dict."""
    data = marshal.dumps(dict(message))
    return len(data).to_bytes(4, "big") + data


#: Each field of a call's frame, and what it must be (`None` among them: may be null).
_CALL_FIELDS: dict[str, tuple[type | None, ...]] = {
    "flags": (dict,),
    "command": (list,),
    "cwd": (str,),
    "env": (dict,),
    "umask": (int,),
    "rlimits": (list,),
    "stdin": (bytes, None),
    "imports": (list,),
    "request_id": (str, None),
}


def call_frame(message: dict[str, object]) -> CallFrame:
    """`message` as a call's frame; TrialToolError naming what is wrong when it is not one."""
    for name, kinds in _CALL_FIELDS.items():
        value = message.get(name)
        if not any(value is None if kind is None else isinstance(value, kind) for kind in kinds):
            raise TrialToolError(f"the call's request to the server is malformed: {name} is {type(value).__name__}")
    return message  # type: ignore[return-value]  # checked above, field by field


class Frames:
    """Messages read off a connection as they arrive."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def feed(self) -> bool:
        """Read what has arrived; False once the other end has closed the connection."""
        try:
            chunk = self.sock.recv(1 << 20)
        except OSError:
            chunk = b""
        self.buffer += chunk
        return bool(chunk)

    def pop(self) -> dict[str, object] | None:
        """The next whole message, if one has arrived."""
        if len(self.buffer) < 4:
            return None
        size = int.from_bytes(self.buffer[:4], "big")
        if len(self.buffer) < 4 + size:
            return None
        message: dict[str, object] = marshal.loads(bytes(self.buffer[4 : 4 + size]))
        del self.buffer[: 4 + size]
        return message


__all__ = [
    "IDLE_ENV",
    "MAX_SOCKET_PATH",
    "SERVER_ENV",
    "SERVER_KEEPS",
    "Frames",
    "checked_directory",
    "frame",
    "identity",
    "reach",
    "server_environment",
    "socket_path",
]
