"""The command line: exit codes, refusals, pinning, and bad input that changes nothing."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import TrialFiles


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert text.startswith("trial-tool: ") and text.count("\n") == 1, text
    return text


def test_runs_and_records(trial: TrialFiles) -> None:
    done = trial.call("echo", "hello")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"hello\n", b"")
    state = trial.state_json()
    assert state["calls"] == 1 and state["emitted_tokens"] == 2
    [record] = trial.records()
    assert record["status"] == "ok" and record["sequence"] == 1
    assert base64.b64decode(record["stdout_b64"]) == b"hello\n"
    assert record["delivered_emitted_tokens"] == 2 and record["return_code"] == 0


def test_python_dash_m_and_console_script_agree(trial: TrialFiles, tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("trial-tool")
    if not script.exists():
        pytest.skip("trial-tool console script not installed beside this interpreter")
    import subprocess

    done = subprocess.run(
        [str(script), "--state", str(trial.state), "--log", str(trial.log), "--", "echo", "hi"],
        capture_output=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, b"hi\n")


def test_command_exit_code_passes_through(trial: TrialFiles) -> None:
    done = trial.call("sh", "-c", "echo out; echo err >&2; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")
    assert trial.records()[0]["status"] == "error"


def test_killed_by_a_signal_is_128_plus(trial: TrialFiles) -> None:
    # Unsandboxed: inside bwrap, a signal comes back as 128 + N only (tests/process/test_sandbox.py).
    done = trial.call("sh", "-c", "kill -9 $$", flags=("--sandbox", "none"))
    assert done.returncode == 137
    record = trial.records()[0]
    assert record["command_signal"] == 9 and record["status"] == "error"


def test_not_found_is_127_and_charged(trial: TrialFiles) -> None:
    done = trial.call("no-such-command-trialtool")
    assert done.returncode == 127 and b"command not found" in done.stderr
    record = trial.records()[0]
    assert record["status"] == "command_error" and record["charged"]
    assert trial.state_json()["calls"] == 1


def test_not_executable_is_126(trial: TrialFiles, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert trial.call(str(script)).returncode == 126
    assert trial.call(str(tmp_path)).returncode == 126  # a directory


def test_deadline_is_124(trial: TrialFiles) -> None:
    done = trial.call("sleep", "30", flags=("--call-timeout", "0.3"))
    assert done.returncode == 124
    record = trial.records()[0]
    assert record["status"] == "timeout" and record["deadline_kind"] == "call"
    assert b"--call-timeout" in done.stderr
    # The notice the agent sees is counted in the delivered tokens.
    assert record["delivered_emitted_tokens"] > 0


def test_refused_when_calls_are_spent(trial: TrialFiles) -> None:
    for _ in range(2):
        assert trial.call("true", flags=("--max-calls", "2")).returncode == 0
    done = trial.call("echo", "never")
    assert done.returncode == 123 and done.stdout == b""
    assert "--max-calls" in one_line(done.stderr)
    record = trial.records()[-1]
    assert record["status"] == "maximum_tool_calls" and not record["charged"]
    state = trial.state_json()
    assert state["calls"] == 2 and state["refused_calls"] == 1


def test_refused_when_tokens_are_spent(trial: TrialFiles) -> None:
    done = trial.call("seq", "1", "100", flags=("--max-tokens", "10", "--max-call-tokens", "10"))
    assert done.returncode == 0
    assert trial.records()[0]["status"] == "truncated"
    assert trial.state_json()["emitted_tokens"] <= 10
    if trial.state_json()["emitted_tokens"] == 10:
        done = trial.call("echo", "x")
        assert done.returncode == 123 and "--max-tokens" in one_line(done.stderr)
        assert trial.records()[-1]["status"] == "maximum_emitted_tokens"


def test_trial_timeout_binds_the_call_and_then_refuses(trial: TrialFiles) -> None:
    done = trial.call("sleep", "30", flags=("--trial-timeout", "0.5"))
    assert done.returncode == 124
    assert trial.records()[0]["deadline_kind"] == "trial"
    done = trial.call("echo", "late")
    assert done.returncode == 123 and "--trial-timeout" in one_line(done.stderr)
    assert trial.records()[-1]["status"] == "task_timeout_seconds"


def test_stdin_is_dev_null(trial: TrialFiles) -> None:
    # A wrapper that passes its own stdin on would hang `cat` until the trial timed out. Here
    # trial-tool's own stdin is a pipe we never close, and `cat` still ends at once.
    import subprocess

    argv = [sys.executable, "-m", "trialtool", "--state", str(trial.state), "--log", str(trial.log), "--", "cat"]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            assert proc.stdin is not None
            proc.stdin.close()
    assert trial.records()[0]["status"] == "ok"


def test_init_pins_limits(trial: TrialFiles) -> None:
    done = trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), "--max-calls", "3")
    assert done.returncode == 0
    # One line saying what was made; the whole state with --json.
    made = done.stdout.decode().splitlines()
    assert len(made) == 1 and made[0].startswith("made trial: ") and "3 calls" in made[0], made
    assert trial.state_json()["trial_id"] in made[0]
    assert trial.call("true", flags=("--max-calls", "3")).returncode == 0
    assert trial.call("true").returncode == 0
    before = trial.snapshot()
    done = trial.call("true", flags=("--max-calls", "4"))
    assert done.returncode == 125 and "--max-calls" in one_line(done.stderr)
    assert trial.snapshot() == before
    # init again: the same trial is fine (as through the API, serve and the shim); other limits are not.
    again = trial.cli("init", "--json", "--state", str(trial.state), "--log", str(trial.log), "--max-calls", "3")
    assert again.returncode == 0 and json.loads(again.stdout)["trial_id"] == trial.state_json()["trial_id"]
    assert json.loads(again.stdout)["limits"]["max_calls"] == 3
    before = trial.snapshot()
    done = trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), "--max-calls", "5")
    assert done.returncode == 125 and "--max-calls 5 differs" in one_line(done.stderr)
    assert trial.snapshot() == before
    assert trial.snapshot() == before


def test_status_reports_what_is_left(trial: TrialFiles) -> None:
    trial.call("echo", "hi", flags=("--max-calls", "5"))
    done = trial.cli("status", "--json", "--state", str(trial.state), "--log", str(trial.log))
    assert done.returncode == 0
    shown = json.loads(done.stdout)
    assert shown["left"]["calls"] == 4 and shown["used"]["calls"] == 1 and shown["integrity"]["verdict"] == "clean"


BAD_FLAGS = [
    pytest.param(("echo", "hi"), id="no-dashdash"),
    pytest.param(("--",), id="no-command"),
    pytest.param(("--bogus", "1", "--", "true"), id="unknown-flag"),
    pytest.param(("--max-calls", "-1", "--", "true"), id="negative"),
    pytest.param(("--max-tokens", "nan", "--", "true"), id="nan"),
    pytest.param(("--call-timeout", "inf", "--", "true"), id="inf"),
    pytest.param(("--call-timeout", "1e12", "--", "true"), id="absurd"),
    pytest.param(("--max-calls", "1.5", "--", "true"), id="fractional"),
    pytest.param(("--max-calls", "abc", "--", "true"), id="not-a-number"),
    pytest.param(("--max-call-tokens", "0", "--", "true"), id="zero-tokens"),
    pytest.param(("--clip", "middle", "--", "true"), id="bad-clip"),
]


@pytest.mark.parametrize("args", BAD_FLAGS)
def test_bad_flags_change_nothing(trial: TrialFiles, args: tuple[str, ...]) -> None:
    assert trial.call("echo", "first").returncode == 0
    before = trial.snapshot()
    done = trial.cli("--state", str(trial.state), "--log", str(trial.log), *args)
    assert done.returncode == 125
    one_line(done.stderr)
    assert trial.snapshot() == before


def _valid_state(trial: TrialFiles) -> bytes:
    assert trial.call("echo", "first").returncode == 0
    return trial.state.read_bytes()


BAD_STATES = {
    "garbage": lambda good: b"\x00\xffnot json",
    "truncated": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "not-an-object": lambda good: b"[1, 2, 3]\n",
    "unknown-version": lambda good: good.replace(b'"version": 1', b'"version": 99'),
    "wrong-schema": lambda good: good.replace(b'"trialtool.state"', b'"something.else"'),
    "negative-counter": lambda good: good.replace(b'"calls": 1', b'"calls": -5'),
    "counter-over-limit": lambda good: good.replace(b'"calls": 1', b'"calls": 99'),
}


@pytest.mark.parametrize("corrupt", sorted(BAD_STATES))
def test_bad_state_changes_nothing(trial: TrialFiles, corrupt: str) -> None:
    good = _valid_state(trial)
    bad = BAD_STATES[corrupt](good)
    assert bad != good
    trial.state.write_bytes(bad)
    before = trial.snapshot()
    done = trial.call("echo", "again")
    assert done.returncode == 125
    assert "state" in one_line(done.stderr)
    assert trial.snapshot() == before


def test_log_out_of_step_with_state_is_refused(trial: TrialFiles) -> None:
    _valid_state(trial)
    with trial.log.open("ab") as handle:
        handle.write(b'{"forged": true}\n')
    before = trial.snapshot()
    done = trial.call("echo", "again")
    assert done.returncode == 125 and "verify" in one_line(done.stderr)
    assert trial.snapshot() == before


def test_new_trial_over_an_old_log_is_refused(trial: TrialFiles) -> None:
    trial.log.write_bytes(b'{"old": "trial"}\n')
    done = trial.call("true")
    assert done.returncode == 125 and "another trial" in one_line(done.stderr)
    assert not trial.state.exists()


@pytest.mark.parametrize("which", ["state", "log"])
def test_unwritable_directory_changes_nothing(trial: TrialFiles, tmp_path: Path, which: str) -> None:
    # Root ignores permission bits, so "unwritable" is a parent that is a regular file.
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    state = blocker / "state.json" if which == "state" else trial.state
    log = blocker / "log.jsonl" if which == "log" else trial.log
    before = trial.snapshot()
    done = trial.cli("--state", str(state), "--log", str(log), "--", "echo", "hi")
    assert done.returncode == 125
    assert "a-file" in one_line(done.stderr)
    assert trial.snapshot() == before


def test_help_exits_zero(trial: TrialFiles) -> None:
    done = trial.cli("--help")
    assert done.returncode == 0 and b"--max-calls" in done.stdout


def test_no_trialtool_variables_are_needed(trial: TrialFiles) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TRIALTOOL_")}
    assert trial.call("true", env=env).returncode == 0
