"""Bad input through the CLI and `serve`: one clear line, a documented exit code, nothing charged or changed.

Each test here stands for a case in docs/bad-input.md.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from tests.conftest import COMMAND_PY, TrialFiles, strict_records
from trialtool.ledger._verify import verify

PY = sys.executable


def one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    text = done.stderr.decode("utf-8", "replace")
    assert text.startswith("trial-tool: ") and text.count("\n") == 1, text
    return text


def call(trial: TrialFiles, *command: str | bytes, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[bytes]:
    argv: list[str | bytes] = [*trial.argv(*flags, "--"), *command]
    return subprocess.run(argv, capture_output=True, timeout=60)


def test_a_command_name_that_is_not_utf8_is_not_found_and_logged_losslessly(trial: TrialFiles) -> None:
    done = call(trial, b"no\xffcmd")
    assert done.returncode == 127 and b"command not found" in done.stderr
    [record] = strict_records(trial.log)
    assert record["status"] == "command_error" and record["command"] == ["no\ufffdcmd"]
    assert [base64.b64decode(arg) for arg in record["command_b64"]] == [b"no\xffcmd"]
    assert trial.state_json()["in_flight"] == {}
    assert verify(trial.state, trial.log).ok


def test_an_argument_that_is_not_utf8_reaches_the_command_exactly(trial: TrialFiles) -> None:
    show = "import sys; print(sys.argv[1].encode('utf-8', 'surrogateescape').hex())"
    done = call(trial, COMMAND_PY, "-c", show, b"a\xff\xfeb")
    assert (done.returncode, done.stdout) == (0, b"61fffe62\n")
    [record] = strict_records(trial.log)
    assert record["command"][3] == "a\ufffd\ufffdb"
    assert base64.b64decode(record["command_b64"][3]) == b"a\xff\xfeb"


def test_an_all_utf8_command_has_no_base64_twin(trial: TrialFiles) -> None:
    assert call(trial, "echo", "héllo").returncode == 0
    [record] = strict_records(trial.log)
    assert record["command"] == ["echo", "héllo"] and "command_b64" not in record


def test_an_empty_command_name_is_refused_uncharged(trial: TrialFiles) -> None:
    assert call(trial, "true").returncode == 0
    before = trial.snapshot()
    done = call(trial, "")
    assert done.returncode == 125 and "name is empty" in one_line(done)
    assert trial.snapshot() == before


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"command": ["echo", "a\0b"]}, "NUL"),
        ({"command": ["echo", "\ud800"]}, "lone surrogate"),
        ({"command": "true", "env": {"A=B": "1"}}, "cannot be an environment variable's name"),
        ({"command": "true", "env": {"A": "\0"}}, "NUL"),
        ({"command": "true", "cwd": "/no\ud800where"}, "lone surrogate"),
    ],
)
def test_what_the_os_cannot_take_is_refused_uncharged(trial: TrialFiles, options: dict[str, object], says: str) -> None:
    from trialtool import Trial, UsageError

    with Trial(trial.state, trial.log) as api:
        api.run("true")
        before = trial.snapshot()
        with pytest.raises(UsageError, match=says):
            api.run(**options)  # type: ignore[arg-type]
    assert trial.snapshot() == before


def test_serve_refuses_a_lone_surrogate_uncharged_and_the_log_stays_strict(trial: TrialFiles) -> None:
    requests = (
        b'{"id": 1, "method": "run", "params": {"command": "echo \\ud800"}}\n'
        b'{"id": 2, "method": "run", "params": {"command": ["echo", "x"], "env": {"A": "\\ud800"}}}\n'
        b'{"id": 3, "method": "run", "params": {"command": "true", "cwd": "/nonexistent/dir"}}\n'
        b'{"id": 4, "method": "run", "params": {"command": "echo ok"}}\n'
    )
    argv = [PY, "-m", "trialtool", "serve", "--state", str(trial.state), "--log", str(trial.log)]
    done = subprocess.run([*argv, "--max-concurrent", "1"], input=requests, capture_output=True, timeout=60)
    answers = {answer["id"]: answer for answer in map(json.loads, done.stdout.splitlines())}
    assert answers[1]["error"]["data"]["kind"] == "UsageError" and "lone surrogate" in answers[1]["error"]["message"]
    assert answers[2]["error"]["data"]["kind"] == "UsageError"
    assert answers[3]["error"]["message"] == 'cwd "/nonexistent/dir" is not a directory'  # no CLI flag named
    assert answers[4]["result"]["status"] == "ok"
    assert [row["sequence"] for row in strict_records(trial.log)] == [1]


def test_the_empty_command_name_is_refused_alike_by_cli_and_serve(trial: TrialFiles) -> None:
    request = b'{"id": 1, "method": "run", "params": {"command": [""]}}\n'
    argv = [PY, "-m", "trialtool", "serve", "--state", str(trial.state), "--log", str(trial.log)]
    done = subprocess.run(argv, input=request, capture_output=True, timeout=60)
    assert "name is empty" in json.loads(done.stdout)["error"]["message"]
    assert strict_records(trial.log) == []  # serve made the trial (its first line), and recorded no call


def test_version_and_a_mistyped_command(trial: TrialFiles) -> None:
    from trialtool import __version__

    done = trial.cli("--version")
    assert (done.returncode, done.stdout) == (0, f"trial-tool {__version__}\n".encode())
    done = trial.cli("stauts", "--state", str(trial.state), "--log", str(trial.log))
    assert done.returncode == 125 and "unknown command 'stauts'" in one_line(done)
    usage = trial.cli("--help").stdout.decode()
    assert usage.startswith("usage: trial-tool [run] --state S --log L") and "-- CMD ARGS..." in usage.splitlines()[0]


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_lock_timeout_that_makes_no_sense_is_refused(trial: TrialFiles, value: str) -> None:
    done = call(trial, "true", flags=("--lock-timeout", value))
    assert done.returncode == 125 and "lock timeout" in one_line(done)
    assert not trial.state.exists()


def test_status_and_verify_of_no_trial_create_nothing(trial: TrialFiles) -> None:
    for command in ("status", "verify"):
        done = trial.cli(command, "--state", str(trial.state), "--log", str(trial.log))
        assert done.returncode == 125 and "no trial at" in one_line(done)
    assert list(trial.root.iterdir()) == []


def test_a_log_that_is_a_directory_is_named_as_one(trial: TrialFiles) -> None:
    trial.log.mkdir()
    done = call(trial, "true")
    assert done.returncode == 125 and "is a directory" in one_line(done)
    assert not trial.state.exists()


def test_a_log_in_a_place_that_cannot_hold_one_fails_before_the_command_runs(trial: TrialFiles) -> None:
    assert call(trial, "true").returncode == 0
    before = trial.snapshot()
    blocker = trial.root / "file"
    blocker.write_text("")
    marker = trial.root / "ran"
    done = subprocess.run(
        [*trial.argv()[:3], str(trial.state), "--log", str(blocker / "log.jsonl"), "--", "touch", str(marker)],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 125 and not marker.exists()
    assert {k: v for k, v in trial.snapshot().items() if k != "file"} == before


def test_missing_directories_are_made_by_init_only(trial: TrialFiles) -> None:
    nested = trial.root / "typo" / "state.json"
    done = subprocess.run(
        [PY, "-m", "trialtool", "--state", str(nested), "--log", str(trial.log), "--", "true"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 125 and "does not exist" in one_line(done)
    assert not (trial.root / "typo").exists() and not trial.log.exists()
    done = trial.cli("init", "--state", str(nested), "--log", str(trial.root / "logs" / "l.jsonl"))
    assert done.returncode == 0 and nested.exists()


def test_the_deadline_notice_costs_no_blank_line_and_elapsed_counts_from_the_deadlines_start(trial: TrialFiles) -> None:
    done = call(trial, "sleep", "5", flags=("--call-timeout", "0.5", "--kill-grace", "0.1"))
    assert done.returncode == 124 and done.stderr.startswith(b"[trial-tool: stopped at the 0.5 s call deadline")
    [record] = strict_records(trial.log)
    assert record["elapsed_seconds"] >= record["deadline_seconds"] == 0.5
    printed = call(trial, "sh", "-c", "printf partial >&2; sleep 5", flags=("--call-timeout", "0.5"))
    assert printed.stderr.startswith(b"partial\n[trial-tool: stopped")


def test_numbers_and_values_in_messages_read_as_written(trial: TrialFiles) -> None:
    done = call(trial, "true", flags=("--max-calls", "5000000"))
    assert "between 1 and 1000000, not 5000000" in one_line(done)
    trial.state.write_text("{}")
    done = call(trial, "true")
    assert "schema is null" in one_line(done)
