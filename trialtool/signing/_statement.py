"""The formats a signed trial is vouched for in: its statement (in-toto v1) and its checkpoints.

A statement is an in-toto Statement, version 1, in a DSSE envelope of type
`application/vnd.in-toto+json`. Its one subject is the trial's log (its file
name, its SHA-256, and its size in bytes as an annotation); its predicate,
of type PREDICATE_TYPE, holds what a grader gates on (docs/attestations.md
lists each field). A checkpoint is smaller and signed on every call: the
trial, how many records and bytes of its log it covers, and the chain's head
after them; the SHA-256 chain links every earlier line to that head.

Both are encoded as canonical JSON (keys sorted, no spaces), so the same
content is always the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The in-toto Statement's `_type`, and the envelope's type for it (the in-toto specification's).
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: The predicate's type: a name of trialtool's own, not a page to fetch.
PREDICATE_TYPE = "https://trialtool.dev/attestation/trial/v1"
#: A checkpoint's envelope type, and its payload's `_type`.
CHECKPOINT_TYPE = "application/vnd.trialtool.checkpoint+json"
CHECKPOINT_SCHEMA = "trialtool.checkpoint/v1"
#: Where a trial's statement is written: beside its log, the log's name and this.
SUFFIX = ".intoto.json"


def canonical(document: Mapping[str, object]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def statement(log_name: str, sha256: str, size: int, predicate: Mapping[str, object]) -> bytes:
    """The statement's bytes: the log (`log_name`, its `sha256` and `size`) is the subject."""
    return canonical(
        {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": log_name, "digest": {"sha256": sha256}, "annotations": {"bytes": size}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": dict(predicate),
        }
    )


def checkpoint(trial_id: str, records: int, size: int, head: str, totals: Mapping[str, object]) -> bytes:
    """A checkpoint's bytes: the first `records` lines (`size` bytes) of the trial's log end at `head`."""
    return canonical(
        {
            "_type": CHECKPOINT_SCHEMA,
            "trial_id": trial_id,
            "records": records,
            "bytes": size,
            "head": head,
            "ledger_after": dict(totals),
        }
    )


class Malformed(Exception):
    """A payload that verified but does not have the shape it must (one line)."""


def _object(payload: bytes, kind: str, what: str) -> dict[str, Any]:
    """The JSON object of `payload`, whose `_type` is `kind`; Malformed (naming `what`) otherwise."""
    try:
        document = json.loads(payload)
    except ValueError:
        raise Malformed(f"the {what} is not JSON") from None
    if not isinstance(document, dict) or document.get("_type") != kind:
        raise Malformed(f"not a {what} of type {kind}")
    return document


def parse_statement(payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the subject, the predicate) of a statement's payload; Malformed if it is not one of trialtool's."""
    document = _object(payload, STATEMENT_TYPE, "statement")
    if document.get("predicateType") != PREDICATE_TYPE:
        raise Malformed(f"the statement's predicateType is not {PREDICATE_TYPE}")
    subjects, predicate = document.get("subject"), document.get("predicate")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise Malformed("the statement does not have one subject")
    if not isinstance(predicate, dict):
        raise Malformed("the statement has no predicate")
    subject = subjects[0]
    digest, annotations = subject.get("digest"), subject.get("annotations")
    if not isinstance(digest, dict) or not isinstance(digest.get("sha256"), str):
        raise Malformed("the statement's subject has no sha256")
    if not isinstance(annotations, dict) or type(annotations.get("bytes")) is not int:
        raise Malformed("the statement's subject does not say its size")
    return subject, predicate


def parse_checkpoint(payload: bytes) -> dict[str, Any]:
    """A checkpoint's fields; Malformed if it is not one."""
    document = _object(payload, CHECKPOINT_SCHEMA, "checkpoint")
    if not all(type(document.get(name)) is int for name in ("records", "bytes")) or not isinstance(
        document.get("head"), str
    ):
        raise Malformed("the checkpoint's records, bytes or head are malformed")
    return document


__all__ = [
    "CHECKPOINT_SCHEMA",
    "CHECKPOINT_TYPE",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "SUFFIX",
    "Malformed",
    "canonical",
    "checkpoint",
    "parse_checkpoint",
    "parse_statement",
    "statement",
]
