"""The proxy reads every name one way: real sockets on loopback, hostile bytes by SOCKS5, CONNECT and plain HTTP.

The proxy runs here in the test's process, on a listener of its own, with the
rules an attacker faced (`*.allowed.test`, `allowed.test`, on any port; the upstream's own
loopback address and port). Names are resolved by a table of the test's own
(every name it knows is the upstream's address), so that the only thing between
a name and a connection is the proxy's reading of it: the property is that the
resolver is asked only about a name the rules allow, in the very spelling the
rules were asked about, and that the upstream is reached only then.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trialtool.sandbox import egress
from trialtool.sandbox.network import Proxy


class Harness:
    """The proxy, an upstream listener on loopback, and a table of names that all resolve to it."""

    def __init__(self) -> None:
        self.upstream = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.upstream.setblocking(False)
        self.port = self.upstream.getsockname()[1]
        self.heard: list[bytes] = []
        self.asked: list[str] = []
        self.lock = threading.Lock()
        listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.address = listener.getsockname()
        allow = egress.canonical(["*.allowed.test:*", "allowed.test:*", f"127.0.0.1:{self.port}"])
        self.rules = egress.Rules(allow)
        self.proxy = Proxy(listener, allow, time.monotonic(), resolve=self.resolve)
        self.network: dict[str, Any] | None = None

    def finish(self) -> dict[str, Any]:
        """What the proxy says of the connections (it is finished once)."""
        if self.network is None:
            self.network = self.proxy.finish()
        return self.network

    def resolve(self, name: str, port: int) -> list[egress.IPAddress]:
        with self.lock:
            self.asked.append(name)
        return [ipaddress.IPv4Address("127.0.0.1")]

    def exchange(self, payload: bytes, way: str) -> tuple[bytes, int]:
        """Send `payload` by `way`; the proxy's answer, and how many connections reached the upstream.

        Waits on both the client's socket and the upstream's listener: a connection
        that reaches the upstream is accepted when it arrives (a plain request's
        head read from it, then closed), and the exchange ends when the proxy's
        own answer is complete or it hangs up.
        """
        reached = 0
        with socket.create_connection(self.address, timeout=10) as client:
            client.sendall(payload)
            answer = b""
            while not _complete(answer, way):
                ready, _, _ = select.select([client, self.upstream], [], [], 10)
                assert ready, "neither an answer nor a connection within 10 s"
                if self.upstream in ready:
                    reached += self._accept(way)
                if client in ready:
                    chunk = client.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
        return answer, reached + self._accept(way)

    def _accept(self, way: str) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.upstream.accept()
            except BlockingIOError:
                return count
            count += 1
            with conn:
                conn.setblocking(True)
                conn.settimeout(10)
                if way == "http":  # the proxy sends a plain request's head as soon as it connects
                    head = b""
                    while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
                        head += chunk
                    self.heard.append(head)


def _complete(answer: bytes, way: str) -> bool:
    if way == "socks5":
        return len(answer) >= 12  # the method's two bytes, then the reply's ten
    return way == "connect" and b"\r\n\r\n" in answer  # a plain request's answer ends when the proxy hangs up


@pytest.fixture
def harness() -> Iterator[Harness]:
    made = Harness()
    try:
        yield made
    finally:
        made.finish()
        made.upstream.close()


def socks(name: bytes, port: int) -> bytes:
    return b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port)


def connect(name: bytes, port: int) -> bytes:
    return b"CONNECT " + name + b":" + str(port).encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"


def plain(name: bytes, port: int) -> bytes:
    return b"GET http://" + name + b":" + str(port).encode() + b"/marker HTTP/1.1\r\nHost: evil.test\r\n\r\n"


WAYS = {"socks5": socks, "connect": connect, "http": plain}

_HOSTILE = st.one_of(
    st.binary(max_size=255),
    st.builds(
        lambda head, junk, tail: head + junk + tail,
        st.sampled_from([b"evil.test", b"", b"www", b"allowed.test", b"127.0.0.1", b"[::ffff:127.0.0.1]"]),
        st.binary(max_size=4),
        st.sampled_from([b".allowed.test", b".ALLOWED.test.", b"allowed.test", b"", b"%00.allowed.test"]),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_HOSTILE, way=st.sampled_from(sorted(WAYS)))
def test_for_any_bytes_as_a_name_the_proxy_connects_only_where_a_rule_allows_the_name_it_checked(
    harness: Harness, name: bytes, way: str
) -> None:
    before = len(harness.asked)
    _, reached = harness.exchange(WAYS[way](name, harness.port), way)
    asked = harness.asked[before:]
    for checked in asked:
        assert egress.host(checked) == checked  # the resolver got a checked name, as checked
        assert harness.rules.name_allowed(checked, harness.port) is None
        assert not checked.startswith("evil.test") or checked.endswith(".allowed.test")
    literal: object = None
    try:
        literal = egress.host(name.decode("utf-8"))
    except (egress.Malformed, UnicodeDecodeError):
        pass
    if reached:
        assert asked or literal == egress.host("127.0.0.1"), (name, way)


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize(
    ("name", "code"),
    [
        (b"evil.test\x00.allowed.test", "bad_name"),
        (b"evil.test%00.allowed.test", "bad_name"),
        (b"evil.test\x01.allowed.test", "bad_name"),
        (b"evil_test.allowed.test", "bad_name"),
        (b"a" * 64 + b".allowed.test", "bad_name"),
        (b"127.1", "bad_address"),
        (b"0x7f.0.0.1", "bad_address"),
        (b"2130706433", "bad_address"),
        (b"[fe80::1%25lo]", "bad_address"),
        (b"evil.test", "not_listed"),
    ],
)
def test_a_hostile_name_is_refused_with_its_rule_and_nothing_is_reached(
    harness: Harness, way: str, name: bytes, code: str
) -> None:
    answer, reached = harness.exchange(WAYS[way](name, harness.port), way)
    assert reached == 0 and harness.asked == []
    assert answer[2:4] == b"\x05\x02" if way == "socks5" else answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403"))
    network = harness.finish()
    (denied,) = network["denied"]
    assert denied["rule"] == code and denied["via"] == way
    shown = denied["host"]
    assert shown.isascii() and shown.isprintable() and "\x00" not in shown
    if b"\x00" in name:
        assert "\\x00" in shown  # escaped, so that a grader sees what was sent


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize(
    ("name", "checked"),
    [
        (b"WWW.Allowed.Test", "www.allowed.test"),
        (b"www.allowed.test.", "www.allowed.test"),
        ("bücher.allowed.test".encode(), "xn--bcher-kva.allowed.test"),
    ],
)
def test_a_legitimate_spelling_is_allowed_as_the_list_says(
    harness: Harness, way: str, name: bytes, checked: str
) -> None:
    _, reached = harness.exchange(WAYS[way](name, harness.port), way)
    assert harness.asked == [checked] and reached == 1
    network = harness.finish()
    (allowed,) = network["allowed"]
    assert (allowed["host"], allowed["address"], allowed["via"]) == (checked, "127.0.0.1", way)


@pytest.mark.parametrize("way", sorted(WAYS))
def test_an_address_is_connected_as_parsed_and_a_mapped_one_as_its_ipv4(harness: Harness, way: str) -> None:
    reached = [
        harness.exchange(WAYS[way](spelling, harness.port), way)[1]
        for spelling in (b"127.0.0.1", b"[::ffff:127.0.0.1]")
    ]
    assert reached == [1, 1] and harness.asked == []
    network = harness.finish()
    assert [entry["address"] for entry in network["allowed"]] == ["127.0.0.1", "127.0.0.1"]


def test_a_plain_request_carries_the_checked_host_and_not_the_clients(harness: Harness) -> None:
    assert harness.exchange(plain(b"www.allowed.test", harness.port), "http")[1] == 1
    (request,) = harness.heard
    head = request.split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"GET /marker HTTP/1.1"
    assert [field for field in head if field.lower().startswith(b"host:")] == [
        f"Host: www.allowed.test:{harness.port}".encode()
    ]


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET http://www.allowed.test/ HTTP/1.1\r\nX: a\x00b\r\n\r\n",  # NUL in a field
        b"GET http://www.allowed.test/ HTTP/1.1\r\nX: a\rb\r\n\r\n",  # a bare CR
        b"GET http://www.allowed.test/a\x01b HTTP/1.1\r\n\r\n",  # a control byte in the path
        b"GET http://evil.test@www.allowed.test/ HTTP/1.1\r\n\r\n",  # credentials in the authority
        b"GET http://www.allowed.test/#x HTTP/1.1\r\n\r\n",
        b"GET  http://www.allowed.test/ HTTP/1.1\r\n\r\n",
        b"GET http://www.allowed.test/ HTTP/2\r\n\r\n",
        b"get http://www.allowed.test/ HTTP/1.1\r\n\r\n",
        b"GET /origin-form HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n",
    ],
)
def test_a_request_head_in_no_spelling_the_proxy_reads_is_refused(harness: Harness, request_head: bytes) -> None:
    answer, reached = harness.exchange(request_head, "http")
    assert answer.startswith(b"HTTP/1.1 400")
    assert reached == 0 and harness.asked == []
    (denied,) = harness.finish()["denied"]
    assert denied["rule"] == "protocol"
