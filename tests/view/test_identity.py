"""Every trial carries its identity (labels, its own log, a key for each record) and every format says it."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TrialFiles
from tests.view.conftest import make_trial

DOCS = Path(__file__).resolve().parents[2] / "docs"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trialtool", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_labels_are_pinned_and_shown_everywhere(tmp_path: Path) -> None:
    files = ["--state", str(tmp_path / "s.json"), "--log", str(tmp_path / "l.jsonl"), "--sandbox", "none"]
    first = cli(*files, "--label", "task=t1", "--label", "epoch=2", "--", "echo", "hi")
    assert first.returncode == 0, first.stderr
    assert cli(*files, "--label", "task=t1", "--", "true").returncode == 0  # naming fewer is fine
    other = cli(*files, "--label", "task=t2", "--", "touch", str(tmp_path / "ran"))
    assert other.returncode == 125 and other.stderr.count("\n") == 1 and "pinned" in other.stderr
    assert not (tmp_path / "ran").exists()
    bad = cli(*files, "--label", "no equals sign", "--", "true")
    assert bad.returncode == 125 and "KEY=VALUE" in bad.stderr
    status = cli("status", *files[:4])
    assert "labels    epoch=2 task=t1" in status.stdout
    assert json.loads(cli("status", "--json", *files[:4]).stdout)["labels"] == {"epoch": "2", "task": "t1"}
    first_line = json.loads((tmp_path / "l.jsonl").read_text().splitlines()[0])
    assert first_line["record_type"] == "trial_tool_trial" and first_line["labels"] == {"epoch": "2", "task": "t1"}
    report = json.loads(cli("report", "--format", "json", str(tmp_path)).stdout)
    assert report["trials"][0]["labels"] == {"epoch": "2", "task": "t1"}


def test_scores_join_on_labels_or_on_trial_id(tmp_path: Path) -> None:
    for task in ("a", "b", "c"):
        (tmp_path / task).mkdir()
        make_trial(tmp_path / task / "s.json", tmp_path / task / "l.jsonl", ["echo hi"], labels={"task": task})
    scores = tmp_path / "scores.csv"
    scores.write_text("task,score\na,1\nb,0.5\n")
    report = json.loads(cli("report", "--format", "json", "--scores", str(scores), str(tmp_path)).stdout)
    got = {trial["labels"]["task"]: trial.get("score") for trial in report["trials"]}
    assert got == {"a": 1.0, "b": 0.5, "c": None}
    by_id = tmp_path / "by-id.jsonl"
    trial_id = json.loads((tmp_path / "c" / "s.json").read_text())["trial_id"]
    by_id.write_text(json.dumps({"trial_id": trial_id, "score": 0.25}) + "\n")
    report = json.loads(cli("report", "--format", "json", "--scores", str(by_id), str(tmp_path)).stdout)
    assert {trial["labels"]["task"]: trial.get("score") for trial in report["trials"]}["c"] == 0.25


def test_refusals_sharing_a_call_number_each_have_a_record_number(tmp_path: Path) -> None:
    files = TrialFiles(tmp_path)
    make_trial(files.state, files.log, ["echo one", "echo two", "echo three"], {"max_calls": 1})
    records = files.records()
    assert [(r["sequence"], r["record"]) for r in records] == [(1, 2), (2, 3), (2, 4)]  # two refusals, call 2
    names = ["--state", str(files.state), "--log", str(files.log)]
    for number, word in ((3, "two"), (4, "three")):
        shown = json.loads(cli("show", "--json", "--record", str(number), *names).stdout)
        assert shown["record"]["record"] == number and shown["record"]["command"][-1] == f"echo {word}"
    both = json.loads(cli("show", "--json", "--call", "2", *names).stdout)
    assert [entry["record"]["record"] for entry in both] == [3, 4]
    missing = cli("show", "--record", "9", *names)
    assert missing.returncode == 125 and "no record 9" in missing.stderr
    rows = [json.loads(line) for line in cli("export", str(tmp_path)).stdout.splitlines()]
    keys = [(row["trial_id"], row["record"]) for row in rows]
    assert len(keys) == len(set(keys)) == 3


def test_a_log_the_command_wrote_beside_the_state_is_not_taken_for_its_own(tmp_path: Path) -> None:
    files = TrialFiles(tmp_path)
    make_trial(files.state, files.log, ["echo one", "echo two"])
    # A log named as the state's stem, as a command could write it: records of no trial, or of another.
    (tmp_path / "state.jsonl").write_bytes(files.log.read_bytes().splitlines(keepends=True)[0].replace(b"a", b"b"))
    [(_, log)] = _found(tmp_path)
    assert Path(log).name == "log.jsonl"
    report = json.loads(cli("report", "--format", "json", str(tmp_path)).stdout)
    assert [trial["integrity"]["verdict"] for trial in report["trials"]] == ["clean"]


def _found(root: Path) -> list[tuple[str, str]]:
    from trialtool.view.trials import find

    return find([str(root)]).pairs


def test_a_copied_trial_pairs_with_its_own_copy_of_the_log(tmp_path: Path) -> None:
    (tmp_path / "t0").mkdir()
    make_trial(tmp_path / "t0" / "s.json", tmp_path / "t0" / "l.jsonl", ["echo hi"])
    shutil.copytree(tmp_path / "t0", tmp_path / "t1")  # its state still names t0's log
    pairs = {Path(state).parent.name: Path(log).parent.name for state, log in _found(tmp_path)}
    assert pairs == {"t0": "t0", "t1": "t1"}


def test_trials_made_inside_a_sandboxed_trials_workspace_are_ignored_and_counted(tmp_path: Path) -> None:
    from trialtool import sandbox as seam

    if seam.unavailable() is not None:
        pytest.skip(f"the bwrap sandbox cannot run here: {seam.unavailable()}")
    template = tmp_path / "template"
    template.mkdir()
    make_trial(template / "s.json", template / "l.jsonl", ["echo forged"])
    runs = tmp_path / "runs"
    workspace = runs / "real" / "workspace"
    workspace.mkdir(parents=True)
    real = TrialFiles(runs / "real")
    real.state, real.log = runs / "real" / "s.json", runs / "real" / "l.jsonl"
    flags = ("--sandbox", "bwrap", "--workspace", str(workspace))
    # From inside a call: the command plants a whole unkeyed trial, clean by its own files, in its workspace.
    # (The host's /tmp, where the template is, is not the sandbox's: the files come in on stdin.)
    for name in ("s.json", "l.jsonl"):
        plant = f"mkdir -p fake && cat > fake/{name}"
        done = real.call("sh", "-c", plant, flags=(*flags, "--stdin", str(template / name)), cwd=workspace)
        assert done.returncode == 0, done.stderr
    assert (workspace / "fake" / "s.json").exists()
    report = cli("report", "--format", "json", str(runs))
    shown = json.loads(report.stdout)
    assert [Path(trial["state"]).parent.name for trial in shown["trials"]] == ["real"]
    assert shown["overview"]["ignored_inside_workspaces"] == [str(workspace / "fake" / "s.json")]
    assert "1 file inside trials' workspaces ignored" in report.stderr
    exported = cli("export", "--trials", str(tmp_path / "trials.jsonl"), str(runs))
    assert "1 file inside trials' workspaces ignored" in exported.stderr
    assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == 1


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three trials: one with calls and labels, one created and never called, one tampered with."""
    root = tmp_path_factory.mktemp("identity")
    for name, commands, labels in (
        ("used", ["echo hi", "exit 3"], {"task": "t1", "epoch": "1", "model": "m"}),
        ("idle", [], {"task": "t2"}),
        ("tampered", ["echo a", "echo b", "echo c"], {"task": "t3"}),
    ):
        (root / name).mkdir()
        files = root / name / "s.json", root / name / "l.jsonl"
        if commands:
            make_trial(*files, commands, labels=labels)
        else:
            done = cli(
                "init", "--state", str(files[0]), "--log", str(files[1]), "--sandbox", "none", "--label", "task=t2"
            )
            assert done.returncode == 0, done.stderr
    log = root / "tampered" / "l.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"echo b"', b'"echo B"')
    log.write_bytes(b"".join(lines))
    return root


def _trials_table(bench: Path, tmp_path: Path, chosen: str) -> list[dict[str, Any]]:
    suffix = {"jsonl": "jsonl", "csv": "csv", "parquet": "parquet"}[chosen]
    trials, calls = tmp_path / f"trials.{suffix}", tmp_path / f"calls.{suffix}"
    done = cli("export", "--format", chosen, "--trials", str(trials), "-o", str(calls), str(bench))
    assert done.returncode == 0, done.stderr
    if chosen == "jsonl":
        return [json.loads(line) for line in trials.read_text().splitlines()]
    if chosen == "csv":
        with trials.open(newline="") as handle:
            return list(csv.DictReader(handle))
    return []  # Parquet: read by DuckDB in the test


@pytest.mark.parametrize("chosen", ["jsonl", "csv"])
def test_the_trials_table_has_every_trial_and_what_a_grader_filters_on(
    bench: Path, tmp_path: Path, chosen: str
) -> None:
    rows = {row["task"]: row for row in _trials_table(bench, tmp_path, chosen)}
    assert set(rows) == {"t1", "t2", "t3"}  # the idle trial, with no calls, has its row
    assert rows["t1"]["verdict"] == "clean" and str(rows["t1"]["calls"]) == "2" and rows["t1"]["model"] == "m"
    assert rows["t2"]["verdict"] == "clean" and str(rows["t2"]["calls"]) == "0"
    assert rows["t3"]["verdict"] == "failed" and str(rows["t3"]["first_bad_record"]) == "4"
    assert "chain broken" in rows["t3"]["why"]
    for row in rows.values():
        assert str(row["fairness_group"]) == "1" and row["state"].endswith("s.json")
        for name in ("in_flight", "ended_by", "score", "max_call_tokens", "clip", "labels", "head", "log"):
            assert name in row


def test_parquet_types_its_timestamps_and_the_documented_join_runs(bench: Path, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="DuckDB reads the exports (the test extra installs it)")
    _trials_table(bench, tmp_path, "parquet")
    for table in ("calls", "trials"):
        kinds = {
            row[0]: row[1] for row in duckdb.sql(f"DESCRIBE SELECT * FROM '{tmp_path / table}.parquet'").fetchall()
        }
        assert kinds["started_at_utc"] == "TIMESTAMP WITH TIME ZONE", kinds["started_at_utc"]
    keys = duckdb.sql(f"SELECT count(*), count(DISTINCT (trial_id, record)) FROM '{tmp_path / 'calls.parquet'}'")
    assert keys.fetchall() == [(5, 5)]
    # The join of docs/graders.md, as written there.
    query = re.search(r"```sql\n(.*?)```", (DOCS / "graders.md").read_text(), re.S)
    assert query is not None
    sql = query.group(1).replace("'calls.parquet'", f"'{tmp_path / 'calls.parquet'}'")
    sql = sql.replace("'trials.parquet'", f"'{tmp_path / 'trials.parquet'}'")
    rows = duckdb.sql(sql).fetchall()
    assert {row[0] for row in rows} == {"t1"}, rows  # calls of clean trials only: the idle one has none


def test_every_format_gives_each_trial_its_fairness_group(tmp_path: Path) -> None:
    for name, limits in (("a", {}), ("b", {}), ("c", {"max_calls": 5, "clip": "head"})):
        (tmp_path / name).mkdir()
        make_trial(tmp_path / name / "s.json", tmp_path / name / "l.jsonl", ["echo hi"], limits)
    shown = json.loads(cli("report", "--format", "json", str(tmp_path)).stdout)
    groups = {Path(t["state"]).parent.name: t["fairness"] for t in shown["trials"]}
    assert groups["a"] == groups["b"] == {"group": 1, "differs": {}}
    assert groups["c"] == {"group": 2, "differs": {"limits.clip": ["headtail", "head"], "limits.max_calls": [12, 5]}}
    with (tmp_path / "r.csv").open("w") as handle:
        handle.write(cli("report", "--format", "csv", str(tmp_path)).stdout)
    with (tmp_path / "r.csv").open(newline="") as handle:
        rows = {Path(row["trial"]).parent.name: row for row in csv.DictReader(handle)}
    assert rows["c"]["fairness_group"] == "2" and "limits.clip headtail -> head" in rows["c"]["differs"]
    for name in ("call_timeout", "clip", "max_call_tokens", "max_capture_bytes", "kill_grace", "max_procs"):
        assert name in rows["a"]
    markdown = cli("report", "--format", "markdown", str(tmp_path)).stdout
    assert "| fairness_group |" in markdown and "limits.max_calls 12 -> 5" in markdown
    table = cli("report", str(tmp_path)).stdout
    assert "group 2" in table and "majority" in table
