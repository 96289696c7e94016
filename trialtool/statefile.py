"""The state document: its schema, validation, encoding, and its agreement with the log.

With a key, the state carries `mac`, an HMAC-SHA256 over its canonical JSON,
so that its counters cannot be edited without the key. Without one, a state
edited by hand is still caught by `check_against_log`: every record carries the
ledger's totals after it (`ledger_after`), and the state's counters must match
those of the last record.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from . import audit, clock
from .errors import StateError
from .limits import Limits, from_state

SCHEMA = "trialtool.state"
VERSION = 1


def new(limits: Limits, chain: audit.Chain) -> dict[str, Any]:
    """A fresh trial's state."""
    now = time.time()
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "trial_id": os.urandom(16).hex(),
        "chain": chain.name,
        "limits": limits,
        "calls": 0,
        "refused_calls": 0,
        "emitted_tokens": 0,
        "started_at": now,
        "started_at_utc": clock.utc(now),
        "elapsed_seconds": 0.0,
        "clock": clock.anchor(),
        "in_flight": {},
        "log": audit.LogHead(),
    }


def totals(state: dict[str, Any]) -> dict[str, int]:
    """The ledger's totals as the last record must state them (`ledger_after`)."""
    return {
        "charged_calls": state["calls"] - len(state["in_flight"]),
        "emitted_tokens": state["emitted_tokens"],
        "refused_calls": state["refused_calls"],
    }


def _canonical(document: dict[str, Any]) -> bytes:
    body = {key: value for key, value in document.items() if key not in ("mac", "updated_at_utc")}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(state: dict[str, Any], chain: audit.Chain) -> bytes:
    document = dict(state)
    document["limits"] = state["limits"]._asdict()
    document["log"] = state["log"]._asdict()
    document.pop("mac", None)
    if chain.key is not None:
        document["mac"] = chain.digest(_canonical(document))
    document["updated_at_utc"] = clock.utc(time.time())
    # One line: json's C encoder does not indent, and the state is written twice a call.
    return json.dumps(document, sort_keys=True).encode() + b"\n"


def decode(raw: bytes, path: str, chain: audit.Chain) -> dict[str, Any]:
    """The validated state, or StateError naming what is wrong."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        msg = f"state {path} is not valid JSON (corrupt or truncated): {exc}"
        raise StateError(msg) from exc

    def bad(what: str) -> StateError:
        return StateError(f"state {path} is not a trialtool state: {what}; run `trial-tool verify`")

    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, found {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise bad(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    if data.get("version") != VERSION:
        msg = f"state {path} has schema version {data.get('version')!r}; this trial-tool reads version {VERSION} only"
        raise StateError(msg)
    if data.get("chain") != chain.name:
        if data.get("chain") == "hmac-sha256":
            msg = f"state {path} belongs to a keyed trial: pass its key (--key-file or TRIALTOOL_LEDGER_KEY)"
        else:
            msg = f"state {path} belongs to a trial without a key, but a key was given"
        raise StateError(msg)
    if chain.key is not None and not (
        isinstance(data.get("mac"), str) and chain.matches(_canonical(data), data["mac"])
    ):
        msg = f"state {path} fails its HMAC: edited, or the key is wrong; run `trial-tool verify`"
        raise StateError(msg)
    for key in ("calls", "emitted_tokens", "refused_calls"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"{key} is {value!r}, expected a non-negative integer")
    for key in ("started_at", "elapsed_seconds"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad(f"{key} is {value!r}, expected a non-negative number")
    if not isinstance(data.get("trial_id"), str):
        raise bad("trial_id is missing")
    try:
        data["limits"] = from_state(data.get("limits"))
    except ValueError as exc:
        raise bad(f"limits: {exc}") from exc
    if not isinstance(data.get("in_flight"), dict) or not isinstance(data.get("clock"), dict):
        raise bad("in_flight or clock is missing")
    log: Any = data.get("log")
    try:
        data["log"] = audit.LogHead(int(log["records"]), int(log["bytes"]), str(log["head"]), int(log["last_offset"]))
    except (TypeError, KeyError, ValueError) as exc:
        raise bad("log binding is missing or malformed") from exc
    limits: Limits = data["limits"]
    if data["calls"] > limits.max_calls or data["emitted_tokens"] > limits.max_tokens:
        raise bad("counters exceed the pinned limits")
    if len(data["in_flight"]) > data["calls"]:
        raise bad("more calls in flight than calls charged")
    return data


def check_against_log(state: dict[str, Any], last: dict[str, Any] | None, path: str) -> None:
    """The state's counters must be those the last record states (or zero for an empty log)."""
    expected = totals(state)
    stated = last.get("ledger_after") if last is not None else dict.fromkeys(expected, 0)
    if last is not None and last.get("trial_id") not in (None, state["trial_id"]):
        msg = f"state {path} and its log belong to different trials; run `trial-tool verify`"
        raise StateError(msg)
    if stated != expected:
        msg = (
            f"state {path} disagrees with its log: the state says {expected}, the last record {stated}; "
            "an edited or rolled-back state; run `trial-tool verify`"
        )
        raise StateError(msg)


__all__ = ["SCHEMA", "VERSION", "check_against_log", "decode", "encode", "new", "totals"]
