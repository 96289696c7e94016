"""The per-user server: one process per user and installation that runs CLI calls warm.

`python -m trialtool.server._server SOCKET` is started by the first CLI call
that finds none (server/_client.py), detached in a session of its own, and exits
after TRIALTOOL_SERVER_IDLE seconds (default 300) without a call. It listens on
a Unix socket in a directory only its user can open, and serves a connection
only from a process of its own world (world.py): its user (SO_PEERCRED), and
its namespaces, cgroup, credentials and privileges, so that a caller's
privileges never grow or shrink through it. A process of the same user in
another world (a sandboxed command that found the socket) is told so, and
nothing runs for it. Each connection is one call,
run on a thread of its own through the same `Trial` API the other doors use,
so one encoder in memory serves every trial on the machine, and one fork server
hands out the calls' supervisors.

The call keeps the caller's contract: its working directory, environment
(TRIALTOOL_* removed, as always), umask and resource limits are the caller's,
sent with the request; a relative path in the flags was made absolute by the
caller. A caller's SIGINT, SIGTERM or SIGHUP arrives as a message and stops
the call as it would in-process (recorded `interrupted`, delivered); a caller
that goes away (SIGKILLed) stops the call, which is then recorded `interrupted`
and withheld, since no one is left to deliver to. If this server dies during a
call, its supervisors stop their trees (their parent-death signal), and the
caller, once the server is gone, settles the call itself: it finds the call's
record by its request id (recording it `abandoned` if it was reserved and never
committed), says which of "not charged", "charged, abandoned" or "delivered"
happened, and exits 125 unless it holds the output to deliver. The output is
handed to the caller before the record is committed, so a record never claims
a delivery the caller did not get.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import TYPE_CHECKING

from ..doors.fromflags import request_of, trial_of, trial_settings
from ..doors.options import Arguments
from ..errors import TrialToolError, UsageError
from ..osio import make_undumpable
from . import _world as world
from ._wire import IDLE_ENV, Frames, call_frame, frame, reach

if TYPE_CHECKING:
    from ..process import ForkServer
    from ..trial import Trial
    from ._wire import CallFrame

#: Longest request line: argv and environment, generously.
MAX_REQUEST = 64 << 20
DEFAULT_IDLE = 300.0


#: Seconds a caller has to say it holds a call's output before the call is recorded as withheld.
HAND_OVER_SECONDS = 60.0


class RemoteInterrupt:
    """A call's stop button pressed by its caller over the socket (the Interrupt protocol), and the
    hand-over of its output (`hand_over`), which Trial makes before it commits the call."""

    def __init__(self, conn: socket.socket) -> None:
        self.signum: int | None = None
        self.delivers = True
        #: Set once the call has its answer: a later EOF from the caller means nothing then.
        self.finished = False
        self.fd, self._write_fd = os.pipe()
        self._conn = conn
        #: The caller holds the output (it said `got`); `settled` once it did, or went away.
        self.got = threading.Event()
        self.settled = threading.Event()

    def hand_over(self, stdout: str, stderr: str) -> bool:
        """Send the call's output to the caller, before the call is committed; whether the caller has it.

        The record then says delivered only what the caller holds: if this server dies before it
        commits, the caller finds the call abandoned (nothing delivered) and writes nothing.
        """
        try:
            self._conn.sendall(frame({"held": {"stdout": stdout, "stderr": stderr}}))
        except OSError:
            return False
        self.settled.wait(HAND_OVER_SECONDS)
        return self.got.is_set()

    @property
    def reason(self) -> str:
        if not self.delivers:
            return "the caller went away"
        return "trial-tool received " + signal.Signals(self.signum or signal.SIGINT).name

    def fire(self, signum: int, *, delivers: bool) -> None:
        if self.signum is None and not self.finished:
            self.signum = signum
            self.delivers = delivers
            os.write(self._write_fd, b"s")

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._write_fd)


class UserServer:
    """The listening socket, the calls in progress, and the trials they use."""

    def __init__(self, path: str, idle: float) -> None:
        self.path = path
        self.idle = idle
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        reach(self.listener, path, bind=True)
        os.chmod(path, 0o600)
        #: The socket file's inode: its name is removed on leaving only while it is still ours.
        self.inode = os.stat(path).st_ino
        self.listener.listen(128)
        self.guard = threading.Lock()
        self.active = 0
        self.last_call = time.monotonic()
        self.trials: dict[str, Trial] = {}
        self.forkserver: ForkServer | None = None
        #: Set by `trial-tool server stop`: leave once the calls running have ended.
        self.stopping = False

    def serve_forever(self) -> None:
        # Woken this often to see whether it is idle or told to stop (a shut-down listener does not wake accept).
        self.listener.settimeout(0.2)
        while True:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if self.stopping:
                    self._drain()
                    return
                with self.guard:
                    if self.active == 0 and time.monotonic() - self.last_call >= self.idle:
                        self._leave()
                        return
                continue
            except OSError:
                if self.stopping:  # `server stop` shut the listener down
                    self._drain()
                    return
                raise
            with self.guard:
                self.active += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _drain(self) -> None:
        """Wait for the calls running to end (stopping)."""
        while True:
            with self.guard:
                if self.active == 0:
                    return
            time.sleep(0.05)

    def _leave(self) -> None:
        """Stop taking calls: the socket goes first, so that a new caller starts a new server."""
        self._unlink()
        self.listener.close()

    def _unlink(self) -> None:
        """Remove the socket's name, unless it is already another server's."""
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except OSError:
            pass

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._serve(conn)
        except Exception:  # one call's trouble must never end the server
            pass
        finally:
            with self.guard:
                self.active -= 1
                self.last_call = time.monotonic()

    def _serve(self, conn: socket.socket) -> None:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            return  # another user's process: not a word
        foreign = world.foreign_peer(conn, pid)
        if foreign is not None:
            # Same uid, another world (a sandboxed command, a caller with fewer privileges):
            # nothing is run for it; it runs its call itself, with what it has.
            conn.sendall(frame({"other_world": foreign}))
            _linger(conn)
            return
        frames = Frames(conn)
        request = frames.pop()
        while request is None:
            if len(frames.buffer) >= 4 and int.from_bytes(frames.buffer[:4], "big") > MAX_REQUEST:
                return
            if not frames.feed():
                return
            request = frames.pop()
        if "control" in request:
            conn.sendall(frame(self._control(str(request["control"]))))
            return
        interrupt = RemoteInterrupt(conn)
        conn.sendall(frame({"accepted": True}))
        # The caller's later messages and its going away, read beside the call.
        watcher = threading.Thread(target=_watch, args=(frames, interrupt), daemon=True)
        watcher.start()
        answer = self._call_frame(request, interrupt)
        interrupt.finished = True
        try:
            conn.sendall(frame(answer))
        except OSError:
            pass
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        watcher.join()
        # Only now: a descriptor closed while the call's wait still watches it would never wake it.
        interrupt.close()

    def _control(self, action: str) -> dict[str, object]:
        """`trial-tool server status|stop`: what this server is; or stop taking calls (those running finish)."""
        from .._version import __version__

        with self.guard:
            status = {
                "pid": os.getpid(),
                "version": __version__,
                "socket": self.path,
                "calls_running": self.active - 1,  # this connection aside
                "trials_known": len(self.trials),
                "idle_exit_seconds": self.idle,
            }
            if action == "stop" and not self.stopping:
                self.stopping = True
                self._unlink()
                self.listener.shutdown(socket.SHUT_RDWR)
        return status

    def _call_frame(self, message: dict[str, object], interrupt: RemoteInterrupt) -> dict[str, object]:
        try:
            request = call_frame(message)
        except TrialToolError as exc:
            return {"exit": exc.exit_code, "error": exc.message, "error_json": exc.as_json()}
        return self._call(request, interrupt)

    def _call(self, request: CallFrame, interrupt: RemoteInterrupt) -> dict[str, object]:
        try:
            args = Arguments("run", dict(request["flags"]))
            trial = self._trial(args, request)
            call = request_of(
                args,
                request["command"],
                request.get("stdin"),
                cwd=request["cwd"],
                environ=request["env"],
                umask=request["umask"],
                rlimits=request["rlimits"],
                caller_imports=[str(path) for path in request.get("imports") or ()],
                request_id=request.get("request_id"),
            )
            result = trial.call(call, interrupt=interrupt)
        except Exception as exc:  # reported to the caller; not a TrialToolError: the server's own failure
            error = exc if isinstance(exc, TrialToolError) else TrialToolError(f"the server failed: {exc!r}")
            return {"exit": error.exit_code, "error": error.message, "error_json": error.as_json()}
        shown = result.as_json()
        if interrupt.got.is_set():  # the caller holds the streams already (RemoteInterrupt.hand_over)
            del shown["stdout"], shown["stderr"]
        return {"exit": result.exit_code, "result": shown}

    def _trial(self, args: Arguments, request: CallFrame) -> Trial:
        """The Trial for these flags, kept for the next call with the same ones (its log stays trusted)."""
        from ..process import ForkServer

        settings = trial_settings(args, request["env"])
        key = settings["key"]
        signer = settings["signing_key"]
        identity = json.dumps(
            {
                **settings,
                "key": key and key.hex(),
                "signing_key": signer and signer.fingerprint,
                "origin": request["cwd"],
            },
            sort_keys=True,
        )
        with self.guard:
            if self.forkserver is None:
                self.forkserver = ForkServer()
            trial = self.trials.get(identity)
            if trial is None:
                if len(self.trials) >= 256:
                    self.trials.clear()
                trial = self.trials[identity] = trial_of(
                    args, origin=request["cwd"], fork_server=self.forkserver, settings=settings
                )
        return trial


def _linger(conn: socket.socket, seconds: float = 1.0) -> None:
    """Let the peer read what was sent: closing with its request unread would reset the connection first.

    What it sends meanwhile is read and dropped, for `seconds` at most: a peer of
    another world holds no thread of this server longer than that.
    """
    until = time.monotonic() + seconds
    try:
        conn.shutdown(socket.SHUT_WR)
        while (left := until - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(1 << 16):
                break
    except OSError:
        pass


def _watch(frames: Frames, interrupt: RemoteInterrupt) -> None:
    """The caller's later messages: a signal to pass on, or its going away."""
    try:
        while True:
            # What already arrived first: a signal sent right behind the request is in the buffer.
            while (message := frames.pop()) is not None:
                if isinstance(signum := message.get("signal"), int):
                    interrupt.fire(signum, delivers=True)
                elif message.get("got") is True:
                    interrupt.got.set()
                    interrupt.settled.set()
            if not frames.feed():
                break
    except (OSError, ValueError, EOFError, TypeError):
        pass
    # EOF: the caller closed its end, having its answer, or having died; only the latter matters.
    interrupt.settled.set()
    interrupt.fire(signal.SIGTERM, delivers=False)


def _warm_up() -> None:
    """Build the encoder now, beside the first calls, rather than in the first call with output."""
    from ..output import tokens

    try:
        tokens.verified(tokens.locate()).encoder()
    except TrialToolError:
        pass  # the call that needs it reports it


def main(argv: list[str]) -> int:
    """Listen on `argv[0]`, release the start lock (descriptor 3), serve until idle."""
    make_undumpable()
    os.chdir("/")  # not to hold the first caller's directory: every path it gets is absolute
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal that started us is not for us
    try:
        idle = float(os.environ.get(IDLE_ENV, DEFAULT_IDLE))
    except ValueError:
        idle = DEFAULT_IDLE
    try:
        server = UserServer(argv[0], idle)
    except OSError:
        return 1  # the callers waiting on the start lock (descriptor 3) find no server, and start one
    os.close(3)  # the start lock: callers waiting on it now connect
    threading.Thread(target=_warm_up, daemon=True).start()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except UsageError:
        code = 125
    os._exit(code)
