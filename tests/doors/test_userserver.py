"""The per-user server the CLI reaches: started once, found again, replaced when gone, refused when unsafe.

Each test has a server directory of its own (TRIALTOOL_SERVER_DIR) and stops
every server it started. The rest of the CLI's tests run through a server too
(the `cli_mode` fixture), so these are about the server's own life.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import TrialFiles, marked, stop_servers
from trialtool.ledger._verify import verify
from trialtool.server import wire as userwire

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-user server is Linux only")


@pytest.fixture
def trial(tmp_path: Path) -> TrialFiles:
    """The trial, without the conftest's two modes: every test here is about the server."""
    return TrialFiles(tmp_path)


def server_pids(directory: Path) -> list[int]:
    """The live servers listening in `directory` (their command line names the socket)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            ours = any(str(directory) in part for part in cmdline)
            if proc.info["status"] != psutil.STATUS_ZOMBIE and "trialtool.server._server" in cmdline and ours:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def status(trial: TrialFiles) -> dict[str, object]:
    done = trial.cli("server", "status")
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.timeout(120)
def test_racing_first_calls_start_one_server(trial: TrialFiles, servers: Path) -> None:
    results = trial.parallel(trial.argv("--max-calls", "20", "--", "echo", "hi"), 20)
    assert results == [(0, b"hi\n")] * 20
    assert len(server_pids(servers)) == 1
    assert verify(trial.state, trial.log).ok


def test_status_and_stop(trial: TrialFiles, servers: Path) -> None:
    assert status(trial)["running"] is False
    assert trial.call("true").returncode == 0
    running = status(trial)
    assert running["running"] is True and running["pid"] in server_pids(servers)
    stopped = trial.cli("server", "stop")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["running"] is False
    assert (
        not psutil.pid_exists(int(str(running["pid"]))) or psutil.Process(int(str(running["pid"]))).status() == "zombie"
    )
    assert status(trial)["running"] is False


def test_a_stale_socket_is_replaced(trial: TrialFiles, servers: Path) -> None:
    assert trial.call("true").returncode == 0
    path = Path(str(status(trial)["socket"]))
    stop_servers(servers)
    # A socket file left by a server that died without removing it: nothing listens there.
    with socket.socket(socket.AF_UNIX) as stale:
        userwire.reach(stale, str(path), bind=True)
    assert path.exists()
    done = trial.call("echo", "again")
    assert done.returncode == 0 and done.stdout == b"again\n"
    assert len(server_pids(servers)) == 1


def test_a_server_of_another_version_is_left_alone(trial: TrialFiles, servers: Path) -> None:
    servers.mkdir(mode=0o700)
    other = servers / "server-0.0.1-00000000.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        userwire.reach(listener, str(other), bind=True)
        listener.listen()
        listener.setblocking(False)
        assert trial.call("echo", "mine").stdout == b"mine\n"
        with pytest.raises(BlockingIOError):
            listener.accept()  # never contacted


@pytest.mark.parametrize("problem", ["mode", "owner", "symlink"])
def test_an_unsafe_server_directory_is_refused(trial: TrialFiles, servers: Path, tmp_path: Path, problem: str) -> None:
    if problem == "owner" and os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    if problem == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        servers.symlink_to(tmp_path / "elsewhere")
    else:
        servers.mkdir(mode=0o700)
        if problem == "mode":
            servers.chmod(0o755)
        else:
            os.chown(servers, 65534, 65534)
    done = trial.call("echo", "hi")
    assert done.returncode == 125 and done.stdout == b""
    assert done.stderr.count(b"\n") == 1 and b"server's directory" in done.stderr
    assert not trial.state.exists()


def test_a_server_killed_between_calls_is_replaced(trial: TrialFiles, servers: Path) -> None:
    assert trial.call("true").returncode == 0
    [pid] = server_pids(servers)
    os.kill(pid, signal.SIGKILL)
    psutil.Process(pid).wait(timeout=30) if psutil.pid_exists(pid) else None
    done = trial.call("echo", "next")
    assert done.returncode == 0 and done.stdout == b"next\n"
    assert server_pids(servers) != [pid] and len(server_pids(servers)) == 1


def running_call(trial: TrialFiles, marker: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A CLI call through the server whose command (marked) has started: it says so through a FIFO."""
    assert trial.call("true").returncode == 0  # the first call starts the server (and runs in process)
    started = tmp_path / "started"
    os.mkfifo(started)
    cli = subprocess.Popen(
        trial.argv("--", "sh", "-c", f"echo printed; echo up > {started}; sleep 300; : {marker}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        started.read_bytes()  # the command is running: the event
    except BaseException:
        cli.kill()
        cli.wait()
        raise
    return cli


@pytest.mark.timeout(90)
def test_a_server_killed_during_a_call(trial: TrialFiles, servers: Path, marker: str, tmp_path: Path) -> None:
    cli = running_call(trial, marker, tmp_path)
    try:
        [pid] = server_pids(servers)
        os.kill(pid, signal.SIGKILL)
        out, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
        cli.wait()
    assert cli.returncode == 125 and out == b""  # nothing delivered, not even what was printed
    assert b"died during the call" in err and err.count(b"\n") == 1
    assert trial.call("true").returncode == 0
    statuses = [record["status"] for record in trial.records()]
    assert statuses == ["ok", "abandoned", "ok"]
    assert marked(marker) == []


@pytest.mark.timeout(90)
def test_a_cli_killed_mid_call_stops_it_and_it_is_recorded(
    trial: TrialFiles, servers: Path, marker: str, tmp_path: Path
) -> None:
    cli = running_call(trial, marker, tmp_path)
    cli.kill()
    cli.communicate()
    # The server sees the connection close and stops the call; its record is written then.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(trial.records()) < 2:
        time.sleep(0.01)  # no event to wait on from here: the record is the server's
    [_, record] = trial.records()
    assert record["status"] == "interrupted" and record["withheld"] is True
    assert marked(marker) == []
    assert verify(trial.state, trial.log).ok


@pytest.mark.timeout(60)
def test_the_server_exits_when_idle(trial: TrialFiles, servers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough that the server is still there when looked for on a loaded machine; short enough to wait out.
    monkeypatch.setenv("TRIALTOOL_SERVER_IDLE", "3")
    assert trial.call("true").returncode == 0
    [pid] = server_pids(servers)
    psutil.Process(pid).wait(timeout=30)
    assert list(servers.glob("*.sock")) == []
    assert trial.call("echo", "woken").stdout == b"woken\n"


def test_the_caller_keeps_its_environment_umask_and_limits(trial: TrialFiles, servers: Path) -> None:
    assert trial.call("true").returncode == 0  # the server starts with this process's settings
    script = "echo $MINE; umask; ulimit -n; ulimit -s"
    env = dict(os.environ, MINE="from-the-caller")
    done = subprocess.run(
        ["sh", "-c", 'umask 027; ulimit -n 77; ulimit -s 4096; exec "$@"', "sh", *trial.argv("--", "sh", "-c", script)],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.stdout.decode().split() == ["from-the-caller", "0027", "77", "4096"], done.stderr
    # The next caller's own settings, not the last one's.
    mine = os.umask(0)
    os.umask(mine)
    assert trial.call("sh", "-c", "echo ${MINE:-unset}; umask").stdout == f"unset\n{mine:04o}\n".encode()


def two_answers(payload: bytes) -> list[dict[str, object]]:
    """`payload` sent to the server straight (as the CLI would), and its first two answers: taken, and how it ended."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        userwire.reach(sock, userwire.socket_path())
        sock.sendall(payload)
        frames = userwire.Frames(sock)
        answers = []
        while len(answers) < 2:
            message = frames.pop()
            if message is None:
                assert frames.feed(), "the server closed the connection"
                continue
            answers.append(message)
    return answers


@pytest.mark.timeout(60)
def test_a_signal_right_behind_the_request_is_not_lost(trial: TrialFiles, servers: Path) -> None:
    from tests.ledger.test_durability import stopped_lock_holder
    from trialtool.doors.options import quick
    from trialtool.server import client as userclient

    assert trial.call("true").returncode == 0  # the first call starts the server
    args = quick("run", ["--state", str(trial.state), "--log", str(trial.log)])
    assert args is not None
    with stopped_lock_holder(trial):
        before = trial.snapshot()
        # The call waits for the ledger lock; the signal arrives in the same read as the request.
        payload = userwire.frame(userclient.request(args, ["echo", "never"]))
        answers = two_answers(payload + userwire.frame({"signal": int(signal.SIGTERM)}))
        assert answers[0] == {"accepted": True}
        assert answers[1]["exit"] == 128 + signal.SIGTERM and "nothing is charged" in answers[1]["error"]
        assert trial.snapshot() == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("field", "value"), [("command", "echo hi"), ("cwd", None), ("stdin", "text"), ("flags", [])])
def test_a_malformed_call_gets_one_clear_line_and_charges_nothing(
    trial: TrialFiles, servers: Path, field: str, value: object
) -> None:
    from trialtool.doors.options import quick
    from trialtool.server import client as userclient

    assert trial.call("true").returncode == 0  # the first call starts the server
    args = quick("run", ["--state", str(trial.state), "--log", str(trial.log)])
    assert args is not None
    before = trial.snapshot()
    request = {**userclient.request(args, ["echo", "never"]), field: value}
    answers = two_answers(userwire.frame(request))
    assert answers[0] == {"accepted": True}
    assert answers[1]["exit"] == 125 and answers[1]["error"].startswith("the call's request to the server is malformed")
    assert field in answers[1]["error"]
    assert trial.snapshot() == before


#: Connects to the socket argv[1], asks for the server's status, prints how many bytes came back.
#: By its name in its directory: the whole path may be longer than a socket address can hold.
ASK_STATUS = """
import marshal, os, socket, sys
message = marshal.dumps({"control": "status"})
os.chdir(os.path.dirname(sys.argv[1]))
with socket.socket(socket.AF_UNIX) as sock:
    sock.settimeout(30)
    sock.connect(os.path.basename(sys.argv[1]))
    answer = b""
    try:
        sock.sendall(len(message).to_bytes(4, "big") + message)
        while chunk := sock.recv(65536):
            answer += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed before or after our request was read: no answer either way
print(len(answer))
"""


@pytest.mark.timeout(120)
def test_another_users_process_gets_no_answer(trial: TrialFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        pytest.skip("needs root and setpriv to connect as the user nobody")
    # Where nobody can reach the socket's directory (the test's tmp_path is root's alone, and TMPDIR
    # may be too: a directory of our own in /var/tmp, whose parents anyone may pass through).
    work = Path(tempfile.mkdtemp(prefix="trialtool-peer-", dir="/var/tmp"))
    servers = work / "servers"
    monkeypatch.setenv("TRIALTOOL_SERVER_DIR", str(servers))
    monkeypatch.setenv("TRIALTOOL_SERVER", "on")
    try:
        work.chmod(0o755)
        assert trial.call("true").returncode == 0
        path = str(status(trial)["socket"])
        # Permissions opened up by mistake: the peer-credential check is what is left.
        servers.chmod(0o755)
        os.chmod(path, 0o777)
        python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
        ask = [python if Path(python).exists() else sys.executable, "-c", ASK_STATUS, path]
        drop = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        theirs = subprocess.run([*drop, *ask], capture_output=True, timeout=60, cwd="/")
        assert theirs.returncode == 0, theirs.stderr
        assert theirs.stdout == b"0\n"  # connected, then closed without a word
        ours = subprocess.run(ask, capture_output=True, timeout=60, cwd="/")
        assert ours.returncode == 0 and int(ours.stdout) > 0, ours.stderr
    finally:
        stop_servers(servers)
        shutil.rmtree(work)


def test_python_and_python3_of_one_installation_reach_one_server(trial: TrialFiles, servers: Path) -> None:
    names = [Path(sys.executable).parent / name for name in ("python", "python3")]
    pythons = [str(path) for path in names if path.exists()]
    if len(pythons) < 2 or len({os.path.realpath(path) for path in pythons}) != 1:
        pytest.skip(f"needs python and python3 naming one interpreter beside {sys.executable}")
    argv = ["--state", str(trial.state), "--log", str(trial.log), "--sandbox", "none", "--", "true"]
    for python in pythons:
        started = subprocess.run([python, "-m", "trialtool", *argv], capture_output=True, timeout=60)
        assert started.returncode == 0, started.stderr
    pids = {
        json.loads(subprocess.run([python, "-m", "trialtool", "server", "status"], capture_output=True).stdout)["pid"]
        for python in pythons
    }
    assert len(pids) == 1 and server_pids(servers) == list(pids)


def test_the_server_runs_only_its_own_code_whatever_its_first_caller_set(
    trial: TrialFiles, servers: Path, tmp_path: Path
) -> None:
    """A first caller's PYTHONPATH (a sitecustomize), PYTHONSTARTUP, LD_PRELOAD and BASH_ENV reach
    neither the server nor the processes it starts; its command gets them, as the caller's own."""
    planted = tmp_path / "planted"
    planted.mkdir()
    ran = tmp_path / "ran-in"
    (planted / "sitecustomize.py").write_text(
        f"import os\nwith open({str(ran)!r}, 'a') as f:\n"
        "    f.write(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode() + '\\n')\n"
    )
    hostile = {
        "PYTHONPATH": str(planted),
        "PYTHONSTARTUP": str(planted / "sitecustomize.py"),
        "LD_PRELOAD": str(planted / "nothing.so"),  # not there: the loader only complains, but names it
        "BASH_ENV": str(planted / "sitecustomize.py"),
    }
    env = dict(os.environ, **hostile)
    script = "echo $PYTHONPATH $LD_PRELOAD"
    done = subprocess.run(trial.argv("--", "sh", "-c", script), capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == [hostile["PYTHONPATH"], hostile["LD_PRELOAD"]]
    # The server the first call started, serving a second call of a clean caller.
    assert trial.call("python3", "-c", "print('clean')").stdout == b"clean\n"
    [pid] = server_pids(servers)
    server = psutil.Process(pid)
    for process in [server, *server.children(recursive=True)]:
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        names = {entry.partition(b"=")[0].decode() for entry in environ if entry}
        assert not names & set(hostile), (process.cmdline(), names)
        assert "-I" in process.cmdline() or process.pid != pid
    # sitecustomize ran in the first CLI process (the caller's own interpreter) and nowhere of the server's.
    lines = ran.read_text().splitlines() if ran.exists() else []
    assert not [line for line in lines if "userserver" in line or "forkserver" in line], lines


def test_callers_whose_server_settings_differ_reach_servers_of_their_own(trial: TrialFiles, servers: Path) -> None:
    """PATH says where the server finds bwrap and docker: a caller with another PATH gets another server."""
    assert trial.call("true").returncode == 0
    env = dict(os.environ, PATH=os.environ["PATH"] + ":/nonexistent-dir")
    assert subprocess.run(trial.argv("--", "true"), env=env, timeout=60).returncode == 0
    assert subprocess.run(trial.argv("--", "true"), env=env, timeout=60).returncode == 0
    assert len(server_pids(servers)) == 2
