"""The bwrap sandbox, escaped for real: each escape runs as a call and must fail, the trial intact after.

Two layouts of the trial's files: beside the workspace (their directory is
covered) and inside it (each file overmounted, calls one at a time). Every
test runs real bwrap; on a machine where it cannot run, they are skipped, and
the reason is shown.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMMAND_PY, calls_of, marked
from trialtool import sandbox

PY = sys.executable
KEY = "k3y-0f-the-ledger-" + "x" * 20
#: Run inside a call: every process it can see, a line each (its pid and program).
PROCESSES = (
    "import os\n"
    "for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n"
    "    print(pid, open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0].decode())\n"
)

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {sandbox.unavailable()}"
)


class Sandboxed:
    """A keyed trial pinned to bwrap, its workspace, and its files laid out as `layout` says."""

    def __init__(self, root: Path, layout: str) -> None:
        self.root = root
        self.workspace = root / "ws"
        self.workspace.mkdir()
        home = self.workspace if layout == "inside" else root / "trial"
        home.mkdir(exist_ok=True)
        self.state = home / "state.json"
        self.log = home / "log.jsonl"
        self.lock = home / "state.json.lock"
        self.key = home / "ledger.key" if layout == "inside" else root / "ledger.key"
        self.key.write_text(KEY)
        self.flags = ["--state", str(self.state), "--log", str(self.log), "--key-file", str(self.key)]
        self.pinned = ["--sandbox", "bwrap", "--workspace", str(self.workspace)]

    def call(self, *command: str, flags: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [PY, "-m", "trialtool", *self.flags, *self.pinned, *flags, "--", *command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.workspace)

    def sh(self, script: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.call("sh", "-c", script, **kwargs)

    def records(self) -> list[dict[str, Any]]:
        return calls_of([json.loads(line) for line in self.log.read_text().splitlines()])

    def state_json(self) -> dict[str, Any]:
        return json.loads(self.state.read_text())

    def verify(self) -> subprocess.CompletedProcess[str]:
        argv = [PY, "-m", "trialtool", "verify", *self.flags]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    def assert_intact(self, calls: int) -> None:
        checked = self.verify()
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert self.state_json()["calls"] == calls
        assert len(self.records()) == calls


@pytest.fixture(params=["beside", "inside"])
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Sandboxed:
    return Sandboxed(tmp_path, request.param)


def test_the_trial_pins_the_sandbox_and_records_it(box: Sandboxed) -> None:
    done = box.sh("echo hi")
    assert done.returncode == 0 and done.stdout == "hi\n", done.stderr
    pinned = box.state_json()["sandbox"]
    info = box.workspace.stat()
    bwrap = os.stat(pinned["binary"]["path"])
    assert pinned == {
        "mode": "bwrap",
        "network": "none",
        "workspace": str(box.workspace),
        "writable": [],
        "binary": {
            "path": os.path.realpath(shutil.which("bwrap") or "/usr/bin/bwrap"),
            "device": bwrap.st_dev,
            "inode": bwrap.st_ino,
            "size": bwrap.st_size,
            "mtime_ns": bwrap.st_mtime_ns,
        },
        "pins": [{"path": str(box.workspace), "device": info.st_dev, "inode": info.st_ino}],
        "fallback": None,
        "home": "trial",
        "home_path": os.path.realpath(os.path.expanduser("~")),
        # A root caller's command runs as nobody; anyone else's as its caller.
        "run_as": "65534:65534" if os.geteuid() == 0 else f"{os.geteuid()}:{os.getegid()}",
    }
    assert box.records()[0]["sandbox"] == "bwrap"


def test_the_trial_files_cannot_be_read_written_or_moved(box: Sandboxed) -> None:
    assert box.sh("true").returncode == 0  # the trial and its log exist
    before = box.state.read_bytes()
    attempts = []
    for path in (box.state, box.log, box.lock):
        attempts += [
            f"cat {path} && echo LEAK-read-{path.name}",
            f"echo x >> {path} && echo LEAK-append-{path.name}",
            f"true > {path} && echo LEAK-truncate-{path.name}",
            f"mv {path} {path}.moved && echo LEAK-rename-{path.name}",
            f"rm {path} && echo LEAK-delete-{path.name}",
        ]
    attempts.append(f"cat {box.key} && echo LEAK-key")
    # The trial's /tmp, replaced by a link to where the next call would then write.
    tmp = f"{box.state.parent}/.state.json.sandbox-tmp-*"
    attempts.append(f"mv {tmp} {box.workspace}/moved-tmp && ln -s /etc {tmp} && echo LEAK-tmp")
    # The directory holding them, renamed or replaced (a fresh trial's budget).
    attempts.append(f"mv {box.state.parent} {box.state.parent}.moved && echo LEAK-dir")
    done = box.sh("; ".join(attempts) + "; echo done")
    assert done.stdout.endswith("done\n"), done.stderr
    assert "LEAK" not in done.stdout and KEY not in done.stdout + done.stderr
    box.assert_intact(2)
    assert box.state.read_bytes() != before  # moved on by the second call's own commit, and nothing else


def test_the_host_outside_the_workspace_is_read_only(box: Sandboxed) -> None:
    home = os.path.expanduser("~")
    script = "; ".join(
        f"touch {path}/trialtool-escape 2>/dev/null && echo LEAK-{path}" for path in ("/usr", "/etc", home, box.root)
    )
    done = box.sh(script + "; echo in-workspace > made-here; echo done")
    # The workspace's parent, under the host's /tmp here, is a directory of the trial's own /tmp
    # in the sandbox: writable there, and not the host's. So is the home: the trial's own layer.
    seen = done.stdout.replace(f"LEAK-{box.root}\n", "").replace(f"LEAK-{home}\n", "")
    assert seen == "done\n", done.stderr
    assert (box.workspace / "made-here").read_text() == "in-workspace\n"
    assert not any(Path(path, "trialtool-escape").exists() for path in ("/usr", "/etc", home, box.root))


def test_no_privilege_to_undo_the_sandbox(box: Sandboxed) -> None:
    script = (
        "grep -q '^CapEff:.0000000000000000$' /proc/self/status && echo no-capabilities; "
        "grep -q '^NoNewPrivs:.1$' /proc/self/status && echo no-new-privileges; "
        "mount -o remount,rw / 2>/dev/null && echo LEAK-remount; "
        "touch /etc/trialtool-escape 2>/dev/null && echo LEAK-etc; "
        f"{COMMAND_PY} -c 'import os; os.unshare(os.CLONE_NEWUSER)' 2>/dev/null && echo LEAK-userns; "
        "echo done"
    )
    done = box.sh(script)
    assert done.stdout == "no-capabilities\nno-new-privileges\ndone\n", done.stderr


def test_no_trial_tool_process_is_visible(box: Sandboxed) -> None:
    # Every process the command can see is its own or bwrap's: no ancestor's descriptors to write to.
    done = box.call(COMMAND_PY, "-c", PROCESSES)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert all("trialtool" not in name and "trial-tool" not in name for name in seen.values()), seen
    assert max(int(pid) for pid in seen) < 10  # a fresh pid namespace


def test_no_network_but_loopback(box: Sandboxed) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('LEAK')"
        done = box.call(COMMAND_PY, "-c", code)
        assert done.returncode != 0 and "LEAK" not in done.stdout
        assert "ConnectionRefusedError" in done.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_network_host_reaches_the_host(tmp_path: Path) -> None:
    box = Sandboxed(tmp_path, "beside")
    box.pinned += ["--network", "host"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = box.call(COMMAND_PY, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)")
        assert done.returncode == 0, done.stderr
        listener.settimeout(5)
        listener.accept()[0].close()
    assert box.state_json()["sandbox"]["network"] == "host"


@pytest.mark.timeout(90)
def test_no_process_survives_the_call(box: Sandboxed, marker: str) -> None:
    script = (
        f"setsid sleep 300 {marker} & "
        f"(sh -c 'sleep 300 {marker}' &) ; "
        f"{COMMAND_PY} -c 'import os, time; os.fork() or (os.setsid(), time.sleep(300))' {marker} & "
        "echo started"
    )
    done = box.sh(script)
    assert done.stdout == "started\n", done.stderr
    assert marked(marker) == []
    assert box.records()[-1]["processes_surviving"] == []


def test_a_deadline_still_gives_the_command_its_grace(box: Sandboxed) -> None:
    done = box.sh("trap 'echo cleaned up; exit 3' TERM; sleep 30 & wait", flags=("--call-timeout", "1"))
    assert done.returncode == 124
    assert done.stdout.startswith("cleaned up\n"), done.stdout + done.stderr
    assert box.records()[-1]["status"] == "timeout"


def test_tmp_persists_within_the_trial_and_only_there(tmp_path: Path) -> None:
    first = Sandboxed(tmp_path / "a", "beside") if (tmp_path / "a").mkdir() is None else None
    assert first is not None
    assert first.sh("echo kept > /tmp/note").returncode == 0
    assert first.sh("cat /tmp/note").stdout == "kept\n"
    (tmp_path / "b").mkdir()
    other = Sandboxed(tmp_path / "b", "beside")
    done = other.sh("cat /tmp/note")
    assert done.returncode != 0 and done.stdout == ""


def test_the_workspace_tools_work(box: Sandboxed) -> None:
    assert box.call(COMMAND_PY, "-c", "print(6 * 7)").stdout == "42\n"
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = box.sh("git init -q . && echo hello > tracked.txt && git status --porcelain")
    assert done.returncode == 0, done.stderr
    assert "?? tracked.txt" in done.stdout


def test_pip_runs_in_the_workspace(box: Sandboxed) -> None:
    if subprocess.run([COMMAND_PY, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip(f"{COMMAND_PY} has no pip")
    pip = box.call(COMMAND_PY, "-m", "pip", "--version")
    assert pip.returncode == 0 and pip.stdout.startswith("pip "), pip.stderr


def test_writable_paths_are_writable(tmp_path: Path) -> None:
    box = Sandboxed(tmp_path, "beside")
    extra = tmp_path / "extra"
    extra.mkdir()
    box.pinned += ["--writable", str(extra)]
    assert box.sh(f"echo out > {extra}/file").returncode == 0
    assert (extra / "file").read_text() == "out\n"
    assert box.state_json()["sandbox"]["writable"] == [str(extra)]


def test_exit_codes_are_the_commands(box: Sandboxed) -> None:
    assert box.sh("exit 7").returncode == 7
    killed = box.sh("kill -9 $$")
    assert killed.returncode == 137
    assert box.call("no-such-command-here").returncode == 127
    script = box.workspace / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert box.call(str(script)).returncode == 126
    statuses = [record["status"] for record in box.records()]
    assert statuses == ["error", "error", "command_error", "command_error"]


@pytest.mark.parametrize("name", ["\x85", "a\nb", "x\u2028y", "plain"])
def test_bwraps_word_for_a_missing_command_is_read_whatever_its_name(name: str) -> None:
    """bwrap names the command it could not run; a name may break lines (U+0085, "\\n") and is still the command's."""
    said = f"bwrap: execvp {name}: {os.strerror(2)}\n".encode()
    assert sandbox.bwrap.failure(said, 1) == ("not_found", os.strerror(2))
    assert sandbox.bwrap.failure(b"bwrap: Creating new namespace failed: nope\n", 1) == (
        "sandbox",
        "bwrap: Creating new namespace failed: nope",
    )
    assert sandbox.bwrap.failure(said, 137) is None  # bwrap itself killed: not its word for the command


def test_the_sandbox_settings_are_pinned(box: Sandboxed) -> None:
    assert box.sh("true").returncode == 0
    box.pinned = ["--sandbox", "none"]
    refused = box.sh("true")
    assert refused.returncode == 125 and '--sandbox "none" differs' in refused.stderr
    box.pinned = ["--sandbox", "auto"]
    assert box.sh("true").returncode == 0
    box.pinned = ["--network", "host"]
    assert '--network "host" differs' in box.sh("true").stderr
    box.pinned = ["--workspace", str(box.root)]
    assert "--workspace" in box.sh("true").stderr
    box.assert_intact(2)


def test_calls_of_a_trial_inside_its_workspace_run_one_at_a_time(tmp_path: Path) -> None:
    box = Sandboxed(tmp_path, "inside")
    assert box.sh("true").returncode == 0
    argv = [PY, "-m", "trialtool", *box.flags, "--", "sh", "-c", "sleep 0.3"]
    procs = [subprocess.Popen(argv, cwd=box.workspace) for _ in range(3)]
    try:
        assert [proc.wait(timeout=60) for proc in procs] == [0, 0, 0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    spans = sorted((record["started_at_utc"], record["ended_at_utc"]) for record in box.records()[1:])
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(spans)), spans
    box.assert_intact(4)


def test_the_api_door_is_sandboxed(tmp_path: Path) -> None:
    from trialtool import Trial

    box = Sandboxed(tmp_path, "beside")
    limits = {"sandbox": "bwrap", "workspace": str(box.workspace)}
    with Trial(box.state, box.log, limits=limits, key=KEY.encode(), hidden_files=[box.key]) as trial:
        result = trial.run(f"cat {box.state} {box.key}; echo x > {box.root}/escape; pwd", cwd=box.workspace)
    assert result.record["sandbox"] == "bwrap"
    assert result.stdout == f"{box.workspace}\n"
    assert KEY not in result.stderr and not (box.root / "escape").exists()


def test_the_shim_door_is_sandboxed(tmp_path: Path) -> None:
    box = Sandboxed(tmp_path, "beside")
    shims = tmp_path / "shims"
    argv = [PY, "-m", "trialtool", "shim", str(shims), *box.flags, *box.pinned]
    installed = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=box.workspace)
    assert installed.returncode == 0, installed.stderr
    done = subprocess.run(
        [str(shims / "sh"), "-c", f"cat {box.key}; echo done"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=box.workspace,
    )
    assert done.stdout == "done\n" and KEY not in done.stderr
    assert box.records()[-1]["sandbox"] == "bwrap"


def test_the_serve_door_is_sandboxed(tmp_path: Path) -> None:
    box = Sandboxed(tmp_path, "beside")
    request = json.dumps({"id": 1, "method": "run", "params": {"command": f"cat {box.key}; echo done"}}) + "\n"
    argv = [PY, "-m", "trialtool", "serve", *box.flags, *box.pinned]
    started = time.monotonic()
    served = subprocess.run(argv, input=request, capture_output=True, text=True, timeout=60, cwd=box.workspace)
    assert time.monotonic() - started < 60
    reply = json.loads(served.stdout.splitlines()[0])["result"]
    assert reply["stdout"] == "done\n" and KEY not in reply["stderr"], reply
    assert box.records()[-1]["sandbox"] == "bwrap"


def test_the_mcp_door_is_sandboxed(tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'trialtool[mcp]')")
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    box = Sandboxed(tmp_path, "beside")
    params = StdioServerParameters(
        command=PY, args=["-m", "trialtool", "mcp", *box.flags, *box.pinned], cwd=str(box.workspace)
    )
    seen: list[str] = []

    async def main() -> None:
        async with Client(params) as client:
            result = await client.call_tool("run_shell", {"command": f"cat {box.key}; echo done"})
            seen.extend(block.text for block in result.content)

    anyio.run(main)
    assert seen[0] == "done\n" and KEY not in "".join(seen)
    assert box.records()[-1]["sandbox"] == "bwrap"


@pytest.mark.timeout(90)
def test_resource_limits_hold_inside(tmp_path: Path, marker: str) -> None:
    box = Sandboxed(tmp_path, "beside")
    box.pinned += ["--max-open-files", "8", "--max-procs", "4", "--call-timeout", "5"]
    done = box.sh("ulimit -n; ulimit -Hn")
    assert done.stdout == "8\n8\n", done.stderr
    # Four processes of the command's own are allowed (bwrap's two are not counted); more are not.
    assert box.sh("sleep 0.1 & sleep 0.1 & wait").returncode == 0
    forks = box.sh(f"for i in 1 2 3 4 5 6; do sleep 30 {marker} & done; wait")
    # The pids cgroup refuses the fork (the shell gives up: exit 2), or, without cgroups, the sweep stops it (124).
    assert (forks.returncode, box.records()[-1]["status"]) in ((2, "process_limit"), (124, "process_limit")), forks
    assert marked(marker) == []


@pytest.mark.timeout(120)
def test_as_a_non_root_user_the_sandbox_holds(tmp_path: Path) -> None:
    from tests.process.test_descriptors import _nobody_python

    work = Path(tempfile.mkdtemp(prefix="trialtool-nobody-"))
    try:
        work.chmod(0o755)
        python = _nobody_python(work / "lib")
        box = Sandboxed(work / "t", "inside") if (work / "t").mkdir() is None else None
        assert box is not None
        for path in (work / "t", box.workspace):
            os.chown(path, 65534, 65534)
        os.chown(box.key, 65534, 65534)
        argv = [*python, "-m", "trialtool", *box.flags, *box.pinned, "--"]
        script = f"cat {box.state} {box.key} && echo LEAK; mv {box.state} x && echo LEAK; echo made > here; id -u"
        done = subprocess.run(
            [*argv, "sh", "-c", script], capture_output=True, text=True, timeout=60, cwd=box.workspace
        )
        assert done.returncode == 0 and done.stdout == "65534\n", done.stderr
        assert (box.workspace / "here").read_text() == "made\n"
        assert box.records()[0]["sandbox"] == "bwrap"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_program_on_the_hosts_tmp_not_found_says_why(box: Sandboxed) -> None:
    """A venv made in the host's /tmp (a directory of the test's own there, wherever TMPDIR points): the
    sandbox has a /tmp of its own. Not found, as before, and a line that says where it is and how to make
    it visible."""
    mine = Path(tempfile.mkdtemp(prefix="trialtool-host-tmp-", dir="/tmp"))
    try:
        tool = mine / "venv" / "bin" / "tool"
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\necho hi\n")
        tool.chmod(0o755)
        for done in (box.call(str(tool)), box.sh(str(tool))):
            assert done.returncode == 127, done.stderr
            assert f"{tool} is on the host's /tmp, which the sandbox does not show" in done.stderr, done.stderr
            assert "--writable" in done.stderr
        missing = box.call(str(mine / "venv" / "bin" / "nothing-there"))
        assert missing.returncode == 127 and "host's /tmp" not in missing.stderr  # nowhere on the host either
        assert box.sh("exit 127").returncode == 127
    finally:
        shutil.rmtree(mine)
