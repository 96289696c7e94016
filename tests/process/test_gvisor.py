"""The gvisor backend, for real: real runsc, real sandboxes kept warm across a trial's calls, real escapes.

Each trial's sandbox is made on its first call and kept; these tests look into it
with runsc's own `ps`. Every sandbox a test made is ended at the end (by its
trial's `close`, and by id). Where runsc cannot run (not installed, not root),
every test is skipped with runsc's reason.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMMAND_PY, gvisor_unavailable
from tests.process.test_sandbox import PROCESSES, Sandboxed
from trialtool.errors import EXIT_INTERNAL, EXIT_REFUSED, EXIT_TIMEOUT, TrialToolError
from trialtool.sandbox import _runsc as runsc

PY = sys.executable
KEY = "k3y-0f-the-ledger-" + "y" * 20


WHY_NOT = gvisor_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"gVisor cannot run here: {WHY_NOT}")


class Kernel(Sandboxed):
    """A keyed trial pinned to gvisor: its files beside its workspace, whose directory is covered."""

    def __init__(self, root: Path, *pinned: str) -> None:  # its own layout: Sandboxed's is bwrap's two
        self.root = root
        self.workspace = root / "ws"
        self.workspace.mkdir()
        (root / "trial").mkdir()
        self.state = root / "trial" / "state.json"
        self.log = root / "trial" / "log.jsonl"
        self.key = root / "ledger.key"
        self.key.write_text(KEY)
        self.flags = ["--state", str(self.state), "--log", str(self.log), "--key-file", str(self.key)]
        self.pinned = ["--sandbox", "gvisor", "--workspace", str(self.workspace), *pinned]
        self._container: str | None = None

    @property
    def container(self) -> str:
        """The trial's sandbox by id (kept once read: a test may remove the state)."""
        if self._container is None:
            self._container = f"trialtool-{self.state_json()['trial_id']}"
        return self._container

    def processes(self) -> list[str]:
        """Every process in the trial's sandbox, by runsc's own `ps`: its command names."""
        done = subprocess.run(
            ["runsc", "--root", runsc.ROOT, "ps", self.container], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [line.split()[-1] for line in done.stdout.splitlines()[1:]]

    def close(self) -> subprocess.CompletedProcess[str]:
        argv = [PY, "-m", "trialtool", "close", *self.flags]
        return subprocess.run(argv, capture_output=True, text=True, timeout=90)


@pytest.fixture
def kernels(tmp_path: Path) -> Iterator[list[Kernel]]:
    """Trials of the gvisor backend, made by the test; every sandbox of theirs ended afterwards."""
    made: list[Kernel] = []
    yield made
    for kernel in made:
        if kernel.state.exists():
            kernel.container  # noqa: B018 (read before the close, for the delete below)
            kernel.close()
        if kernel._container is not None:  # by the id, whatever became of the trial's runsc: its bundle too
            runsc.delete(runsc_binary(), kernel._container)


@pytest.fixture
def box(tmp_path: Path, kernels: list[Kernel]) -> Kernel:
    kernel = Kernel(tmp_path)
    kernels.append(kernel)
    return kernel


def test_a_call_runs_under_gvisor_and_the_trial_pins_and_records_it(box: Kernel) -> None:
    done = box.sh("pwd; echo out; echo err >&2; exit 3")
    assert done.returncode == 3, done.stderr
    assert done.stdout == f"{box.workspace}\nout\n" and done.stderr == "err\n"
    # gVisor's own kernel answers: its /proc/version is not the host's.
    seen = box.sh("cat /proc/version").stdout
    with open("/proc/version") as host:
        assert seen and seen != host.read()
    pinned = box.state_json()["sandbox"]
    facts = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout.split()
    assert pinned["mode"] == "gvisor" and pinned["network"] == "none"
    assert pinned["runtime"] == f"runsc {facts[2]}" and pinned["platform"] in runsc.PLATFORMS
    assert pinned["binary"]["path"] == os.path.realpath("/usr/bin/runsc") or pinned["binary"]["path"].endswith("/runsc")
    first, second = box.records()
    assert first["sandbox"] == "gvisor"
    assert first["container"] == {
        "name": box.container,
        "runtime": pinned["runtime"],
        "platform": pinned["platform"],
        "made": "the trial's first call",
    }
    assert second["container"]["made"] is None  # kept warm: the same sandbox
    start = json.loads(box.log.read_text().splitlines()[0])
    assert (start["sandbox_settings"]["runtime"], start["sandbox_settings"]["platform"]) == (
        pinned["runtime"],
        pinned["platform"],
    )


def test_exact_budgets_and_refusals(box: Kernel) -> None:
    more = ("--max-calls", "2", "--max-tokens", "1000", "--max-call-tokens", "5")
    outputs = [box.sh("echo call >> calls; seq 1 200", flags=more) for _ in range(3)]
    assert [done.returncode for done in outputs] == [0, 0, EXIT_REFUSED]
    assert (box.workspace / "calls").read_text() == "call\ncall\n"  # the refused call never ran
    records = box.records()
    assert [record["delivered_emitted_tokens"] for record in records[:2]] == [5, 5]
    assert records[-1]["status"] == "maximum_tool_calls"


def test_the_trials_files_and_key_are_not_there(box: Kernel) -> None:
    assert box.sh("true").returncode == 0
    before = box.state.read_bytes()
    attempts = [f"cat {path} && echo LEAK-{path.name}" for path in (box.state, box.log, box.key)]
    attempts += [f"echo x >> {path} && echo LEAK-write-{path.name}" for path in (box.state, box.log, box.key)]
    attempts.append(f"mv {box.state.parent} {box.root}/moved && echo LEAK-dir")
    attempts.append(f"ls {runsc.ROOT} && echo LEAK-runsc-state")
    done = box.sh("; ".join(attempts) + "; echo done")
    assert done.stdout == "done\n", done.stdout + done.stderr
    assert KEY not in done.stdout + done.stderr
    assert box.state.read_bytes() != before  # moved on by the call's own commit only
    verified = subprocess.run([PY, "-m", "trialtool", "verify", *box.flags], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_host_is_read_only_and_the_workspace_writable(box: Kernel) -> None:
    script = "; ".join(
        f"touch {path}/trialtool-escape 2>/dev/null && echo LEAK-{path}"
        for path in ("/usr", "/etc", os.path.expanduser("~"), box.root)
    )
    done = box.sh(script + "; echo in-workspace > made-here; echo done")
    assert done.stdout == "done\n", done.stderr
    assert (box.workspace / "made-here").read_text() == "in-workspace\n"
    assert not any(Path(path, "trialtool-escape").exists() for path in ("/usr", "/etc", os.path.expanduser("~")))


def test_no_privilege_and_no_file_that_grants_any(box: Kernel) -> None:
    code = (
        "import os, stat\n"
        "for name, act in [('chmod-u', lambda: os.chmod('f', 0o4755)), ('chmod-g', lambda: os.chmod('f', 0o2755)),\n"
        "                  ('open', lambda: os.close(os.open('g', os.O_CREAT | os.O_WRONLY, 0o6755))),\n"
        "                  ('mkdir', lambda: os.mkdir('d', 0o2755)),\n"
        "                  ('mknod', lambda: os.mknod('n', stat.S_IFCHR | 0o666, os.makedev(1, 3)))]:\n"
        "    try:\n"
        "        act(); print('ran', name)\n"
        "    except OSError as exc:\n"
        "        print('refused', name, exc.errno)\n"
    )
    (box.workspace / "f").write_text("x")
    done = box.sh(
        "grep -q '^CapEff:.0000000000000000$' /proc/self/status && echo no-capabilities; "
        f"{COMMAND_PY} -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))' | grep -qx 1 && "
        "echo no-new-privileges; "
        f'{COMMAND_PY} -c "{code}"; echo done'
    )
    assert done.stdout.startswith("no-capabilities\nno-new-privileges\n"), done.stdout + done.stderr
    for name in ("chmod-u", "chmod-g", "mknod"):
        assert f"refused {name} 1" in done.stdout, done.stdout
    for path in box.workspace.rglob("*"):
        mode = path.lstat().st_mode
        assert not mode & 0o6000, (path, oct(mode))  # nothing setuid or setgid on the host
        assert not (path.is_char_device() or path.is_block_device()), path


def test_no_trial_tool_process_and_no_network(box: Kernel) -> None:
    done = box.call(COMMAND_PY, "-c", PROCESSES)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert all("trialtool" not in name and "trial-tool" not in name and "runsc" not in name for name in seen.values())
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('LEAK')"
        done = box.call(COMMAND_PY, "-c", connect)
        assert done.returncode != 0 and "LEAK" not in done.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_network_host_reaches_the_host(tmp_path: Path, kernels: list[Kernel]) -> None:
    box = Kernel(tmp_path, "--network", "host")
    kernels.append(box)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = box.call(COMMAND_PY, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)")
        assert done.returncode == 0, done.stderr
        listener.settimeout(5)
        listener.accept()[0].close()
    assert box.state_json()["sandbox"]["network"] == "host"


def test_a_deadline_leaves_nothing_running_in_the_sandbox(box: Kernel) -> None:
    script = (
        "trap '' TERM; setsid sh -c \"trap '' TERM; sleep 300\" & (sh -c 'sleep 300 &' &); "
        f"{COMMAND_PY} -c 'import os, time; os.fork() or (os.setsid(), time.sleep(300))' & "
        "echo started; sleep 200"
    )
    done = box.sh(script, flags=("--call-timeout", "3", "--kill-grace", "0.5"))
    assert done.returncode == EXIT_TIMEOUT, done.stderr
    assert done.stdout == "started\n"
    (record,) = box.records()
    assert record["status"] == "timeout" and record["stop_signal"] == 9  # TERM was ignored: KILL after the grace
    assert record["elapsed_seconds"] < 30
    assert box.processes() == ["sh", "sleep"]  # the sandbox's keeper and its waiting child, nothing else


def test_a_command_that_ends_leaves_nothing_behind(box: Kernel) -> None:
    done = box.sh("(setsid sleep 300 &); sleep 200 & echo quick")
    assert done.returncode == 0 and done.stdout == "quick\n" and done.stderr == ""
    assert box.processes() == ["sh", "sleep"]


def test_the_output_cap_stops_the_command(box: Kernel) -> None:
    done = box.call("yes", flags=("--max-capture-bytes", "10000"))
    assert done.returncode != 0
    (record,) = box.records()
    assert record["status"] == "output_limit" and record["stdout_capture_truncated"]
    assert box.processes() == ["sh", "sleep"]


def test_a_system_call_gvisor_refuses_gets_a_plain_record_not_a_hang(box: Kernel) -> None:
    # fanotify_init: not in gVisor's kernel. It answers ENOSYS, and the command goes on.
    code = "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.syscall(300, 0, 0), ctypes.get_errno())"
    done = box.call(COMMAND_PY, "-c", code, timeout=60)
    assert done.returncode == 0 and done.stdout == "-1 38\n", done.stdout + done.stderr
    (record,) = box.records()
    assert record["status"] == "ok"


def test_a_sandbox_gone_between_calls_is_made_again_and_the_record_says_so(box: Kernel) -> None:
    assert box.sh("echo one").returncode == 0
    subprocess.run(["runsc", "--root", runsc.ROOT, "delete", "--force", box.container], check=True, timeout=60)
    done = box.sh("echo two")
    assert done.returncode == 0 and done.stdout == "two\n", done.stderr
    assert box.records()[-1]["container"]["made"] == "the trial's sandbox was gone"


def test_a_command_that_kills_its_sandbox_is_charged_and_the_next_call_gets_a_new_one(box: Kernel) -> None:
    assert box.sh("true").returncode == 0
    done = box.sh("kill -KILL 1; sleep 5; echo LEAK-still-running")
    assert done.returncode == 137 and "LEAK" not in done.stdout  # its own act: the sandbox ended under it
    assert box.records()[-1]["charged"] is True
    again = box.sh("echo after")
    assert again.stdout == "after\n", again.stderr
    assert box.records()[-1]["container"]["made"] == "the trial's sandbox had stopped"


def test_runsc_failing_is_trial_tools_and_costs_nothing(box: Kernel) -> None:
    """A sandbox that cannot start (1 MiB holds no gVisor kernel): 125 and runsc's reason, before any charge."""
    done = box.call("echo", "LEAK", flags=("--max-memory", str(1 << 20)))
    assert done.returncode == EXIT_INTERNAL and "LEAK" not in done.stdout
    assert "the trial's gVisor sandbox cannot be started" in done.stderr, done.stderr
    assert not box.state.exists()  # the trial was never made: nothing was charged


def test_runsc_failing_after_the_check_is_a_failed_call(box: Kernel) -> None:
    """runsc's exec fails before the command starts (the sandbox's record gone behind its back, after the
    check): 125 and runsc's words, the command never ran, and, as under every backend, the call is charged."""
    from trialtool import Trial

    limits: dict[str, object] = {"sandbox": "gvisor", "workspace": str(box.workspace)}
    with Trial(box.state, box.log, limits=limits, key=KEY.encode(), hidden_files=[box.key]) as trial:
        assert trial.run(["true"], cwd=str(box.workspace)).exit_code == 0
        box.container  # noqa: B018 (its id, for the cleanup)
        # The sandbox still runs (its process is the one the trial remembers), but runsc no longer knows it.
        for name in os.listdir(runsc.ROOT):
            if name.startswith(box.container + "_sandbox:"):
                os.rename(os.path.join(runsc.ROOT, name), os.path.join(box.root, name))
        try:
            with pytest.raises(TrialToolError) as failed:
                trial.run(["sh", "-c", "echo LEAK > leaked"], cwd=str(box.workspace))
        finally:
            for name in os.listdir(box.root):
                if name.startswith(box.container + "_sandbox:"):
                    os.rename(os.path.join(box.root, name), os.path.join(runsc.ROOT, name))
    assert failed.value.exit_code == EXIT_INTERNAL and "the sandbox could not be set up" in failed.value.message
    assert not (box.workspace / "leaked").exists()
    last = box.records()[-1]
    assert last["status"] == "trial_tool_error" and "file does not exist" in last["error"], last


def test_a_state_inside_the_workspace_is_refused_before_anything_is_charged(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    state = tmp_path / "ws" / "state.json"
    argv = [PY, "-m", "trialtool", "--state", str(state), "--log", str(tmp_path / "log.jsonl")]
    argv += ["--sandbox", "gvisor", "--workspace", str(tmp_path / "ws"), "--", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert done.returncode != 0 and "outside the workspace" in done.stderr, done.stderr
    assert not state.exists() or json.loads(state.read_text())["calls"] == 0


def test_close_and_gc(tmp_path: Path, kernels: list[Kernel]) -> None:
    trials = {}
    for name in ("kept", "closed", "orphaned"):
        (tmp_path / name).mkdir()
        trials[name] = Kernel(tmp_path / name)
        kernels.append(trials[name])
        assert trials[name].sh("true").returncode == 0
    ids = {name: trial.container for name, trial in trials.items()}
    done = trials["closed"].close()
    assert done.returncode == 0, done.stderr
    trials["orphaned"].state.unlink()
    done = subprocess.run([PY, "-m", "trialtool", "gc"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = runsc.listed(runsc_binary())
    assert ids["kept"] in listed and ids["closed"] not in listed and ids["orphaned"] not in listed
    assert "state file is gone" in done.stdout
    assert trials["closed"].sh("echo later").stdout == "later\n"
    assert trials["closed"].records()[-1]["container"]["made"] == "the trial's sandbox was gone"


def runsc_binary() -> Any:
    from trialtool.sandbox._executable import find

    binary, why = find((), None, ("runsc",))
    assert binary is not None, why
    return binary


def test_the_report_compares_the_runtime_and_platform(tmp_path: Path, kernels: list[Kernel]) -> None:
    (tmp_path / "g").mkdir()
    boxed = Kernel(tmp_path / "g")
    kernels.append(boxed)
    assert boxed.sh("true").returncode == 0
    (tmp_path / "b" / "ws").mkdir(parents=True)
    flags = ["--sandbox", "bwrap", "--workspace", str(tmp_path / "b" / "ws"), "--cwd", str(tmp_path / "b" / "ws")]
    argv = [PY, "-m", "trialtool", "--state", str(tmp_path / "b" / "s.json"), "--log", str(tmp_path / "b" / "l.jsonl")]
    assert subprocess.run([*argv, *flags, "--", "true"], capture_output=True, timeout=90).returncode == 0
    report = [PY, "-m", "trialtool", "report", "--format", "json", str(tmp_path / "g"), str(tmp_path / "b")]
    done = subprocess.run(report, capture_output=True, text=True, timeout=120)
    overview = json.loads(done.stdout)["overview"]
    pinned = boxed.state_json()["sandbox"]
    (differs,) = [group["differs"] for group in overview["fairness"]["others"]]
    # bwrap's trial has no runtime: the two are not the same conditions, by mode, runtime and platform.
    assert pinned["runtime"] in differs["sandbox.runtime"] and pinned["platform"] in differs["sandbox.platform"]
    assert sorted(differs["sandbox.mode"]) == ["bwrap", "gvisor"], differs


def test_exit_statuses_are_the_commands(box: Kernel) -> None:
    assert box.sh("exit 7").returncode == 7
    assert box.sh("kill -TERM $$").returncode == 128 + 15  # a signal, as a shell reports it
    missing = box.call("no-such-command-here")
    assert missing.returncode == 127 and "no-such-command-here: not found" in missing.stderr, missing.stderr
    (box.workspace / "plain").write_text("not a program\n")
    refused = box.call("./plain")
    assert refused.returncode == 126, refused.stderr
    statuses = [record["status"] for record in box.records()]
    assert statuses[0] == "error" and all(record["charged"] for record in box.records())


FAKE_RUNSC = '#!/bin/sh\ntouch {marker}\nexec /usr/bin/env runsc "$@"\n'


def test_a_runsc_planted_on_path_never_runs(box: Kernel) -> None:
    """An activated venv's bin in the workspace, and "." on PATH: runsc is found once, never there."""
    marker = box.root / "ESCAPED"
    (box.workspace / "bin").mkdir()
    env = dict(os.environ, PATH=f"{box.workspace / 'bin'}:.:{os.environ['PATH']}")
    for place in (box.workspace / "bin" / "runsc", box.workspace / "runsc"):
        place.write_text(FAKE_RUNSC.format(marker=marker))
        place.chmod(0o755)
    argv = [PY, "-m", "trialtool", *box.flags, *box.pinned, "--", "echo", "hi"]
    for _ in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=box.workspace, env=env)
        assert done.returncode == 0 and done.stdout == "hi\n", done.stderr
    assert box.state_json()["sandbox"]["binary"]["path"] == os.path.realpath("/usr/bin/runsc")
    assert not marker.exists()


def test_a_pinned_runsc_that_changed_fails_closed(box: Kernel) -> None:
    tools = box.root / "tools"
    tools.mkdir(mode=0o755)
    copy = tools / "runsc"
    shutil.copy2(os.path.realpath("/usr/bin/runsc"), copy)
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}", TRIALTOOL_SERVER="off")
    argv = [PY, "-m", "trialtool", *box.flags, *box.pinned, "--", "echo", "hi"]
    assert subprocess.run(argv, capture_output=True, timeout=90, cwd=box.workspace, env=env).returncode == 0
    assert box.state_json()["sandbox"]["binary"]["path"] == str(copy)
    before = box.state.read_bytes(), box.log.read_bytes()
    os.utime(copy, ns=(0, 0))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=box.workspace, env=env)
    assert done.returncode == EXIT_INTERNAL and done.stdout == "", done.stdout + done.stderr
    assert "sandbox executable" in done.stderr and done.stderr.count("\n") == 1
    assert (box.state.read_bytes(), box.log.read_bytes()) == before
