"""trial-tool's side of a call's network: the proxy that lets out only what the trial's allowlist allows.

It runs in the supervisor, on threads of its own, for the one call: it accepts
on the listener made in the call's network namespace (_netns.py), speaks HTTP
(a plain request, or `CONNECT`) and SOCKS5 on the one port, told apart by the
first byte, decides each connection by the pinned rules (sandbox/_egress.py), resolves
an allowed name here, and connects to the very address it checked.

Every host, port and request line is read once, strictly, by one parser
(egress.host, egress.authority, egress.port): what the rules are asked about is
the very string the resolver gets, so no two readers can read one name two
ways (a NUL byte, which a C resolver takes for the name's end, is a bad name).
Traffic is relayed, never read: a plain HTTP request's head is checked field by
field and rewritten to the origin's form, with the checked authority as its
Host and `Connection: close`, one request a connection, so that each is
checked. A denial is answered at once: HTTP 400 or 403 with a one-line reason,
or the SOCKS refusal.

Every attempt is counted, and the first `egress.LISTED` of each kind kept for the
call's record: allowed ones with the address connected, bytes each way and
duration; denied ones with the rule's code. A flood cannot grow the record.
"""

from __future__ import annotations

import ipaddress
import os
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

from .. import _egress as egress

#: Connections open at once; more are refused (`capacity`).
MAX_OPEN = 256
#: A request's head: its longest, and how long it may take to arrive.
HEAD_LIMIT = 64 * 1024
HEAD_SECONDS = 30.0
#: Seconds to connect to one address of an allowed host.
CONNECT_SECONDS = 10.0
_CHUNK = 256 * 1024
#: Fields not passed on: hop-by-hop ones, and Host (the checked authority's is sent instead).
_DROPPED = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"upgrade", b"host"}
)


class Refused(Exception):
    """A request this proxy will not serve: what to answer, and the code the record gets."""

    def __init__(self, code: str, status: int = 403) -> None:
        super().__init__(code)
        self.code, self.status = code, status


class Proxy:
    """One call's proxy: started on the listener, `finish`ed once the command's tree is gone."""

    def __init__(
        self,
        listener: socket.socket,
        allow: Sequence[str],
        started: float,
        resolve: Callable[[str, int], list[egress.IPAddress]] | None = None,
    ) -> None:
        self.rules = egress.Rules(allow)
        #: How a checked name becomes addresses: the system's resolver, or a test's table of its own.
        self.resolve = resolve or system_resolve
        self.listener, self.started = listener, started
        self.lock = threading.Lock()
        self.allowed: list[dict[str, object]] = []
        self.denied: list[dict[str, object]] = []
        self.allowed_count = self.denied_count = self.sent = self.received = 0
        self.open: set[socket.socket] = set()
        self.handlers: set[threading.Thread] = set()
        self.wake_r, self.wake_w = os.pipe()
        listener.setblocking(False)
        self.thread = threading.Thread(target=self._accept, name="trialtool-proxy", daemon=True)
        self.thread.start()

    def finish(self, linger: float = 2.0) -> dict[str, object]:
        """Stop accepting, end every open connection, and say what the call's network did."""
        os.write(self.wake_w, b"x")
        self.thread.join(linger)
        with self.lock:
            for sock in self.open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            handlers = list(self.handlers)
        end = time.monotonic() + linger
        for handler in handlers:
            handler.join(max(0.0, end - time.monotonic()))
        self.listener.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        with self.lock:
            return {
                "allowed": [dict(entry) for entry in self.allowed],
                "denied": list(self.denied),
                "allowed_count": self.allowed_count,
                "denied_count": self.denied_count,
                "bytes_sent": self.sent,
                "bytes_received": self.received,
            }

    def _now(self) -> float:
        return round(time.monotonic() - self.started, 6)

    def _accept(self) -> None:
        while True:
            ready, _, _ = select.select([self.listener.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                return
            try:
                client, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError:
                return  # out of descriptors, say: the listener stays, the backlog waits
            with self.lock:
                busy = len(self.handlers) >= MAX_OPEN
            if busy:
                self._deny("", 0, "capacity", "", None)
                client.close()
                continue
            handler = threading.Thread(target=self._serve, args=(client,), daemon=True)
            with self.lock:
                self.handlers.add(handler)
                self.open.add(client)
            handler.start()

    def _serve(self, client: socket.socket) -> None:
        try:
            client.setblocking(True)
            client.settimeout(HEAD_SECONDS)
            first = client.recv(1, socket.MSG_PEEK)
            if first == b"\x05":
                self._socks(client)
            elif first:
                self._http(client)
        except OSError:
            pass
        finally:
            with self.lock:
                self.open.discard(client)
                self.handlers.discard(threading.current_thread())
            client.close()

    def _deny(self, host: str, port: int, code: str, via: str, address: str | None) -> None:
        host = host[: egress.HOST_CHARS]
        entry = {"host": host, "port": port, "rule": code, "address": address, "via": via, "at": self._now()}
        with self.lock:
            self.denied_count += 1
            if len(self.denied) < egress.LISTED:
                self.denied.append(entry)

    def _connect(self, where: str | egress.IPAddress, port: int, via: str) -> tuple[socket.socket, dict[str, object]]:
        """The connection to `where` (a checked name or address) on `port` if the rules allow it, and its entry.

        The name the rules were asked about is the very string resolved; the
        address connected is one the rules allowed. Refused if not allowed.
        """
        host = str(where)
        if isinstance(where, str):
            code = self.rules.name_allowed(where, port)
            if code is not None:
                self._deny(host, port, code, via, None)  # never resolved: no lookup leaves for an unlisted name
                raise Refused(code)
            resolved = list(dict.fromkeys(egress.unmapped(address) for address in self.resolve(where, port)))
            candidates = [a for a in resolved if self.rules.address_allowed(a, port, named=True) is None]
            if resolved and not candidates:
                code = self.rules.address_allowed(resolved[0], port, named=True) or "reserved"
                self._deny(host, port, code, via, str(resolved[0]))
                raise Refused(code)
        else:
            code = self.rules.address_allowed(where, port, named=False)
            if code is not None:
                self._deny(host, port, code, via, host)
                raise Refused(code)
            candidates = [where]
        entry: dict[str, object] = {"host": host, "port": port, "address": None, "via": via}
        entry.update(sent=0, received=0, seconds=0.0, at=self._now())
        with self.lock:
            self.allowed_count += 1
            if len(self.allowed) < egress.LISTED:
                self.allowed.append(entry)
        if not candidates:
            entry["error"] = "the name does not resolve"
            raise Refused("unresolved", 502)
        error: OSError | None = None
        for address in candidates:
            upstream = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            upstream.settimeout(CONNECT_SECONDS)
            try:
                upstream.connect((str(address), port))
            except OSError as exc:
                upstream.close()
                error = exc
                continue
            entry["address"] = str(address)
            with self.lock:
                self.open.add(upstream)
            return upstream, entry
        entry["address"] = str(candidates[-1])
        entry["error"] = "timed out" if isinstance(error, TimeoutError) else (getattr(error, "strerror", None) or "")
        raise Refused("unreachable", 504 if isinstance(error, TimeoutError) else 502)

    def _relay(
        self, client: socket.socket, upstream: socket.socket, entry: dict[str, object], begun: float, sent: int = 0
    ) -> None:
        """Copy both ways until the far end is done; the bytes counted into `entry`, after the `sent` already."""
        client.settimeout(None)
        upstream.settimeout(None)
        buffer = memoryview(bytearray(_CHUNK))
        received = 0
        peers = {client: upstream, upstream: client}
        reading = [client, upstream]
        try:
            while reading:
                ready, _, _ = select.select(reading, [], [])
                for sock in ready:
                    count = sock.recv_into(buffer)
                    if not count:
                        if sock is upstream:
                            return  # the far end is done: so is the connection
                        reading.remove(client)
                        upstream.shutdown(socket.SHUT_WR)
                        continue
                    peers[sock].sendall(buffer[:count])
                    if sock is client:
                        sent += count
                    else:
                        received += count
        except OSError:
            pass
        finally:
            with self.lock:
                entry.update(sent=sent, received=received, seconds=round(time.monotonic() - begun, 6))
                self.sent += sent
                self.received += received
                self.open.discard(upstream)
            upstream.close()

    def _http(self, client: socket.socket) -> None:
        head = bytearray()
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk or len(head) > HEAD_LIMIT:
                if head.strip():
                    self._deny("", 0, "protocol", "http", None)
                    _answer(client, 400, "protocol", "", 0)
                return
            head += chunk
        whole, _, rest = bytes(head).partition(b"\r\n\r\n")
        line, *fields = whole.split(b"\r\n")
        begun = time.monotonic()
        via, given, port, shown, sent = "http", "", 0, "", 0
        try:
            method, target, version = _request_line(line)
            via = "connect" if method == "CONNECT" else "http"
            if method == "CONNECT":
                given = target
                where, port = egress.authority(target, None)
                shown = str(where)
                upstream, entry = self._connect(where, port, via)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                given, path = _absolute(target)
                where, port = egress.authority(given, 80)
                shown = str(where)
                kept = _fields(fields)
                upstream, entry = self._connect(where, port, via)
                # The Host field is the checked authority's, never the client's (RFC 9112, 3.2.2).
                name = f"[{where}]" if isinstance(where, ipaddress.IPv6Address) else str(where)
                authority = name if port == 80 else f"{name}:{port}"
                lines = [f"{method} {path} {version}".encode("ascii"), f"Host: {authority}".encode("ascii"), *kept]
                request = b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + rest
                upstream.sendall(request)
                sent, rest = len(request), b""
        except egress.Malformed as bad:
            self._deny(*_shown(given), bad.code, via, None)
            _answer(client, 400, bad.code, "", 0)
            return
        except Refused as refused:
            if refused.code == "protocol":
                self._deny("", 0, "protocol", via, None)
            _answer(client, refused.status, refused.code, shown, port)
            return
        if rest:
            upstream.sendall(rest)
            sent += len(rest)
        self._relay(client, upstream, entry, begun, sent)

    def _socks(self, client: socket.socket) -> None:
        _, count = _exactly(client, 2)
        if 0 not in _exactly(client, count):
            client.sendall(b"\x05\xff")
            self._deny("", 0, "protocol", "socks5", None)
            return
        client.sendall(b"\x05\x00")
        _, command, _, kind = _exactly(client, 4)
        given = ""
        try:
            if kind == 1:
                where: str | egress.IPAddress = ipaddress.IPv4Address(_exactly(client, 4))
            elif kind == 4:
                where = egress.unmapped(ipaddress.IPv6Address(_exactly(client, 16)))
            elif kind == 3:
                raw = _exactly(client, _exactly(client, 1)[0])
                given = raw.decode("utf-8", "backslashreplace")
                where = egress.host(raw.decode("utf-8"))  # bytes that are no UTF-8: a bad name, below
            else:
                client.sendall(b"\x05\x08\x00\x01" + bytes(6))
                self._deny("", 0, "protocol", "socks5", None)
                return
        except (egress.Malformed, UnicodeDecodeError) as bad:
            _exactly(client, 2)
            code = bad.code if isinstance(bad, egress.Malformed) else "bad_name"
            client.sendall(b"\x05\x02\x00\x01" + bytes(6))
            self._deny(egress.escaped(given), 0, code, "socks5", None)
            return
        port = struct.unpack("!H", _exactly(client, 2))[0]
        if command != 1 or port == 0:  # CONNECT only, to a port
            client.sendall(b"\x05\x07\x00\x01" + bytes(6))
            self._deny(str(where), port, "protocol", "socks5", None)
            return
        begun = time.monotonic()
        try:
            upstream, entry = self._connect(where, port, "socks5")
        except Refused as refused:
            reply = {"unresolved": 4, "unreachable": 5}.get(refused.code, 2)
            client.sendall(bytes([5, reply, 0, 1]) + bytes(6))
            return
        client.sendall(b"\x05\x00\x00\x01" + bytes(6))
        self._relay(client, upstream, entry, begun)


def system_resolve(name: str, port: int) -> list[egress.IPAddress]:
    """The addresses of a checked host name, by the system's resolver (given as ASCII bytes: nothing re-read)."""
    try:
        found = socket.getaddrinfo(name.encode("ascii"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in found]


#: A request line's method: an upper-case token; its version: HTTP/1.0 or 1.1.
_METHOD = re.compile(rb"[A-Z]{1,20}")
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
#: A field line: a token, a colon, then a value of visible bytes, spaces and tabs (no NUL, CR or LF).
_FIELD = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*")


def _shown(given: str) -> tuple[str, int]:
    """A refused authority as its record shows it: the host's text escaped, and the port where it is one."""
    try:
        where, text = egress.split(given)
    except egress.Malformed:
        return egress.escaped(given), 0
    try:
        number = egress.port(text) if text is not None else 0
    except egress.Malformed:
        number = 0
    return egress.escaped(where), number


def _request_line(line: bytes) -> tuple[str, str, str]:
    """(method, target, version) of `method SP target SP version`, the target as UTF-8; else Refused."""
    parts = line.split(b" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or parts[2] not in _VERSIONS:
        raise Refused("protocol", 400)
    try:
        target = parts[1].decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("protocol", 400) from None
    return parts[0].decode("ascii"), target, parts[2].decode("ascii")


def _absolute(target: str) -> tuple[str, str]:
    """(authority, path and query) of a plain request's `http://authority[/path][?query]`; else Refused."""
    if target[:7].lower() != "http://":
        raise Refused("protocol", 400)
    rest = target[7:]
    cut = min((rest.index(c) for c in "/?" if c in rest), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority or "#" in target:  # no credentials in the authority, no fragment in a request
        raise Refused("protocol", 400)
    if path.startswith("?") or not path:
        path = "/" + path
    if not all("!" <= c <= "~" for c in path):
        raise Refused("protocol", 400)
    return authority, path


def _fields(fields: list[bytes]) -> list[bytes]:
    """The request's field lines to pass on: each checked; hop-by-hop ones and Host dropped; else Refused."""
    if not all(_FIELD.fullmatch(field) for field in fields):
        raise Refused("protocol", 400)
    return [field for field in fields if field.split(b":", 1)[0].lower() not in _DROPPED]


def _exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionResetError("the client hung up")
        data += chunk
    return data


def _answer(client: socket.socket, status: int, code: str, host: str, port: int) -> None:
    """The HTTP answer to a request not served: one line saying why."""
    what = f"{host}:{port}" if host else "the request"
    reason = egress.REASONS.get(code) or {
        "unresolved": "does not resolve",
        "unreachable": "cannot be reached",
    }.get(code, "was refused")
    text = f"trial-tool: {what} {reason}\n".encode("utf-8", "replace")
    title = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 504: "Gateway Timeout"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\nContent-Length: {len(text)}\r\n"
    try:
        client.sendall(head.encode() + f"X-Trialtool-Reason: {code}\r\nConnection: close\r\n\r\n".encode() + text)
    except OSError:
        pass


__all__ = ["MAX_OPEN", "Proxy"]
