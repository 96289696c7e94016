"""One trial summed up for a grader: its limits, what it used, what stopped it, whether it is intact.

Everything here reads a trial's files at one moment (ledger/_snapshot.py),
without the lock, and never writes. A summary is a plain JSON-able dict (its
shape is documented in docs/graders.md), so that worker processes can hand it
back cheaply and every output format reads the same fields.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import NotRequired, TypedDict

from .. import signing
from ..errors import StateError, TrialToolError
from ..ledger import GRADING, REFUSED, REPAIR, START, TrialState, audit, decode, snapshot, verify, whole
from ..osio import alive
from ..types import LATER_FIELDS, Limits, budget
from .calls import mapping, typed


class Integrity(TypedDict):
    """`verify`'s verdict for a trial, why, and where the first bad record is."""

    verdict: str
    why: NotRequired[str]
    first_bad_sequence: NotRequired[int | None]
    line: NotRequired[int | None]
    first_bad_record: NotRequired[int | None]
    #: Against the head the harness kept (report given --heads).
    head: NotRequired[str]


class Group(TypedDict):
    """A trial's group of rules in a report (1: the majority's), and how its rules differ from the majority's."""

    group: int
    differs: dict[str, list[object]]


class Used(TypedDict):
    """What a trial used of its budgets."""

    calls: int
    tokens: int
    seconds: float


class Connections(TypedDict):
    """Connections through the egress proxy (network "allow"), as the state counts them."""

    allowed: int
    denied: int


class Signature(TypedDict):
    """A trial's signatures: `status` is `not_checked` (no --public-key), or what the check found
    (`statement`, `checkpoint`, `partly`, `unsigned`, `invalid`)."""

    status: str
    #: The fingerprint of the trial's key: the one that signed (checked), else the one its state names.
    signer: str | None
    signed_records: NotRequired[int]
    statement_sha256: NotRequired[str | None]


class Summary(TypedDict):
    """One trial summed up: the shape docs/graders.md documents, and every output format reads."""

    state: str
    log: str
    trial_id: str | None
    labels: dict[str, str]
    started_at_utc: NotRequired[object]
    first_call_at_utc: NotRequired[object]
    last_call_at_utc: NotRequired[object]
    keyed: bool
    limits: dict[str, object]
    #: The sandbox's rules, which the fairness check compares: mode, network, image, allowlist, user.
    sandbox: dict[str, object]
    sandbox_fallback: str | None
    tokenizer: list[str]
    used: Used
    refused_calls: int
    connections: Connections
    in_flight: int
    ended_by: str | None
    statuses: dict[str, int]
    grading_commands: int
    records: int
    head: object
    log_head: NotRequired[str | None]
    #: `verify`'s verdict, its reasons, and (report) against the head the harness kept.
    integrity: Integrity
    #: Who signed the trial and what the signatures cover (ledger/_signatures.py), checked with --public-key.
    signature: Signature
    #: What is left of each budget when read (`now`: status, not report).
    left: NotRequired[dict[str, object]]
    #: The benchmark's score (report and export given --scores).
    score: NotRequired[float]
    #: Report's page: the calls it embeds; and the trial's group of rules, and how they differ from the majority's.
    calls: NotRequired[list[dict[str, object]]]
    fairness: NotRequired[Group]


def records_of(log: bytes) -> list[dict[str, object]]:
    """The log's whole lines that parse as JSON objects (a torn or bad line ends the list).

    Each has `record`, its line number: the key unique to it, which a log written
    before records carried it gets here.
    """
    found = []
    for number, raw in enumerate(log.splitlines(keepends=True), 1):
        if not raw.endswith(b"\n"):
            break
        try:
            record = json.loads(raw)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        record.setdefault("record", number)
        found.append(record)
    return found


def _state(taken: snapshot.Snapshot, state_path: str, key: bytes | None) -> tuple[TrialState | None, dict[str, object]]:
    """The decoded state (None when it cannot be), and its raw document for what can still be shown."""
    if taken.state is None:
        return None, {}
    try:
        raw: object = json.loads(taken.state)
    except ValueError:
        raw = {}
    if not isinstance(raw, dict):
        raw = {}
    try:
        return decode(taken.state, state_path, audit.Chain(key)), raw
    except TrialToolError:
        return None, raw


def _integrity(report: verify.Report, in_progress: bool) -> Integrity:
    """The trial's verdict (ledger/_verify.py's, one word for every graders' command), why, and where."""
    if in_progress and report.verdict in ("failed", "unconfirmed"):
        # The files changed while they were read, or a call's owner is recording it now.
        why = report.why or "a call is being recorded"
        return {"verdict": "in_flight", "why": f"a call is running or being recorded ({why})"}
    integrity: Integrity = {"verdict": report.verdict}
    if report.why:
        integrity["why"] = report.why
    if report.verdict == "failed":
        integrity["first_bad_sequence"] = next((p.sequence for p in report.problems if p.sequence is not None), None)
        integrity["line"] = report.problems[0].line if report.problems else None
        # The record's number is its line (records carry it as `record`): one key for show, export and the page.
        integrity["first_bad_record"] = integrity["line"]
    if report.verdict == "unconfirmed" and report.pending is not None:
        integrity["first_bad_record"] = report.pending
    return integrity


def _in_progress(state: TrialState | None, taken: snapshot.Snapshot) -> bool:
    """A call is running or being committed right now (its owner is alive)."""
    if taken.moving:
        return True
    if state is None:
        return False
    return any(alive(entry.pid, entry.pid_token) for entry in state.in_flight.values())


def summarize(
    state_path: str,
    log_path: str,
    key: bytes | None = None,
    *,
    now: bool = False,
    trusted: tuple[bytes, ...] | None = None,
) -> Summary:
    """The summary of the trial at `state_path` and `log_path`; never raises for what it finds in them.

    StateError when there is no trial there at all. `now`: with `left` (summarize_snapshot).
    """
    if not os.path.lexists(state_path) and not os.path.lexists(log_path):
        msg = f"no trial at {state_path} (and no log at {log_path})"
        raise StateError(msg)
    try:
        taken = snapshot.read(state_path, log_path)
    except TrialToolError as exc:
        found = unreadable(state_path, log_path, exc.message)
        if now:
            found["left"] = _left(None, {}, 0, 0, 0.0)
        return found
    return summarize_snapshot(taken, state_path, log_path, key, now=now, trusted=trusted)[0]


#: The trusted keys of this process's checks, built once from their raw bytes (a report's workers get bytes).
_TRUSTED: dict[tuple[bytes, ...], dict[str, signing.PublicKey]] = {}


def _trusted(raws: tuple[bytes, ...]) -> dict[str, signing.PublicKey]:
    found = _TRUSTED.get(raws)
    if found is None:
        found = _TRUSTED[raws] = {key.fingerprint: key for key in map(signing.PublicKey, raws)}
    return found


def summarize_snapshot(
    taken: snapshot.Snapshot,
    state_path: str,
    log_path: str,
    key: bytes | None,
    *,
    now: bool = False,
    trusted: tuple[bytes, ...] | None = None,
) -> tuple[Summary, list[dict[str, object]]]:
    """(the summary, the log's records) of a trial read at one moment.

    `now` adds `left`, what is left of each budget at this moment: it changes as trial
    time runs, so a report (whose summaries must not depend on when it runs) leaves it out.
    `trusted`: the raw public keys whose signatures count (signatures checked; None: not).
    """
    state, raw = _state(taken, state_path, key)
    keyed = raw.get("chain") == "hmac-sha256"
    statement = None if trusted is None else verify.statement_of(log_path)
    checking = None if trusted is None else _trusted(trusted)
    report = verify.check(taken, state_path, key if keyed else None, trusted=checking, statement=statement)
    records = records_of(taken.log)
    in_progress = _in_progress(state, taken)
    statuses: Counter[str] = Counter()
    ended_by = None
    tokenizers = set()
    first_at = last_at = None
    start: dict[str, object] = {}
    grading = 0
    for record in records:
        if record.get("record_type") == START:
            start = record
            continue
        if record.get("record_type") == GRADING:
            grading += 1  # the harness's commands: not the agent's calls, outcomes or end
            continue
        if record.get("record_type") == REPAIR:
            statuses["log_repaired"] += 1
            continue
        status = str(record.get("status"))
        statuses[status] += 1
        if status in REFUSED and ended_by is None:
            ended_by = budget.BUDGET_OF[status]
        if record.get("tokenizer"):
            tokenizers.add(str(record["tokenizer"]))
        started = record.get("started_at_utc") or record.get("at_utc")
        first_at = first_at or started
        last_at = record.get("ended_at_utc") or record.get("at_utc") or last_at
    limits = mapping(raw.get("limits"))
    if limits:
        # A state written before a limit existed has its default: the same trial, for the fairness check.
        # Sorted, as the state stores them: the page compares trials' limits as JSON text.
        limits = dict(sorted({**{name: getattr(Limits(), name) for name in LATER_FIELDS}, **limits}.items()))
    sandbox = mapping(raw.get("sandbox"))
    calls = whole(raw.get("calls"))
    tokens = whole(raw.get("emitted_tokens"))
    seconds = typed("float", raw.get("elapsed_seconds")) or 0.0
    caps = whole(limits.get("max_calls")), whole(limits.get("max_tokens"))
    if ended_by is None and min(caps) > 0:
        # No refusal, but a budget used to its last unit: the agent could not have gone on. (Time is
        # not: the state's clock stops between calls, so a trial's time runs out only when it is asked.)
        ended_by = budget.spent(caps[0] - calls, caps[1] - tokens, math.inf)
    log_head = mapping(raw.get("log"))
    summary: Summary = {
        "state": state_path,
        "log": log_path,
        "trial_id": trial_id if isinstance(trial_id := raw.get("trial_id"), str) else None,
        # Who the trial is: the state's labels, else its log's first record's (a state lost).
        "labels": _labels(raw.get("labels", start.get("labels"))),
        "started_at_utc": raw.get("started_at_utc"),
        "first_call_at_utc": first_at,
        "last_call_at_utc": last_at,
        "keyed": keyed,
        "limits": limits,
        "sandbox": {
            "mode": sandbox.get("mode", "none"),
            "network": sandbox.get("network", "none"),
            **_image(sandbox),
            **({"run_as": sandbox["run_as"]} if isinstance(sandbox.get("run_as"), str) else {}),
        },
        # Outside "sandbox", which the fairness check compares: the same rules, whatever the wording of why.
        "sandbox_fallback": fallback if isinstance(fallback := sandbox.get("fallback"), str) else None,
        "tokenizer": sorted(tokenizers) or ["o200k_base"],
        "used": {"calls": calls, "tokens": tokens, "seconds": round(float(seconds), 3)},
        "refused_calls": whole(raw.get("refused_calls")),
        # Connections through the egress proxy (network "allow"), as the state counts them.
        "connections": {
            "allowed": whole(raw.get("connections_allowed")),
            "denied": whole(raw.get("connections_denied")),
        },
        "in_flight": len(mapping(raw.get("in_flight"))),
        "ended_by": ended_by,
        "statuses": dict(sorted(statuses.items())),
        "grading_commands": grading,
        "records": len(records),
        "head": log_head.get("head"),
        # The digest of the log's last whole line (the state's `head` may be one record behind it);
        # None where it cannot be computed (a keyed trial read without its key).
        "log_head": None if report.verdict == "unverified" else report.head,
        "integrity": _integrity(report, in_progress),
        "signature": _signature(report, raw),
    }
    if now:
        summary["left"] = _left(state, limits, calls, tokens, float(seconds))
    return summary, records


def _signature(report: verify.Report, raw: dict[str, object]) -> Signature:
    named = mapping(raw.get("signing")).get("signer")
    signer = named if isinstance(named, str) else None
    found = report.signatures
    if found is None:
        return {"status": "not_checked", "signer": signer}
    return {
        "status": found.status,
        "signer": found.signer or signer,
        "signed_records": found.signed_records,
        "statement_sha256": found.statement_sha256,
    }


def _labels(value: object) -> dict[str, str]:
    found = mapping(value)
    return {str(key): str(found[key]) for key in sorted(found)}


def _image(sandbox: dict[str, object]) -> dict[str, object]:
    """A container trial's image (by its id, which the fairness check compares, and as it was named);
    a gVisor trial's runtime and platform; a trial's egress allowlist."""
    if sandbox.get("network") == "allow":
        allow = sandbox.get("allow")
        return {"allow": list(allow) if isinstance(allow, list) else []}
    kernel = {name: sandbox[name] for name in ("runtime", "platform") if sandbox.get(name) is not None}
    if sandbox.get("image_id") is None:
        return kernel
    return {"image_id": sandbox.get("image_id"), "image": sandbox.get("image"), **kernel}


def unreadable(state_path: str, log_path: str, why: str) -> Summary:
    """The summary of a trial whose files cannot be read at all."""
    return {
        "state": state_path,
        "log": log_path,
        "trial_id": None,
        "labels": {},
        "keyed": False,
        "limits": {},
        "sandbox": {"mode": "none", "network": "none"},
        "sandbox_fallback": None,
        "tokenizer": [],
        "used": {"calls": 0, "tokens": 0, "seconds": 0.0},
        "refused_calls": 0,
        "connections": {"allowed": 0, "denied": 0},
        "in_flight": 0,
        "ended_by": None,
        "statuses": {},
        "grading_commands": 0,
        "records": 0,
        "head": None,
        "integrity": {"verdict": "failed", "why": why},
        "signature": {"status": "not_checked", "signer": None},
    }


def _left(
    state: TrialState | None, limits: dict[str, object], calls: int, tokens: int, seconds: float
) -> dict[str, object]:
    """What is left of each budget at the moment of reading (trial time runs between calls too)."""
    if state is not None:
        now = budget.of(state)
        return {
            "calls": now.calls_left,
            "tokens": now.tokens_left,
            "seconds": now.seconds_left,
            "seconds_used": now.seconds_used,
        }
    timeout = typed("float", limits.get("trial_timeout")) or 0.0
    return {
        "calls": max(0, whole(limits.get("max_calls")) - calls),
        "tokens": max(0, whole(limits.get("max_tokens")) - tokens),
        "seconds": max(0.0, timeout - seconds),
        "seconds_used": seconds,
    }


def fairness_key(summary: Summary) -> str:
    """What must be the same in every trial of a benchmark: pinned limits, sandbox, tokenizer."""
    return json.dumps(
        {"limits": summary["limits"], "sandbox": summary["sandbox"], "tokenizer": summary["tokenizer"]},
        sort_keys=True,
    )


__all__ = [
    "Connections",
    "Summary",
    "Used",
    "fairness_key",
    "records_of",
    "summarize",
    "summarize_snapshot",
    "unreadable",
]
