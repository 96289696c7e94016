"""A small process that forks call supervisors for a long-lived, possibly threaded, Python process.

The CLI forks each call's supervisor from itself (_launcher.py): it is a fresh,
single-threaded process. A harness that embeds trialtool is neither: it has
threads (asyncio's executor, its own), and forking a threaded process can
deadlock the child on a lock another thread held. It also carries a large heap
(the encoder alone is a large heap of Python objects), which makes every fork and
the supervisor's first steps slow (page tables, copy-on-write faults).

So the API starts this server once, with fork+exec (safe from threads), and
asks it for a supervisor per call. It is single-threaded, has the supervisor's
modules imported already and a small heap, so a fork costs well under a
millisecond. The caller passes the supervisor's four descriptors (two spools,
the result pipe's write end, the control pipe's read end) over a Unix socket
(SCM_RIGHTS) and gets the pid back; everything else between caller and
supervisor goes through those pipes exactly as with a direct fork.

Lifetimes: the server reaps its supervisors. When the caller's socket reaches
EOF (the caller closed it, exited or was killed) the server waits for the
supervisors still running and exits. A supervisor whose caller is gone sees
EOF on its control pipe and stops its command's tree; one whose server is
killed gets its parent-death signal and does the same. POSIX only.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
import threading

from ..osio import make_undumpable

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

_PID = struct.Struct("!q")
#: Names the four descriptors a request carries, in order.
_FDS = 4


class ForkServer:
    """The caller's side: start the server on first use, then ask it for supervisors. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._retired: list[subprocess.Popen[bytes]] = []
        self._owner_pid = -1

    def _start(self) -> socket.socket:
        import subprocess

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # The same interpreter finds the same trialtool; a source checkout not on the
        # path is appended (never prepended: that could shadow the standard library).
        code = (
            "import sys; sys.argv[1] in sys.path or sys.path.append(sys.argv[1]); "
            "from trialtool.process._forkserver import main; main(int(sys.argv[2]))"
        )
        # stdout is /dev/null: nothing it or a supervisor prints can reach the caller's
        # stdout, which may be a protocol stream (serve, mcp).
        self._process = subprocess.Popen(
            # -P: the caller's working directory is not on the path (it may hold anything).
            [sys.executable, "-P", "-c", code, package_root, str(theirs.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            close_fds=True,
        )
        theirs.close()
        self._owner_pid = os.getpid()
        return ours

    def fork_supervisor(self, fds: tuple[int, int, int, int]) -> int:
        """A new supervisor holding `fds` (spool out, spool err, result write end, control read end); its pid."""
        with self._lock:
            if self._owner_pid != os.getpid() and self._sock is not None:
                # We are a fork of the process that started the server: it is that one's.
                self._sock.close()
                self._sock, self._process, self._retired = None, None, []
            if self._sock is None:
                self._sock = self._start()
            sock = self._sock
            try:
                socket.send_fds(sock, [b"f"], list(fds))
                reply = _recv_exact(sock, _PID.size)
            except BaseException as exc:
                # A request cut short (an error, KeyboardInterrupt) leaves a reply unread:
                # this connection is out of step, so retire the server and start afresh next time.
                self._retire_locked()
                if not isinstance(exc, OSError):
                    raise
                msg = f"the supervisor fork server failed: {exc.strerror or exc}"
                raise OSError(exc.errno, msg) from exc
            if len(reply) < _PID.size:
                self._retire_locked()
                msg = "the supervisor fork server exited"
                raise OSError(msg)
            (pid,) = _PID.unpack(reply)
            if pid < 0:
                raise OSError(-pid, f"cannot fork a supervisor: {os.strerror(-pid)}")
            return int(pid)

    def _retire_locked(self) -> None:
        """Close the connection without waiting: EOF makes the server exit once its supervisors have."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._process is not None:
            self._retired.append(self._process)
            self._process = None

    def close(self) -> None:
        """Stop the server (and any retired one) once the calls they started have ended."""
        with self._lock:
            self._retire_locked()
            retired, self._retired = self._retired, []
        for process in retired:
            # EOF on its socket: it waits for its supervisors (each ends with its call) and exits.
            process.wait()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class _Server:
    """The server's side: one connection to its caller, one spare supervisor, its children."""

    def __init__(self, fd: int) -> None:
        import signal

        self.sock = socket.socket(fileno=fd)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # The caller's Ctrl-C reaches us too (same process group); the caller decides.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.children: set[int] = set()
        self.pid = os.getpid()
        self.spare: tuple[int, socket.socket] | None = None

    def fork_spare(self) -> tuple[int, socket.socket] | None:
        """A supervisor made ready for the next call, and our end of its socket; None if fork failed."""
        import signal

        from . import _supervisor as supervisor

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:
            try:
                self.sock.close()
                ours.close()
                os.close(self.wake_r)
                os.close(self.wake_w)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
            finally:
                supervisor.run_spare(theirs.detach(), self.pid)
        theirs.close()
        self.children.add(pid)
        return pid, ours

    def reap(self) -> None:
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def hand_over(self, fds: list[int]) -> int:
        """Give the spare supervisor a call's descriptors; its pid, or -errno."""
        self.reap()
        if self.spare is not None and self.spare[0] not in self.children:
            self.spare[1].close()  # it died waiting (killed from outside)
            self.spare = None
        if self.spare is None:
            self.spare = self.fork_spare()
        if self.spare is None or len(fds) != _FDS:
            return -errno.EAGAIN
        pid, handle = self.spare
        self.spare = None
        try:
            socket.send_fds(handle, [b"f"], fds)
            return pid
        except OSError as exc:
            return -(exc.errno or errno.EIO)
        finally:
            handle.close()

    def loop(self) -> None:
        import selectors

        self.spare = self.fork_spare()
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            selector.register(self.wake_r, selectors.EVENT_READ)
            while True:
                ready = {key.fd for key, _ in selector.select()}
                if self.wake_r in ready:
                    try:
                        while os.read(self.wake_r, 64):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                if self.sock.fileno() not in ready:
                    continue
                _, fds, _, _ = socket.recv_fds(self.sock, 16, _FDS)
                if not fds:
                    return  # EOF: the caller is done or gone
                reply = self.hand_over(fds)
                for each in fds:
                    os.close(each)
                self.sock.sendall(_PID.pack(reply))
                if self.spare is None:
                    self.spare = self.fork_spare()

    def shut_down(self) -> None:
        """EOF to the spare (it removes its cgroup and exits), then wait for every supervisor."""
        self.sock.close()
        if self.spare is not None:
            self.spare[1].close()
        for pid in self.children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def main(fd: int) -> None:
    """The server's life: hand a ready supervisor each request's descriptors, reply with its pid.

    One supervisor is kept ready (forked, in its cgroup) ahead of the next
    request, so that a call does not wait for the cgroup join; a new one is
    forked as soon as one is handed out.
    """
    from . import _supervisor as supervisor

    # Imported and loaded once here, so that no supervisor pays for it.
    supervisor.preload()
    make_undumpable()
    server = _Server(fd)
    server.loop()
    server.shut_down()
    os._exit(0)


__all__ = ["ForkServer", "main"]
