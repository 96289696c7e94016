"""`trial-tool report`: many trials found, verified in parallel, compared; every format; only reads."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.view.conftest import make_trial, make_trials
from trialtool.view import report as reports
from trialtool.view.trials import find

KEY = b"k" * 32


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "trialtool", *args], capture_output=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five trials as a benchmark leaves them: three alike, one under other rules, one tampered, one keyed."""
    root = tmp_path_factory.mktemp("bench")
    rules = {"max_calls": 3, "max_call_tokens": 40}
    make_trials(root, "abc", ["echo hi", "seq 1 500", "false", "echo no"], rules)
    make_trials(root, "d", ["echo hi"], {**rules, "max_calls": 10})
    make_trials(root, "e", ["echo one", "echo two"], rules)
    log = root / "e" / "l.jsonl"
    log.write_bytes(log.read_bytes().replace(b"echo two", b"echo TWO"))
    make_trials(root, "f", ["echo hi"], rules, key=KEY)
    return root


def report_json(*args: str) -> dict[str, Any]:
    done = cli("report", "--format", "json", *args)
    assert done.returncode in (0, 1), done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_the_overview_answers_the_graders_questions(bench: Path) -> None:
    shown = report_json(str(bench))
    overview = shown["overview"]
    assert overview["trials"] == 6
    fairness = overview["fairness"]
    assert not fairness["same_rules"] and fairness["majority"]["trials"] == 5
    assert fairness["others"] == [{"group": 2, "trials": 1, "differs": {"limits.max_calls": [3, 10]}}]
    assert overview["integrity"] == {"clean": 4, "failed": 1, "unverified": 1}
    assert overview["ended_by"] == {"calls": 3, "none": 3}
    assert overview["statuses"]["maximum_tool_calls"] == 3 and overview["statuses"]["truncated"] == 3
    assert overview["used"]["calls"]["max"] == 3 and sum(overview["histograms"]["calls"]) == 6
    trials = shown["trials"]
    assert trials[0]["state"].endswith("d/s.json")  # the one held to other rules comes first
    tampered = next(t for t in trials if t["state"].endswith("e/s.json"))
    assert tampered["integrity"]["verdict"] == "failed" and tampered["integrity"]["first_bad_sequence"] == 2
    keyed = next(t for t in trials if t["state"].endswith("f/s.json"))
    assert keyed["keyed"] and keyed["integrity"]["verdict"] == "unverified"


def test_a_key_verifies_keyed_trials(bench: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    shown = report_json(str(bench / "f"), "--key-file", str(key_file))
    assert shown["overview"]["integrity"] == {"clean": 1}


def test_exit_code_says_whether_every_trial_is_intact(bench: Path) -> None:
    assert cli("report", str(bench)).returncode == 1
    assert cli("report", str(bench / "a"), str(bench / "b")).returncode == 0


def test_scores_are_joined_to_usage(bench: Path, tmp_path: Path) -> None:
    ids = {name: json.loads((bench / name / "s.json").read_text())["trial_id"] for name in "abcd"}
    scores = tmp_path / "scores.csv"
    scores.write_text(
        "trial_id,score\n" + "".join(f"{ids[n]},{s}\n" for n, s in zip("abcd", (0, 1, 0, 1), strict=True))
    )
    overview = report_json(str(bench), "--scores", str(scores))["overview"]
    assert overview["scores"] == {
        "matched": 4,
        "by_ended_by": {"calls": {"trials": 3, "mean": round(1 / 3, 4)}, "none": {"trials": 1, "mean": 1.0}},
    }
    lines = tmp_path / "scores.jsonl"
    lines.write_text("".join(json.dumps({"trial_id": ids[n], "score": 0.5}) + "\n" for n in "ab"))
    assert report_json(str(bench), "--scores", str(lines))["overview"]["scores"]["matched"] == 2


def test_the_table_csv_and_markdown(bench: Path, tmp_path: Path) -> None:
    table = cli("report", str(bench)).stdout.decode()
    assert table.startswith("6 trials\nfairness: 1 trial differs") and "d/s.json" in table
    rows = list(csv.DictReader(io.StringIO(cli("report", "--format", "csv", str(bench)).stdout.decode())))
    assert len(rows) == 6 and rows[0]["trial"] == "d/s.json" and rows[0]["max_calls"] == "10"
    markdown = cli("report", "--format", "markdown", str(bench)).stdout.decode()
    assert markdown.startswith("# Trials") and markdown.count("\n| ") == 8  # header, rule, six trials
    out = tmp_path / "report.csv"
    assert cli("report", "--format", "csv", "-o", str(out), str(bench)).returncode == 1
    with out.open() as handle:
        assert len(list(csv.DictReader(handle))) == 6
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_globs_and_single_states(bench: Path) -> None:
    assert report_json(str(bench / "*" / "s.json"))["overview"]["trials"] == 6
    assert report_json(str(bench / "**" / "*.json"), str(bench / "a"))["overview"]["trials"] == 6
    assert report_json(str(bench / "a" / "s.json"))["overview"]["trials"] == 1


def test_bad_input_gets_one_line(bench: Path, tmp_path: Path) -> None:
    for args in (
        ("report", str(tmp_path / "nowhere")),
        ("report", str(tmp_path / "*.json")),
        ("report", "--format", "pdf", str(bench)),
        ("report", str(tmp_path)),  # a directory without trials
        ("report", "--scores", str(tmp_path / "missing.csv"), str(bench)),
    ):
        done = cli(*args)
        assert done.returncode == 125 and done.stderr.count(b"\n") == 1, (args, done.stderr)


def test_report_changes_nothing(bench: Path) -> None:
    before = {p: p.read_bytes() for p in sorted(bench.rglob("*")) if p.is_file()}
    assert cli("report", "--format", "json", str(bench)).returncode == 1
    assert {p: p.read_bytes() for p in sorted(bench.rglob("*")) if p.is_file()} == before


def test_pairs_by_stem_by_trial_id_and_alone(tmp_path: Path) -> None:
    make_trial(tmp_path / "one.json", tmp_path / "one.jsonl", ["echo 1"])
    make_trial(tmp_path / "x.json", tmp_path / "y.jsonl", ["echo 2"])
    make_trial(tmp_path / "p.json", tmp_path / "q.jsonl", ["echo 3"])
    (tmp_path / "config.json").write_text('{"not": "a trial"}')
    (tmp_path / ".hidden.json").write_text("{}")
    found = {Path(state).name: Path(log).name for state, log in find([str(tmp_path)]).pairs}
    assert found == {"one.json": "one.jsonl", "x.json": "y.jsonl", "p.json": "q.jsonl"}
    alone = tmp_path / "alone"
    alone.mkdir()
    make_trial(alone / "s.json", alone / "l.jsonl", ["echo 4"])
    assert [(Path(s).name, Path(log).name) for s, log in find([str(alone)]).pairs] == [("s.json", "l.jsonl")]


def test_a_trial_from_before_the_stdin_bound_has_the_same_rules(tmp_path: Path) -> None:
    make_trials(tmp_path, "ab", ["echo hi"], {})
    state = tmp_path / "a" / "s.json"
    document = json.loads(state.read_text())
    del document["limits"]["max_stdin_bytes"]  # as a state written before the limit existed
    state.write_text(json.dumps(document, sort_keys=True))
    overview = report_json(str(tmp_path))["overview"]
    assert overview["fairness"]["same_rules"], overview["fairness"]
    assert overview["integrity"] == {"clean": 2}


def test_in_parallel_as_in_one_process(tmp_path: Path) -> None:
    """Enough trials for the worker pool: the same summaries, in the same order, as without it."""
    first = tmp_path / "t000"
    first.mkdir()
    make_trial(first / "s.json", first / "l.jsonl", ["echo hi", "false"])
    for number in range(1, 80):
        shutil.copytree(first, tmp_path / f"t{number:03}")
    pairs = find([str(tmp_path)]).pairs
    serial = reports.build(pairs, workers=1)
    parallel = reports.build(pairs, workers=2)
    try:
        assert list(serial.trials()) == list(parallel.trials())
        assert serial.overview == parallel.overview
        assert parallel.overview["duplicate_trial_ids"] != []  # copies of one trial are called out
    finally:
        serial.close()
        parallel.close()


@given(st.lists(st.floats(min_value=0, max_value=3, allow_nan=False), max_size=200))
def test_histograms_count_every_trial_once(shares: list[float]) -> None:
    from array import array

    counts = reports._histogram(array("d", shares))
    assert sum(counts) == len(shares) and len(counts) == 20
    spread = reports._distribution(array("d", shares))
    if shares:
        # Figures are rounded to 4 places.
        assert min(shares) - 1e-4 <= spread["median"] <= spread["p90"] <= spread["max"] == round(max(shares), 4)


def test_a_progress_bar_only_on_a_terminal(bench: Path) -> None:
    import os
    import pty

    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "trialtool", "report", str(bench)],
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=120,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 1 and b"verifying [" in seen and b"6/6" in seen
    assert b"verifying" not in cli("report", str(bench)).stderr  # not a terminal: no bar


@pytest.mark.timeout(120)
def test_output_to_a_device_or_fifo_writes_to_it_and_never_replaces_it(bench: Path, tmp_path: Path) -> None:
    import os
    import stat
    import threading

    if os.geteuid() != 0:
        pytest.skip("needs root to make a device node (a node of the test's own, never the machine's /dev/null)")
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()))
    reader.start()
    try:
        for target in (null, fifo):
            for command in (["report", str(bench), "--format", "csv"], ["export", str(bench), "--format", "csv"]):
                if target == fifo and command[0] == "export":
                    continue  # one writer for the one reader
                done = cli(*command, "-o", str(target))
                assert done.returncode in (0, 1), done.stderr
    finally:
        reader.join(timeout=60)
    assert stat.S_ISCHR(null.stat().st_mode) and null.stat().st_rdev == os.makedev(1, 3)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert read and read[0].startswith(b"trial,")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fifo", "null"]  # no temporary left


def test_output_through_a_symlink_replaces_what_it_points_to(bench: Path, tmp_path: Path) -> None:
    target = tmp_path / "reports" / "latest.csv"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "report.csv"
    link.symlink_to(target)
    done = cli("report", str(bench), "--format", "csv", "-o", str(link))
    assert done.returncode in (0, 1), done.stderr
    assert link.is_symlink() and target.read_text().startswith("trial,")
    directory = tmp_path / "dir"
    directory.mkdir()
    refused = cli("report", str(bench), "--format", "csv", "-o", str(directory))
    assert refused.returncode == 125 and refused.stderr.count(b"\n") == 1 and b"directory" in refused.stderr


def test_one_trial_is_counted_as_one(tmp_path: Path) -> None:
    make_trials(tmp_path, "a", ["echo hi"], {"max_calls": 3})
    done = cli("report", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines()[0] == "1 trial"
