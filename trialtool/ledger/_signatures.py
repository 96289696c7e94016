"""What a signed trial's signatures vouch for, checked with public keys alone (the reading side).

Two kinds of signature cover a trial's log (ledger/_attest.py makes them):
its statement, beside the log, which covers the log as it was at the trial's
end and names its rules; and its last checkpoint, in the state, which covers
the log up to the record it names. Each is held to the files: the statement's
subject must be the log's first bytes, its head and records the chain's at
that point, its trial and rules the state's; a checkpoint's head must be the
chain's at its record. What neither covers is unsigned, and said to be.

The answer is a `Signatures`: its `status` is one of
- `statement`: a statement of a trusted key covers the log (and a checkpoint
  anything after it);
- `checkpoint`: no statement, and a checkpoint covers the log;
- `partly`: some records at the end are covered by neither (a trial killed
  between a record and its checkpoint, a checkpoint every N records);
- `unsigned`: nothing covers the log (a trial made without a signing key);
- `invalid`: a signature does not verify under a trusted key, or does not
  hold for these files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .. import signing
from ._state import TrialState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._verify import _Step


class Signatures(NamedTuple):
    status: str
    why: str | None = None
    #: The fingerprint of the key that signed (a trusted one), when one did.
    signer: str | None = None
    #: How many records of the log a signature covers.
    signed_records: int = 0
    #: The statement's SHA-256 (of its payload), when it verified; and what it said.
    statement_sha256: str | None = None
    predicate: dict[str, Any] | None = None

    def as_json(self) -> dict[str, object]:
        shown = self._asdict()
        predicate = shown.pop("predicate")
        shown["signed_verdict"] = None if predicate is None else predicate.get("verdict")
        shown["ended_by"] = None if predicate is None else predicate.get("ended_by")
        return shown


class _Invalid(Exception):
    pass


def _at(steps: Sequence[_Step], records: int) -> _Step | None:
    return steps[records - 1] if 0 < records <= len(steps) else None


def _statement(
    raw: bytes, log: bytes, steps: Sequence[_Step], state: TrialState | None, trusted: Mapping[str, signing.PublicKey]
) -> tuple[int, str, str, dict[str, Any]]:
    """(records covered, signer, the statement's SHA-256, its predicate) of a statement that holds; else _Invalid."""
    try:
        envelope = json.loads(raw)
        opened = signing.dsse.open_envelope(envelope, signing.statement.PAYLOAD_TYPE, trusted)
        subject, predicate = signing.statement.parse_statement(opened.payload)
    except (ValueError, signing.dsse.BadEnvelope, signing.statement.Malformed) as exc:
        raise _Invalid(f"the statement: {exc}") from None
    size = subject["annotations"]["bytes"]
    if size > len(log) or hashlib.sha256(log[:size]).hexdigest() != subject["digest"]["sha256"]:
        raise _Invalid("the log is not the one the statement signed (its first bytes differ, or it is shorter)")
    covered: dict[str, Any] = predicate["log"] if isinstance(predicate.get("log"), dict) else {}
    records = covered.get("records")
    at = _at(steps, records) if isinstance(records, int) else None
    if at is None or not isinstance(records, int) or at.size != size or at.head != covered.get("head"):
        raise _Invalid("the statement's records and head are not the log's at the size it signed")
    if state is not None:
        if predicate.get("trial_id") != state.trial_id:
            raise _Invalid("the statement is another trial's")
        if predicate.get("rules") != json.loads(json.dumps(state.rules())):
            raise _Invalid("the rules in the statement are not the ones the trial pinned")
    return records, opened.signer, hashlib.sha256(opened.payload).hexdigest(), predicate


def _checkpoint(
    checkpoint: Mapping[str, Any], steps: Sequence[_Step], trial_id: str, trusted: Mapping[str, signing.PublicKey]
) -> tuple[int, str]:
    """(records covered, signer) of a checkpoint that holds; else _Invalid."""
    try:
        opened = signing.dsse.open_envelope(checkpoint.get("envelope"), signing.statement.CHECKPOINT_TYPE, trusted)
        signed = signing.statement.parse_checkpoint(opened.payload)
    except (signing.dsse.BadEnvelope, signing.statement.Malformed) as exc:
        raise _Invalid(f"the checkpoint: {exc}") from None
    if signed.get("trial_id") != trial_id:
        raise _Invalid("the checkpoint is another trial's")
    at = _at(steps, signed["records"])
    if at is None or at.size != signed["bytes"] or at.head != signed["head"]:
        raise _Invalid(f"the log's record {signed['records']} is not the one the checkpoint signed")
    if signed.get("ledger_after") != at.totals.as_json():
        raise _Invalid("the checkpoint's totals are not the log's")
    return signed["records"], opened.signer


def check(
    log: bytes,
    steps: Sequence[_Step],
    state: TrialState | None,
    statement: bytes | None,
    trusted: Mapping[str, signing.PublicKey],
) -> Signatures:
    """What the signatures of a trial cover, given its log's bytes and its chain walked (`steps`)."""
    records = len(steps)
    covered, signer, digest, predicate = 0, "", None, None
    try:
        if statement is not None:
            covered, signer, digest, predicate = _statement(statement, log, steps, state, trusted)
        hint = None if state is None or state.checkpoint is None else state.checkpoint.get("records")
        # A checkpoint that says it covers no more than the statement adds nothing: it is not checked
        # (its hint is unsigned, but a wrong one only leaves records uncovered, never covers more).
        if state is not None and state.checkpoint is not None and not (isinstance(hint, int) and hint <= covered):
            reach, by = _checkpoint(state.checkpoint, steps, state.trial_id, trusted)
            if reach > covered:
                covered, signer = reach, signer or by
    except _Invalid as exc:
        return Signatures("invalid", str(exc))
    if not signer:
        if state is not None and state.signer is None:
            return Signatures("unsigned", "the trial was made without a signing key: nothing of it is signed")
        return Signatures("unsigned", "no statement beside the log, no checkpoint in the state: nothing is signed")
    status = "statement" if digest is not None else "checkpoint"
    why = None
    if covered < records:
        status = "partly"
        why = (
            f"records {covered + 1} to {records} are not signed (the last signature covers {covered} of {records}): "
            "what a trial wrote after its last checkpoint, or appended by someone else"
        )
    return Signatures(status, why, signer, covered, digest, predicate)


__all__ = ["Signatures", "check"]
