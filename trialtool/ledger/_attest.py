"""A signed trial's signatures, made under the lock: a checkpoint at each step, a statement at its end.

A checkpoint signs the log's head once `checkpoint_every` records were added
since the last one (default: every record), and rides in the state, which is
written after every record anyway: no write, and no fsync, of its own. A trial
killed at any moment is then signed up to its last checkpoint, and what came
after is known to be unsigned.

A statement (in-toto v1, in a DSSE envelope) is written beside the log when the
trial ends: its budget spent (the call that spends it, or the first refusal),
`trial-tool close`, `Trial.close()`, or on demand (`trial-tool attest`). It is
made from a whole check of the trial's files as they are on disk under the lock
(the reading side's `check`), and a trial that fails that check is not signed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from .. import signing
from .._version import __version__
from ..errors import StateError
from ..types import budget
from . import _clock as clock
from . import _durable as durable
from . import _mending as mending
from . import _snapshot as snapshot
from . import _verify as verifying
from ._state import TrialState


def checkpoint(state: TrialState, key: signing.SigningKey) -> None:
    """Sign the log's head as `state` has it now, if `checkpoint_every` records were added since the last."""
    covered = 0 if state.checkpoint is None else int(state.checkpoint.get("records", 0))
    if state.log.records - covered < state.checkpoint_every:
        return
    payload = signing.statement.checkpoint(
        state.trial_id, state.log.records, state.log.bytes, state.log.head, state.totals().as_json()
    )
    envelope = signing.dsse.seal(payload, signing.statement.CHECKPOINT_TYPE, key)
    state.checkpoint = {"records": state.log.records, "envelope": envelope}


def statement_path(log_path: str) -> str:
    """Where a trial's statement is: beside its log."""
    return log_path + signing.statement.SUFFIX


def ended_by(state: TrialState) -> str | None:
    """The budget that is spent (the status a next call is refused with), or None while calls may run."""
    return budget.of(state).refusal_status


def write_statement(state: TrialState, state_path: str, log_path: str, key: signing.SigningKey, signed_on: str) -> str:
    """Check the trial's files, sign its statement, and write it beside the log; the statement's SHA-256.

    Under the lock, after `state` was written: the files on disk are the ones signed.
    StateError when the check fails: a trial that is not what its records say is never signed.
    """
    taken = snapshot.read(state_path, log_path)
    report = verifying.check(taken, state_path)
    if report.verdict == "failed":
        msg = f"the trial fails verification ({report.why}): nothing was signed; run `trial-tool verify`"
        raise StateError(msg)
    signed = taken.log[: state.log.bytes]
    now = time.time()
    predicate = {
        "trial_id": state.trial_id,
        "labels": state.labels,
        "rules": state.rules(),
        "totals": report.totals.as_json(),
        "calls": state.calls,
        "log": {"records": state.log.records, "bytes": state.log.bytes, "head": state.log.head},
        "ended_by": ended_by(state),
        "signed_on": signed_on,
        "verdict": report.verdict,
        "why": report.why,
        "signer": key.fingerprint,
        "trialtool": __version__,
        "started_at_utc": state.started_at_utc,
        "signed_at_utc": clock.utc(now),
        "elapsed_seconds": state.elapsed(),
    }
    body = signing.statement.statement(
        os.path.basename(log_path), hashlib.sha256(signed).hexdigest(), len(signed), predicate
    )
    envelope = signing.dsse.seal(body, signing.statement.PAYLOAD_TYPE, key)
    path = statement_path(log_path)
    mending.sweep_temporaries(path)  # what an earlier statement's write, cut short by a crash, left
    durable.atomic_write(path, json.dumps(envelope, indent=2).encode() + b"\n")
    digest = hashlib.sha256(body).hexdigest()
    state.statement = {"records": state.log.records, "sha256": digest, "signed_on": signed_on}
    return digest


__all__ = ["checkpoint", "ended_by", "statement_path", "write_statement"]
