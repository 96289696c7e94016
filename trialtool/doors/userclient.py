"""The CLI's side of the per-user server: find it (or start it), hand it the call, relay signals, write the answer.

A cold `trial-tool -- CMD` would otherwise build the o200k_base encoder in
every process that has output to count (300-500 ms). The per-user server
(userserver.py) keeps it built: this module connects to it through a Unix
socket in a directory only this user can open, sends the call (its flags
already parsed, paths made absolute; the command; this process's working
directory, environment, umask and resource limits), and writes back exactly
what an in-process call writes: stdout, stderr, the exit code.

Imports stay light (no trialtool module beyond the options and errors): this
runs in every CLI process, and its whole cost is on the call's path.

Protocol, JSON lines: the request; the server's `{"accepted": true}` once it
has taken the call (before that, a vanished server is simply started again);
`{"signal": N}` from us when SIGINT, SIGTERM or SIGHUP arrives; the answer,
`{"exit": N, "stdout": ..., "stderr": ...}` or `{"exit": N, "error": ...}`.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from ..errors import TrialToolError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .options import Arguments

#: Off (in-process calls, as without a server) when set to "off".
SERVER_ENV = "TRIALTOOL_SERVER"
#: Where the socket lives, instead of $XDG_RUNTIME_DIR/trialtool or $TMPDIR/trialtool-UID.
SERVER_DIR_ENV = "TRIALTOOL_SERVER_DIR"
#: Seconds the server waits idle before it exits.
IDLE_ENV = "TRIALTOOL_SERVER_IDLE"
#: Flags whose values are paths, made absolute against the caller's directory before they travel.
PATH_FLAGS = ("state", "log", "key_file", "o200k_file", "cwd", "workspace")
#: Seconds to wait for a server being started to listen.
START_TIMEOUT = 30.0


def wanted(environ: Any = os.environ) -> bool:
    """Whether calls go through the per-user server (Linux; not when TRIALTOOL_SERVER=off)."""
    return sys.platform.startswith("linux") and bool(environ.get(SERVER_ENV, "on") != "off")


def directory(environ: Any = os.environ) -> str:
    """The socket's directory: TRIALTOOL_SERVER_DIR, else $XDG_RUNTIME_DIR/trialtool, else TMPDIR/trialtool-UID."""
    chosen = environ.get(SERVER_DIR_ENV)
    if chosen:
        return os.path.abspath(str(chosen))
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "trialtool")
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"trialtool-{os.getuid()}")


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


def identity(environ: Any = os.environ) -> str:
    """What names one server: the version, this installation, and settings the server cannot take per call."""
    import zlib

    from .._version import __version__

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Whether the calls' supervisors make cgroups is fixed when the server starts them.
    settings = f"{here}\0{sys.executable}\0{environ.get('TRIALTOOL_CGROUPS', '')}"
    return f"{__version__}-{zlib.crc32(settings.encode()):08x}"


def socket_path(environ: Any = os.environ) -> str:
    return os.path.join(checked_directory(directory(environ)), f"server-{identity(environ)}.sock")


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def connect(path: str) -> socket.socket:
    """A connection to the server at `path`, started if none is listening (one, however many race to start it)."""
    sock = _connect(path)
    if sock is not None:
        return sock
    import fcntl

    lock = os.open(os.path.join(os.path.dirname(path), "start.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)  # another caller may have started it while we waited
        if sock is None:
            _start(path)
            sock = _connect(path)
    finally:
        os.close(lock)
    if sock is None:
        raise TrialToolError(f"the trial-tool server did not start at {path}")
    return sock


def _start(path: str) -> None:
    """Start a server on `path`, detached in a session of its own, and wait until it listens."""
    try:
        os.unlink(path)  # a stale socket of a server that is gone
    except FileNotFoundError:
        pass
    ready_r, ready_w = os.pipe()
    argv = [sys.executable, "-m", "trialtool.doors.userserver", path]
    try:
        os.posix_spawn(
            sys.executable,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, ready_w, 3),
            ],
            setsid=True,
        )
    finally:
        os.close(ready_w)
    import select

    try:
        readable, _, _ = select.select([ready_r], [], [], START_TIMEOUT)
        said = os.read(ready_r, 4096) if readable else b""
    finally:
        os.close(ready_r)
    if said != b"ready\n":
        why = said.decode("utf-8", "replace").strip() or "it exited without a word"
        raise TrialToolError(f"the trial-tool server could not start: {why}")


def control(action: str) -> dict[str, Any] | None:
    """Ask the running server for its status, or to stop; None when none is running."""
    import json

    sock = _connect(socket_path())
    if sock is None:
        return None
    with sock:
        sock.sendall(json.dumps({"control": action}).encode() + b"\n")
        answer = sock.makefile("rb").readline()
    if not answer:
        return None
    parsed: dict[str, Any] = json.loads(answer)
    if action == "stop":
        _wait_gone(int(parsed["pid"]))
    return parsed


def _wait_gone(pid: int, timeout: float = 60.0) -> None:
    """Wait until process `pid` has exited (it finishes the calls it is running first)."""
    import select

    try:
        watch = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        select.select([watch], [], [], timeout)
    finally:
        os.close(watch)


def request(args: Arguments, command: list[str]) -> dict[str, Any]:
    """The call as the server takes it: flags with paths made absolute, and this process's own settings."""
    import resource

    values = {name: value for name, value in vars(args).items() if name != "command"}
    for name in PATH_FLAGS:
        if values.get(name) is not None:
            values[name] = os.path.abspath(values[name])
    values["writable"] = [os.path.abspath(path) for path in values.get("writable") or ()]
    umask = os.umask(0)
    os.umask(umask)
    limits = []
    for name in dir(resource):
        if name.startswith("RLIMIT_") and name != "RLIMIT_CORE":
            which = getattr(resource, name)
            limits.append([which, *resource.getrlimit(which)])
    return {
        "flags": values,
        "command": command,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": umask,
        "rlimits": limits,
    }


class _Answer:
    """The server's lines, read as they come."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def next(self, wake_r: int) -> dict[str, Any] | None:
        """The next line (None once the server closed the connection); signals are relayed meanwhile."""
        import json
        import select

        while b"\n" not in self.buffer:
            readable = select.select([self.sock.fileno(), wake_r], [], [])[0]
            if wake_r in readable:
                os.read(wake_r, 64)
            self.relay()
            if self.sock.fileno() in readable:
                try:
                    chunk = self.sock.recv(1 << 20)
                except OSError:
                    chunk = b""
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, rest = self.buffer.partition(b"\n")
        self.buffer = bytearray(rest)
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def relay(self) -> None:
        """Pass the signals received so far on to the server, which stops the call as ours would."""
        while _SIGNALS:
            try:
                self.sock.sendall(b'{"signal": %d}\n' % _SIGNALS.pop(0))
            except OSError:
                return  # the server is gone: its answer (or its absence) says what happened


#: Signals received and not yet relayed; the handler only records them.
_SIGNALS: list[int] = []


def _on_signal(signum: int, frame: object) -> None:
    _SIGNALS.append(signum)


def call(args: Arguments, command: list[str]) -> int:
    """Run the call through the server; write what it delivered; its exit code."""
    import json

    path = socket_path()
    payload = json.dumps(request(args, command)).encode() + b"\n"
    # A signal only records itself and wakes the wait: the server stops the call and answers.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    for attempt in range(2):
        sock = connect(path)
        try:
            sock.sendall(payload)
            answer = _Answer(sock)
            accepted = answer.next(wake_r)
            if accepted is None:
                # The server went away before taking the call (an idle exit racing us): nothing ran.
                if attempt == 0:
                    continue
                raise TrialToolError("the trial-tool server closed the connection before taking the call")
            if "exit" in accepted:
                return _deliver(accepted)
            result = answer.next(wake_r)
            if result is None:
                msg = (
                    "the trial-tool server died during the call; the call stays charged and the next call "
                    "records it as abandoned"
                )
                raise TrialToolError(msg)
            return _deliver(result)
        finally:
            sock.close()
    raise TrialToolError("the trial-tool server could not be reached")


def _deliver(result: dict[str, Any]) -> int:
    """Write the call's answer as an in-process call would; its exit code."""
    if "error" in result:
        sys.stderr.write(f"trial-tool: {result['error']}\n")
        sys.stderr.flush()
        return int(result["exit"])
    sys.stdout.buffer.write(result["stdout"].encode("utf-8"))
    sys.stdout.flush()
    sys.stderr.buffer.write(result["stderr"].encode("utf-8"))
    sys.stderr.flush()
    return int(result["exit"])


__all__ = ["SERVER_ENV", "call", "connect", "directory", "socket_path", "wanted"]
