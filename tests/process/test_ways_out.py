"""The sandbox's ways out to the host, attacked from inside a call: none leads anywhere.

Each test is an attack a sandboxed command can make in a setup harnesses use
every day: reach the per-user server's socket, plant code in trial-tool's own
installation, plant a `bwrap` on PATH, swap a pinned path for a symlink. After
each: a marker outside every writable path does not exist, `verify` is clean,
and the records tell the truth. Real bwrap, real servers, real files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import COMMAND_PY, calls_of, gvisor_unavailable, stop_servers
from trialtool import sandbox as seam

PY = sys.executable

pytestmark = pytest.mark.skipif(
    seam.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {seam.unavailable()}"
)


class Host:
    """A trial's files beside a workspace, a marker no command can write, and the CLI to call with."""

    def __init__(self, root: Path, backend: str = "bwrap") -> None:
        self.root, self.backend = root, backend
        self.workspace = root / "ws"
        self.workspace.mkdir()
        (root / "trial").mkdir()
        self.state = root / "trial" / "s.json"
        self.log = root / "trial" / "l.jsonl"
        #: Outside every writable path: only a process on the host can make it.
        self.marker = root / "ESCAPED"

    def call(
        self,
        command: str,
        *,
        env: dict[str, str] | None = None,
        python: str = PY,
        flags: tuple[str, ...] | None = None,
        state: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A call of this trial (or of another, `state`, beside it), pinned to its backend unless `flags` say not."""
        files = [self.state, self.log] if state is None else [self.root / f"{state}.json", self.root / f"{state}.jsonl"]
        argv = [python, "-m", "trialtool", "--state", str(files[0]), "--log", str(files[1])]
        argv += ["--sandbox", self.backend] if flags is None else flags
        argv += ["--", "sh", "-c", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=self.workspace, env=env)

    def records(self) -> list[dict[str, Any]]:
        return calls_of([json.loads(line) for line in self.log.read_text().splitlines()]) if self.log.exists() else []

    def assert_clean(self, calls: int) -> None:
        assert not self.marker.exists(), "a command ran on the host"
        checked = subprocess.run(
            [PY, "-m", "trialtool", "verify", "--state", str(self.state), "--log", str(self.log)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        records = self.records()
        assert len(records) == calls
        assert all(record["sandbox"] == self.backend for record in records if record.get("status") != "refused")


@pytest.fixture
def host(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return Host(tmp_path_factory.mktemp("w"))


@pytest.fixture(params=["bwrap", "gvisor"])
def any_host(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Host]:
    """A Host under each backend over the host's root: bwrap's, and gVisor's (its sandbox ended after)."""
    if request.param == "gvisor" and (why := gvisor_unavailable()) is not None:
        pytest.skip(f"gVisor cannot run here: {why}")
    made = Host(tmp_path_factory.mktemp("w"), request.param)
    yield made
    for state in (made.state, *made.root.glob("*.json")):
        if request.param == "gvisor" and state.exists():
            log = state.with_suffix(".jsonl") if state != made.state else made.log
            closing = [PY, "-m", "trialtool", "close", "--state", str(state), "--log", str(log)]
            subprocess.run(closing, capture_output=True, timeout=120, env=_env(TRIALTOOL_SERVER="off"))


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _attack_payload(host: Host, path: Path) -> None:
    """What a command would send a server it found: an unsandboxed call of a fresh trial that writes the marker."""
    from trialtool.doors.options import parse
    from trialtool.server import client as userclient
    from trialtool.server import wire as userwire

    evil = host.workspace / "evil"
    args = parse("run", ["--state", f"{evil}.json", "--log", f"{evil}.jsonl", "--sandbox", "none"])
    request = userclient.request(args, ["sh", "-c", f"touch {host.marker}"])
    path.write_bytes(userwire.frame(request))


#: Run inside the sandbox: find every server socket in the workspace, send the payload, say what came back.
KNOCK = """
import glob, marshal, os, socket, sys
payload = open(sys.argv[1], "rb").read()
for path in glob.glob(os.getcwd() + "/**/server-*.sock", recursive=True):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(os.path.relpath(path))  # short, however deep the workspace is
        sock.sendall(payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        print("refused", path, exc)
        continue
    first = marshal.loads(data[4 : 4 + int.from_bytes(data[:4], "big")]) if data else None
    print("answered", path, first)
print("done")
"""


def _peer_pid(path: Path) -> int | None:
    """The pid of the server listening at `path`, from its socket (SO_PEERCRED); None if none listens."""
    import socket
    import struct

    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return None
        return int(struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0])


def _stop_other_worlds(directory: Path) -> None:
    """Stop the servers in `directory` that are not of this process's world (they take no `stop` from it)."""
    from trialtool.server._wire import identity

    for path in directory.glob("server-*.sock") if directory.is_dir() else []:
        pid = None if path.name == f"server-{identity()}.sock" else _peer_pid(path)
        if pid is None:
            continue
        try:
            process = psutil.Process(pid)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass


def _server_stopper(directory: Path) -> None:
    """Stop every server in `directory`: its own world's by `stop`, any other by SIGTERM."""
    stop_servers(directory)
    _stop_other_worlds(directory)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["TRIALTOOL_SERVER_DIR", "TMPDIR"])
@pytest.mark.parametrize("mode", ["server", "in-process"])
def test_a_command_cannot_have_the_server_run_a_call_on_the_host(any_host: Host, where: str, mode: str) -> None:
    host = any_host
    # The server's directory where the sandbox can see it: in the workspace.
    visible = host.workspace / "runtime"
    visible.mkdir(mode=0o700)
    server_dir = visible if where == "TRIALTOOL_SERVER_DIR" else visible / f"trialtool-{os.getuid()}"
    env = _env(
        TRIALTOOL_SERVER_DIR=str(visible) if where == "TRIALTOOL_SERVER_DIR" else None,
        TMPDIR=str(visible) if where == "TMPDIR" else None,
        XDG_RUNTIME_DIR=None,
        TRIALTOOL_SERVER="on",
    )
    payload = host.root / "trial" / "payload"
    _attack_payload(host, payload)
    try:
        # A server for this environment, started by a first call and then warm.
        assert host.call("true", env=env).returncode == 0
        assert list(server_dir.glob("server-*.sock"))
        shutil.copy(payload, host.workspace / "payload")
        call_env = dict(env, TRIALTOOL_SERVER="on" if mode == "server" else "off")
        done = host.call(f"{COMMAND_PY} -c '{KNOCK}' payload", env=call_env)
        assert done.returncode == 0, done.stderr
        assert "done" in done.stdout
        # Hidden from the command, as the trial's own files are: it found no socket at all.
        assert "answered" not in done.stdout, done.stdout
        host.assert_clean(2)
    finally:
        _server_stopper(server_dir)


def _start_other_server(host: Host, other: Path, state: str) -> None:
    """A server started (by a call of trial `state`) in `other`, a directory in the workspace that the trial's
    calls do not name, so that no sandbox hides it; and the attack's payload in the workspace."""
    other.mkdir(mode=0o700)
    _attack_payload(host, host.workspace / "payload")
    started = host.call("true", env=_env(TRIALTOOL_SERVER_DIR=str(other), TRIALTOOL_SERVER="on"), state=state)
    assert started.returncode == 0 and list(other.glob("server-*.sock")), started.stderr


@pytest.mark.timeout(180)
def test_a_server_the_sandbox_can_reach_runs_nothing_for_it(host: Host) -> None:
    """Where the socket is not hidden (another environment's server), the server itself refuses the sandbox."""
    other = host.workspace / "other-runtime"
    try:
        _start_other_server(host, other, "test")
        # This call's own server directory is elsewhere: the other one is not among those it hides.
        done = host.call(f"{COMMAND_PY} -c '{KNOCK}' payload", env=_env(TRIALTOOL_SERVER="off"))
        assert done.returncode == 0, done.stderr
        assert "answered" in done.stdout and "other_world" in done.stdout, done.stdout
        host.assert_clean(1)
        # And the server is still there for the harness, which it serves.
        again = host.call("echo still", env=_env(TRIALTOOL_SERVER_DIR=str(other), TRIALTOOL_SERVER="on"), state="test")
        assert again.returncode == 0 and again.stdout == "still\n"
    finally:
        _server_stopper(other)


@pytest.mark.timeout(180)
def test_through_the_api_a_command_reaches_no_server_either(host: Host) -> None:
    from trialtool import Trial

    other = host.workspace / "other-runtime"
    try:
        _start_other_server(host, other, "cli")
        limits = {"sandbox": "bwrap", "workspace": str(host.workspace)}
        with Trial(host.state, host.log, limits=limits) as trial:
            result = trial.run(["sh", "-c", f"{COMMAND_PY} -c '{KNOCK}' payload"], cwd=host.workspace)
        assert result.exit_code == 0, result.stderr
        assert "other_world" in result.stdout and "done" in result.stdout, result.stdout
        host.assert_clean(1)
    finally:
        _server_stopper(other)


@pytest.mark.timeout(180)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("mode", ["server", "in-process"])
def test_a_caller_with_fewer_capabilities_gets_no_more_through_the_server(tmp_path: Path, mode: str) -> None:
    state = tmp_path / "s.json"
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    log_dir.chmod(0o555)  # root may write it only with CAP_DAC_OVERRIDE
    argv = [PY, "-m", "trialtool", "--state", str(state), "--log", str(log_dir / "l.jsonl"), "--sandbox", "none"]
    reduced = ["setpriv", "--bounding-set", "-dac_override", "--inh-caps", "-dac_override"]
    env = _env(TRIALTOOL_SERVER="on" if mode == "server" else "off")
    server_dir = Path(os.environ["TRIALTOOL_SERVER_DIR"])
    try:
        for _ in range(2):  # the first of its world starts its server; the second reaches it
            done = subprocess.run(
                [*reduced, *argv, "--", "true"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
            )
            assert done.returncode == 125, done.stdout + done.stderr
            assert done.stderr.count("\n") == 1
            assert not (log_dir / "l.jsonl").exists()
        assert not state.exists() or json.loads(state.read_text())["calls"] == 0
    finally:
        log_dir.chmod(0o755)
        _stop_other_worlds(server_dir)


def _venv_in_workspace(host: Host, editable: bool) -> str:
    """A virtualenv in the workspace that runs this trialtool: the repository's way (or an editable checkout's)."""
    import site
    import sysconfig

    import trialtool

    venv = host.workspace / ".venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    source = Path(trialtool.__file__).resolve().parent
    if editable:
        # An editable install of a checkout inside the workspace: the package's source is the workspace's.
        checkout = host.workspace / "src"
        checkout.mkdir()
        shutil.copytree(source, checkout / "trialtool", ignore=shutil.ignore_patterns("__pycache__"))
        top = str(checkout)
    else:
        top = str(source.parent)
    # This test run's dependencies (tiktoken, psutil) from where they are installed now.
    deps = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    Path(purelib, "trialtool-under-test.pth").write_text("\n".join([top, *dict.fromkeys(deps)]) + "\n")
    return python


@pytest.mark.timeout(240)
@pytest.mark.parametrize("editable", [False, True], ids=["venv", "editable"])
@pytest.mark.parametrize("mode", ["server", "in-process"])
def test_code_planted_in_trial_tools_installation_never_runs(any_host: Host, editable: bool, mode: str) -> None:
    host = any_host
    python = _venv_in_workspace(host, editable)
    env = _env(TRIALTOOL_SERVER="on" if mode == "server" else "off")
    first = host.call("true", env=env, python=python)
    assert first.returncode == 0, first.stderr
    purelib = next((host.workspace / ".venv" / "lib").glob("python*/site-packages"))
    package = host.workspace / "src" / "trialtool" if editable else None
    plant = [
        f'echo \'import os; open("{host.marker}", "w").close()\' > {purelib}/zz-evil.pth && echo PLANTED-pth',
        f'echo \'open("{host.marker}", "w").close()\' >> {purelib}/trialtool-under-test.pth && echo PLANTED-path',
        f"mv {host.workspace}/.venv {host.workspace}/.venv-moved && echo MOVED-venv",
    ]
    if package is not None:
        plant += [
            f'echo \'open("{host.marker}", "w").close()\' >> {package}/__init__.py && echo PLANTED-module',
            f"mv {host.workspace}/src {host.workspace}/src-moved && echo MOVED-src",
        ]
    done = host.call("; ".join(plant) + "; true", env=env, python=python)
    assert done.returncode == 0, done.stderr
    assert "PLANTED" not in done.stdout and "MOVED" not in done.stdout, done.stdout
    # The harness calls again, and again in a fresh process: nothing planted is imported.
    for _ in range(2):
        again = host.call("echo ok", env=env, python=python)
        assert again.returncode == 0 and again.stdout == "ok\n", again.stderr
    # Still usable, read-only: the workspace's tools run from the venv.
    ran = host.call(".venv/bin/python -c 'print(1 + 1)'", env=env, python=python)
    assert ran.stdout == "2\n", ran.stderr
    host.assert_clean(5)


FAKE_BWRAP = '#!/bin/sh\ntouch {marker}\nexec /usr/bin/env bwrap "$@"\n'


@pytest.mark.parametrize("mode", ["server", "in-process"])
def test_a_bwrap_planted_on_path_never_runs(host: Host, mode: str) -> None:
    bin_dir = host.workspace / "bin"
    bin_dir.mkdir()
    # An activated venv in the workspace, and "." on PATH: both where the command may write.
    env = _env(PATH=f"{bin_dir}:.:{os.environ['PATH']}", TRIALTOOL_SERVER="on" if mode == "server" else "off")
    first = host.call("true", env=env)
    assert first.returncode == 0, first.stderr
    fake = FAKE_BWRAP.format(marker=host.marker)
    planted = host.call(
        f"printf '{fake}' > bin/bwrap && printf '{fake}' > bwrap && chmod +x bin/bwrap bwrap && echo ok", env=env
    )
    assert planted.stdout == "ok\n", planted.stderr
    again = host.call("echo again", env=env)
    assert again.returncode == 0 and again.stdout == "again\n", again.stderr
    host.assert_clean(3)
    # A new trial made with the fakes there pins no fake either.
    fresh = host.call("echo fresh", env=env, state="fresh")
    assert fresh.stdout == "fresh\n", fresh.stderr
    pinned = json.loads((host.root / "fresh.json").read_text())["sandbox"]["binary"]["path"]
    assert pinned == os.path.realpath(shutil.which("bwrap") or "/usr/bin/bwrap")
    assert not host.marker.exists()


def _own_bwrap(directory: Path) -> Path:
    """A copy of the real bwrap in a directory of the test's own, which the test may then change."""
    directory.mkdir(mode=0o755)
    copy = directory / "bwrap"
    shutil.copy2(os.path.realpath(shutil.which("bwrap") or "/usr/bin/bwrap"), copy)
    copy.chmod(0o755)
    return copy


@pytest.mark.parametrize("change", ["replaced", "removed", "touched"])
def test_a_pinned_bwrap_that_changed_fails_closed(host: Host, change: str) -> None:
    copy = _own_bwrap(host.root / "tools")
    env = _env(PATH=f"{copy.parent}:{os.environ['PATH']}", TRIALTOOL_SERVER="off")
    assert host.call("true", env=env).returncode == 0
    assert json.loads(host.state.read_text())["sandbox"]["binary"]["path"] == str(copy)
    before = host.state.read_bytes(), host.log.read_bytes()
    if change == "replaced":
        copy.unlink()
        copy.write_text(FAKE_BWRAP.format(marker=host.marker))
        copy.chmod(0o755)
    elif change == "removed":
        copy.unlink()
    else:
        os.utime(copy, ns=(0, 0))
    for server in ("off", "on"):
        done = host.call("echo hi", env=dict(env, TRIALTOOL_SERVER=server))
        assert done.returncode == 125 and done.stdout == "", done.stdout + done.stderr
        assert done.stderr.count("\n") == 1 and "sandbox executable" in done.stderr
        assert (host.state.read_bytes(), host.log.read_bytes()) == before
    assert not host.marker.exists()


def test_auto_says_why_it_fell_back(host: Host) -> None:
    """`auto` on a machine where bwrap cannot make a sandbox: unsandboxed, and the state and status say why."""
    tools = host.root / "tools"
    tools.mkdir(mode=0o755)
    (tools / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (tools / "bwrap").chmod(0o755)
    env = _env(PATH=f"{tools}:{os.environ['PATH']}", TRIALTOOL_SERVER="off")
    argv = [PY, "-m", "trialtool", "--state", str(host.state), "--log", str(host.log), "--sandbox", "auto"]
    done = subprocess.run([*argv, "--", "echo", "hi"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout == "hi\n", done.stderr
    pinned = json.loads(host.state.read_text())["sandbox"]
    assert pinned["mode"] == "none"
    assert "No permissions to create new namespace" in pinned["fallback"]
    status = subprocess.run(
        [PY, "-m", "trialtool", "status", "--state", str(host.state), "--log", str(host.log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "No permissions to create new namespace" in status.stdout, status.stdout
    report = subprocess.run(
        [PY, "-m", "trialtool", "report", str(host.state.parent), "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    header, row = report.stdout.splitlines()[:2]
    assert "sandbox_fallback" in header.split(",") and "No permissions to create new namespace" in row
    # Asked for outright, it is refused with bwrap's own words, nothing created.
    strict = subprocess.run(
        [
            PY,
            "-m",
            "trialtool",
            "--state",
            str(host.root / "s3.json"),
            "--log",
            str(host.root / "l3.jsonl"),
            "--sandbox",
            "bwrap",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert strict.returncode == 125 and "No permissions to create new namespace" in strict.stderr
    assert not (host.root / "s3.json").exists()


@pytest.mark.parametrize("mode", ["server", "in-process"])
@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
def test_a_nested_writable_path_cannot_be_swapped_for_a_symlink(tmp_path: Path, mode: str, backend: str) -> None:
    if backend == "gvisor" and (why := gvisor_unavailable()) is not None:
        pytest.skip(f"gVisor cannot run here: {why}")
    outer = tmp_path / "H"
    workspace = outer / "work" / "repo"
    workspace.mkdir(parents=True)
    (tmp_path / "trial").mkdir()
    secret_dir = tmp_path / "host-dir"
    secret_dir.mkdir()
    state, log = tmp_path / "trial" / "s.json", tmp_path / "trial" / "l.jsonl"
    argv = [PY, "-m", "trialtool", "--state", str(state), "--log", str(log)]
    pinned = ["--sandbox", backend, "--workspace", str(workspace), "--writable", str(outer)]
    env = _env(TRIALTOOL_SERVER="on" if mode == "server" else "off")

    def call(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
        # Later calls need not repeat the pinned settings: they are the state's.
        return subprocess.run(
            [*argv, *flags, "--", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=60
        )

    assert call("true", *pinned).returncode == 0
    # From inside: the way to the workspace cannot be renamed, so no symlink can take its place.
    swap = call(
        f"cd {outer} && mv work work2 && mkdir work && ln -s ../../trial work/repo && echo SWAPPED; "
        f"mv {workspace} {outer}/moved && echo MOVED; true"
    )
    assert swap.returncode == 0, swap.stderr
    assert "SWAPPED" not in swap.stdout and "MOVED" not in swap.stdout, swap.stdout
    after = call(f"ls {workspace}; touch {secret_dir}/x 2>/dev/null && echo WROTE; cat {state} && echo READ; true")
    assert "WROTE" not in after.stdout and "READ" not in after.stdout, after.stdout
    assert not (secret_dir / "x").exists()
    # From the host (a concurrent call, an older version): the pin refuses what took the path's place.
    before = state.read_bytes(), log.read_bytes()
    (outer / "work").rename(outer / "work2")
    (outer / "work").mkdir()
    (outer / "work" / "repo").symlink_to(Path("..") / ".." / "host-dir")
    refused = call(f"touch {workspace}/x; echo ran")
    assert refused.returncode == 125 and refused.stdout == "", refused.stdout + refused.stderr
    assert "pinned path" in refused.stderr and refused.stderr.count("\n") == 1
    assert (state.read_bytes(), log.read_bytes()) == before
    assert not (secret_dir / "x").exists()
    # Put back, it runs again: the pin is the directory itself, wherever its name went meanwhile.
    (outer / "work" / "repo").unlink()
    (outer / "work").rmdir()
    (outer / "work2").rename(outer / "work")
    assert call("echo back").stdout == "back\n"
    verified = subprocess.run(
        [PY, "-m", "trialtool", "verify", "--state", str(state), "--log", str(log)], capture_output=True, timeout=60
    )
    assert verified.returncode == 0
    if backend == "gvisor":  # its sandbox ended
        subprocess.run([*argv[:-4], "close", *argv[-4:]], capture_output=True, timeout=120, env=env)


def test_the_server_keeps_no_no(host: Host) -> None:
    """A sandbox refused once (bwrap failing here) is asked about again: once it works, the server sees it."""
    tools = host.root / "tools"
    tools.mkdir(mode=0o755)
    (tools / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (tools / "bwrap").chmod(0o755)
    servers = host.root / "servers"
    servers.mkdir(mode=0o700)
    env = _env(TRIALTOOL_SERVER_DIR=str(servers), TRIALTOOL_SERVER="on")
    try:
        assert host.call("true", env=env, flags=("--sandbox", "none"), state="warm").returncode == 0
        refused = host.call("true", env=dict(env, PATH=f"{tools}:{os.environ['PATH']}"))
        assert refused.returncode == 125 and "No permissions" in refused.stderr, refused.stderr
        assert not host.state.exists()
        works = host.call("echo works", env=env)
        assert works.returncode == 0 and works.stdout == "works\n", works.stderr
        host.assert_clean(1)
    finally:
        _server_stopper(servers)


@pytest.mark.parametrize("mode", ["server", "in-process"])
def test_the_shims_and_paths_named_read_only_stay_as_they_were(host: Host, mode: str) -> None:
    env = _env(TRIALTOOL_SERVER="on" if mode == "server" else "off")
    shims = host.workspace / "shims"
    pinned = ["--sandbox", "bwrap", "--workspace", str(host.workspace)]
    made = subprocess.run(
        [PY, "-m", "trialtool", "shim", str(shims), "--state", str(host.state), "--log", str(host.log), *pinned],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    before = (shims / "sh").read_bytes()
    # A command run through the shim tries to rewrite the shim the harness runs next.
    evil = f"#!/bin/sh\ntouch {host.marker}\n"
    done = subprocess.run(
        [str(shims / "sh"), "-c", f"printf '{evil}' > {shims}/sh && echo REWROTE; mv {shims} x && echo MOVED; true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=host.workspace,
    )
    assert done.returncode == 0, done.stderr
    assert "REWROTE" not in done.stdout and "MOVED" not in done.stdout, done.stdout
    assert (shims / "sh").read_bytes() == before
    # The grader's tests in the workspace, named read-only for the agent's calls.
    tests = host.workspace / "tests"
    tests.mkdir()
    (tests / "test_task.py").write_text("assert True\n")
    change = host.call(
        "echo 'assert False' > tests/test_task.py && echo CHANGED; rm -rf tests && echo REMOVED; "
        "cat tests/test_task.py",
        env=env,
        flags=("--read-only", str(tests)),
    )
    assert change.returncode == 0, change.stderr
    assert "CHANGED" not in change.stdout and "REMOVED" not in change.stdout and "assert True" in change.stdout
    assert (tests / "test_task.py").read_text() == "assert True\n"
    host.assert_clean(2)


@pytest.mark.parametrize("mode", ["server", "in-process"])
def test_an_import_path_entry_yet_to_be_made_cannot_be_made_by_a_command(host: Host, mode: str) -> None:
    later = host.workspace / "lib-later"
    env = _env(PYTHONPATH=str(later), TRIALTOOL_SERVER="on" if mode == "server" else "off")
    planted = host.call(
        f'mkdir -p {later} && echo \'open("{host.marker}", "w").close()\' > {later}/sitecustomize.py && echo PLANTED;'
        " true",
        env=env,
    )
    assert planted.returncode == 0, planted.stderr
    assert "PLANTED" not in planted.stdout, planted.stdout
    assert later.is_dir() and not any(later.iterdir())  # made, empty, by trial-tool
    assert host.call("echo again", env=env).stdout == "again\n"
    host.assert_clean(2)
