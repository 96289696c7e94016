"""`trial-tool verify`: check a whole trial, the log's chain, every record's totals, and the state.

Read-only, and independent of the ledger's writing side (_ledger.py, _store.py,
_mending.py): it recomputes the totals from the records one by one with the
same rule the ledger uses (records.apply), so a state or a log edited by hand,
a line deleted, changed or moved, or a state restored from an older copy shows
up as the first record (or the state) where the numbers stop adding up.

Its answer is one verdict, the same word every graders' command uses:

- `clean`: the chain, the totals and the state agree, and nothing is pending;
- `unconfirmed`: the log has a record (or a torn line) the state does not
  count yet: a crash the next call mends, or a record someone appended; the
  files alone cannot tell which (`expect_head`, the head the harness was
  given, can);
- `in_flight`: a call is reserved and not recorded: still running, or its
  owner is gone (the next call records it abandoned);
- `unverified`: a keyed trial checked without its key: its HMACs cannot be
  checked, so nothing is said of them;
- `failed`: the first bad record (or the state), and why.

Checked with public keys (`trusted`), a trial's signatures are held to its
files too (_signatures.py), and two more verdicts can be said:

- `signature_invalid`: a statement or checkpoint that does not verify under a
  trusted key, or does not hold for these files;
- `unsigned`: records of the log that no signature covers (all of them, for
  a trial made without a signing key).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import NamedTuple

from ..errors import StateError, StorageError
from ..osio import alive, plain
from . import _audit as audit
from . import _durable as durable
from . import _snapshot as snapshot
from ._records import START, Totals, apply, whole
from ._state import TrialState, decode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .. import signing
    from ._signatures import Signatures


class Problem(NamedTuple):
    """One thing wrong: where (log line and call sequence, when known) and what."""

    line: int | None
    sequence: int | None
    message: str


#: The verdicts, most serious first; each graders' command says one of them of a trial.
VERDICTS = ("failed", "signature_invalid", "unverified", "unsigned", "in_flight", "unconfirmed", "clean")


class Report(NamedTuple):
    #: No problem found (the verdict may still be other than clean: see `verdict`).
    ok: bool
    problems: list[Problem]
    records: int
    totals: Totals
    #: What the log holds that the state does not count yet (a record, a torn line): unconfirmed.
    recoverable: list[str] = []  # noqa: RUF012 (a NamedTuple default, never mutated)
    #: One of VERDICTS, and why (None when clean).
    verdict: str = "clean"
    why: str | None = None
    #: The digest of the log's last whole line: the head a harness was handed after that call.
    head: str = audit.GENESIS
    #: Calls reserved and not recorded: {"sequence", "owner": "running" | "gone"}.
    in_flight: list[dict[str, object]] = []  # noqa: RUF012 (a NamedTuple default, never mutated)
    #: The line of the record the state does not count yet (unconfirmed), if there is one.
    pending: int | None = None
    #: What the trial's signatures cover, when checked with public keys (None: not checked).
    signatures: Signatures | None = None

    def as_json(self) -> dict[str, object]:
        first = next((p for p in self.problems), None)
        return {
            "verdict": self.verdict,
            "why": self.why,
            "ok": self.ok,
            "records": self.records,
            "head": self.head,
            "totals": self.totals.as_json(),
            "first_bad_line": None if first is None else first.line,
            "first_bad_sequence": next((p.sequence for p in self.problems if p.sequence is not None), None),
            "problems": [p._asdict() for p in self.problems],
            "unconfirmed": self.recoverable,
            "unconfirmed_record": self.pending,
            "in_flight": self.in_flight,
            "signature": None if self.signatures is None else self.signatures.as_json(),
        }


class _Step(NamedTuple):
    """The log as it stands after one line: what a state written then would be bound to."""

    records: int
    size: int
    head: str
    last_offset: int
    totals: Totals
    sequence: int | None


def verify(
    state_path: str | os.PathLike[str],
    log_path: str | os.PathLike[str],
    key: bytes | None = None,
    expect_head: str | None = None,
    trusted: Mapping[str, signing.PublicKey] | None = None,
) -> Report:
    """Check the trial at `state_path` and `log_path`; never raises for what it finds.

    StateError (exit 125: it cannot run) when there is no trial there at all.
    The files are read without the lock, at one moment (_snapshot.py).
    `expect_head` is the chain head the harness was handed after the last call it
    made: a log that ends anywhere else fails, so that a record appended with a
    correct link (which the files alone would take for a crash) is caught.
    `trusted`: the public keys whose signatures count (signatures checked; None: not).
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
        return Report(False, problems, 0, Totals(), verdict="failed", why=exc.message)
    statement = None if trusted is None else statement_of(log_path)
    return check(taken, state_path, key, expect_head, trusted, statement)


def statement_of(log_path: str) -> bytes | None:
    """The bytes of the signed statement beside the log, or None: none there, or unreadable (then
    nothing it says is taken, and the log reads as unsigned)."""
    from ..signing import statement as statements

    try:
        return durable.read_bytes(log_path + statements.SUFFIX)
    except StorageError:
        return None


def _keyed(raw: bytes | None) -> bool:
    """The state says its trial is keyed (read only for that: a keyless reader cannot check more)."""
    try:
        data = json.loads(raw or b"")
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("chain") == "hmac-sha256"


def check(
    taken: snapshot.Snapshot,
    state_path: str,
    key: bytes | None = None,
    expect_head: str | None = None,
    trusted: Mapping[str, signing.PublicKey] | None = None,
    statement: bytes | None = None,
) -> Report:
    """Check a trial's files as read at one moment (`state_path` names the state in messages);
    with `trusted` keys, its signatures too (`statement`: the bytes of the statement beside its log)."""
    unverified = key is None and _keyed(taken.state)
    chain = audit.Chain(key)
    problems: list[Problem] = []
    # Without the key, a keyed trial's state and links cannot be checked: what can be (each line a
    # record of the trial, the totals adding up) still is.
    state = None if unverified else _load_state(taken.state, state_path, chain, problems)
    lines = taken.log.splitlines(keepends=True)
    trial_id = None if state is None else state.trial_id
    steps, charged, torn = _walk(lines, None if unverified else chain, trial_id, problems)
    recoverable: list[str] = []
    if torn:
        recoverable.append(
            f"line {len(steps) + 1} is torn (a write cut short, {len(torn)} bytes, or one appended by someone "
            "else): the next call cuts it off and logs the repair"
        )
    if state is not None:
        _check_state(state, steps, charged, problems, recoverable)
        if torn and len(steps) > state.log.records:
            # A record beyond the state and a torn line after it: more than one crash leaves.
            problems.append(Problem(len(steps) + 1, None, "a torn line after a record the state does not know of"))
    last = steps[-1] if steps else _Step(0, 0, audit.GENESIS, 0, Totals(), None)
    if expect_head is not None and not unverified and last.head != expect_head.lower():
        problems.append(Problem(last.records or None, last.sequence, _away_from(steps, expect_head.lower())))
    # A call whose record is in the log already (the state one step behind) is not in flight: unconfirmed.
    in_flight = [] if state is None else [entry for entry in _in_flight(state) if entry["sequence"] not in charged]
    signed = None
    if trusted is not None:
        from . import _signatures as signatures  # checked with public keys only: a plain check loads none of it

        signed = signatures.check(taken.log, steps, state, statement, trusted)
    verdict, why = _verdict(problems, unverified, in_flight, recoverable, len(steps), signed)
    pending = None
    if state is not None and len(steps) == state.log.records + 1 and not problems:
        pending = len(steps)
    return Report(
        not problems,
        problems,
        len(steps),
        last.totals,
        recoverable,
        verdict,
        why,
        last.head,
        in_flight,
        pending,
        signed,
    )


def _away_from(steps: list[_Step], expected: str) -> str:
    """Why a log that does not end at the expected head fails."""
    at = next((step for step in steps if step.head == expected), None)
    if at is None:
        return f"the log's head is not {expected}, the one the harness was given (records replaced or forged)"
    after = len(steps) - at.records
    return (
        f"{after} record{'s' if after != 1 else ''} after line {at.records}, the head the harness was given: "
        "appended by someone else"
    )


def _in_flight(state: TrialState) -> list[dict[str, object]]:
    return [
        {"sequence": sequence, "owner": "running" if alive(entry.pid, entry.pid_token) else "gone"}
        for sequence, entry in sorted(state.in_flight.items())
    ]


def _verdict(
    problems: list[Problem],
    unverified: bool,
    in_flight: list[dict[str, object]],
    recoverable: list[str],
    records: int,
    signed: Signatures | None = None,
) -> tuple[str, str | None]:
    """The one verdict of VERDICTS that says it, and why."""
    if problems:
        first = problems[0]
        where = f"line {first.line}: " if first.line is not None else ""
        return "failed", where + first.message
    if signed is not None and signed.status == "invalid":
        return "signature_invalid", signed.why
    if unverified:
        return "unverified", (
            f"a keyed trial checked without its key: the {records} records read as records of one trial whose "
            "totals add up, but their HMAC chain and the state's are not checked; give the key (--key-file)"
        )
    if signed is not None and signed.status in ("unsigned", "partly"):
        return "unsigned", signed.why
    if in_flight:
        entry = in_flight[0]
        if entry["owner"] == "running":
            return "in_flight", f"call {entry['sequence']} is running"
        return "in_flight", (
            f"call {entry['sequence']} was reserved and its owner is gone (killed?) without recording it; "
            "the next call records it abandoned"
        )
    if recoverable:
        return "unconfirmed", (
            recoverable[0] + "; or a record someone appended: the files cannot tell which (--expect-head can)"
        )
    return "clean", None


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
    lines: list[bytes], chain: audit.Chain | None, trial_id: str | None, problems: list[Problem]
) -> tuple[list[_Step], set[int], bytes]:
    """Every whole line checked in order; (the log after each, the sequences charged, a torn last line).

    Without a `chain` (a keyed trial read without its key), the links are not checked.
    """
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

        if chain is not None and record.get("prev_hash") != head:
            bad("chain broken: prev_hash is not the digest of the line before (a line edited, deleted or moved)")
            break
        trial_id = trial_id or record.get("trial_id")
        if record.get("trial_id") != trial_id:
            bad("a record of another trial (two trials share this log)")
        if record.get("record", number) != number:
            bad(f"the record says it is record {plain(record.get('record'))}: a line deleted, inserted or moved")
        if record.get("record_type") == START and number != 1:
            bad("a trial's first record, not on the log's first line")
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
        head = chain.digest(line) if chain is not None else audit.GENESIS
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
            f"the log's last record (line {ahead[0].records}, call {ahead[0].sequence}) is not counted by the state: "
            "trial-tool stopped between writing the record and the state, and the next call rolls it forward"
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
    if report.verdict != "failed" and report.why:
        out.append(f"{report.verdict}: {report.why}")
    signed = report.signatures
    if signed is not None and signed.status in ("statement", "checkpoint", "partly"):
        what = "a statement" if signed.status == "statement" else "a checkpoint"
        if signed.status == "partly":
            what = "a statement and a checkpoint" if signed.statement_sha256 else "a checkpoint"
        out.append(f"signed: {signed.signed_records} of {report.records} records, by key {signed.signer} ({what})")
    out.append(
        f"{report.verdict.upper() if report.verdict != 'clean' else 'clean'}: {report.records} records, "
        f"{totals.charged_calls} calls charged, {totals.emitted_tokens} tokens delivered, "
        f"{totals.refused_calls} refused"
    )
    return "\n".join(out)


__all__ = ["VERDICTS", "Problem", "Report", "check", "render", "statement_of", "verify"]
