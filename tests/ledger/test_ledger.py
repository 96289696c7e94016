"""The ledger and the log agree, under random call sequences, parallel processes and a killed wrapper."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import COMMAND_PY, TrialFiles, marked, wait_until
from trialtool import BudgetExhausted, Trial
from trialtool.ledger._audit import GENESIS

EXAMPLES = int(os.environ.get("TRIALTOOL_HYPOTHESIS_EXAMPLES", "150"))


def check_ledger(state_path: Path, log_path: Path) -> dict[str, Any]:
    """Every invariant between the state and its log; returns the state."""
    files = TrialFiles(state_path.parent)
    files.state, files.log = state_path, log_path
    state = files.state_json()
    rows = files.records()
    limits = state["limits"]
    charged = [r for r in rows if r["charged"]]
    assert state["calls"] == len(charged) + len(state["in_flight"]) <= limits["max_calls"]
    assert state["emitted_tokens"] == sum(r["delivered_emitted_tokens"] for r in charged) <= limits["max_tokens"]
    assert state["refused_calls"] == len(rows) - len(charged)
    for record in charged:
        assert record["delivered_emitted_tokens"] <= record["allowance_tokens"] <= limits["max_call_tokens"]
    # The chain: each record names the hash of the line before; the state names the last.
    head = GENESIS
    lines = log_path.read_bytes().splitlines() if log_path.exists() else []
    for number, line in enumerate(lines, 1):
        assert json.loads(line)["prev_hash"] == head and json.loads(line)["record"] == number
        head = hashlib.sha256(line).hexdigest()
    assert state["log"]["head"] == head and state["log"]["records"] == len(lines)
    assert state["log"]["bytes"] == (log_path.stat().st_size if log_path.exists() else 0)
    return state


# A call: how many words it prints to stdout and to stderr, and its exit code.
calls = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 30), st.sampled_from([0, 0, 1, 2])), min_size=1, max_size=8
)


@settings(
    max_examples=max(10, EXAMPLES // 6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sequence=calls,
    max_calls=st.integers(1, 6),
    max_tokens=st.integers(1, 120),
    max_call_tokens=st.integers(1, 80),
)
def test_ledger_and_log_agree_after_any_sequence(
    tmp_path_factory: pytest.TempPathFactory,
    sequence: list[tuple[int, int, int]],
    max_calls: int,
    max_tokens: int,
    max_call_tokens: int,
) -> None:
    root = tmp_path_factory.mktemp("seq")
    limits = {"max_calls": max_calls, "max_tokens": max_tokens, "max_call_tokens": max_call_tokens}
    trial = Trial(root / "s.json", root / "l.jsonl", limits=limits)
    ran = 0
    refusals: list[str] = []
    for out_words, err_words, code in sequence:
        script = f"printf 'w%.0s ' $(seq {out_words}) ; printf 'e%.0s ' $(seq {err_words}) >&2; exit {code}"
        try:
            result = trial.run(["sh", "-c", script])
        except BudgetExhausted as exc:
            refusals.append(exc.status)
            continue
        ran += 1
        assert result.delivered_tokens <= result.allowance
        assert result.exit_code == code
    state = check_ledger(root / "s.json", root / "l.jsonl")
    assert state["calls"] == ran and state["refused_calls"] == len(refusals)
    assert set(refusals) <= {"maximum_tool_calls", "maximum_emitted_tokens"}


@pytest.mark.timeout(120)
def test_parallel_processes_never_exceed_the_call_cap(trial: TrialFiles) -> None:
    assert trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), "--max-calls", "5").returncode == 0
    codes = [code for code, _ in trial.parallel(trial.argv("--", "sleep", "0.3"), 9)]
    recorded = [(record.get("status"), record.get("error")) for record in trial.records()]
    assert sorted(codes) == [0] * 5 + [123] * 4, recorded
    state = check_ledger(trial.state, trial.log)
    assert state["calls"] == 5 and state["refused_calls"] == 4


@pytest.mark.timeout(60)
def test_killed_wrapper_charges_its_call_and_is_recovered(trial: TrialFiles, marker: str, cli_mode: str) -> None:
    script = f"{COMMAND_PY} -c 'import time; time.sleep(300)' {marker}"
    argv = trial.argv("--", "sh", "-c", script)
    wrapper = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The command only starts after the reservation is written: its appearance is the event.
        # The supervisor is a fork of the wrapper (same command line); the command is its child.
        assert wait_until(lambda: [p for p in marked(marker) if wrapper.pid not in (p.pid, p.ppid())], timeout=30)
    finally:
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait()
    assert trial.state_json()["calls"] == 1
    # In process, the supervisor's parent-death signal ends the command; through the server, the
    # server sees the connection close and stops it. Nothing announces when.
    assert wait_until(lambda: marked(marker) == [], timeout=20)
    assert trial.call("echo", "next").returncode == 0
    rows = trial.records()
    # In process the next call records it abandoned; the server records it itself, withheld.
    expected = "interrupted" if cli_mode == "server" else "abandoned"
    assert [r["status"] for r in rows] == [expected, "ok"]
    assert rows[0]["sequence"] == 1 and rows[0]["charged"] and rows[0]["delivered_emitted_tokens"] == 0
    state = check_ledger(trial.state, trial.log)
    assert state["calls"] == 2 and state["in_flight"] == {}
