"""trial-tool's own files: links are not followed, FIFOs never block, a log holds one trial, verify says what mends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TrialFiles, strict_records
from trialtool.ledger._verify import verify


def one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    text = done.stderr.decode()
    assert text.startswith("trial-tool: ") and text.count("\n") == 1, text
    return text


@pytest.mark.parametrize("which", ["state", "log", "lock"])
def test_a_link_in_place_of_a_file_is_refused_and_its_target_untouched(trial: TrialFiles, which: str) -> None:
    outside = trial.root / "outside.txt"
    outside.write_bytes(b"precious\n")
    path = {"state": trial.state, "log": trial.log, "lock": Path(f"{trial.state}.lock")}[which]
    path.symlink_to(outside)
    done = trial.call("true")
    assert done.returncode == 125 and "symbolic link" in one_line(done)
    assert outside.read_bytes() == b"precious\n"


def test_a_dangling_link_as_the_lock_creates_nothing(trial: TrialFiles) -> None:
    target = trial.root / "not-there"
    Path(f"{trial.state}.lock").symlink_to(target)
    done = trial.call("true")
    assert done.returncode == 125 and "symbolic link" in one_line(done)
    assert not target.exists() and not trial.state.exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["state", "log", "lock"])
def test_a_fifo_in_place_of_a_file_is_refused_at_once(trial: TrialFiles, which: str) -> None:
    path = {"state": trial.state, "log": trial.log, "lock": Path(f"{trial.state}.lock")}[which]
    os.mkfifo(path)
    marker = trial.root / "ran"
    done = trial.call("touch", str(marker), timeout=30)
    assert done.returncode == 125 and "a FIFO, not a regular file" in one_line(done)
    assert not marker.exists()
    if which == "state":
        checked = trial.cli("verify", "--state", str(trial.state), "--log", str(trial.log), timeout=30)
        assert checked.returncode == 1 and b"a FIFO" in checked.stdout


def test_two_trials_cannot_share_a_log(trial: TrialFiles) -> None:
    """A log is bound to its trial when the trial is made: a second trial on it is refused at once."""
    other = trial.root / "other.json"
    assert trial.cli("init", "--state", str(trial.state), "--log", str(trial.log)).returncode == 0
    before = trial.snapshot()
    files = ["--state", str(other), "--log", str(trial.log)]
    for argv in (["init", *files], [*files, "--", "sh", "-c", f"echo ran > {trial.root / 'marker'}"]):
        done = trial.cli(*argv)
        assert done.returncode == 125 and "another trial" in one_line(done), done.stderr
    assert trial.snapshot() == before  # the loser left nothing, not even its state; its command never ran
    assert not (trial.root / "marker").exists()
    assert trial.call("echo", "first").returncode == 0
    assert verify(trial.state, trial.log).verdict == "clean"


def test_two_new_trials_started_together_on_one_log(tmp_path: Path) -> None:
    """Raced, rounds over: one trial claims the log; the other's command never runs; every command that ran
    has its record."""
    for round_ in range(8):
        root = tmp_path / f"round{round_}"
        root.mkdir()
        log = root / "l.jsonl"
        procs = []
        for name in "ab":
            argv = [sys.executable, "-m", "trialtool", "--state", str(root / f"{name}.json"), "--log", str(log)]
            argv += ["--sandbox", "none", "--in-process", "--", "sh", "-c", f"echo {name} > {root / name}.ran"]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        codes = []
        for proc in procs:
            proc.communicate(timeout=60)
            codes.append(proc.returncode)
        assert sorted(codes) == [0, 125], codes
        winner = "ab"[codes.index(0)]
        loser = "ab"[codes.index(125)]
        assert (root / f"{winner}.ran").exists() and not (root / f"{loser}.ran").exists()
        assert not (root / f"{loser}.json").exists()
        records = [json.loads(line) for line in log.read_bytes().splitlines()]
        assert [r["record_type"] for r in records] == ["trial_tool_trial", "trial_tool_call"]
        assert verify(root / f"{winner}.json", log).verdict == "clean"


def test_verify_calls_a_crash_one_record_behind_unconfirmed(trial: TrialFiles, tmp_path: Path) -> None:
    assert trial.call("echo", "first").returncode == 0
    reserved = json.loads(trial.state.read_text())
    assert trial.call("echo", "second").returncode == 0
    # As if trial-tool died between appending call 2's record and replacing its state.
    reserved["calls"] = 2
    reserved["in_flight"] = {"2": {"pid": 1, "pid_token": "gone", "allowance": 5000, "command": ["echo", "second"]}}
    trial.state.write_text(json.dumps(reserved))
    done = trial.cli("verify", "--state", str(trial.state), "--log", str(trial.log))
    assert done.returncode == 0, done.stdout
    assert b"unconfirmed: the log's last record (line 3, call 2) is not counted by the state" in done.stdout
    strict = trial.cli("verify", "--strict", "--state", str(trial.state), "--log", str(trial.log))
    assert strict.returncode == 4, strict.stdout
    assert trial.call("echo", "third").returncode == 0  # rolled forward, as verify said
    assert verify(trial.state, trial.log).verdict == "clean"


def test_verify_calls_a_torn_last_line_unconfirmed(trial: TrialFiles) -> None:
    assert trial.call("echo", "first").returncode == 0
    with trial.log.open("ab") as handle:
        handle.write(b'{"record_type":"trial_tool_call","seq')
    report = verify(trial.state, trial.log)
    assert report.ok and report.verdict == "unconfirmed" and "torn" in str(report.why)


@pytest.mark.timeout(60)
def test_a_lock_timeout_names_the_process_that_holds_the_lock(trial: TrialFiles) -> None:
    assert trial.call("true").returncode == 0
    lock = Path(f"{trial.state}.lock")
    holder = subprocess.Popen(["flock", "-x", str(lock), "-c", "echo locked; exec sleep 60"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"  # the event: it holds the lock
        done = trial.call("true", flags=("--lock-timeout", "0.3"))
        assert done.returncode == 125 and f"held by pid {holder.pid}" in one_line(done)
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert lock.read_bytes() == b""  # nothing written into the lock file by anyone
    assert [row["status"] for row in strict_records(trial.log)] == ["ok"]


def test_a_trial_whose_log_is_still_empty_claims_it_on_its_next_call(trial: TrialFiles) -> None:
    """As a crash between writing a new trial's state and its log's first line leaves it (or a trial made
    before logs had one): the next call claims the log, then runs."""
    assert trial.cli("init", "--state", str(trial.state), "--log", str(trial.log)).returncode == 0
    document = json.loads(trial.state.read_text())
    document["log"] = {"records": 0, "bytes": 0, "head": "0" * 64, "last_offset": 0}
    trial.state.write_text(json.dumps(document))
    trial.log.write_bytes(b"")
    assert trial.call("echo", "hi").returncode == 0
    lines = [json.loads(line) for line in trial.log.read_text().splitlines()]
    assert [(line["record_type"], line["record"]) for line in lines] == [
        ("trial_tool_trial", 1),
        ("trial_tool_call", 2),
    ]
    assert verify(trial.state, trial.log).verdict == "clean"


def test_grading_commands_are_never_refused_never_charged(tmp_path: Path) -> None:
    """The harness's own commands (a scorer's) after the agent spent every call, token and second."""
    from trialtool import BudgetExhausted, Trial

    files = TrialFiles(tmp_path)
    limits = {"sandbox": "none", "max_calls": 1, "max_call_tokens": 5}
    with Trial(files.state, files.log, limits=limits) as trial:
        assert trial.run(["echo", "the agent's"]).status == "ok"
        with pytest.raises(BudgetExhausted):
            trial.run(["echo", "refused"])
        before = json.loads(files.state.read_text())
        graded = trial.run(["sh", "-c", "seq 1 2000"], grading=True)
        assert graded.status == "ok" and graded.stdout.endswith("2000\n")  # all of it: not the agent's allowance
        assert graded.sequence == 0 and not graded.output_truncated
    after = json.loads(files.state.read_text())
    counters = ("calls", "emitted_tokens", "refused_calls", "in_flight")
    assert {name: after[name] for name in counters} == {name: before[name] for name in counters}
    record = strict_records(files.log)[-1]
    assert (record["record_type"], record["charged"], record["sequence"]) == ("trial_tool_grading", False, None)
    assert verify(files.state, files.log).verdict == "clean"
    done = files.cli("status", "--json", "--state", str(files.state), "--log", str(files.log))
    shown = json.loads(done.stdout)
    assert shown["grading_commands"] == 1 and shown["ended_by"] == "calls"
    assert shown["statuses"] == {"ok": 1, "maximum_tool_calls": 1}


def test_the_final_act_runs_once_a_trial_however_many_processes_race_for_it(tmp_path: Path) -> None:
    """`final=True` is an ordinary call while the budget lasts; once it is spent, one of eight racing
    processes runs it (as grading, uncharged), and the seven others are refused as any call is."""
    files = TrialFiles(tmp_path)
    files.cli("init", "--state", str(files.state), "--log", str(files.log), "--max-calls", "1", "--sandbox", "none")
    racer = (
        "import sys\n"
        "from trialtool import BudgetExhausted, Trial\n"
        "with Trial(sys.argv[1], sys.argv[2]) as trial:\n"
        "    try:\n"
        "        result = trial.run(['sh', '-c', 'echo ran >> ' + sys.argv[3]], final=True)\n"
        "    except BudgetExhausted as exc:\n"
        "        print(exc.status)\n"
        "    else:\n"
        "        print('sequence', result.sequence)\n"
    )
    marks = tmp_path / "ran"
    argv = [sys.executable, "-c", racer, str(files.state), str(files.log), str(marks)]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == "sequence 1\n"
    racing = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(8)]
    said = sorted(process.communicate(timeout=120)[0] for process in racing)
    assert said == ["maximum_tool_calls\n"] * 7 + ["sequence 0\n"]
    assert marks.read_text() == "ran\n" * 2
    kinds = [(r["record_type"], r["status"], r.get("final")) for r in strict_records(files.log)]
    assert sorted(kinds[1:], key=str) == sorted(
        [("trial_tool_call", "maximum_tool_calls", None)] * 7 + [("trial_tool_grading", "ok", True)], key=str
    )
    state = json.loads(files.state.read_text())
    assert state["calls"] == 1 and state["refused_calls"] == 7 and state["final_used"] is True
    assert verify(files.state, files.log).verdict == "clean"
