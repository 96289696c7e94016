"""What each call checks of its trial's files without walking the log, and what is left to `verify`.

A call whose state says the log is exactly as it was written (its stamp), and whose
log's last record states the state's totals, reads nothing else of the log; any other
log gets the whole walk. These tests change the files between two calls of one warm
Trial, where nothing in memory vouches for them either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trialtool import StateError, Trial
from trialtool.ledger import durable
from trialtool.ledger._verify import verify


@pytest.fixture
def trial(tmp_path: Path) -> Iterator[Trial]:
    with Trial(tmp_path / "s.json", tmp_path / "l.jsonl", limits={"sandbox": "none", "max_calls": 20}) as made:
        for word in ("one", "two", "three"):
            made.run(["echo", word])
        yield made


def _files(trial: Trial) -> tuple[bytes, bytes]:
    return Path(trial.ledger.state_path).read_bytes(), Path(trial.ledger.log_path).read_bytes()


def _refused(trial: Trial) -> str:
    before = _files(trial)
    with pytest.raises(StateError) as caught:
        trial.run(["echo", "again"])
    assert _files(trial) == before
    return str(caught.value)


def _overwrite(path: str, old: bytes, new: bytes, line: int) -> None:
    """`old` replaced by `new` (as long) in line `line` of `path`, written in place: the same file, the same size."""
    assert len(old) == len(new)
    data = Path(path).read_bytes()
    lines = data.splitlines(keepends=True)
    at = sum(len(each) for each in lines[:line]) + lines[line].index(old)
    with open(path, "r+b") as handle:
        handle.seek(at)
        handle.write(new)


def test_a_call_reads_only_the_last_record_of_an_unchanged_log(trial: Trial) -> None:
    # The proof is what the next test shows the fast path cannot see; here: it answers, and stays right.
    state = json.loads(Path(trial.ledger.state_path).read_bytes())
    assert state["log"]["stamp"] == durable.stamp(trial.ledger.log_path)
    assert trial.run(["echo", "four"]).stdout == "four\n"
    assert verify(trial.ledger.state_path, trial.ledger.log_path).ok


def test_an_earlier_record_edited_in_place_is_refused(trial: Trial) -> None:
    _overwrite(trial.ledger.log_path, b'"delivered_emitted_tokens":2', b'"delivered_emitted_tokens":0', 2)
    assert "broken at line" in _refused(trial)


def test_a_log_cut_back_is_refused(trial: Trial) -> None:
    log = Path(trial.ledger.log_path)
    data = log.read_bytes()
    os.truncate(log, len(data) - len(data.splitlines(keepends=True)[-1]))
    assert "cut or replaced" in _refused(trial)


def test_a_log_with_records_appended_is_refused(trial: Trial) -> None:
    log = Path(trial.ledger.log_path)
    last = log.read_bytes().splitlines(keepends=True)[-1]
    with open(log, "ab") as handle:
        handle.write(last + last)
    assert "more than one crash can leave" in _refused(trial)


def test_a_log_swapped_for_another_trials_is_refused(trial: Trial, tmp_path: Path) -> None:
    with Trial(tmp_path / "other.json", tmp_path / "other.jsonl", limits={"sandbox": "none"}) as other:
        for word in ("one", "two", "three"):
            other.run(["echo", word])
    os.replace(tmp_path / "other.jsonl", trial.ledger.log_path)
    _refused(trial)


def test_the_states_counters_edited_are_refused(trial: Trial) -> None:
    state = json.loads(Path(trial.ledger.state_path).read_bytes())
    state["calls"] = 1  # buy two calls back; the log is untouched, so its stamp still matches
    Path(trial.ledger.state_path).write_text(json.dumps(state))
    assert "disagrees with its log" in _refused(trial)


def test_the_state_rolled_back_is_refused_or_rolled_forward(trial: Trial, tmp_path: Path) -> None:
    shutil.copyfile(trial.ledger.state_path, tmp_path / "old.json")
    trial.run(["echo", "four"])
    shutil.copyfile(tmp_path / "old.json", trial.ledger.state_path)
    # One record behind is what a crash leaves: that record is rolled forward, its call still charged.
    assert trial.budget().calls_used == 4
    trial.run(["echo", "five"])
    shutil.copyfile(tmp_path / "old.json", trial.ledger.state_path)
    _refused(trial)


def test_a_log_touched_or_copied_back_as_it_was_gets_the_walk_and_passes(trial: Trial, tmp_path: Path) -> None:
    log = trial.ledger.log_path
    os.utime(log, ns=(1, 1))
    assert trial.run(["echo", "four"]).exit_code == 0
    shutil.copyfile(log, tmp_path / "copy.jsonl")
    os.replace(tmp_path / "copy.jsonl", log)  # the same bytes in another file
    assert trial.run(["echo", "five"]).exit_code == 0
    assert verify(trial.ledger.state_path, log).ok


def test_an_edit_stat_cannot_tell_apart_is_left_to_verify_strict(trial: Trial) -> None:
    # What the fast path trusts: a log whose device, inode, size, mtime and ctime are as the state
    # recorded them. An edit that kept all five (the same size, within one tick of a kernel's coarse
    # clock, before multigrain timestamps) is made here by setting the state's stamp after the edit.
    _overwrite(trial.ledger.log_path, b'"delivered_emitted_tokens":2', b'"delivered_emitted_tokens":0', 2)
    state = json.loads(Path(trial.ledger.state_path).read_bytes())
    state["log"]["stamp"] = durable.stamp(trial.ledger.log_path)
    Path(trial.ledger.state_path).write_text(json.dumps(state))
    assert trial.run(["echo", "four"]).exit_code == 0  # not walked: accepted
    assert not verify(trial.ledger.state_path, trial.ledger.log_path).ok
    log = trial.ledger.log_path
    done = subprocess.run(
        [sys.executable, "-m", "trialtool", "verify", "--strict", "--state", trial.ledger.state_path, "--log", log],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and b"FAILED" in done.stdout
