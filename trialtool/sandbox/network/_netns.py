"""A call's network under "allow": the proxy's listener, opened inside the sandbox's own network namespace (Linux).

bwrap makes the sandbox's network namespace as it does for `none` (only a
loopback, no route anywhere), states the pid of its process on the status
descriptor, and waits on a descriptor of ours (`--block-fd`) before it runs
the command. In that moment the supervisor opens the proxy's listening socket
inside that namespace, at 127.0.0.1:PORT, then lets bwrap go on. A socket
keeps the namespace it was made in: the supervisor accepts connections made
inside the sandbox while it connects out from the host's own network. The
command gets the listener's address, never the socket.

Joining a network namespace takes CAP_SYS_ADMIN over it and over one's own:
root joins it from a thread of the supervisor; another user has that only
inside bwrap's user namespace, so a short-lived child joins that first.
"""

from __future__ import annotations

import ipaddress
import json
import os
import select
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import _egress as egress

#: Where the proxy listens inside the sandbox: the namespace is the call's own, so the port is always free.
ADDRESS = "127.0.0.1"
PORT = 3128
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
#: Bind before bwrap has brought the loopback up (it does so before it reads the block descriptor).
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)


def _setns(fd: int, kind: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12
    if setns is not None:
        setns(fd, kind)
        return
    import ctypes  # loaded ahead in the supervisor (osio.prctl)

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, kind) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _listen() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
        listener.bind((ADDRESS, PORT))
        listener.listen(512)
    except BaseException:
        listener.close()
        raise
    return listener


def _from_thread(net: int) -> socket.socket:
    """The listener made by a thread that joins the namespace (and ends with it): root's way."""
    made: list[Any] = []

    def run() -> None:
        try:
            _setns(net, _CLONE_NEWNET)
            made.append(_listen())
        except OSError as exc:
            made.append(exc)

    thread = threading.Thread(target=run, name="trialtool-netns")
    thread.start()
    thread.join()
    if isinstance(made[0], OSError):
        raise made[0]
    return made[0]  # type: ignore[no-any-return]


def _from_child(user: int, net: int) -> socket.socket:
    """The listener made by a child that joins bwrap's user namespace, then its network namespace."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            parent.close()
            _setns(user, _CLONE_NEWUSER)
            _setns(net, _CLONE_NEWNET)
            listener = _listen()
            socket.send_fds(child, [b"L"], [listener.fileno()])
        except BaseException as exc:
            try:
                child.send(f"E{getattr(exc, 'strerror', None) or exc}".encode()[:512])
            finally:
                os._exit(1)
        os._exit(0)
    child.close()
    try:
        message, fds, _, _ = socket.recv_fds(parent, 512, 1)
    finally:
        parent.close()
        os.waitpid(pid, 0)
    if not fds:
        raise OSError(message[1:].decode("utf-8", "replace") if message.startswith(b"E") else "no listener")
    return socket.socket(fileno=fds[0])


def listener_in(pid: int, inode: int) -> socket.socket:
    """A listening socket at ADDRESS:PORT in the network namespace of `pid`, which must be the one `inode` names."""
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(net).st_ino != inode:
            raise OSError(f"process {pid} is not in the sandbox's network namespace")
        try:
            return _from_thread(net)
        except PermissionError:
            user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            try:
                return _from_child(user, net)
            finally:
                os.close(user)
    finally:
        os.close(net)


def _first_line(status_r: int, deadline: float) -> bytes:
    """bwrap's first status document (or what came before it ended, or the deadline passed)."""
    got = b""
    while b"\n" not in got:
        ready, _, _ = select.select([status_r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(status_r, 4096)
        if not chunk:
            break
        got += chunk
    return got


class CallNetwork:
    """A call's proxy, from before bwrap starts to the call's report (_running.supervise).

    With `socket_path` (gVisor's sandbox, whose own network stack reaches a socket bound in), the proxy
    listens there instead, on a unix socket made now, before the command starts: nothing waits on it.
    """

    def __init__(self, allow: tuple[str, ...] | list[str], started: float, socket_path: str | None = None) -> None:
        self.allow, self.started = allow, started
        self.proxy: Any = None
        self.unix: socket.socket | None = None
        self.block_r = self.block_w = -1
        if socket_path is None:
            #: bwrap's --block-fd (the read end, passed to it) and ours, written once the listener is there.
            self.block_r, self.block_w = os.pipe()
            return
        try:
            os.unlink(socket_path)  # the last call's, in a directory of trial-tool's own
        except FileNotFoundError:
            pass
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.unix.bind(socket_path)
            os.chmod(socket_path, 0o666)  # for the sandbox's user, whoever it is; the directory is the sandbox's only
            self.unix.listen(512)
        except BaseException:
            self.unix.close()
            raise

    def start(self, status_r: int, deadline: float) -> bytes:
        """After bwrap started: the proxy listening in the sandbox, then bwrap let go on.

        Returns what was read of bwrap's status (the command's exit code comes later on
        the same descriptor): without a first document, bwrap ended before the sandbox
        was made, and says why on its stderr. OSError when the listener cannot be made:
        bwrap is then still waiting, and must be stopped before this closes our end.
        """
        if self.unix is not None:
            from ._proxy import Proxy

            self.proxy, self.unix = Proxy(self.unix, self.allow, self.started), None
            return b""  # the backend's status is read when the command has ended
        os.close(self.block_r)
        self.block_r = -1
        status = _first_line(status_r, deadline)
        try:
            document = json.loads(status.partition(b"\n")[0] or b"{}")
        except ValueError:
            document = {}
        pid, inode = document.get("child-pid"), document.get("net-namespace")
        listener = listener_in(pid, inode) if isinstance(pid, int) and isinstance(inode, int) else None
        try:
            os.write(self.block_w, b"x")  # the command may connect from now on: the listener's backlog holds it
        except BrokenPipeError:
            pass  # bwrap ended before it made the sandbox: its status and stderr say why
        self.close()
        if listener is not None:
            from ._proxy import Proxy

            self.proxy = Proxy(listener, self.allow, self.started)
        return status

    def finish(self) -> dict[str, object] | None:
        """What the call's network did (the record's `network`), once the command's tree is gone."""
        return None if self.proxy is None else self.proxy.finish()

    def close(self) -> None:
        if self.unix is not None:
            self.unix.close()
            self.unix = None
        for fd in (self.block_r, self.block_w):
            if fd >= 0:
                os.close(fd)
        self.block_r = self.block_w = -1


def environment(allow: Sequence[str]) -> dict[str, str]:
    """The variables that point pip, git, curl, npm and the like at the proxy.

    Loopback stays the sandbox's own (a server the command starts there is
    reached directly), except where the list names it: `localhost` by name,
    `127.0.0.1` and `::1` by an address or network of theirs. Those go through
    the proxy, which reaches the host's loopback as the list allows; left in
    `NO_PROXY`, curl, pip and urllib would go straight to the sandbox's own
    loopback, where nothing listens.
    """
    http = f"http://{ADDRESS}:{PORT}"
    socks = f"socks5h://{ADDRESS}:{PORT}"
    # In canonical form only these texts can name loopback: parsing just them keeps a long list off every call.
    rules = egress.Rules([text for text in allow if text.startswith(("localhost:", "127.", "[::1]"))])
    named = {
        "localhost": "localhost" in rules.names,
        # Only a rule lying inside loopback opens it (0.0.0.0/0 does not): the proxy's own reading.
        "127.0.0.1": any(isinstance(net, ipaddress.IPv4Network) and net.subnet_of(_LOOP4) for net, _ in rules.networks),
        "::1": any(network == _LOOP6 for network, _ in rules.networks),
    }
    local = ",".join(host for host, through_proxy in named.items() if not through_proxy)
    names = {"HTTP_PROXY": http, "HTTPS_PROXY": http, "ALL_PROXY": socks, "NO_PROXY": local}
    return {**names, **{name.lower(): value for name, value in names.items()}}


_LOOP4 = ipaddress.IPv4Network("127.0.0.0/8")
_LOOP6 = ipaddress.IPv6Network("::1/128")


__all__ = ["ADDRESS", "PORT", "CallNetwork", "environment", "listener_in"]
