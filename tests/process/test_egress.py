"""Network "allow" for real: pip, git, curl and a SOCKS client through the proxy, to hosts of the tests' own.

Every host is in a network namespace the tests make (tests/networld.py); trial-tool
runs inside it, so that its proxy resolves the tests' names and reaches their
addresses, and nothing else. The sandbox is bwrap, and for the calls' own cases
gVisor too (its sandbox reaches the proxy through a socket bound in).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMMAND_PY, TrialFiles, gvisor_unavailable
from tests.networld import World, git_repository, package_index, world
from trialtool import sandbox

__all__ = ["world"]  # the fixture, used by name

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {sandbox.unavailable()}"
)

ALLOW = (
    "--allow", "web.test", "--allow", "pypi.test:443", "--allow", "git.test:80",
    "--allow", "loop.test:8080", "--allow", "inside.test",
)  # fmt: skip


@pytest.fixture(scope="module")
def served(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The world with its servers: web (HTTP and HTTPS), a package index, a git repository, and the others."""
    web = tmp_path_factory.mktemp("web")
    (web / "hello.txt").write_text("hello from web.test\n")
    (web / "big.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    git = shutil.which("git")
    world.serve(web, "203.0.113.10", 80)
    world.serve(web, "203.0.113.10", 443, tls=True)
    world.serve(package_index(tmp_path_factory.mktemp("index")), "203.0.113.11", 443, tls=True)
    if git is not None:
        world.serve(git_repository(tmp_path_factory.mktemp("git"), git), "203.0.113.12", 80)
    for address, port in (("198.51.100.20", 80), ("10.77.0.5", 80), ("127.0.0.1", 8080)):
        world.serve(web, address, port)
    world.serve(package_index(tmp_path_factory.mktemp("local-index")), "127.0.0.1", 8081)
    return world


class Inside:
    """A trial whose calls run in the tests' world, in the sandbox `backend`."""

    def __init__(self, world: World, root: Path, allow: tuple[str, ...] = ALLOW, backend: str = "bwrap") -> None:
        self.world, self.files = world, TrialFiles(root)
        self.workspace = root / "ws"
        self.workspace.mkdir(exist_ok=True)
        # The world's certificate where the sandbox sees it: its /tmp is its own.
        self.cert = self.workspace / "cert.pem"
        shutil.copyfile(world.cert, self.cert)
        self.flags = ("--sandbox", backend, "--network", "allow", *allow, "--workspace", str(self.workspace))
        self.backend = backend

    def run(self, script: str, timeout: float = 120, *extra: str) -> subprocess.CompletedProcess[str]:
        call = ("--call-timeout", "100", "--cwd", str(self.workspace), *extra, "--", "sh", "-c", script)
        argv = self.world.prefix() + self.files.argv(*self.flags, *call)
        # Without the machine's own certificate settings: requests prefers REQUESTS_CA_BUNDLE to pip's --cert.
        env = {name: value for name, value in os.environ.items() if not name.startswith(_THEIRS)}
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)

    def network(self) -> dict[str, Any]:
        return self.files.records()[-1]["network"]


_THEIRS = ("PIP_", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_", "GIT_")


@pytest.fixture(params=["bwrap", "gvisor"])
def inside(served: World, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Inside]:
    if request.param == "gvisor" and (why := gvisor_unavailable()) is not None:
        pytest.skip(f"gVisor cannot run here: {why}")
    trial = Inside(served, tmp_path, backend=request.param)
    yield trial
    if request.param == "gvisor" and trial.files.state.exists():  # its sandbox ended
        trial.files.cli("close", "--state", str(trial.files.state), "--log", str(trial.files.log), timeout=120)


def test_curl_reaches_an_allowed_host_over_http_and_https(inside: Inside) -> None:
    cert = inside.cert
    done = inside.run(f"curl -sS http://web.test/hello.txt && curl -sS --cacert {cert} https://web.test/hello.txt")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from web.test\n" * 2
    network = inside.network()
    assert network["allowed_count"] == 2 and network["denied_count"] == 0
    plain, tunnel = network["allowed"]
    assert (plain["host"], plain["port"], plain["address"], plain["via"]) == ("web.test", 80, "203.0.113.10", "http")
    assert (tunnel["host"], tunnel["port"], tunnel["via"]) == ("web.test", 443, "connect")
    assert plain["received"] > len("hello from web.test\n") and tunnel["received"] > plain["received"]  # TLS
    assert tunnel["sent"] > 0 and tunnel["seconds"] >= 0 and "error" not in tunnel
    # A plain request's bytes went upstream too: its request line and fields, as passed on.
    assert plain["sent"] > len("GET /hello.txt HTTP/1.1\r\nHost: web.test\r\n\r\n")
    assert network["bytes_received"] == plain["received"] + tunnel["received"]
    assert network["bytes_sent"] == plain["sent"] + tunnel["sent"]
    state = inside.files.state_json()
    assert (state["connections_allowed"], state["connections_denied"]) == (2, 0)


def test_a_socks_client_reaches_an_allowed_host(inside: Inside) -> None:
    done = inside.run('curl -sS --proxy "$ALL_PROXY" http://web.test/hello.txt')
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from web.test\n"
    (entry,) = inside.network()["allowed"]
    assert (entry["via"], entry["host"], entry["address"]) == ("socks5", "web.test", "203.0.113.10")
    # A SOCKS client of our own, by address (not listed: refused by the ruleset, code 2).
    client = (
        "import socket; s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'\\x05\\x01\\x00');"
        "assert s.recv(2) == b'\\x05\\x00'; s.sendall(b'\\x05\\x01\\x00\\x01' + bytes([198, 51, 100, 20]) + b'\\x00P');"
        "print(s.recv(10)[1])"
    )
    done = inside.run(f'{COMMAND_PY} -c "{client}"')
    assert done.stdout == "2\n", done.stderr
    (denied,) = inside.network()["denied"]
    assert (denied["host"], denied["port"], denied["rule"]) == ("198.51.100.20", 80, "not_listed")
    assert denied["via"] == "socks5"


def test_pip_installs_a_wheel_from_an_allowed_index(inside: Inside) -> None:
    if subprocess.run([COMMAND_PY, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"{COMMAND_PY} has no pip")
    cert = inside.cert
    pip = f"{COMMAND_PY} -m pip --isolated install --no-cache-dir --disable-pip-version-check --cert {cert}"
    imported = 'import sys; sys.path.insert(0, "site"); import trialtool_testpkg as m; print(m.GREETING)'
    check = f"{COMMAND_PY} -c '{imported}'"
    done = inside.run(f"{pip} --index-url https://pypi.test/simple/ --target site trialtool-testpkg >&2 && {check}")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "installed through the allowlist\n"
    network = inside.network()
    assert {(entry["host"], entry["port"], entry["via"]) for entry in network["allowed"]} == {
        ("pypi.test", 443, "connect")
    }
    assert network["denied_count"] == 0


def test_git_clones_over_http_from_an_allowed_host(inside: Inside) -> None:
    if shutil.which("git") is None:
        pytest.skip("needs git")
    done = inside.run("git clone -q http://git.test/repo.git clone && cat clone/README")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "cloned through the allowlist\n"
    network = inside.network()
    assert network["allowed_count"] >= 2 and network["denied_count"] == 0  # refs, then objects
    assert {entry["host"] for entry in network["allowed"]} == {"git.test"}


def test_an_unlisted_host_is_denied_clearly_and_recorded(inside: Inside) -> None:
    cert = inside.cert
    done = inside.run(
        "curl -sS -i http://other.test/hello.txt; echo; curl -sS --cacert " + str(cert) + " https://other.test/; "
        "echo rc=$?; curl -sS http://web.test:8080/"
    )
    assert "HTTP/1.1 403 Forbidden" in done.stdout
    assert "trial-tool: other.test:80 is not on this trial's allowlist" in done.stdout
    assert "403" in done.stderr and "rc=56" in done.stdout  # curl: the CONNECT was refused
    assert "trial-tool: web.test:8080 is on this trial's allowlist, but not on this port" in done.stdout
    network = inside.network()
    assert network["allowed_count"] == 0 and network["denied_count"] == 3
    rules = [(entry["host"], entry["port"], entry["rule"], entry["via"]) for entry in network["denied"]]
    assert rules == [
        ("other.test", 80, "not_listed", "http"),
        ("other.test", 443, "not_listed", "connect"),
        ("web.test", 8080, "port_not_listed", "http"),
    ]
    assert all(entry["address"] is None for entry in network["denied"])  # never resolved
    assert all(0 <= entry["at"] < 60 for entry in network["denied"])


def test_an_allowed_name_that_resolves_to_a_private_or_loopback_address_is_refused(inside: Inside) -> None:
    done = inside.run("curl -sS http://inside.test/hello.txt; curl -sS http://loop.test:8080/hello.txt")
    assert "trial-tool: inside.test:80 is a private address" in done.stdout
    assert "trial-tool: loop.test:8080 is a loopback address" in done.stdout
    denied = [(entry["host"], entry["rule"], entry["address"]) for entry in inside.network()["denied"]]
    assert denied == [("inside.test", "private", "10.77.0.5"), ("loop.test", "loopback", "127.0.0.1")]


def test_a_private_address_named_by_address_is_reached(served: World, tmp_path: Path) -> None:
    trial = Inside(served, tmp_path, ("--allow", "10.77.0.5:80", "--allow", "0.0.0.0/0:*"))
    done = trial.run("curl -sS http://10.77.0.5/hello.txt; curl -sS --noproxy '' http://127.0.0.1:8080/hello.txt")
    assert done.stdout.startswith("hello from web.test\n"), done.stderr
    # 0.0.0.0/0 names every address, but opens no private range: 127.0.0.1 stays refused.
    assert "trial-tool: 127.0.0.1:8080 is a loopback address" in done.stdout
    network = trial.network()
    assert [entry["address"] for entry in network["allowed"]] == ["10.77.0.5"]
    assert [entry["rule"] for entry in network["denied"]] == ["loopback"]


def test_a_loopback_address_the_list_names_is_reached_by_ordinary_clients(served: World, tmp_path: Path) -> None:
    """curl, urllib and pip read NO_PROXY: a listed loopback address is not in it, so they go through the proxy."""
    if subprocess.run([COMMAND_PY, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"{COMMAND_PY} has no pip")
    trial = Inside(served, tmp_path, ("--allow", "127.0.0.1:8080", "--allow", "127.0.0.1:8081"))
    fetch = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/hello.txt').read().decode(), end='')"
    pip = f"{COMMAND_PY} -m pip --isolated install --no-cache-dir --disable-pip-version-check --target site"
    pip += " --index-url http://127.0.0.1:8081/simple/ --trusted-host 127.0.0.1 trialtool-testpkg"
    script = f'echo "$NO_PROXY"; curl -sS http://127.0.0.1:8080/hello.txt; {COMMAND_PY} -c "{fetch}"; {pip} >&2'
    done = trial.run(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "localhost,::1\n" + "hello from web.test\n" * 2
    assert (trial.workspace / "site" / "trialtool_testpkg.py").exists()
    network = trial.network()
    ports = {(entry["address"], entry["port"]) for entry in network["allowed"]}
    assert ports == {("127.0.0.1", 8080), ("127.0.0.1", 8081)} and network["denied_count"] == 0


def test_a_program_that_ignores_the_proxy_gets_nothing_at_once(inside: Inside) -> None:
    probe = (
        "import socket, time; start = time.monotonic()\n"
        "for address in ('203.0.113.10', '10.77.0.5', '8.8.8.8'):\n"
        "    try: socket.create_connection((address, 80), timeout=20)\n"
        "    except OSError as exc: print(address, exc.errno)\n"
        "print('seconds', time.monotonic() - start)\n"
    )
    done = inside.run(f"{COMMAND_PY} -c \"{probe}\"; curl -sS --noproxy '*' -m 20 http://web.test/; echo curl=$?")
    lines = done.stdout.splitlines()
    # ENETUNREACH; gVisor's own network stack says EHOSTUNREACH.
    unreachable = "113" if inside.backend == "gvisor" else "101"
    expected = [f"{address} {unreachable}" for address in ("203.0.113.10", "10.77.0.5", "8.8.8.8")]
    assert lines[:3] == expected, done.stderr
    assert float(lines[3].split()[1]) < 1.0
    assert "curl=6" in done.stdout or "curl=7" in done.stdout  # no name resolution, or no route
    network = inside.network()
    assert network["allowed_count"] == network["denied_count"] == 0


def test_a_flood_of_denied_attempts_leaves_a_bounded_record_and_an_exact_count(inside: Inside) -> None:
    flood = (
        "import socket\n"
        "for n in range(10000):\n"
        "    s = socket.create_connection(('127.0.0.1', 3128))\n"
        "    s.sendall(b'CONNECT flood%d.test:443 HTTP/1.1\\r\\n\\r\\n' % n)\n"
        "    assert s.recv(12) == b'HTTP/1.1 403'\n"
        "    s.close()\n"
        "print('done')\n"
    )
    started = time.monotonic()
    done = inside.run(f'{COMMAND_PY} -c "{flood}"', 200)
    assert done.stdout == "done\n", done.stderr
    assert time.monotonic() - started < 150
    network = inside.network()
    assert network["denied_count"] == 10000 and len(network["denied"]) == 100
    assert [entry["host"] for entry in network["denied"][:2]] == ["flood0.test", "flood1.test"]
    assert len(json.dumps(inside.files.records()[-1])) < 64 * 1024
    assert inside.files.state_json()["connections_denied"] == 10000
    verified = inside.files.cli("verify", "--state", str(inside.files.state), "--log", str(inside.files.log))
    assert verified.returncode == 0, verified.stdout


def test_show_lists_a_calls_connections(inside: Inside) -> None:
    inside.run("curl -sS http://web.test/hello.txt; curl -sS http://other.test/")
    shown = inside.files.cli("show", "--state", str(inside.files.state), "--log", str(inside.files.log), "--call", "1")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert "allowed web.test:80 203.0.113.10" in text
    assert "denied other.test:80 not_listed" in text


def test_the_lists_are_pinned_and_two_lists_break_the_fairness_check(tmp_path: Path) -> None:
    for name, allowed in (("a", "pypi.org"), ("b", "pypi.org"), ("c", "*.example.com:443")):
        (tmp_path / name / "ws").mkdir(parents=True)
        trial = TrialFiles(tmp_path / name)
        flags = ("--sandbox", "bwrap", "--allow", allowed, "--workspace", str(trial.root / "ws"))
        done = trial.call("true", flags=flags)
        assert done.returncode == 0, done.stderr
    pinned = TrialFiles(tmp_path / "a").state_json()["sandbox"]
    assert (pinned["network"], pinned["allow"]) == ("allow", ["pypi.org:443", "pypi.org:80"])
    again = TrialFiles(tmp_path / "a").call("true", flags=("--allow", "pypi.org:443"))
    assert again.returncode == 125, again.stderr
    assert b'--allow "pypi.org:443" differs from the value "pypi.org:443 pypi.org:80" pinned' in again.stderr
    done = TrialFiles(tmp_path).cli("report", "--format", "json", str(tmp_path), timeout=120)
    fairness = json.loads(done.stdout)["overview"]["fairness"]
    assert not fairness["same_rules"]
    (differs,) = [group["differs"] for group in fairness["others"]]
    assert differs["sandbox.allow"] == [["pypi.org:443", "pypi.org:80"], ["*.example.com:443"]]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_report_status_and_export_carry_each_trials_denials(tmp_path: Path) -> None:
    # Denials need no host: an unlisted name is refused before anything is resolved.
    tries = "for host in one.test two.test:8080; do curl -s -o /dev/null -w '%{http_code} ' http://$host/; done"
    for name, command in (("a", tries), ("b", "true")):
        (tmp_path / name / "ws").mkdir(parents=True)
        trial = TrialFiles(tmp_path / name)
        flags = ("--sandbox", "bwrap", "--allow", "pypi.org", "--workspace", str(trial.root / "ws"))
        done = trial.call("sh", "-c", command, flags=flags)
        assert done.returncode == 0, done.stderr
    assert TrialFiles(tmp_path / "a").records()[-1]["network"]["denied_count"] == 2
    reader = TrialFiles(tmp_path)
    status = reader.cli(
        "status", "--state", str(tmp_path / "a" / "state.json"), "--log", str(tmp_path / "a" / "log.jsonl")
    )
    assert b"network   0 connections allowed, 2 denied" in status.stdout, status.stdout
    overview = json.loads(reader.cli("report", "--format", "json", str(tmp_path)).stdout)["overview"]
    assert overview["connections"] == {"trials": 2, "allowed": 0, "denied": 2, "trials_with_denials": 1}
    table = reader.cli("report", str(tmp_path)).stdout.decode()
    assert "network: 2 trials on an allowlist; 0 connections allowed, 2 denied (in 1 trial)" in table
    rows = {line.split()[-1]: line.split()[4] for line in table.splitlines() if line.endswith("state.json")}
    assert rows == {"a/state.json": "2", "b/state.json": "0"}, table
    out = tmp_path / "out"
    out.mkdir()
    flags = ("--trials", str(out / "trials.csv"), "--connections", str(out / "connections.csv"), "-o", str(out / "c"))
    done = reader.cli("export", "--format", "csv", *flags, str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(out / "connections.csv", newline="") as handle:
        listed = list(csv.DictReader(handle))
    assert [(row["kind"], row["host"], row["port"], row["rule"]) for row in listed] == [
        ("denied", "one.test", "80", "not_listed"),
        ("denied", "two.test", "8080", "not_listed"),
    ]
    assert {row["sequence"] for row in listed} == {"1"} and listed[0]["trial_id"]
    with open(out / "trials.csv", newline="") as handle:
        denied = {row["state"].split("/")[-2]: row["connections_denied"] for row in csv.DictReader(handle)}
    assert denied == {"a": "2", "b": "0"}
    with open(out / "c", newline="") as handle:
        calls = {row["state"].split("/")[-2]: row["connections_denied"] for row in csv.DictReader(handle)}
    assert calls == {"a": "2", "b": "0"}
    # The state's count is checked against the log's records, as every total is.
    state = json.loads((tmp_path / "a" / "state.json").read_text())
    (tmp_path / "a" / "state.json").write_text(json.dumps({**state, "connections_denied": 1}))
    verified = reader.cli(
        "verify", "--state", str(tmp_path / "a" / "state.json"), "--log", str(tmp_path / "a" / "log.jsonl")
    )
    assert verified.returncode == 1 and b"'connections_denied': 2" in verified.stdout, verified.stdout


def test_the_command_gets_the_proxys_address_and_no_descriptor_of_it(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    trial = TrialFiles(tmp_path)
    listing = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    flags = (
        "--sandbox",
        "bwrap",
        "--allow",
        "pypi.org",
        "--workspace",
        str(tmp_path / "ws"),
        "--cwd",
        str(tmp_path / "ws"),
    )
    done = trial.call(COMMAND_PY, "-c", listing, flags=flags)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"[0, 1, 2, 3]\n"  # the three streams, and the listing's own
    done = trial.call("sh", "-c", "echo $HTTPS_PROXY $ALL_PROXY $no_proxy", flags=flags)
    assert done.stdout == b"http://127.0.0.1:3128 socks5h://127.0.0.1:3128 localhost,127.0.0.1,::1\n"


def test_allow_is_refused_where_it_cannot_hold(tmp_path: Path) -> None:
    trial = TrialFiles(tmp_path)
    for flags, words in (
        (("--sandbox", "none", "--network", "allow"), b"--network allow needs a sandbox"),
        (("--sandbox", "bwrap", "--network", "host", "--allow", "pypi.org"), b"--allow goes with --network allow"),
        (("--sandbox", "bwrap", "--allow", "pypi.org:99999"), b"the port must be 1 to 65535"),
    ):
        done = trial.call("true", flags=flags)
        assert done.returncode == 125 and words in done.stderr, done.stderr
        assert not trial.state.exists()


@pytest.mark.parametrize(
    ("allow", "direct"),
    [
        ((), "localhost,127.0.0.1,::1"),
        (("0.0.0.0/0:*", "[::/0]:*"), "localhost,127.0.0.1,::1"),  # a broad rule opens no loopback
        (("127.0.0.1:8080",), "localhost,::1"),
        (("127.0.0.0/8:*",), "localhost,::1"),
        (("[::1]:80",), "localhost,127.0.0.1"),
        (("localhost:8080", "127.0.0.1:8080"), "::1"),
    ],
)
def test_no_proxy_keeps_direct_only_the_loopback_the_list_does_not_name(allow: tuple[str, ...], direct: str) -> None:
    from trialtool.sandbox import egress
    from trialtool.sandbox import network as _netns

    environment = _netns.environment(egress.canonical(list(allow)))
    assert environment["NO_PROXY"] == environment["no_proxy"] == direct
