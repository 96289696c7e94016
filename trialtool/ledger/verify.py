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

from ..errors import StateError, StorageError
from ..osio import plain
from . import audit, snapshot
from .records import Totals, apply, whole
from .state import TrialState, decode


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
    #: What a crash left that the next call mends by itself (not a problem), and what it will do.
    recoverable: list[str] = []  # noqa: RUF012 (a NamedTuple default, never mutated)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "totals": self.totals.as_json(),
            "first_bad_sequence": next((p.sequence for p in self.problems if p.sequence is not None), None),
            "problems": [p._asdict() for p in self.problems],
            "recoverable": self.recoverable,
        }


class _Step(NamedTuple):
    """The log as it stands after one line: what a state written then would be bound to."""

    records: int
    size: int
    head: str
    last_offset: int
    totals: Totals
    sequence: int | None


def verify(state_path: str | os.PathLike[str], log_path: str | os.PathLike[str], key: bytes | None = None) -> Report:
    """Check the trial at `state_path` and `log_path`; never raises for what it finds.

    StateError (exit 125: it cannot run) when there is no trial there at all.
    The files are read without the lock, at one moment (snapshot.py).
    """
    state_path, log_path = os.fspath(state_path), os.fspath(log_path)
    if not os.path.lexists(state_path) and not os.path.lexists(log_path):
        msg = f"no trial at {state_path} (and no log at {log_path})"
        raise StateError(msg)
    problems: list[Problem] = []
    try:
        taken = snapshot.read(state_path, log_path)
    except StorageError as exc:
        problems.append(Problem(None, None, exc.message))
        return Report(False, problems, 0, Totals())
    return check(taken, state_path, key)


def check(taken: snapshot.Snapshot, state_path: str, key: bytes | None = None) -> Report:
    """Check a trial's files as read at one moment (`state_path` names the state in messages)."""
    chain = audit.Chain(key)
    problems: list[Problem] = []
    state = _load_state(taken.state, state_path, chain, problems)
    lines = taken.log.splitlines(keepends=True)
    steps, charged, torn = _walk(lines, chain, None if state is None else state.trial_id, problems)
    recoverable: list[str] = []
    if torn:
        recoverable.append(
            f"line {len(steps) + 1} is torn (a write cut short, {len(torn)} bytes): "
            "the next call cuts it off and logs the repair"
        )
    if state is not None:
        _check_state(state, steps, charged, problems, recoverable)
        if torn and len(steps) > state.log.records:
            # A record beyond the state and a torn line after it: more than one crash leaves.
            problems.append(Problem(len(steps) + 1, None, "a torn line after a record the state does not know of"))
    last = steps[-1] if steps else _Step(0, 0, audit.GENESIS, 0, Totals(), None)
    return Report(not problems, problems, len(steps), last.totals, recoverable)


def _load_state(raw: bytes | None, state_path: str, chain: audit.Chain, problems: list[Problem]) -> TrialState | None:
    if raw is None:
        problems.append(Problem(None, None, f"no state at {state_path}"))
        return None
    try:
        return decode(raw, state_path, chain)
    except (StateError, StorageError) as exc:
        problems.append(Problem(None, None, exc.message))
        return None


def _walk(
    lines: list[bytes], chain: audit.Chain, trial_id: str | None, problems: list[Problem]
) -> tuple[list[_Step], set[int], bytes]:
    """Every whole line checked in order; (the log after each, the sequences charged, a torn last line)."""
    steps: list[_Step] = []
    charged: set[int] = set()
    totals, head, offset = Totals(), audit.GENESIS, 0
    for number, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            return steps, charged, raw
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
            bad("a record of another trial (two trials share this log)")
        after = apply(totals, record)
        if after is None:
            bad(f"unknown kind of record (status {plain(record.get('status'))})")
        elif after.charged_calls > totals.charged_calls:
            if after.emitted_tokens - totals.emitted_tokens > whole(record.get("allowance_tokens")):
                bad("delivered more tokens than the call's allowance")
            if sequence in charged:
                bad("a call recorded twice")
            if sequence is not None:
                charged.add(sequence)
        totals = after or totals
        if record.get("ledger_after") != totals.as_json():
            bad(f"totals after this record should be {totals.as_json()}, the record says {record.get('ledger_after')}")
        head = chain.digest(line)
        steps.append(_Step(number, offset + len(raw), head, offset, totals, sequence))
        offset += len(raw)
    return steps, charged, b""


def _check_state(
    state: TrialState, steps: list[_Step], charged: set[int], problems: list[Problem], recoverable: list[str]
) -> None:
    """The state bound to the log as it is, or to all of it but the last record (a crash the next call mends)."""
    log = state.log
    bound = (log.records, log.bytes, log.head, log.last_offset)
    at = steps[log.records - 1] if 0 < log.records <= len(steps) else _Step(0, 0, audit.GENESIS, 0, Totals(), None)
    if (at.records, at.size, at.last_offset) == (log.records, log.bytes, log.last_offset) and at.head != log.head:
        # Same length, another digest: the record the state counted last was changed after it was written.
        message = "the record the state counted last was changed after it was written (its digest is not the state's)"
        problems.append(Problem(at.records, at.sequence, message))
        return
    if bound != (at.records, at.size, at.head, at.last_offset):
        last = steps[-1] if steps else at
        problems.append(
            Problem(
                None,
                None,
                f"state is bound to a log of {log.records} records and {log.bytes} bytes, "
                f"but the log has {last.records} records and {last.size} bytes (or a different last record)",
            )
        )
        return
    ahead = steps[log.records :]
    if len(ahead) > 1:
        problems.append(Problem(None, None, f"the log has {len(ahead)} records the state does not know of"))
        return
    if ahead:
        recoverable.append(
            f"the log is one record ahead of the state (call {ahead[0].sequence}: trial-tool stopped between "
            "writing the record and the state); the next call rolls it forward"
        )
    if state.totals() != at.totals:
        message = f"state counters {state.totals().as_json()} disagree with the log's {at.totals.as_json()}"
        problems.append(Problem(None, None, message))
    recorded_late = {ahead[0].sequence} if ahead else set()
    both = (set(state.in_flight) & charged) - recorded_late
    if both:
        problems.append(Problem(None, min(both), "a call both in flight and recorded"))


def render(report: Report) -> str:
    """The report for people: one line a problem, then a verdict."""
    out = [
        f"line {p.line if p.line is not None else '-'} sequence {p.sequence if p.sequence is not None else '-'}: "
        f"{p.message}"
        for p in report.problems
    ]
    totals = report.totals
    out += [f"recoverable: {note}" for note in report.recoverable]
    verdict = "ok" if report.ok else "FAILED"
    out.append(
        f"{verdict}: {report.records} records, {totals.charged_calls} calls charged, "
        f"{totals.emitted_tokens} tokens delivered, {totals.refused_calls} refused"
    )
    return "\n".join(out)


__all__ = ["Problem", "Report", "check", "render", "verify"]
