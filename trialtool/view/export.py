"""Every call of every trial as one flat row, and every trial as one: JSON lines, CSV, or Parquet for SQL.

A call's row is its own columns (calls.COLUMNS) after its trial's: the path,
the pinned limits and the sandbox, so that one table answers questions across
a whole benchmark (`SELECT status, count(*) ... GROUP BY ALL` in DuckDB, Spark
or Trino) without a join; (trial_id, record) is its key. The trials table
(`--trials FILE`) has a row for every trial found, calls or none: its verdict
and why, its first bad record, what ended it, its fairness group, labels,
score and paths, built by the report (report.py) so that both say the same.
The connections table (`--connections FILE`, connections.py) has a row for
every connection a call's record lists.
Trials are read in worker processes and written in batches, never all held
at once. Parquet needs pyarrow (`trialtool[parquet]`), which nothing else
imports; there, timestamps are typed (TIMESTAMP, UTC).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any

from ..errors import TrialToolError, UsageError
from ..ledger import START
from ..types import Limits

if TYPE_CHECKING:
    from .report import Report
from . import calls as call_rows
from .render import spreadsheet_safe

#: The trial's columns, ahead of each call's, with their kinds.
TRIAL_SCHEMA = (
    ("state", "text"),
    ("max_calls", "int"),
    ("max_tokens", "int"),
    ("max_call_tokens", "int"),
    ("trial_timeout", "float"),
    ("call_timeout", "float"),
    ("sandbox_mode", "text"),
    ("sandbox_network", "text"),
    ("keyed", "bool"),
)
TEXT_SCHEMA = (("delivered_stdout", "text"), ("delivered_stderr", "text"), ("delivered_matches", "bool"))
#: Labels that harnesses set (the inspect integration sets them all), each a column of its own.
KNOWN_LABELS = ("task", "sample", "epoch", "model", "run")
#: The trials table's columns (docs/graders.md).
TRIALS_SCHEMA = (
    ("trial_id", "text"),
    ("verdict", "text"),
    ("why", "text"),
    ("first_bad_record", "int"),
    ("first_bad_sequence", "int"),
    ("ended_by", "text"),
    ("in_flight", "int"),
    ("fairness_group", "int"),
    ("differs", "json"),
    ("labels", "json"),
    *((name, "text") for name in KNOWN_LABELS),
    ("score", "float"),
    ("calls", "int"),
    ("tokens", "int"),
    ("seconds", "float"),
    ("refused_calls", "int"),
    ("records", "int"),
    *(
        (name, "int" if isinstance(default, int) else "float" if isinstance(default, float) else "text")
        for name, default in Limits()._asdict().items()
    ),
    ("sandbox_mode", "text"),
    ("sandbox_network", "text"),
    ("connections_allowed", "int"),
    ("connections_denied", "int"),
    ("keyed", "bool"),
    ("signer", "text"),
    ("signature", "text"),
    ("signed_records", "int"),
    ("statement_sha256", "text"),
    ("head", "text"),
    ("log_head", "text"),
    ("started_at_utc", "timestamp"),
    ("first_call_at_utc", "timestamp"),
    ("last_call_at_utc", "timestamp"),
    ("state", "text"),
    ("log", "text"),
)
FORMATS = ("jsonl", "csv", "parquet")
_BATCH = 4096
_CHUNK = 32


def schema(with_text: bool) -> tuple[tuple[str, str], ...]:
    """(column, kind) of every column of a row, in order."""
    return (*TRIAL_SCHEMA, *call_rows.SCHEMA, *(TEXT_SCHEMA if with_text else ()))


def _rows(job: tuple[str, str, bool]) -> list[dict[str, object]]:
    from ..ledger import snapshot
    from .summary import records_of

    state_path, log_path, with_text = job
    try:
        taken = snapshot.read(state_path, log_path)
    except TrialToolError:
        return []
    try:
        state: object = json.loads(taken.state or b"{}")
    except ValueError:
        state = {}
    state = state if isinstance(state, dict) else {}
    limits = call_rows.mapping(state.get("limits"))
    sandbox = call_rows.mapping(state.get("sandbox"))
    values = {
        "state": state_path,
        "sandbox_mode": sandbox.get("mode", "none"),
        "sandbox_network": sandbox.get("network", "none"),
        "keyed": state.get("chain") == "hmac-sha256",
    }
    trial = {name: call_rows.typed(kind, values.get(name, limits.get(name))) for name, kind in TRIAL_SCHEMA}
    replayer = call_rows.Replayer() if with_text else None
    rows = []
    for record in records_of(taken.log):
        if record.get("record_type") == START:
            continue  # the trial's first line: its labels and limits are the trials table's
        row = {**trial, **call_rows.row(record)}
        if replayer is not None:
            given = replayer.delivered(record)
            row.update(delivered_stdout=given.stdout, delivered_stderr=given.stderr, delivered_matches=given.matches)
        rows.append(row)
    return rows


def rows(
    pairs: Iterable[tuple[str, str]],
    *,
    with_text: bool = False,
    workers: int = 1,
    of: Callable[[tuple[str, str, bool]], list[dict[str, object]]] = _rows,
) -> Iterator[dict[str, object]]:
    """Every call of every trial, trial by trial; `of` a trial's rows of another table (connections.rows)."""
    jobs = [(state, log, with_text) for state, log in pairs]
    if not jobs:
        raise UsageError("no trials found (a trial is a state .json and its log .jsonl)")
    if workers <= 1 or len(jobs) < 2 * _CHUNK:
        for job in jobs:
            yield from of(job)
        return
    import multiprocessing

    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    with context.Pool(workers) as pool:
        for batch in pool.imap(of, jobs, chunksize=_CHUNK):
            yield from batch


def trial_rows(report: Report) -> Iterator[dict[str, object]]:
    """One row of TRIALS_SCHEMA a trial, from a built report (flagged trials first)."""
    for summary in report.trials():
        integrity = summary["integrity"]
        limits = summary["limits"]
        labels = summary.get("labels") or {}
        fairness = summary.get("fairness")
        values = {
            **{name: limits.get(name) for name in Limits._fields},
            **{name: labels.get(name) for name in KNOWN_LABELS},
            "trial_id": summary["trial_id"],
            "verdict": integrity["verdict"],
            "why": integrity.get("why"),
            "first_bad_record": integrity.get("first_bad_record"),
            "first_bad_sequence": integrity.get("first_bad_sequence"),
            "ended_by": summary["ended_by"],
            "in_flight": summary["in_flight"],
            "fairness_group": fairness["group"] if fairness else None,
            "differs": fairness["differs"] if fairness else {},
            "labels": labels,
            "score": summary.get("score"),
            "calls": summary["used"]["calls"],
            "tokens": summary["used"]["tokens"],
            "seconds": summary["used"]["seconds"],
            "refused_calls": summary["refused_calls"],
            "records": summary["records"],
            "sandbox_mode": summary["sandbox"]["mode"],
            "sandbox_network": summary["sandbox"]["network"],
            "connections_allowed": (summary.get("connections") or {}).get("allowed"),
            "connections_denied": (summary.get("connections") or {}).get("denied"),
            "keyed": summary["keyed"],
            "signer": summary["signature"]["signer"],
            "signature": summary["signature"]["status"],
            "signed_records": summary["signature"].get("signed_records"),
            "statement_sha256": summary["signature"].get("statement_sha256"),
            "head": summary["head"],
            "log_head": summary.get("log_head"),
            "started_at_utc": summary.get("started_at_utc"),
            "first_call_at_utc": summary.get("first_call_at_utc"),
            "last_call_at_utc": summary.get("last_call_at_utc"),
            "state": summary["state"],
            "log": summary["log"],
        }
        yield {name: call_rows.typed(kind, values.get(name)) for name, kind in TRIALS_SCHEMA}


def write_jsonl(source: Iterator[dict[str, object]], out: IO[str]) -> int:
    count = 0
    for row in source:
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        count += 1
    return count


def write_csv(source: Iterator[dict[str, object]], out: IO[str], columns: tuple[tuple[str, str], ...]) -> int:
    writer = csv.DictWriter(out, fieldnames=[name for name, _ in columns])
    writer.writeheader()
    count = 0
    for row in source:
        # A cell that a spreadsheet would take for a formula is written as text (render.spreadsheet_safe).
        writer.writerow({name: spreadsheet_safe(value) for name, value in row.items()})
        count += 1
    return count


def write_parquet(source: Iterator[dict[str, object]], path: str, columns: tuple[tuple[str, str], ...]) -> int:
    """Typed columns, written a batch at a time (pyarrow); timestamps as TIMESTAMP (UTC, microseconds)."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError as exc:
        msg = "Parquet needs pyarrow: pip install 'trialtool[parquet]'"
        raise UsageError(msg) from exc
    types = {
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "text": pa.string(),
        "json": pa.string(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    arrow = pa.schema([(name, types[kind]) for name, kind in columns])
    names = [name for name, _ in columns]

    def table(batch: dict[str, list[Any]]) -> Any:
        arrays = []
        for name, kind in columns:
            if kind == "timestamp":
                arrays.append(_timestamps(pa, batch[name], types[kind]))
            else:
                arrays.append(pa.array(batch[name], type=types[kind]))
        return pa.Table.from_arrays(arrays, schema=arrow)

    count = 0
    with pq.ParquetWriter(path, arrow, compression="zstd") as writer:
        # Column lists, converted a column at a time: many times faster than a row of dicts at a time.
        batch: dict[str, list[Any]] = {name: [] for name in names}
        size = 0
        for row in source:
            for name in names:
                batch[name].append(row[name])
            size += 1
            if size == _BATCH:
                writer.write_table(table(batch))
                count += size
                batch, size = {name: [] for name in names}, 0
        if size or not count:
            writer.write_table(table(batch))
            count += size
    return count


def _timestamps(pa: Any, texts: list[Any], kind: Any) -> Any:
    """ISO 8601 texts as a TIMESTAMP column: Arrow's own parser, or one by one where a record holds odd text."""
    try:
        return pa.array(texts, type=pa.string()).cast(kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([call_rows.instant(text) for text in texts], type=kind)


__all__ = [
    "FORMATS",
    "KNOWN_LABELS",
    "TEXT_SCHEMA",
    "TRIALS_SCHEMA",
    "TRIAL_SCHEMA",
    "rows",
    "schema",
    "trial_rows",
    "write_csv",
    "write_jsonl",
    "write_parquet",
]
