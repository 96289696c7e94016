"""Nothing survives a call: escapes, signals to trial-tool, resource limits, environment.

Each test marks its processes with a unique word (the `marker` fixture), and the
fixture fails the test if any marked process is alive at its end, after killing
it. Everything here is bounded: short chains, small limits, few processes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import COMMAND_PY, TrialFiles, marked, wait_until

PY = COMMAND_PY

# A process that escapes in the given way, then sleeps, carrying the marker in its argv.
ESCAPES = {
    "background-child": "import time; time.sleep(300)",
    "setsid": "import os, time; os.setsid(); time.sleep(300)",
    "setpgid": "import os, time; os.setpgid(0, 0); time.sleep(300)",
    "double-fork-daemon": textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(300)
        os._exit(0)
        """
    ),
    "ignores-sigterm": "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)",
    "stops-itself": "import os, signal; os.setsid(); os.kill(os.getpid(), signal.SIGSTOP)",
    # A runaway chain: each link forks the next into a new session and exits. Bounded at 3000 links.
    "fork-and-exit-chain": textwrap.dedent(
        """
        import os, time
        for hop in range(3000):
            if os.fork():
                os._exit(0)
            os.setsid()
            time.sleep(0.001)
        """
    ),
}


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "started"
    os.mkfifo(path)
    return path


def read_line(path: Path, timeout: float = 30) -> bytes:
    """Block until a writer sends a line to the FIFO: the event the test waits on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, "the command never reported that it started"
        # A writer may open the FIFO, and write, a moment after select wakes.
        data = b""
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready
            chunk = os.read(fd, 100)
            data += chunk
        return data
    finally:
        os.close(fd)


@pytest.fixture(params=["cgroups", "no-cgroups"])
def containment_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """Run with whatever cgroups the machine allows, and with the fallbacks forced."""
    if request.param == "cgroups":
        return dict(os.environ)
    return dict(os.environ, TRIALTOOL_CGROUPS="off")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("ending", ["exits", "deadline"])
def test_nothing_survives(
    trial: TrialFiles, marker: str, escape: str, ending: str, containment_env: dict[str, str]
) -> None:
    code = ESCAPES[escape]
    started = f"{PY} -c {_quote(code)} {marker} &"
    tail = "echo main-done" if ending == "exits" else "sleep 300"
    flags = ("--call-timeout", "1", "--kill-grace", "0.2")
    done = trial.call("sh", "-c", f"{started} {tail}", flags=flags, env=containment_env)
    assert done.returncode == (0 if ending == "exits" else 124), done.stderr
    assert marked(marker) == []
    record = trial.records()[-1]
    assert record["processes_surviving"] == []


def _quote(code: str) -> str:
    return "'" + code.replace("'", "'\"'\"'") + "'"


@pytest.mark.timeout(60)
def test_prompt_return_counts_what_it_killed(trial: TrialFiles, marker: str) -> None:
    # Unsandboxed: in the sandbox the kernel may end the background process first, with the
    # pid namespace, and the sweep then has nothing left to count (tests/process/test_sandbox.py).
    script = f"{PY} -c 'import time; time.sleep(300)' {marker} & echo hi"
    done = trial.call("sh", "-c", script, flags=("--sandbox", "none"))
    assert done.stdout == b"hi\n"
    record = trial.records()[0]
    assert record["processes_killed"] >= 1 and record["elapsed_seconds"] < 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_to_trial_tool_stops_and_records_the_call(
    trial: TrialFiles, marker: str, tmp_path: Path, sig: int, code: int
) -> None:
    started = fifo(tmp_path)
    script = f"{PY} -c 'import time; time.sleep(300)' {marker} & echo up > {started}; wait"
    argv = trial.argv("--kill-grace", "0.3")
    wrapper = subprocess.Popen([*argv, "--", "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert read_line(started) == b"up\n"
        wrapper.send_signal(sig)
        _, err = wrapper.communicate(timeout=30)
    finally:
        wrapper.kill()
        wrapper.wait()
    assert wrapper.returncode == code, err
    assert signal.Signals(sig).name.encode() in err
    assert marked(marker) == []
    record = trial.records()[-1]
    assert record["status"] == "interrupted" and record["charged"] and record["return_code"] == code
    assert trial.state_json()["calls"] == 1


@pytest.mark.timeout(60)
def test_sigkill_of_trial_tool_leaves_no_survivor(trial: TrialFiles, marker: str, tmp_path: Path) -> None:
    started = fifo(tmp_path)
    script = f"{PY} -c 'import os, time; os.setsid(); time.sleep(300)' {marker} & echo up > {started}; wait"
    argv = [sys.executable, "-m", "trialtool", "--state", str(trial.state), "--log", str(trial.log)]
    wrapper = subprocess.Popen([*argv, "--", "sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert read_line(started) == b"up\n"
    finally:
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait()
    # The supervisor's parent-death signal makes it kill the tree; nothing announces the
    # moment the last process is gone, so this one wait polls.
    assert wait_until(lambda: marked(marker) == [], timeout=20)


def _limit_call(
    trial: TrialFiles, code: str, *flags: str
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, object]]:
    done = trial.call(PY, "-c", code, flags=flags, timeout=60)
    return done, trial.records()[-1]


@pytest.mark.timeout(60)
def test_cpu_limit(trial: TrialFiles) -> None:
    flags = ("--max-cpu-seconds", "1", "--call-timeout", "20", "--sandbox", "none")
    done, record = _limit_call(trial, "while True: pass", *flags)
    assert record["status"] == "cpu_limit", done.stderr
    assert record["command_signal"] in (signal.SIGXCPU, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_cpu_limit_in_the_sandbox(trial: TrialFiles) -> None:
    # bwrap reports a signal as 128 + N, which is how the limit is still recognised.
    done, record = _limit_call(trial, "while True: pass", "--max-cpu-seconds", "1", "--call-timeout", "20")
    assert record["status"] == "cpu_limit", done.stderr
    assert done.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["direct", "via-shell"])
def test_file_size_limit(trial: TrialFiles, tmp_path: Path, how: str) -> None:
    target = tmp_path / "big"
    write = f"head -c 10000000 /dev/zero > {target}"
    done = trial.call(
        "sh", "-c", f"exec {write}" if how == "direct" else f"{write}; exit $?", flags=("--max-file-size", "100000")
    )
    assert trial.records()[-1]["status"] == "file_size_limit", done.stderr
    assert target.stat().st_size <= 100000


def test_python_ignores_sigxfsz_but_the_limit_holds(trial: TrialFiles, tmp_path: Path) -> None:
    # CPython ignores SIGXFSZ, so its writes fail with EFBIG instead: an ordinary error.
    target = tmp_path / "big"
    code = f"f = open({str(target)!r}, 'wb')\nwhile True: f.write(b'x' * 4096); f.flush()"
    done, record = _limit_call(trial, code, "--max-file-size", "100000")
    assert record["status"] == "error" and b"File too large" in done.stderr
    assert target.stat().st_size <= 100000


@pytest.mark.timeout(60)
def test_memory_limit(trial: TrialFiles, containment_env: dict[str, str]) -> None:
    code = "blocks = []\nwhile True: blocks.append(bytearray(8 << 20))"
    done = trial.call(PY, "-c", code, flags=("--max-memory", str(64 << 20)), env=containment_env)
    record = trial.records()[-1]
    containment = record["containment"]
    assert isinstance(containment, dict)
    if containment["memory_cap"] == "rlimit_as":
        # Without a memory cgroup the cap is per process and the command just fails to allocate.
        assert record["status"] == "error" and b"MemoryError" in done.stderr
    else:
        assert record["status"] == "memory_limit", done.stderr


@pytest.mark.timeout(60)
def test_process_limit(trial: TrialFiles, marker: str, containment_env: dict[str, str]) -> None:
    script = f"for i in $(seq 40); do {PY} -c 'import time; time.sleep(300)' {marker} & done; wait"
    flags = ("--max-procs", "8", "--call-timeout", "10")
    done = trial.call("sh", "-c", script, flags=flags, env=containment_env)
    record = trial.records()[-1]
    assert record["status"] == "process_limit", done.stderr
    assert marked(marker) == []


@pytest.mark.timeout(60)
def test_process_limit_when_the_command_outlives_its_failed_forks(
    trial: TrialFiles, marker: str, containment_env: dict[str, str]
) -> None:
    # Unlike dash, this parent shrugs off the refused forks and waits on, until the deadline.
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        kids = []
        for _ in range(40):
            try:
                kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}]))
            except OSError:
                pass
        time.sleep(300)
        """
    )
    flags = ("--max-procs", "8", "--call-timeout", "3")
    done = trial.call(PY, "-c", code, marker, flags=flags, env=containment_env)
    assert done.returncode == 124
    assert trial.records()[-1]["status"] == "process_limit", done.stderr
    assert marked(marker) == []


def test_open_files_and_core_limits_reach_the_command(trial: TrialFiles) -> None:
    code = "import resource as r; print(r.getrlimit(r.RLIMIT_NOFILE)[0], r.getrlimit(r.RLIMIT_CORE)[0])"
    done, _ = _limit_call(trial, code, "--max-open-files", "64")
    assert done.stdout.split() == [b"64", b"0"]


def test_resource_use_is_recorded(trial: TrialFiles) -> None:
    _, record = _limit_call(trial, "x = bytearray(50 << 20); sum(range(3_000_000))")
    assert record["peak_rss_bytes"] > 40 << 20
    assert record["cpu_user_seconds"] + record["cpu_system_seconds"] > 0  # type: ignore[operator]


def test_environment_flags(trial: TrialFiles, tmp_path: Path) -> None:
    env = dict(os.environ, TRIALTOOL_LEDGER_KEY="a-secret-key-of-32-bytes-0123456", KEEP_ME="yes", DROP_ME="x")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    flags = ("--env", "ADDED=1", "--unset-env", "DROP_ME", "--cwd", str(tmp_path))
    done = trial.call(PY, "-c", code + "; print(os.getcwd())", flags=flags, env=env)
    seen, cwd = done.stdout.decode().splitlines()
    variables = json.loads(seen)
    assert variables["ADDED"] == "1" and variables["KEEP_ME"] == "yes"
    assert "DROP_ME" not in variables
    assert not any(key.startswith("TRIALTOOL_") for key in variables)
    assert cwd == str(tmp_path)


def test_clean_env_keeps_only_the_minimal_set(trial: TrialFiles) -> None:
    env = dict(os.environ, SECRET_TOKEN="abc", PATH=os.environ["PATH"])
    code = "import json, os; print(json.dumps(sorted(os.environ)))"
    done = trial.call(PY, "-c", code, flags=("--clean-env",), env=env)
    names = json.loads(done.stdout)
    assert "SECRET_TOKEN" not in names and "PATH" in names
    assert set(names) <= {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TERM",
        "TZ",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",  # bwrap sets it to the working directory it changes to, as a shell would
    }


def test_bad_cwd_and_own_variables_are_refused_before_charging(trial: TrialFiles, tmp_path: Path) -> None:
    assert trial.call("true").returncode == 0
    before = trial.snapshot()
    done = trial.call("true", flags=("--cwd", str(tmp_path / "missing")))
    assert done.returncode == 125 and b"--cwd" in done.stderr
    done = trial.call("true", flags=("--env", "TRIALTOOL_LEDGER_KEY=x"))
    assert done.returncode == 125
    done = trial.call("true", flags=("--env", "NOEQUALS"))
    assert done.returncode == 125
    assert trial.snapshot() == before


@pytest.mark.timeout(60)
def test_deadline_is_kept_without_polling(trial: TrialFiles) -> None:
    # Figures live in scripts/bench.py; this bound only catches a poll loop gone wrong or a hang.
    done = trial.call("sleep", "300", flags=("--call-timeout", "0.3"))
    assert done.returncode == 124
    record = trial.records()[-1]
    assert 0 <= record["deadline_overshoot_seconds"] < 1.0
    assert record["exited_after_deadline_seconds"] < 5.0
    assert record["stop_signal"] == signal.SIGTERM
