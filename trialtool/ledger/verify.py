"""`trial-tool verify`: check a whole trial, the log's chain, every record's totals, and the state.

Read-only, and independent of the ledger's writing side (ledger.py, store.py,
mending.py): it recomputes the totals from the records one by one with the
same rule the ledger uses (records.apply), so a state or a log edited by hand,
a line deleted, changed or moved, or a state restored from an older copy shows
up as the first record (or the state) where the numbers stop adding up.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from ..errors import StateError
from . import audit, fsio
from .records import Totals, apply, whole
from .state import decode


class Problem(NamedTuple):
    """One thing wrong: where (log line and call sequence, when known) and what."""

    line: int | None
    sequence: int | None
    message: str


class Report(NamedTuple):
    ok: bool
    problems: list[Problem]
    records: int
    totals: Totals

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "totals": self.totals.as_json(),
            "first_bad_sequence": next((p.sequence for p in self.problems if p.sequence is not None), None),
            "problems": [p._asdict() for p in self.problems],
        }


def verify(state_path: str | os.PathLike[str], log_path: str | os.PathLike[str], key: bytes | None = None) -> Report:
    """Check the trial at `state_path` and `log_path`; never raises for what it finds."""
    state_path, log_path = os.fspath(state_path), os.fspath(log_path)
    chain = audit.Chain(key)
    problems: list[Problem] = []
    totals = Totals()
    head, offset, last_offset = audit.GENESIS, 0, 0
    trial_id: str | None = None
    charged_sequences: set[int] = set()
    lines = audit.lines(log_path)
    for number, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            problems.append(Problem(number, None, "torn last line (a write cut short)"))
            break
        line = raw[:-1]
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            problems.append(Problem(number, None, "not a JSON object"))
            break
        sequence = record.get("sequence") if isinstance(record.get("sequence"), int) else None

        def bad(message: str, sequence: int | None = sequence, number: int = number) -> None:
            problems.append(Problem(number, sequence, message))

        if record.get("prev_hash") != head:
            bad("chain broken: prev_hash is not the digest of the line before (a line edited, deleted or moved)")
            break
        trial_id = trial_id or record.get("trial_id")
        if record.get("trial_id") != trial_id:
            bad("record of another trial")
        after = apply(totals, record)
        if after is None:
            bad(f"unknown kind of record (status {record.get('status')!r})")
        elif after.charged_calls > totals.charged_calls:
            if after.emitted_tokens - totals.emitted_tokens > whole(record.get("allowance_tokens")):
                bad("delivered more tokens than the call's allowance")
            if sequence in charged_sequences:
                bad("a call recorded twice")
            if sequence is not None:
                charged_sequences.add(sequence)
        totals = after or totals
        if record.get("ledger_after") != totals.as_json():
            bad(f"totals after this record should be {totals.as_json()}, the record says {record.get('ledger_after')}")
        head = chain.digest(line)
        last_offset, offset = offset, offset + len(raw)
    _check_state(state_path, chain, problems, len(lines), offset, head, last_offset, totals, charged_sequences)
    return Report(not problems, problems, len(lines), totals)


def _check_state(
    state_path: str,
    chain: audit.Chain,
    problems: list[Problem],
    count: int,
    size: int,
    head: str,
    last_offset: int,
    totals: Totals,
    charged: set[int],
) -> None:
    raw = fsio.read_bytes(state_path)
    if raw is None:
        problems.append(Problem(None, None, f"no state at {state_path}"))
        return
    try:
        state = decode(raw, state_path, chain)
    except StateError as exc:
        problems.append(Problem(None, None, exc.message))
        return
    log = state.log
    if (log.records, log.bytes, log.head, log.last_offset) != (count, size, head, last_offset):
        problems.append(
            Problem(
                None,
                None,
                f"state is bound to a log of {log.records} records and {log.bytes} bytes, "
                f"but the log has {count} records and {size} bytes (or a different last record)",
            )
        )
    expected = state.totals()
    if expected != totals:
        problems.append(
            Problem(None, None, f"state counters {expected.as_json()} disagree with the log's {totals.as_json()}")
        )
    in_flight = set(state.in_flight)
    if in_flight & charged:
        problems.append(Problem(None, min(in_flight & charged), "a call both in flight and recorded"))


def render(report: Report) -> str:
    """The report for people: one line a problem, then a verdict."""
    out = [
        f"line {p.line if p.line is not None else '-'} sequence {p.sequence if p.sequence is not None else '-'}: "
        f"{p.message}"
        for p in report.problems
    ]
    totals = report.totals
    verdict = "ok" if report.ok else "FAILED"
    out.append(
        f"{verdict}: {report.records} records, {totals.charged_calls} calls charged, "
        f"{totals.emitted_tokens} tokens delivered, {totals.refused_calls} refused"
    )
    return "\n".join(out)


__all__ = ["Problem", "Report", "render", "verify"]
