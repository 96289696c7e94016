"""What a grader brings to a report: the benchmark's scores, and the chain heads its harness was given.

Both are files of rows keyed by trial: CSV (with a header, or two columns,
trial_id and the value) or JSON lines. Scores may be keyed by labels instead
(`task,epoch,score`), so that a benchmark's own results table joins as it is.
"""

from __future__ import annotations

import csv
import json
from typing import TYPE_CHECKING, NamedTuple

from ..errors import UsageError

if TYPE_CHECKING:
    from .summary import Summary


class Scores(NamedTuple):
    """The benchmark's scores, keyed by trial id or by labels (`task`, `sample`, `epoch`, ...)."""

    #: The columns a score is matched on: ("trial_id",), or label keys.
    by: tuple[str, ...]
    table: dict[tuple[str, ...], float]

    def of(self, summary: Summary) -> float | None:
        labels = summary["labels"]
        key = [str(summary["trial_id"]) if name == "trial_id" else labels.get(name) for name in self.by]
        # A trial without one of the labels matched on has no score.
        return None if None in key else self.table.get(tuple(str(value) for value in key))

    def __len__(self) -> int:
        return len(self.table)


def load_scores(path: str) -> Scores:
    """The scores of a CSV (a header naming `score` and `trial_id` or label keys; or two columns) or JSON lines.

    Without `trial_id`, every other column names a label, and a trial's score is the
    row whose values are its labels': a benchmark's own results table joins as it is.
    """
    rows = _load_rows(path, "scores")
    by: tuple[str, ...] = ("trial_id",)
    if rows and "trial_id" not in rows[0]:
        by = tuple(name for name in rows[0] if name != "score")
    table: dict[tuple[str, ...], float] = {}
    try:
        for row in rows:
            score = row["score"]
            if isinstance(score, bool) or not isinstance(score, int | float | str):
                raise TypeError(f"a score of {score!r}")
            table[tuple(str(row[name]) for name in by)] = float(score)
    except (KeyError, ValueError, TypeError) as exc:
        msg = f"scores {path}: every row needs a score, a number, and {', '.join(by)} ({exc})"
        raise UsageError(msg) from exc
    return Scores(by, table)


def load_heads(path: str) -> dict[str, str]:
    """trial id -> the chain head its harness was last given, from CSV (`trial_id`, `head`) or JSON lines."""
    try:
        return {str(row["trial_id"]): str(row["head"]).lower() for row in _load_rows(path, "heads")}
    except KeyError as exc:
        msg = f"heads {path}: expected CSV (trial_id,head) or JSON lines with trial_id and head (no {exc})"
        raise UsageError(msg) from exc


def _load_rows(path: str, what: str) -> list[dict[str, object]]:
    """The rows of a CSV (with a header, or two columns: trial_id and the value) or JSON lines file."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except OSError as exc:
        msg = f"cannot read {what} {path}: {exc.strerror or exc}"
        raise UsageError(msg) from exc
    value = "score" if what == "scores" else "head"
    try:
        if text.lstrip().startswith("{"):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            if not all(isinstance(row, dict) for row in rows):
                raise ValueError("a line is not a JSON object")
            return rows
        table = [row for row in csv.reader(text.splitlines()) if row]
        if table and value in table[0]:
            header = table[0]
            return [dict(zip(header, row, strict=True)) for row in table[1:]]
        return [{"trial_id": row[0], value: row[1]} for row in table]
    except (ValueError, IndexError) as exc:
        msg = f"{what} {path}: expected CSV (a header, or trial_id,{value}) or JSON lines ({exc})"
        raise UsageError(msg) from exc


__all__ = ["Scores", "load_heads", "load_scores"]
