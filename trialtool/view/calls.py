"""A trial's calls as flat rows, and the text each one delivered, reproduced from its record.

The log keeps what a command printed (its captured bytes) and the SHA-256 of
what the agent was given, not the given text itself: that text follows from
the bytes, the call's allowance and the clip mode. `delivered` runs the same
clipping again and checks the result against the record's hashes, so what a
grader reads is what the agent read, or is marked as not matching.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import shlex
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..ledger import GRADING_ALLOWANCE
from ..output import clipping, tokens

#: The columns of one call's row, in order, with their kinds (export's schema; docs/graders.md): every
#: field a record has but the captured bytes (in the log; `export --text` adds the text delivered).
SCHEMA = (
    ("trial_id", "text"),
    ("record", "int"),
    ("sequence", "int"),
    ("record_type", "text"),
    ("status", "text"),
    ("ended", "text"),
    ("charged", "bool"),
    ("complete_delivery", "bool"),
    ("withheld", "bool"),
    ("started_at_utc", "timestamp"),
    ("ended_at_utc", "timestamp"),
    ("elapsed_seconds", "float"),
    ("wall_elapsed_seconds", "float"),
    ("deadline_seconds", "float"),
    ("deadline_kind", "text"),
    ("deadline_overshoot_seconds", "float"),
    ("exited_after_deadline_seconds", "float"),
    ("return_code", "int"),
    ("command_exit_code", "int"),
    ("command_signal", "int"),
    ("stop_signal", "int"),
    ("error", "text"),
    ("trial_tool_notice", "text"),
    ("allowance_tokens", "int"),
    ("delivered_stdout_tokens", "int"),
    ("delivered_stderr_tokens", "int"),
    ("delivered_emitted_tokens", "int"),
    ("observed_stdout_tokens", "int"),
    ("observed_stderr_tokens", "int"),
    ("observed_emitted_tokens", "int"),
    ("token_cost_censored", "bool"),
    ("tokenizer", "text"),
    ("clip", "text"),
    ("output_truncated", "bool"),
    ("stdout_bytes", "int"),
    ("stderr_bytes", "int"),
    ("stdout_capture_truncated", "bool"),
    ("stderr_capture_truncated", "bool"),
    ("stdout_sha256", "text"),
    ("stderr_sha256", "text"),
    ("delivered_stdout_bytes", "int"),
    ("delivered_stderr_bytes", "int"),
    ("delivered_stdout_sha256", "text"),
    ("delivered_stderr_sha256", "text"),
    ("peak_rss_bytes", "int"),
    ("peak_rss_scope", "text"),
    ("cpu_user_seconds", "float"),
    ("cpu_system_seconds", "float"),
    ("processes_killed", "int"),
    ("processes_surviving", "int"),
    ("containment", "json"),
    ("sandbox", "text"),
    ("connections_allowed", "int"),
    ("connections_denied", "int"),
    ("stdin_bytes", "int"),
    ("stdin_sha256", "text"),
    ("merged_output", "bool"),
    ("reply", "text"),
    ("command", "text"),
    ("command_b64", "json"),
    ("removed_bytes", "int"),
    ("removed_sha256", "text"),
    ("charged_calls_after", "int"),
    ("emitted_tokens_after", "int"),
    ("refused_calls_after", "int"),
    ("record_version", "int"),
    ("prev_hash", "text"),
)
COLUMNS = tuple(name for name, _ in SCHEMA)
KIND = dict(SCHEMA)
_AFTER = {
    "charged_calls_after": "charged_calls",
    "emitted_tokens_after": "emitted_tokens",
    "refused_calls_after": "refused_calls",
}
#: A call's connections (network "allow"), counted in its record's `network`.
_NETWORK = {"connections_allowed": "allowed_count", "connections_denied": "denied_count"}


def command_text(record: Mapping[str, object]) -> str:
    """The command as a shell would be given it."""
    command = record.get("command")
    if isinstance(command, list):
        return shlex.join(str(part) for part in command)
    return "" if command is None else str(command)


#: The columns read straight from the record's field of the same name (the rest are derived, in `row`).
_PLAIN = tuple(
    (column, kind)
    for column, kind in SCHEMA
    if column not in (*_AFTER, *_NETWORK, "command", "started_at_utc", "ended_at_utc")
)


def row(record: Mapping[str, object]) -> dict[str, object]:
    """One record as a flat row of COLUMNS (absent fields None; values of the wrong type None).

    `typed`'s rule, inlined for the plain columns: an export converts every record, and
    this loop is most of its time (docs/performance.md).
    """
    get = record.get
    out: dict[str, object] = {}
    for column, kind in _PLAIN:
        value = get(column)
        kind_of = type(value)
        if value is None or (kind_of is str and (kind == "text" or kind == "timestamp")):
            out[column] = value
        elif kind == "int":
            out[column] = value if kind_of is int else None
        elif kind == "bool":
            out[column] = value if kind_of is bool else None
        elif kind == "float" and kind_of is float:
            out[column] = value
        else:
            out[column] = typed(kind, value)
    after = mapping(get("ledger_after"))
    for column, field in _AFTER.items():
        out[column] = typed("int", after.get(field))
    network = mapping(get("network"))
    for column, field in _NETWORK.items():
        out[column] = typed("int", network.get(field))
    out["command"] = command_text(record)
    out["started_at_utc"] = typed("timestamp", get("started_at_utc") or get("at_utc"))
    out["ended_at_utc"] = typed("timestamp", get("ended_at_utc") or get("at_utc"))
    return {column: out[column] for column in COLUMNS}


def instant(text: object) -> Any:
    """An ISO 8601 UTC time as a datetime (None where a record holds something else)."""
    from datetime import datetime

    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def mapping(value: object) -> dict[str, object]:
    """`value` when it is a JSON object, else an empty one (records and states may hold anything)."""
    return value if isinstance(value, dict) else {}


def typed(kind: str, value: object) -> Any:
    """`value` as a column of `kind` holds it: None where it is missing or of another type."""
    if value is None:
        return None
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "float":
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind == "json":
        # Nested values (containment, command_b64) as JSON text: one column a plain SQL engine reads.
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    # text, and timestamps (ISO 8601 text here; export's Parquet types them).
    return value if isinstance(value, str) else str(value)


class Delivered(NamedTuple):
    """What the agent was given for one call, and whether it matches the record's hashes."""

    stdout: str
    stderr: str
    #: True: both texts hash to the record's delivered_*_sha256. False: they do not (a
    #: record edited, or captured bytes the log does not hold whole). None: no hashes recorded.
    matches: bool | None


class Replayer:
    """Reproduces delivered text; builds the encoder only for a call whose output was clipped."""

    def __init__(self, rank_file: str | None = None) -> None:
        self._rank_file = rank_file
        self._encoder: Any = None

    def _get_encoder(self) -> Any:
        if self._encoder is None:
            self._encoder = tokens.verified(tokens.locate(self._rank_file)).encoder()
        return self._encoder

    def delivered(self, record: Mapping[str, object]) -> Delivered:
        wanted = (record.get("delivered_stdout_sha256"), record.get("delivered_stderr_sha256"))
        if not all(isinstance(w, str) for w in wanted):
            return Delivered("", "", None)  # a refusal or an abandoned call: nothing was delivered
        if record.get("withheld"):
            return Delivered("", "", _matches("", "", wanted))
        try:
            out = base64.b64decode(str(record.get("stdout_b64") or ""), validate=True)
            err = base64.b64decode(str(record.get("stderr_b64") or ""), validate=True)
        except (binascii.Error, ValueError):
            return Delivered("", "", False)
        notice = record.get("trial_tool_notice") or ""
        # Not clipped and no notice: the decoded bytes themselves (no encoder needed).
        plain_out = out.decode("utf-8", "replace")
        plain_err = err.decode("utf-8", "replace") + str(notice)
        if _matches(plain_out, plain_err, wanted):
            return Delivered(plain_out, plain_err, True)
        allowance = record.get("allowance_tokens")
        if record.get("record_type") == "trial_tool_grading":
            allowance = GRADING_ALLOWANCE  # all of it was delivered (to the harness)
        if not isinstance(allowance, int) or allowance < 1:
            return Delivered(plain_out, plain_err, False)
        stdout = clipping.Captured(out, bool(record.get("stdout_capture_truncated")))
        stderr = clipping.Captured(err, bool(record.get("stderr_capture_truncated")))
        mode = str(record.get("clip") or "headtail")
        encoder = self._get_encoder()
        reply = str(record.get("reply") or "text")
        text_out, text_err = clipping.fit_reply(encoder, stdout, stderr, allowance, mode, str(notice), reply)
        return Delivered(text_out.text, text_err.text, _matches(text_out.text, text_err.text, wanted))


def _matches(out: str, err: str, wanted: tuple[Any, Any]) -> bool:
    return (_sha256(out), _sha256(err)) == wanted


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


__all__ = ["COLUMNS", "KIND", "SCHEMA", "Delivered", "Replayer", "command_text", "instant", "mapping", "row", "typed"]
