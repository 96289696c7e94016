"""The command: its own group, its deadline, its output cap, prompt return. Real processes only."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest

from tests.conftest import COMMAND_PY, TrialFiles, marked

PY = COMMAND_PY


def sleeper(marker: str, extra: str = "") -> str:
    """A shell word that starts a Python sleeper carrying `marker` on its command line."""
    return f"{PY} -c 'import signal, time; {extra}time.sleep(300)' {marker}"


@pytest.mark.timeout(60)
def test_deadline_kills_the_whole_group(trial: TrialFiles, marker: str) -> None:
    done = trial.call("sh", "-c", f"{sleeper(marker)} & {sleeper(marker)}", flags=("--call-timeout", "0.5"))
    assert done.returncode == 124
    assert marked(marker) == []


@pytest.mark.timeout(60)
def test_sigterm_ignored_gets_sigkill_after_grace(trial: TrialFiles, marker: str) -> None:
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    started = time.monotonic()
    done = trial.call(
        "sh", "-c", f"exec {sleeper(marker, ignore)}", flags=("--call-timeout", "0.5", "--kill-grace", "0.3")
    )
    assert done.returncode == 124
    assert time.monotonic() - started < 20  # generous: catches a hang, not a slow machine
    assert marked(marker) == []
    assert trial.records()[0]["command_signal"] == 9


@pytest.mark.timeout(60)
def test_returns_when_the_command_exits_though_a_child_holds_stdout(trial: TrialFiles, marker: str) -> None:
    started = time.monotonic()
    done = trial.call("sh", "-c", f"{sleeper(marker)} & echo hi")
    assert time.monotonic() - started < 20
    assert (done.returncode, done.stdout) == (0, b"hi\n")
    assert marked(marker) == []


@pytest.mark.timeout(60)
def test_output_cap_stops_a_runaway_writer(trial: TrialFiles) -> None:
    done = trial.call("yes", flags=("--max-capture-bytes", "10000"))
    assert done.returncode == 124
    record = trial.records()[0]
    assert record["status"] == "output_limit" and record["stdout_capture_truncated"]
    assert len(base64.b64decode(record["stdout_b64"])) == 10000
    assert record["stdout_bytes"] >= 10000
    assert record["token_cost_censored"] and not record["complete_delivery"]


def test_capture_cap_inside_a_character_delivers_no_replacement(trial: TrialFiles) -> None:
    code = "import sys; sys.stdout.write('😀' * 100000)"
    done = trial.call(PY, "-c", code, flags=("--max-capture-bytes", "1001", "--max-call-tokens", "100000"))
    assert done.returncode == 124
    text = done.stdout.decode("utf-8")
    assert "\ufffd" not in text and set(text) <= {"😀"}


def test_invalid_utf8_is_delivered_and_counted(trial: TrialFiles, encoder: object) -> None:
    done = trial.call("printf", r"ok \377\376 bytes\n")
    assert done.returncode == 0
    record = trial.records()[0]
    assert record["status"] == "ok"
    assert base64.b64decode(record["stdout_b64"]) == b"ok \xff\xfe bytes\n"
    text = done.stdout.decode("utf-8")
    assert text == "ok \ufffd\ufffd bytes\n"
    assert record["delivered_emitted_tokens"] == len(encoder.encode_ordinary(text))  # type: ignore[attr-defined]


def test_delivered_text_recounts_to_the_record(trial: TrialFiles, encoder: object) -> None:
    code = "import sys; print('日本語 😀 <|endoftext|> ' * 400); print('warn ' * 300, file=sys.stderr)"
    done = trial.call(PY, "-c", code, flags=("--max-call-tokens", "150"))
    record = trial.records()[0]
    recount = sum(len(encoder.encode_ordinary(s.decode())) for s in (done.stdout, done.stderr))  # type: ignore[attr-defined]
    assert recount == record["delivered_emitted_tokens"] <= 150
    assert record["status"] == "truncated" and done.stderr  # stderr got its share


def test_head_clip_mode(trial: TrialFiles) -> None:
    done = trial.call("seq", "1", "1000", flags=("--max-call-tokens", "20", "--clip", "head"))
    assert done.returncode == 0
    assert b"1\n2\n3\n".startswith(done.stdout[:6]) and b"clipped" not in done.stdout


@pytest.mark.timeout(60)
def test_interrupt_arriving_with_the_orders_stops_the_command(tmp_path: Path, marker: str) -> None:
    # trial-tool interrupted before the supervisor even read its orders: the stop request
    # can arrive in the same read as the orders, and must not be lost (it once hung here).
    from trialtool.process._launcher import Launcher
    from trialtool.process._orders import Spec
    from trialtool.types._limits import Limits

    read_end, write_end = os.pipe()
    os.write(write_end, b"\x02")  # a signal already waiting, as the wakeup pipe would hold it
    try:
        with Launcher(str(tmp_path)) as launcher:
            started = time.monotonic()
            argv = [PY, "-c", "import time; time.sleep(300)", marker]
            limits = Limits(max_capture_bytes=1000, kill_grace=0.2)
            outcome = launcher.run(Spec(argv, None, None, started, started + 30, limits), read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert outcome.report.ended == "interrupted"
    assert outcome.report.elapsed < 20
    assert marked(marker) == []
