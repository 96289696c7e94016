"""The allowlist attacked from inside a call: every spelling of a host, by SOCKS5, CONNECT and plain HTTP.

The call runs under bwrap with `--allow '*.allowed.test' --allow allowed.test
--allow 127.0.0.1:8080`, in the tests' own network (tests/networld.py), where
`allowed.test` and its subdomains are 203.0.113.13 and `evil.test` is 203.0.113.7.
A script in the sandbox speaks to trial-tool's proxy directly, as an attacker
would, and tags each attempt with a path of its own; the servers' logs then say
which attempts reached which host. The refused host must hear nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import COMMAND_PY, TrialFiles
from tests.networld import World, world
from trialtool import sandbox

__all__ = ["world"]  # the fixture, used by name

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {sandbox.unavailable()}"
)

#: The script the agent runs: each attempt (way, host bytes, port) made against the proxy, the answers printed.
ATTACK = r"""
import json, socket, struct, sys

def exchange(way, host, port, tag):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    inner = b"GET /" + tag + b" HTTP/1.0\r\nHost: x\r\n\r\n"
    try:
        if way.startswith("socks5"):
            s.sendall(b"\x05\x01\x00")
            assert s.recv(2) == b"\x05\x00"
            if way == "socks5":
                address = b"\x03" + bytes([len(host)]) + host
            elif way == "socks5-v4":
                address = b"\x01" + socket.inet_pton(socket.AF_INET, host.decode())
            else:
                address = b"\x04" + socket.inet_pton(socket.AF_INET6, host.decode())
            s.sendall(b"\x05\x01\x00" + address + struct.pack("!H", port))
            reply = b""
            while len(reply) < 10 and (chunk := s.recv(10 - len(reply))):
                reply += chunk
            if reply[1:2] != b"\x00":
                return "refused %d" % reply[1]
            s.sendall(inner)
        elif way == "connect":
            s.sendall(b"CONNECT " + host + b":" + str(port).encode() + b" HTTP/1.1\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head and (chunk := s.recv(4096)):
                head += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                return "refused " + head.split(b"\r\n")[0].decode()
            s.sendall(inner)
        else:
            target = b"http://" + host + b":" + str(port).encode() + b"/" + tag
            s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: evil.test\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        first = answer.split(b"\r\n")[0].decode(errors="replace")
        return ("refused " + first) if b"X-Trialtool-Reason" in answer else "reached " + first
    finally:
        s.close()

attempts = json.load(open(sys.argv[1]))
print(json.dumps([exchange(way, bytes.fromhex(host), port, tag.encode()) for way, host, port, tag in attempts]))
"""

#: (host as sent, port, the rule that refuses it, or None: allowed, and the name or address it is checked as)
REFUSED = [
    (b"evil.test\x00.allowed.test", 80, "bad_name"),
    (b"evil.test\x01.allowed.test", 80, "bad_name"),
    (b"evil.test\x7f.allowed.test", 80, "bad_name"),
    (b"evil.test%00.allowed.test", 80, "bad_name"),
    (b"evil.test\t.allowed.test", 80, "bad_name"),
    (b".".join([b"a" * 63] * 4), 80, "bad_name"),  # 255 characters: the most SOCKS5 carries, over 253
    (b"a" * 64 + b".allowed.test", 80, "bad_name"),
    (b"127.1", 8080, "bad_address"),
    (b"2130706433", 8080, "bad_address"),
    (b"0x7f.0.0.1", 8080, "bad_address"),
    (b"0177.0.0.1", 8080, "bad_address"),
    (b"[fe80::1%25lo]", 80, "bad_address"),
    (b"evil.test", 80, "not_listed"),
    (b"203.0.113.7", 80, "not_listed"),
    (b"[::ffff:203.0.113.7]", 80, "not_listed"),
]
ALLOWED = [
    (b"WWW.Allowed.Test", 80, "www.allowed.test", "203.0.113.13"),
    (b"www.allowed.test.", 80, "www.allowed.test", "203.0.113.13"),
    ("bücher.allowed.test".encode(), 80, "xn--bcher-kva.allowed.test", "203.0.113.13"),
    (b"allowed.test", 80, "allowed.test", "203.0.113.13"),
    (b"[::ffff:127.0.0.1]", 8080, "127.0.0.1", "127.0.0.1"),
]
#: By SOCKS5's address types: (type, address, port, rule or None).
BY_ADDRESS = [
    ("socks5-v4", "203.0.113.7", 80, "not_listed"),
    ("socks5-v6", "::ffff:203.0.113.7", 80, "not_listed"),
    ("socks5-v6", "::ffff:127.0.0.1", 8080, None),
    ("socks5-v4", "127.0.0.1", 8080, None),
]
WAYS = ("socks5", "connect", "http")


@pytest.fixture(scope="module")
def logs(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The servers' logs, by who they are (the world stops its servers when it closes)."""
    web = tmp_path_factory.mktemp("web")
    (web / "hello.txt").write_text("hello\n")
    return {
        "allowed": world.serve(web, "203.0.113.13", 80),
        "evil": world.serve(web, "203.0.113.7", 80),
        "loopback": world.serve(web, "127.0.0.1", 8080),
    }


def _socks_host(host: bytes) -> bytes:
    """SOCKS5 carries a host without brackets (an IPv6 address in the domain type is bare)."""
    return host[1:-1] if host.startswith(b"[") and host.endswith(b"]") else host


def test_no_spelling_of_a_host_by_any_way_reaches_a_host_the_list_does_not_name(
    world: World, logs: dict[str, list[str]], tmp_path: Path
) -> None:
    files = TrialFiles(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    attempts: list[tuple[str, str, int, str]] = []
    expected: list[tuple[str, str | None]] = []  # (tag, rule or None)
    for way in WAYS:
        for index, (host, port, rule) in enumerate(REFUSED):
            sent = _socks_host(host) if way == "socks5" else host
            attempts.append((way, sent.hex(), port, f"refused-{way}-{index}"))
            expected.append((f"refused-{way}-{index}", rule))
        for index, (host, port, _checked, _address) in enumerate(ALLOWED):
            sent = _socks_host(host) if way == "socks5" else host
            attempts.append((way, sent.hex(), port, f"allowed-{way}-{index}"))
            expected.append((f"allowed-{way}-{index}", None))
    for index, (way, address, port, rule) in enumerate(BY_ADDRESS):
        attempts.append((way, address.encode().hex(), port, f"address-{index}"))
        expected.append((f"address-{index}", rule))
    (workspace / "attempts.json").write_text(json.dumps(attempts))
    (workspace / "attack.py").write_text(ATTACK)
    flags = ["--sandbox", "bwrap", "--workspace", str(workspace), "--cwd", str(workspace)]
    flags += ["--allow", "*.allowed.test", "--allow", "allowed.test", "--allow", "127.0.0.1:8080"]
    flags += ["--call-timeout", "100", "--max-call-tokens", "100000"]
    argv = world.prefix() + files.argv(*flags, "--", COMMAND_PY, "attack.py", "attempts.json")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    outcome = dict(zip([tag for tag, _ in expected], answers, strict=True))
    for tag, rule in expected:
        assert outcome[tag].startswith("refused" if rule else "reached"), (tag, outcome[tag])

    # The refused host heard nothing; the allowed ones heard exactly the allowed attempts.
    assert logs["evil"] == []
    heard = logs["allowed"] + logs["loopback"]
    tags = {line.split()[1].lstrip("/") for line in heard}
    assert tags == {tag for tag, rule in expected if rule is None}

    network = files.records()[-1]["network"]
    refused = network["denied"]
    assert network["denied_count"] == len(refused) == sum(rule is not None for _, rule in expected)
    for way in WAYS:
        mine = [entry for entry in refused if entry["via"] == way]
        wanted = [rule for _host, _port, rule in REFUSED]
        if way == "socks5":  # and by its address types, last
            wanted += [rule for _way, _address, _port, rule in BY_ADDRESS if rule]
        assert [entry["rule"] for entry in mine] == wanted, way
        nul = mine[0]["host"]
        assert nul == "evil.test\\x00.allowed.test"  # escaped: what was sent, shown, never resolved
    allowed = [(entry["host"], entry["address"], entry["via"]) for entry in network["allowed"]]
    for way in WAYS:
        wanted_allowed = [(checked, address) for _host, _port, checked, address in ALLOWED]
        if way == "socks5":
            wanted_allowed += [("127.0.0.1", "127.0.0.1")] * 2
        assert [(host, address) for host, address, via in allowed if via == way] == wanted_allowed, way
    assert all(entry["address"] != "203.0.113.7" for entry in network["allowed"])
