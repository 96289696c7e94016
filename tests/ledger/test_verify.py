"""Tampering is detected, per call and by `verify`; a keyed trial resists a consistent rewrite."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import TrialFiles, minimal_env
from trialtool.ledger import _state as statefile
from trialtool.ledger import audit
from trialtool.ledger._verify import verify

KEY = "0123456789abcdef0123456789abcdef"


def three_calls(trial: TrialFiles, *flags: str) -> None:
    for word in ("one", "two", "three"):
        assert trial.call("echo", word, flags=flags).returncode == 0


def refused_and_unchanged(trial: TrialFiles, **kwargs: object) -> str:
    before = trial.snapshot()
    done = trial.call("echo", "again", **kwargs)  # type: ignore[arg-type]
    assert done.returncode == 125, done.stderr
    assert trial.snapshot() == before
    return done.stderr.decode()


def verify_fails(trial: TrialFiles, key: bytes | None = None) -> int | None:
    report = verify(trial.state, trial.log, key)
    assert not report.ok
    return report.as_json()["first_bad_sequence"]  # type: ignore[no-any-return]


def test_clean_trial_verifies(trial: TrialFiles) -> None:
    three_calls(trial, "--max-calls", "3")
    assert trial.call("true").returncode == 123  # refused
    done = trial.cli("verify", "--state", str(trial.state), "--log", str(trial.log), "--json")
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    assert report["ok"] and report["totals"] == {"charged_calls": 3, "emitted_tokens": 6, "refused_calls": 1}


def test_edited_counter(trial: TrialFiles) -> None:
    three_calls(trial)
    state = trial.state_json()
    state["calls"] = 1  # buy two more calls
    trial.state.write_text(json.dumps(state))
    assert "disagrees with its log" in refused_and_unchanged(trial)
    verify_fails(trial)
    done = trial.cli("verify", "--state", str(trial.state), "--log", str(trial.log))
    assert done.returncode == 1 and b"FAILED" in done.stdout


def _rewrite_log(trial: TrialFiles, change: str) -> None:
    lines = trial.log.read_bytes().splitlines(keepends=True)  # the trial's first line, then three calls
    if change == "deleted":
        del lines[2]
    elif change == "edited":
        lines[2] = lines[2].replace(b'"delivered_emitted_tokens":2', b'"delivered_emitted_tokens":0')
    elif change == "reordered":
        lines[1], lines[2] = lines[2], lines[1]
    elif change == "last-edited":
        lines[-1] = lines[-1].replace(b'"status":"ok"', b'"status":"error"')
    trial.log.write_bytes(b"".join(lines))


@pytest.mark.parametrize("change", ["deleted", "edited", "reordered", "last-edited"])
def test_edited_log(trial: TrialFiles, change: str) -> None:
    three_calls(trial)
    _rewrite_log(trial, change)
    refused_and_unchanged(trial)
    first_bad = verify_fails(trial)
    if change in ("deleted", "edited"):
        assert first_bad in (2, 3)  # the call after the change no longer chains


def test_state_rolled_back(trial: TrialFiles, tmp_path: Path) -> None:
    assert trial.call("echo", "one").returncode == 0
    old = tmp_path / "old-state.json"
    shutil.copyfile(trial.state, old)
    assert trial.call("echo", "two").returncode == 0
    assert trial.call("echo", "three").returncode == 0
    shutil.copyfile(old, trial.state)  # back to one call spent
    refused_and_unchanged(trial)
    verify_fails(trial)


def test_consistent_rewrite_passes_without_a_key_but_not_with_one(trial: TrialFiles) -> None:
    # Without a key anyone can recompute SHA-256: this is the documented limit.
    three_calls(trial)
    forge(trial, key=None)
    assert verify(trial.state, trial.log).ok

    keyed = TrialFiles(trial.root / "keyed")
    keyed.root.mkdir()
    env = minimal_env(TRIALTOOL_LEDGER_KEY=KEY)
    for word in ("one", "two", "three"):
        assert keyed.call("echo", word, env=env).returncode == 0
    assert verify(keyed.state, keyed.log, KEY.encode()).ok
    forge(keyed, key=None)  # the forger has no key
    assert not verify(keyed.state, keyed.log, KEY.encode()).ok
    assert keyed.call("echo", "again", env=env).returncode == 125


def forge(trial: TrialFiles, key: bytes | None) -> None:
    """Refund the second call's tokens and rewrite both files consistently, chain and all."""
    chain = audit.Chain(key)
    records = [json.loads(line) for line in trial.log.read_bytes().splitlines()]  # the trial's first line too
    records[2]["delivered_emitted_tokens"] = 0
    head, lines = audit.GENESIS, []
    emitted = 0
    for record in records:
        emitted += record.get("delivered_emitted_tokens", 0)
        record["ledger_after"]["emitted_tokens"] = emitted
        record["prev_hash"] = head
        line = audit.encode(record)
        head = chain.digest(line)
        lines.append(line + b"\n")
    last_offset = sum(len(line) for line in lines[:-1])
    trial.log.write_bytes(b"".join(lines))
    state = trial.state_json()
    state["emitted_tokens"] = emitted
    state["log"] = {"records": len(lines), "bytes": sum(map(len, lines)), "head": head, "last_offset": last_offset}
    if "mac" in state:
        state["mac"] = hashlib.sha256(b"a guess").hexdigest()
    trial.state.write_text(json.dumps(state))


def test_keyed_trial_needs_its_key(trial: TrialFiles, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert trial.call("true", flags=("--key-file", str(key_file))).returncode == 0
    assert "keyed trial" in refused_and_unchanged(trial)
    other = tmp_path / "other-key"
    other.write_text("another key entirely, long enough\n")
    assert "HMAC" in refused_and_unchanged(trial, flags=("--key-file", str(other)))
    assert trial.call("true", flags=("--key-file", str(key_file))).returncode == 0


def test_short_key_is_refused(trial: TrialFiles) -> None:
    done = trial.call("true", env=minimal_env(TRIALTOOL_LEDGER_KEY="short"))
    assert done.returncode == 125 and b"16 bytes" in done.stderr


def test_state_mac_covers_the_counters(trial: TrialFiles) -> None:
    env = minimal_env(TRIALTOOL_LEDGER_KEY=KEY)
    assert trial.call("echo", "one", env=env).returncode == 0
    state = trial.state_json()
    assert state["chain"] == "hmac-sha256" and len(state["mac"]) == 64
    state["refused_calls"] = 0
    state["elapsed_seconds"] = 0.0  # even a field the log does not check
    trial.state.write_text(json.dumps(state))
    assert "HMAC" in refused_and_unchanged(trial, env=env)


def test_state_written_by_this_version_round_trips(trial: TrialFiles) -> None:
    assert trial.call("echo", "x").returncode == 0
    state = statefile.decode(trial.state.read_bytes(), trial.state, audit.Chain())
    assert state.totals().as_json() == {"charged_calls": 1, "emitted_tokens": 2, "refused_calls": 0}
