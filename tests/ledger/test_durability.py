"""The ledger under parallel processes, crashes, a stuck lock, a full disk and random interleavings."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from tests.conftest import TrialFiles, marked, wait_until
from trialtool import BudgetExhausted, StorageError, Trial
from trialtool.ledger import Settings, clock, durable
from trialtool.ledger._ledger import Ledger
from trialtool.ledger._verify import verify
from trialtool.osio import process_token

EXAMPLES = int(os.environ.get("TRIALTOOL_HYPOTHESIS_EXAMPLES", "150"))


def assert_verified(trial: TrialFiles) -> dict[str, Any]:
    report = verify(trial.state, trial.log)
    assert report.ok, report.problems
    return trial.state_json()


@pytest.mark.timeout(120)
def test_twenty_parallel_calls_against_twelve_overlap(trial: TrialFiles) -> None:
    # The trial's files beside the workspace: calls of a trial inside it run one at a time.
    workspace = trial.root / "ws"
    workspace.mkdir()
    init = trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), "--workspace", str(workspace))
    assert init.returncode == 0
    started = time.monotonic()
    codes = [code for code, _ in trial.parallel(trial.argv("--cwd", str(workspace), "--", "sleep", "0.5"), 20)]
    wall = time.monotonic() - started
    assert sorted(codes) == [0] * 12 + [123] * 8
    assert wall < 12 * 0.5  # serial would take at least 6 s; parallel calls overlap
    state = assert_verified(trial)
    assert state["calls"] == 12 and state["refused_calls"] == 8


@pytest.mark.timeout(120)
def test_a_call_waits_for_tokens_held_in_flight(trial: TrialFiles) -> None:
    # The first call to reserve holds all 10 tokens; the others wait for its unused ones.
    flags = ("--max-tokens", "10", "--max-call-tokens", "10")
    assert trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), *flags).returncode == 0
    results = trial.parallel(trial.argv("--", "sh", "-c", "sleep 0.3; echo hi"), 3)
    assert results == [(0, b"hi\n")] * 3
    state = assert_verified(trial)
    assert state["emitted_tokens"] == 6 and state["refused_calls"] == 0


@pytest.mark.timeout(600)
def test_random_sigkills_refund_nothing_and_leave_a_verifiable_trial(trial: TrialFiles, marker: str) -> None:
    """Hundreds of SIGKILLs of trial-tool at random moments of its calls."""
    kills = int(os.environ.get("TRIALTOOL_FAULT_KILLS", "200"))
    ran = trial.root / "ran.txt"
    flags = ("--max-calls", "100000", "--max-tokens", "100000000")
    assert trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), *flags).returncode == 0
    chooser = random.Random(20261202)
    script = f"echo x >> {ran}; echo {marker}"
    for _ in range(kills):
        proc = subprocess.Popen(
            trial.argv("--", "sh", "-c", script), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        # Not synchronisation: the random moment of the kill is the point of the test.
        time.sleep(chooser.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = trial.call("echo", "after")  # recovers whatever the kills left in flight
    assert done.returncode == 0, done.stderr
    state = assert_verified(trial)
    rows = trial.records()
    started = len(ran.read_text().splitlines()) if ran.exists() else 0
    assert state["in_flight"] == {}
    assert state["calls"] >= started + 1  # every command that started was charged
    assert state["calls"] == sum(1 for row in rows if row.get("charged"))
    assert marked(marker) == []


@pytest.mark.timeout(60)
def test_log_append_failing_fails_closed(trial: TrialFiles) -> None:
    assert trial.call("echo", "first").returncode == 0
    limit = trial.log.stat().st_size + 200  # room for the state's rewrites, not for a record

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # In process: the file-size limit is on trial-tool's own writes here (a server would pass it to the command).
    argv = trial.argv("--in-process", "--", "echo", "lost")
    done = subprocess.run(argv, capture_output=True, preexec_fn=small_files, timeout=60)
    assert done.returncode == 125 and done.stdout == b""
    message = done.stderr.decode()
    assert message.count("\n") == 1 and "log.jsonl" in message and "too large" in message.lower()
    state = assert_verified(trial)
    assert state["calls"] == 2 and list(state["in_flight"]) == ["2"]  # charged, not recorded as a success
    assert trial.call("echo", "next").returncode == 0
    assert [row["status"] for row in trial.records()] == ["ok", "abandoned", "ok"]
    assert_verified(trial)


# A call's fsyncs: the reserved state, the record, the committed state (directories only at creation).
@pytest.mark.parametrize("failing_call", [1, 2, 3])
def test_fsync_error_fails_closed_and_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    files = TrialFiles(tmp_path)
    api = Trial(files.state, files.log)
    api.run(["echo", "first"])
    real_fsync = os.fsync
    calls = {"n": 0, "failed": 0}

    def fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == failing_call:
            calls["failed"] += 1
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    if failing_call < 3:
        with pytest.raises(StorageError, match="Input/output error"):
            api.run(["echo", "second"])
    else:
        # The record reached the disk before the state failed: the record is the truth, so
        # the call is delivered as recorded (never failed while its record says delivered).
        assert api.run(["echo", "second"]).stdout == "second\n"
    monkeypatch.setattr(durable.os, "fsync", real_fsync)
    assert calls["failed"] == 1
    # Old or new, never mixed: whatever was left, the next call mends it and verify agrees.
    api.run(["echo", "third"])
    assert verify(files.state, files.log).ok
    state = files.state_json()
    # Only a failure before the reservation's rename leaves the second call uncharged.
    assert state["in_flight"] == {} and state["calls"] == (2 if failing_call == 1 else 3)


def test_torn_log_line_is_repaired_and_recorded(trial: TrialFiles) -> None:
    assert trial.call("echo", "first").returncode == 0
    with trial.log.open("ab") as handle:
        handle.write(b'{"record_type":"trial_tool_call","seq')  # a writer killed mid-line
    assert trial.call("echo", "second").returncode == 0
    rows = trial.records()
    assert [row["status"] for row in rows] == ["ok", "log_repaired", "ok"]
    assert rows[1]["removed_bytes"] == len(b'{"record_type":"trial_tool_call","seq')
    assert_verified(trial)


def test_record_appended_before_a_crash_is_rolled_forward(trial: TrialFiles, tmp_path: Path) -> None:
    assert trial.call("echo", "first").returncode == 0
    before = tmp_path / "state-before.json"
    before.write_bytes(trial.state.read_bytes())
    assert trial.call("echo", "second").returncode == 0
    # As if trial-tool died between appending call 2's record and replacing the state:
    # the state from after call 2's reservation, the log from after its record.
    state = json.loads(before.read_text())
    state["calls"] = 2
    state["in_flight"] = {"2": {"pid": 1, "pid_token": "gone", "allowance": 5000, "command": ["echo", "second"]}}
    trial.state.write_text(json.dumps(state))
    assert trial.call("echo", "third").returncode == 0
    state = assert_verified(trial)
    assert state["calls"] == 3 and state["emitted_tokens"] == 6


@contextlib.contextmanager
def stopped_lock_holder(trial: TrialFiles) -> Iterator[int]:
    """A process that takes the ledger lock and stops itself (SIGSTOP) holding it; yields its pid."""
    holder_code = (
        "import fcntl, os, signal\n"
        f"fd = os.open({str(trial.state) + '.lock'!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.ftruncate(fd, 0); os.pwrite(fd, str(os.getpid()).encode(), 0)\n"
        "print('locked', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGSTOP)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", holder_code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        yield holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.mark.timeout(60)
def test_stuck_lock_holder_times_out_clearly_and_a_dead_one_releases(trial: TrialFiles) -> None:
    assert trial.call("true").returncode == 0
    with stopped_lock_holder(trial) as holder:
        before = trial.snapshot()
        done = trial.call("true", flags=("--lock-timeout", "0.5"))
        assert done.returncode == 125
        assert f"held by pid {holder}".encode() in done.stderr and b"--lock-timeout" in done.stderr
        assert trial.snapshot() == before
    assert trial.call("true", flags=("--lock-timeout", "5")).returncode == 0  # the dead holder's lock is gone


def test_trial_time_never_runs_backwards() -> None:
    # On another boot (or without a boot id) elapsed time comes from the wall clock,
    # which may have been stepped back: the recorded floor still holds.
    anchor = {"boot_id": "another-boot", "boot_clock": 1.0}
    assert clock.elapsed(anchor, started_at=time.time() + 3600, floor=42.0) == 42.0
    same_boot = {"boot_id": clock.boot_id(), "boot_clock": clock.boot_clock() - 5.0}
    if same_boot["boot_id"] is not None:
        assert clock.elapsed(same_boot, started_at=time.time() + 3600, floor=0.0) >= 5.0


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve, commit, crash and recover steps against a model of the ledger."""

    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="trialtool-machine-"))
        self.state, self.log = self.root / "s.json", self.root / "l.jsonl"
        self.limits = {"max_calls": 6, "max_tokens": 40, "max_call_tokens": 15, "call_timeout": 0.01}
        live = (os.getpid(), process_token(os.getpid()))
        self.live = Ledger(self.state, self.log, owner=live)
        self.dead = Ledger(self.state, self.log, owner=(os.getpid(), "a-process-that-died"))
        self.calls = self.emitted = self.refused = 0
        self.in_flight: dict[int, tuple[int, bool]] = {}  # sequence -> (allowance, crashed)

    def _recover_model(self) -> None:
        for sequence, (_, crashed) in list(self.in_flight.items()):
            if crashed:
                del self.in_flight[sequence]

    @rule(target=reservations, crash=st.booleans())
    def reserve(self, crash: bool) -> object:
        self._recover_model()
        reserved = sum(allowance for allowance, _ in self.in_flight.values())
        unreserved = self.limits["max_tokens"] - self.emitted - reserved
        ledger = self.dead if crash else self.live
        try:
            reservation = ledger.reserve(Settings.of(self.limits), ["step"])
        except BudgetExhausted as exc:
            status = exc.status
        else:
            status = None
        if status is not None:
            self.refused += 1
            spent = self.calls >= self.limits["max_calls"]
            assert status == ("maximum_tool_calls" if spent else "maximum_emitted_tokens")
            return None
        assert self.calls < self.limits["max_calls"] and unreserved > 0
        self.calls += 1
        assert reservation.sequence == self.calls
        assert reservation.allowance == min(self.limits["max_call_tokens"], unreserved)
        self.in_flight[reservation.sequence] = (reservation.allowance, crash)
        return None if crash else reservation

    @rule(reservation=consumes(reservations), fraction=st.floats(0, 1))
    def commit(self, reservation: object, fraction: float) -> None:
        if reservation is None or reservation.sequence not in self.in_flight:  # type: ignore[attr-defined]
            return
        delivered = int(reservation.allowance * fraction)  # type: ignore[attr-defined]
        record = {
            "record_type": "trial_tool_call",
            "sequence": reservation.sequence,
            "status": "ok",  # type: ignore[attr-defined]
            "charged": True,
            "delivered_emitted_tokens": delivered,
            "allowance_tokens": reservation.allowance,
        }  # type: ignore[attr-defined]
        self.live.commit(reservation, record)  # type: ignore[arg-type]
        del self.in_flight[reservation.sequence]  # type: ignore[attr-defined]
        self.emitted += delivered

    @invariant()
    def ledger_matches_the_model(self) -> None:
        if not self.state.exists():
            return
        state = json.loads(self.state.read_text())
        assert state["calls"] == self.calls
        assert state["emitted_tokens"] == self.emitted <= self.limits["max_tokens"]
        assert state["refused_calls"] == self.refused
        assert {int(k) for k in state["in_flight"]} == set(self.in_flight)
        assert verify(self.state, self.log).ok

    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


LedgerMachine.TestCase.settings = settings(
    max_examples=max(10, EXAMPLES // 5),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_ledger_state_machine = LedgerMachine.TestCase


def _catches(pid: int, sig: int) -> bool:
    """Whether `pid` has a handler installed for `sig` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            caught = next(line for line in handle if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (sig - 1)))


@pytest.mark.timeout(60)
def test_sigterm_while_waiting_for_the_lock_charges_nothing(trial: TrialFiles) -> None:
    assert trial.call("true").returncode == 0
    with stopped_lock_holder(trial):
        before = trial.snapshot()
        waiting = subprocess.Popen(trial.argv("--", "echo", "never"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            # No event says "now waiting for the lock"; its SIGTERM handler being in place is
            # what the test needs, and /proc shows it.
            assert wait_until(lambda: _catches(waiting.pid, signal.SIGTERM), timeout=30)
            started = time.monotonic()
            waiting.send_signal(signal.SIGTERM)
            out, err = waiting.communicate(timeout=30)
        finally:
            waiting.kill()
            waiting.wait()
        assert waiting.returncode == 143 and out == b""
        assert b"SIGTERM" in err and b"nothing is charged" in err
        assert time.monotonic() - started < 10  # not the 30 s lock timeout
        assert trial.snapshot() == before
