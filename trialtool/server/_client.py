"""The CLI's side of the per-user server: find it (or start it), hand it the call, relay signals, write the answer.

A cold `trial-tool -- CMD` would otherwise build the o200k_base encoder in
every process that has output to count (300-500 ms). The per-user server
(server/_server.py) keeps it built: this module connects to it through a Unix
socket in a directory only this user can open, sends the call (its flags
already parsed, paths made absolute; the command; this process's working
directory, environment, umask and resource limits), and writes back exactly
what an in-process call writes: stdout, stderr, the exit code.

Imports stay light: this runs in every CLI process, and its whole cost is on
the call's path, whose target is Python's own start plus 15 ms. So the socket
and signals are the C modules `_socket` and `_signal` (the `socket` and
`signal` wrappers import `enum`: 4 and 2.5 ms here), and messages are
`marshal` frames rather than JSON (`json` imports `re`: 5 ms). Both ends are
the same interpreter, which the server's socket name pins (`identity`), and
each end talks only to its own user.

The wire, and where the server's socket is, are server/_wire.py's.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub: see the docstring
import _socket
import os
import sys

from ..errors import TrialToolError
from ._wire import SERVER_ENV, Frames, frame, reach, server_environment, socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractContextManager
    from typing import Any

    from ..doors.options import Arguments
    from ..trial import Trial
    from ._wire import CallFrame

    #: Opens a call's trial in this process, from its flags (the CLI's `trial_of`).
    OpenTrial = Callable[..., AbstractContextManager[Trial]]

#: Flags whose values are paths, made absolute against the caller's directory before they travel.
PATH_FLAGS = ("state", "log", "key_file", "signing_key", "o200k_file", "cwd", "workspace")


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether calls go through the per-user server (Linux; not when TRIALTOOL_SERVER=off)."""
    return sys.platform.startswith("linux") and bool(environ.get(SERVER_ENV, "on") != "off")


def _connect(path: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        reach(sock, path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def connect(path: str) -> _socket.socket | None:
    """A connection to the server at `path`; or None once this process has started one.

    Starting takes `start.lock` beside the socket, and the new server holds that
    lock (it inherits the locked descriptor) until it listens: racing callers wait
    for it and connect to it, so one server starts however many race. The caller
    that started it does not wait for it: its call runs in its own process, so the
    first call of all costs what an in-process call costs, besides a spawn.
    """
    sock = _connect(path)
    if sock is not None:
        return sock
    lock = _start_lock(path)
    try:
        sock = _connect(path)  # started by another caller while we waited
        if sock is None:
            _start(path, lock)
        return sock
    finally:
        os.close(lock)


def _start_lock(path: str) -> int:
    """The start lock beside the socket at `path`, taken (a server being started holds it until it listens)."""
    import fcntl

    lock = os.open(os.path.join(os.path.dirname(path), "start.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def _start(path: str, lock: int) -> None:
    """Start a server on `path`, detached in a session of its own, holding `lock` until it listens."""
    try:
        os.unlink(path)  # a stale socket of a server that is gone
    except FileNotFoundError:
        pass
    # -I (isolated): no PYTHON* variable, user site or working directory (perhaps a workspace a
    # command can write) decides what the server imports; and it gets only the environment it keeps.
    argv = [sys.executable, "-I", "-m", "trialtool.server._server", path]
    # A descriptor dup'd onto itself may keep close-on-exec: hand over a copy numbered above 3.
    spare = os.dup(lock) if lock == 3 else -1
    try:
        os.posix_spawn(
            sys.executable,
            argv,
            server_environment(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, spare if spare >= 0 else lock, 3),
            ],
            setsid=True,
        )
    finally:
        if spare >= 0:
            os.close(spare)


def control(action: str) -> dict[str, Any] | None:
    """Ask the running server for its status, or to stop; None when none is running."""
    path = socket_path()
    sock = _connect(path)
    if sock is None:
        os.close(_start_lock(path))  # a server being started: once it listens
        sock = _connect(path)
    if sock is None:
        return None
    try:
        sock.sendall(frame({"control": action}))
        frames = Frames(sock)
        answer = frames.pop()
        while answer is None and frames.feed():
            answer = frames.pop()
    finally:
        sock.close()
    if answer is not None and "other_world" in answer:
        return None  # that server is not this process's to control
    if answer is not None and action == "stop" and isinstance(pid := answer.get("pid"), int):
        _wait_gone(pid)
    return answer


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


def request(
    args: Arguments, command: list[str], stdin: bytes | None = None, request_id: str | None = None
) -> CallFrame:
    """The call as the server takes it: flags with paths made absolute, this process's own settings, the input."""
    import resource

    values = {name: value for name, value in vars(args).items() if name != "command"}
    for name in PATH_FLAGS:
        if values.get(name) is not None:
            values[name] = os.path.abspath(values[name])
    for name in ("writable", "read_only"):
        values[name] = [os.path.abspath(path) for path in values.get(name) or ()]
    values["stdin"] = None  # read by the caller: its bytes travel in the request
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
        "stdin": stdin,
        # What this process runs and imports: kept from the command like the server's own.
        "imports": [sys.executable, sys.prefix, sys.exec_prefix, *sys.path],
        # The call's name in its records: should the server die, this process finds out what became of it.
        "request_id": request_id,
    }


def _on_signal(signum: int, frame: object) -> None:
    _SIGNALS.append(signum)


#: Signals received and not yet relayed; the handler only records them.
_SIGNALS: list[int] = []


def _next(frames: Frames, wake_r: int) -> dict[str, Any] | None:
    """The server's next message (None once it closed the connection); signals are relayed meanwhile."""
    import select

    while True:
        message = frames.pop()
        if message is not None:
            return message
        readable = select.select([frames.sock.fileno(), wake_r], [], [])[0]
        if wake_r in readable:
            os.read(wake_r, 64)
        while _SIGNALS:
            # The server stops the call as ours would have; gone, its answer (or none) says so.
            try:
                frames.sock.sendall(frame({"signal": _SIGNALS.pop(0)}))
            except OSError:
                break
        if frames.sock.fileno() in readable and not frames.feed():
            return frames.pop()


def call(args: Arguments, command: list[str], stdin: bytes | None, open_trial: OpenTrial) -> int | None:
    """Run the call through the server; write what it delivered; its exit code.

    `open_trial` opens the call's trial in this process (the CLI's `trial_of`), for
    a call whose server died: its record is then read from the trial's own files.

    None when this process has just started the server, the server found this process
    of another world than its own, or went away twice before taking the call: the call
    is then the caller's to run in its own process.
    """
    path = socket_path()
    request_id = os.urandom(16).hex()
    payload = frame(request(args, command, stdin, request_id))
    wake_r = -1
    for _ in range(2):
        sock = connect(path)
        if sock is None:
            return None
        if wake_r < 0:
            # A signal only records itself and wakes the wait: the server stops the call and answers.
            wake_r, wake_w = os.pipe()
            os.set_blocking(wake_w, False)
            _signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
                _signal.signal(sig, _on_signal)
        try:
            try:
                sock.sendall(payload)
            except OSError:
                sock.close()
                continue  # the server went away before taking the call: nothing ran
            frames = Frames(sock)
            accepted = _next(frames, wake_r)
            if accepted is None:
                # The server went away before taking the call (an idle exit racing us, a kill): nothing
                # ran. Tried once more; then the call is this process's to run.
                continue
            if "other_world" in accepted:
                return None  # the server runs calls only for its own world: this one runs here
            if "exit" in accepted:
                return write_answer(accepted, as_json=args.json)
            return _answer(args, frames, wake_r, request_id, _peer_pid(sock), open_trial)
        finally:
            sock.close()
    return None  # twice gone before taking the call: it runs here


def _peer_pid(sock: _socket.socket) -> int:
    """The server's pid, as the kernel says (SO_PEERCRED: pid, uid, gid)."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(raw[:4], sys.byteorder)


def _answer(args: Arguments, frames: Frames, wake_r: int, request_id: str, server: int, open_trial: OpenTrial) -> int:
    """The rest of a call the server took: its output held, then the answer once the call is committed.

    The server hands the output over before it commits the call (RemoteInterrupt.hand_over), so
    the record says delivered only what this process holds; this process writes it only once the
    call is committed. Should the server die meanwhile, what became of the call is read from the
    trial itself (`_orphaned`): what this process writes and the records then agree.
    """
    held: dict[str, Any] | None = None
    while True:
        message = _next(frames, wake_r)
        if message is None:
            return _orphaned(args, request_id, held, server, open_trial)
        if "held" not in message:
            break
        held = message["held"]
        try:
            frames.sock.sendall(frame({"got": True}))
        except OSError:
            return _orphaned(args, request_id, held, server, open_trial)
    if "result" in message and held is not None:
        message["result"].update(held)
    return write_answer(message, as_json=args.json)


def _orphaned(args: Arguments, request_id: str, held: dict[str, Any] | None, server: int, open_trial: OpenTrial) -> int:
    """The call's end once its server died: its record, read (after the recovery) from the trial's own files."""
    _wait_gone(server, timeout=30.0)
    from ..errors import BudgetExhausted

    died = "the trial-tool server died during the call"
    with open_trial(args, origin=os.getcwd()) as trial:
        try:
            record, budget = trial.settle_request(request_id)
        except TrialToolError as exc:
            raise TrialToolError(f"{died}, and the trial cannot say how it ended: {exc.message}") from exc
    if record is None:
        raise TrialToolError(f"{died}, before it was charged: nothing ran and nothing is charged")
    status = record.get("status")
    if status == "abandoned":
        raise TrialToolError(f"{died}: it stays charged, recorded abandoned; nothing was delivered")
    if record.get("charged") is False and record.get("record_type") == "trial_tool_call":
        refused = BudgetExhausted(f"call refused: {record.get('error')}", str(status))
        answer = {"exit": refused.exit_code, "error": refused.message, "error_json": refused.as_json()}
        return write_answer(answer, as_json=args.json)
    if held is None or status == "trial_tool_error":
        raise TrialToolError(f"{died}; its record says: {record.get('error') or status}")
    # Committed as delivered to this process, which holds the output: written as the server would have.
    result = {
        "sequence": record.get("sequence") or 0,
        "status": status,
        "exit_code": record.get("return_code"),
        **held,
        "delivered_tokens": record.get("delivered_emitted_tokens"),
        "allowance": record.get("allowance_tokens"),
        "output_truncated": record.get("output_truncated"),
        "budget": budget.as_json(),
        "head": budget.head,
    }
    return write_answer({"exit": int(record.get("return_code") or 0), "result": result}, as_json=args.json)


def write_json(shown: dict[str, Any]) -> None:
    """One JSON object on stdout, a line (`run --json`)."""
    import json

    sys.stdout.buffer.write(json.dumps(shown, ensure_ascii=False).encode("utf-8") + b"\n")
    sys.stdout.flush()


def write_answer(answer: dict[str, Any], *, as_json: bool) -> int:
    """Write a call's answer as the CLI delivers it; its exit code.

    `answer` holds `exit` and either `result` (CallResult.as_json) or `error`
    (one line) with `error_json` (its JSON-RPC error object). Streams are
    written as UTF-8 bytes: exactly the text that was counted, whatever the
    locale. With `as_json`, stdout gets one JSON object, the result or
    `{"error": ...}`; an error's line still goes to stderr.
    """
    if "error" in answer:
        if as_json:
            write_json({"error": answer["error_json"]})
        sys.stderr.write(f"trial-tool: {answer['error']}\n")
        sys.stderr.flush()
        return int(answer["exit"])
    result = answer["result"]
    if as_json:
        write_json(result)
    else:
        sys.stdout.buffer.write(result["stdout"].encode("utf-8"))
        sys.stdout.flush()
        sys.stderr.buffer.write(result["stderr"].encode("utf-8"))
        sys.stderr.flush()
    return int(answer["exit"])


__all__ = ["PATH_FLAGS", "call", "connect", "control", "request", "wanted", "write_answer", "write_json"]
