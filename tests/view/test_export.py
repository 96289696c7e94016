"""`trial-tool export`: every call a row, and DuckDB reads what we write, as a grader would."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.view.conftest import make_trial

duckdb = pytest.importorskip("duckdb", reason="DuckDB reads the exports (the test extra installs it)")


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "trialtool", *args], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    for index, calls in enumerate((3, 5)):
        (root / f"t{index}").mkdir()
        commands = ["echo hi", "seq 1 400", "exit 2", "echo a; echo b >&2", "echo last"]
        make_trial(
            root / f"t{index}" / "s.json",
            root / f"t{index}" / "l.jsonl",
            commands,
            {"max_calls": calls, "max_call_tokens": 30},
        )
    return root


def test_jsonl_has_a_row_per_record(bench: Path) -> None:
    done = cli("export", str(bench))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 10  # 3 calls and 2 refusals, then 5 calls
    first = rows[0]
    assert first["max_calls"] == 3 and first["sequence"] == 1 and first["command"] == "/bin/sh -c 'echo hi'"
    assert [row["status"] for row in rows[:5]] == [
        "ok",
        "truncated",
        "error",
        "maximum_tool_calls",
        "maximum_tool_calls",
    ]


def test_parquet_read_by_duckdb(bench: Path, tmp_path: Path) -> None:
    out = tmp_path / "calls.parquet"
    done = cli("export", "--format", "parquet", "-o", str(out), str(bench))
    assert done.returncode == 0, done.stderr
    # The example of docs/graders.md, as a grader would run it.
    by_status = duckdb.sql(
        f"SELECT status, count(*) AS calls, sum(delivered_emitted_tokens) AS tokens "
        f"FROM '{out}' GROUP BY ALL ORDER BY 1"
    ).fetchall()
    assert dict((status, calls) for status, calls, _ in by_status) == {
        "error": 2, "maximum_tool_calls": 2, "ok": 4, "truncated": 2,
    }  # fmt: skip
    types = dict(duckdb.sql(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM '{out}')").fetchall())
    assert types["sequence"] == "BIGINT" and types["elapsed_seconds"] == "DOUBLE" and types["charged"] == "BOOLEAN"
    per_trial = duckdb.sql(f"SELECT trial_id, max(charged_calls_after) FROM '{out}' GROUP BY ALL").fetchall()
    assert sorted(count for _, count in per_trial) == [3, 5]


def test_csv_and_delivered_text(bench: Path, tmp_path: Path) -> None:
    out = tmp_path / "calls.csv"
    assert cli("export", "--format", "csv", "--text", "-o", str(out), str(bench / "t1")).returncode == 0
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5
    assert rows[3]["delivered_stdout"] == "a\n" and rows[3]["delivered_stderr"] == "b\n"
    clipped = rows[1]
    assert clipped["output_truncated"] == "True" and "clipped" in clipped["delivered_stdout"]
    assert {row["delivered_matches"] for row in rows} == {"True"}
    assert duckdb.sql(f"SELECT count(*) FROM read_csv('{out}')").fetchall() == [(5,)]


def test_parquet_needs_a_file(bench: Path) -> None:
    done = cli("export", "--format", "parquet", str(bench))
    assert done.returncode == 125 and done.stderr == b"trial-tool: --format parquet needs -o FILE\n"
