"""One verdict a grader can gate on: forged, unfinished and keyless trials are never `clean`.

Real trials made through the API and the CLI, then changed as a forger or a crash would
change them; every graders' command is asked, and `--strict` gates on anything but clean.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TrialFiles
from tests.view.conftest import make_trial
from trialtool import Trial
from trialtool.ledger import audit

KEY = b"a-key-of-the-ledger-" * 2


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trialtool", *args], capture_output=True, text=True, timeout=120)


def ask(files: TrialFiles, *extra: str) -> dict[str, Any]:
    """Every graders' command's word for the trial, and verify's exit codes with and without --strict."""
    flags = ["--state", str(files.state), "--log", str(files.log), *extra]
    verified = cli("verify", *flags, "--json")
    strict = cli("verify", *flags, "--strict")
    status = json.loads(cli("status", *flags, "--json").stdout)
    report = cli("report", str(files.state), "--format", "json", *extra)
    report_strict = cli("report", str(files.state), "--format", "csv", "--strict", *extra)
    return {
        "verify": json.loads(verified.stdout)["verdict"],
        "verify_exit": verified.returncode,
        "strict_exit": strict.returncode,
        "verify_text": strict.stdout,
        "status": status["integrity"]["verdict"],
        "report": json.loads(report.stdout)["trials"][0]["integrity"]["verdict"],
        "report_strict_exit": report_strict.returncode,
    }


def forge_last_record(files: TrialFiles, key: bytes | None = None) -> None:
    """Append one record with a correct link and totals that add up, leaving the state alone."""
    lines = files.log.read_bytes().splitlines()
    last = json.loads(lines[-1])
    forged = dict(last, sequence=last["sequence"] + 1, record=last["record"] + 1, stdout_b64="Zm9yZ2VkCg==")
    forged["prev_hash"] = audit.Chain(key).digest(lines[-1])
    after = last["ledger_after"]
    forged["ledger_after"] = dict(
        after,
        charged_calls=after["charged_calls"] + 1,
        emitted_tokens=after["emitted_tokens"] + forged["delivered_emitted_tokens"],
    )
    with files.log.open("ab") as handle:
        handle.write(audit.encode(forged) + b"\n")


@pytest.fixture
def files(tmp_path: Path) -> TrialFiles:
    return TrialFiles(tmp_path)


def test_a_whole_trial_is_clean_everywhere(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi", "false"])
    said = ask(files)
    assert {said[name] for name in ("verify", "status", "report")} == {"clean"}
    assert said["verify_exit"] == said["strict_exit"] == said["report_strict_exit"] == 0


def test_a_forged_last_record_is_never_clean_and_fails_against_the_head(files: TrialFiles) -> None:
    results = make_trial(files.state, files.log, ["echo hi", "echo there"])
    head = results[-1].head
    assert head == json.loads(files.state.read_text())["log"]["head"]
    forge_last_record(files)
    said = ask(files)
    assert {said[name] for name in ("verify", "status", "report")} == {"unconfirmed"}
    assert said["verify_exit"] == 0 and said["strict_exit"] == 4 and said["report_strict_exit"] == 4
    assert "someone appended" in said["verify_text"]
    against = cli("verify", "--state", str(files.state), "--log", str(files.log), "--expect-head", head)
    assert against.returncode == 1 and "1 record after line 3" in against.stdout, against.stdout
    # The forged record shown on its own: its hashes match (the forger made them), and the verdict comes first.
    names = ("--state", str(files.state), "--log", str(files.log))
    shown = cli("show", "--record", "4", *names)
    assert shown.stdout.startswith("!!! the trial is unconfirmed: "), shown.stdout
    said = json.loads(cli("show", "--json", "--record", "4", *names).stdout)["integrity"]
    assert said["verdict"] == "unconfirmed" and said["this_record"] is True and said["first_bad_record"] == 4
    # The genuine trial passes against its head.
    files.log.write_bytes(b"".join(line + b"\n" for line in files.log.read_bytes().splitlines()[:-1]))
    clean = cli("verify", "--state", str(files.state), "--log", str(files.log), "--expect-head", head, "--strict")
    assert clean.returncode == 0, clean.stdout


@pytest.mark.timeout(120)
def test_a_call_whose_owner_was_killed_is_in_flight_everywhere(files: TrialFiles, marker: str) -> None:
    make_trial(files.state, files.log, ["echo hi"])
    argv = files.argv("--sandbox", "none", "--", "sh", "-c", f": {marker}; sleep 60")
    caller = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env={**os.environ, "TRIALTOOL_SERVER": "off"})
    try:
        # In flight once the state says so: polled, as a grader would see it (no event to wait on).
        deadline = time.monotonic() + 60
        while not json.loads(files.state.read_text())["in_flight"]:
            assert time.monotonic() < deadline and caller.poll() is None, "the call never started"
            time.sleep(0.02)
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=60)
    finally:
        caller.kill()
        caller.wait()
    said = ask(files)
    assert {said[name] for name in ("verify", "status", "report")} == {"in_flight"}, said
    assert said["verify_exit"] == 0 and said["strict_exit"] == 5 and said["report_strict_exit"] == 5
    assert "owner is gone" in said["verify_text"]


def test_a_keyed_trial_without_its_key_is_unverified_not_broken(files: TrialFiles, tmp_path: Path) -> None:
    make_trial(files.state, files.log, ["echo hi", "echo there", "false", "echo four"], key=KEY)
    said = ask(files)
    assert {said[name] for name in ("verify", "status", "report")} == {"unverified"}
    assert said["verify_exit"] == said["strict_exit"] == said["report_strict_exit"] == 3
    assert "chain broken" not in said["verify_text"] and "5 records" in said["verify_text"]
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    with_key = ask(files, "--key-file", str(key_file))
    assert with_key["verify"] == "clean" and with_key["strict_exit"] == 0


def test_the_head_travels_with_every_result(files: TrialFiles) -> None:
    with Trial(files.state, files.log, limits={"sandbox": "none"}) as trial:
        first = trial.run(["echo", "hi"])
        second = trial.run(["echo", "there"])
    assert first.head != second.head and len(second.head) == 64
    assert second.as_json()["head"] == second.head == json.loads(files.state.read_text())["log"]["head"]
    done = files.call("echo", "x", flags=("--json",))
    assert json.loads(done.stdout)["head"] == json.loads(files.state.read_text())["log"]["head"]


def test_report_fails_every_trial_off_the_heads_its_harness_was_given(tmp_path: Path) -> None:
    heads = []
    for name in ("a", "b", "c"):
        files = TrialFiles(tmp_path / name)
        files.root.mkdir()
        results = make_trial(files.state, files.log, ["echo hi", "echo there"])
        heads.append({"trial_id": json.loads(files.state.read_text())["trial_id"], "head": results[-1].head})
        if name == "b":
            forge_last_record(files)
    given = tmp_path / "heads.jsonl"
    given.write_text("".join(json.dumps(row) + "\n" for row in heads))
    plain = cli("report", str(tmp_path), "--format", "json")
    verdicts = [trial["integrity"]["verdict"] for trial in json.loads(plain.stdout)["trials"]]
    assert sorted(verdicts) == ["clean", "clean", "unconfirmed"] and plain.returncode == 0
    anchored = cli("report", str(tmp_path), "--format", "json", "--heads", str(given))
    trials = {Path(trial["state"]).parent.name: trial["integrity"] for trial in json.loads(anchored.stdout)["trials"]}
    assert trials["b"]["verdict"] == "failed" and "the one the harness was given" in trials["b"]["why"]
    assert trials["a"]["verdict"] == trials["c"]["verdict"] == "clean"
    assert anchored.returncode == 1
