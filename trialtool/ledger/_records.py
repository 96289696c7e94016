"""The audit records' schema, and the one rule for how a record changes the ledger's totals.

Calls share one shape (`record_type` "trial_tool_call"), told apart by
`status`: a call that ran, a call refused before it ran (`maximum_tool_calls`,
`maximum_emitted_tokens`, `task_timeout_seconds`), and a call whose trial-tool
died before committing it (`abandoned`). Two other kinds: `trial_tool_trial`,
a trial's first line, which binds the log to its trial before any command
runs and says who the trial is; `trial_tool_repair`, that a torn last line
was cut off after a crash. Every line carries `record`, its number in the log:
the one key unique to it (refusals share the sequence number of the call they
would have been). docs/records.md documents each field.

`apply` is the rule both the ledger (rolling a crash forward) and `verify`
(recomputing a whole trial) use, so the two can never disagree on it.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import NamedTuple, TypedDict, Unpack

from ..osio import os_bytes, shown
from ..sandbox import egress
from ..types import BUDGETS

RECORD_TYPE = "trial_tool_call"
#: Record type of a log repair (a torn line cut off).
REPAIR = "trial_tool_repair"
#: Record type of a trial's first line (`start`).
START = "trial_tool_trial"
#: Record type of a command the harness ran to grade the agent's work (`grading`): never
#: refused, never charged, outside the agent's counters.
GRADING = "trial_tool_grading"
RECORD_VERSION = 1

#: Tokens a grading command may deliver: all it printed (the harness reads it, not the agent).
GRADING_ALLOWANCE = 1 << 40

#: Statuses of calls refused before running: a budget spent (budget.BUDGETS).
REFUSED = tuple(status for status, _ in BUDGETS.values())


class Line(TypedDict, total=False):
    """What every line of a log holds: which kind of record, of which trial, its place in the chain, the totals."""

    record_type: str
    record_version: int
    trial_id: str
    status: str
    charged: bool
    #: The line's number in the log, the hash chain's link to the line before, the totals after it:
    #: the ledger's to add (Store.append).
    record: int
    prev_hash: str
    ledger_after: dict[str, int]


class Given(TypedDict, total=False):
    """What a call was given besides its command (`input_fields`), and the caller's name for it."""

    stdin_bytes: int | None
    stdin_sha256: str | None
    merged_output: bool
    request_id: str


class CallFields(Given, total=False):
    """What a call's record says of the call besides who it is (`CallRecord`): docs/records.md says what each means.

    Every field a call's record can hold is declared once, here or in `CallRecord`: the call's
    delivery, the ledger and its refusals build records of this shape. A record read back from
    a log is what its writer wrote: the views check what they read rather than trust this type.
    """

    error: str | None
    complete_delivery: bool
    stdout_b64: str
    stderr_b64: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_sha256: str
    stderr_sha256: str
    stdout_capture_truncated: bool
    stderr_capture_truncated: bool
    delivered_stdout_bytes: int
    delivered_stderr_bytes: int
    delivered_stdout_sha256: str
    delivered_stderr_sha256: str
    observed_stdout_tokens: int | None
    observed_stderr_tokens: int | None
    observed_emitted_tokens: int | None
    delivered_stdout_tokens: int
    delivered_stderr_tokens: int
    delivered_emitted_tokens: int
    allowance_tokens: int | None
    clip: str
    tokenizer: str | None
    token_cost_censored: bool
    output_truncated: bool
    trial_tool_notice: str | None
    elapsed_seconds: float
    started_at_utc: str
    ended_at_utc: str
    wall_elapsed_seconds: float
    deadline_seconds: float
    deadline_kind: str
    ended: str
    command_exit_code: int | None
    command_signal: int | None
    return_code: int | None
    stop_signal: int | None
    deadline_overshoot_seconds: float | None
    exited_after_deadline_seconds: float | None
    processes_killed: int
    processes_surviving: list[int]
    peak_rss_bytes: int
    peak_rss_scope: str
    cpu_user_seconds: float
    cpu_system_seconds: float
    containment: dict[str, object]
    network: dict[str, object]
    withheld: bool
    reply: str
    final: bool
    sandbox: str
    #: Where it ran: the trial's container, or (a harness's own sandbox) what the harness said.
    container: dict[str, object]
    elsewhere: dict[str, object]


class CallRecord(Line, CallFields, total=False):
    """A call's whole record: which call of which trial, its command, and `CallFields`."""

    #: None in a grading command's record.
    sequence: int | None
    command: list[str]
    command_b64: list[str]


class StartRecord(Line, total=False):
    """A trial's first line (`start`): who the trial is and what it pinned."""

    limits: dict[str, object]
    sandbox_settings: dict[str, object]
    labels: dict[str, str]
    at_utc: str


class RepairRecord(Line, total=False):
    """That a torn last line was cut off after a crash (`repair`)."""

    removed_bytes: int
    removed_sha256: str
    removed_b64: str
    at_utc: str


#: Any line trial-tool writes to a log.
Record = CallRecord | StartRecord | RepairRecord


class Totals(NamedTuple):
    """The ledger's running totals, as every record states them after itself (`ledger_after`)."""

    charged_calls: int = 0
    emitted_tokens: int = 0
    refused_calls: int = 0
    #: Connections the calls' proxies allowed and denied (network "allow").
    connections_allowed: int = 0
    connections_denied: int = 0

    def as_json(self) -> dict[str, int]:
        document = self._asdict()
        if not (self.connections_allowed or self.connections_denied):
            del document["connections_allowed"], document["connections_denied"]  # as before there were any
        return document


def network_counts(record: Mapping[str, object]) -> tuple[int, int]:
    """(connections allowed, connections denied) that a call's record counts."""
    network = record.get("network")
    if not isinstance(network, dict):
        return 0, 0
    return whole(network.get("allowed_count")), whole(network.get("denied_count"))


def whole(value: object) -> int:
    """A record's count, or 0 where it holds anything but a whole number (verify must not raise)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def apply(totals: Totals, record: Mapping[str, object]) -> Totals | None:
    """The totals after `record`; None for a record of no kind the ledger writes."""
    if record.get("record_type") in (REPAIR, START, GRADING):
        return totals
    if record.get("status") in REFUSED:
        return totals._replace(refused_calls=totals.refused_calls + 1)
    if record.get("charged") is True:
        allowed, denied = network_counts(record)
        return totals._replace(
            charged_calls=totals.charged_calls + 1,
            emitted_tokens=totals.emitted_tokens + whole(record.get("delivered_emitted_tokens")),
            connections_allowed=totals.connections_allowed + allowed,
            connections_denied=totals.connections_denied + denied,
        )
    return None


def command_fields(argv: list[str] | tuple[str, ...]) -> CallRecord:
    """`command` as text every strict JSON parser reads, and `command_b64`, its exact bytes, where they differ."""
    fields: CallRecord = {"command": [shown(arg) for arg in argv]}
    if fields["command"] != list(argv):
        fields["command_b64"] = [base64.b64encode(os_bytes(arg)).decode("ascii") for arg in argv]
    return fields


def _base(trial_id: str, sequence: int, command: list[str], status: str) -> CallRecord:
    return {
        "record_type": RECORD_TYPE,
        "record_version": RECORD_VERSION,
        "trial_id": trial_id,
        "sequence": sequence,
        **command_fields(command),
        "status": status,
    }


def _not_run(
    base: CallRecord,
    *,
    observed: int | None,
    charged: bool,
    error: str,
    started_at_utc: str,
    at_utc: str,
    wall_elapsed: float,
) -> CallRecord:
    """The fields of a record whose command delivered nothing: refused, or abandoned by a dead trial-tool."""
    base.update(
        {
            "charged": charged,
            "error": error,
            "complete_delivery": False,
            "stdout_b64": "",
            "stderr_b64": "",
            "stdout_bytes": 0,
            "stderr_bytes": 0,
            "stdout_capture_truncated": False,
            "stderr_capture_truncated": False,
            "delivered_stdout_bytes": 0,
            "delivered_stderr_bytes": 0,
            "delivered_stdout_tokens": 0,
            "delivered_stderr_tokens": 0,
            "observed_stdout_tokens": observed,
            "observed_stderr_tokens": observed,
            "observed_emitted_tokens": observed,
            "delivered_emitted_tokens": 0,
            "tokenizer": None,
            "token_cost_censored": True,
            "output_truncated": False,
            "elapsed_seconds": 0.0,
            "allowance_tokens": 0,
            "started_at_utc": started_at_utc,
            "ended_at_utc": at_utc,
            "wall_elapsed_seconds": wall_elapsed,
            "return_code": None,
            "command_exit_code": None,
            "command_signal": None,
        }
    )
    return base


def refusal(
    *,
    trial_id: str,
    sequence: int,
    command: list[str],
    status: str,
    reason: str,
    at_utc: str,
    wall_elapsed: float,
) -> CallRecord:
    """A call refused before its command ran; it is not charged."""
    return _not_run(
        _base(trial_id, sequence, command, status),
        observed=0,
        charged=False,
        error=reason,
        started_at_utc=at_utc,
        at_utc=at_utc,
        wall_elapsed=wall_elapsed,
    )


def abandoned(
    *,
    trial_id: str,
    sequence: int,
    command: list[str],
    started_at_utc: str,
    at_utc: str,
    wall_elapsed: float,
    owner_pid: int,
) -> CallRecord:
    """A call reserved by a trial-tool that died before committing it: charged, nothing delivered."""
    return _not_run(
        _base(trial_id, sequence, command, "abandoned"),
        observed=None,
        charged=True,
        error=f"trial-tool pid {owner_pid} died before recording this call",
        started_at_utc=started_at_utc,
        at_utc=at_utc,
        wall_elapsed=wall_elapsed,
    )


def failed(
    *,
    trial_id: str,
    sequence: int,
    command: list[str],
    error: str,
    started_at_utc: str,
    at_utc: str,
    allowance: int,
    given: Given | None = None,
) -> CallRecord:
    """A call that trial-tool itself failed to run (`trial_tool_error`): charged, nothing delivered.

    `given`: what the call was given besides its command (`input_fields`)."""
    return call(
        **(given or {}),
        trial_id=trial_id,
        sequence=sequence,
        command=command,
        status="trial_tool_error",
        error=error,
        started_at_utc=started_at_utc,
        ended_at_utc=at_utc,
        allowance_tokens=allowance,
        delivered_emitted_tokens=0,
        complete_delivery=False,
        token_cost_censored=True,
    )


def size_bound(max_capture_bytes: int, command: list[str], network: bool = False, streams: int = 2) -> int:
    """Bytes a call's record can take at most: each stream's capture in base64, the command twice, the rest.

    Reserved in the log before the command starts (_ledger.py), so that the record
    always fits, however full the disk then is. `streams` is 1 for a call whose
    stderr is merged into its stdout: its stderr capture is empty.
    """
    captures = streams * 4 * -(-max_capture_bytes // 3)
    # JSON escapes a byte in at most 6 characters; command_b64 adds 4/3 of it again.
    argv = sum(len(os_bytes(arg)) for arg in command)
    return captures + 8 * argv + 16 * 1024 + (egress.RECORD_BOUND if network else 0)


def input_fields(stdin: bytes | None, merged: bool) -> Given:
    """What a call that ran was given besides its command: its stdin (size and digest, not bytes), merged streams."""
    return {
        "stdin_bytes": None if stdin is None else len(stdin),
        "stdin_sha256": None if stdin is None else hashlib.sha256(stdin).hexdigest(),
        "merged_output": merged,
    }


def repair(trial_id: str, torn: bytes, at_utc: str) -> RepairRecord:
    """The record saying that a torn last line of `torn` bytes was cut off."""
    return {
        "record_type": REPAIR,
        "record_version": RECORD_VERSION,
        "trial_id": trial_id,
        "status": "log_repaired",
        "charged": False,
        "removed_bytes": len(torn),
        "removed_sha256": hashlib.sha256(torn).hexdigest(),
        "removed_b64": base64.b64encode(torn).decode("ascii"),
        "at_utc": at_utc,
    }


def start(
    *, trial_id: str, limits: dict[str, object], sandbox: dict[str, object], labels: dict[str, str], at_utc: str
) -> StartRecord:
    """A trial's first record: it claims the log, and says who the trial is and what it pinned."""
    return {
        "record_type": START,
        "record_version": RECORD_VERSION,
        "trial_id": trial_id,
        "status": "trial_started",
        "charged": False,
        "limits": limits,
        "sandbox_settings": sandbox,
        "labels": labels,
        "at_utc": at_utc,
    }


def grading(record: CallRecord) -> CallRecord:
    """A call's record made a grading record: the harness's command, not the agent's; uncharged."""
    record.update({"record_type": GRADING, "sequence": None, "charged": False, "allowance_tokens": None})
    return record


def call(*, trial_id: str, sequence: int, command: list[str], status: str, **fields: Unpack[CallFields]) -> CallRecord:
    """A call that ran (or tried to: not found, not executable); `fields` are the rest."""
    record: CallRecord = {**_base(trial_id, sequence, command, status), "charged": True, **fields}
    return record


__all__ = [
    "GRADING",
    "GRADING_ALLOWANCE",
    "RECORD_TYPE",
    "RECORD_VERSION",
    "REFUSED",
    "REPAIR",
    "START",
    "CallFields",
    "CallRecord",
    "Given",
    "Line",
    "Record",
    "RepairRecord",
    "StartRecord",
    "Totals",
    "abandoned",
    "apply",
    "call",
    "command_fields",
    "grading",
    "input_fields",
    "network_counts",
    "refusal",
    "repair",
    "size_bound",
    "start",
    "whole",
]
