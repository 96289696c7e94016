"""The audit record schema: every field of the reference's record, plus what a grader needs.

Three kinds share one shape (`record_type` "trial_tool_call"), told apart by
`status`: a call that ran, a call refused before it ran (`maximum_tool_calls`,
`maximum_emitted_tokens`, `task_timeout_seconds`), and a call whose trial-tool
died before committing it (`abandoned`). The README documents each field.
"""

from __future__ import annotations

from typing import Any

RECORD_TYPE = "trial_tool_call"
RECORD_VERSION = 1

#: Statuses of calls refused before running.
REFUSED = ("maximum_tool_calls", "maximum_emitted_tokens", "task_timeout_seconds")


def _base(trial_id: str, sequence: int, command: list[str], status: str) -> dict[str, Any]:
    return {
        "record_type": RECORD_TYPE,
        "record_version": RECORD_VERSION,
        "trial_id": trial_id,
        "sequence": sequence,
        "command": command,
        "status": status,
    }


def _nothing_delivered(record: dict[str, Any], observed: int | None) -> dict[str, Any]:
    """The output fields of a record whose command delivered nothing."""
    record.update(
        complete_delivery=False,
        stdout_b64="",
        stderr_b64="",
        stdout_bytes=0,
        stderr_bytes=0,
        stdout_capture_truncated=False,
        stderr_capture_truncated=False,
        delivered_stdout_bytes=0,
        delivered_stderr_bytes=0,
        delivered_stdout_tokens=0,
        delivered_stderr_tokens=0,
        observed_stdout_tokens=observed,
        observed_stderr_tokens=observed,
        observed_emitted_tokens=observed,
        delivered_emitted_tokens=0,
        tokenizer=None,
        token_cost_censored=True,
        output_truncated=False,
        elapsed_seconds=0.0,
        allowance_tokens=0,
    )
    return record


def refusal(
    *,
    trial_id: str,
    sequence: int,
    command: list[str],
    status: str,
    reason: str,
    at_utc: str,
    wall_elapsed: float,
) -> dict[str, Any]:
    """A call refused before its command ran; it is not charged."""
    record = _nothing_delivered(_base(trial_id, sequence, command, status), 0)
    record.update(
        charged=False,
        error=reason,
        started_at_utc=at_utc,
        ended_at_utc=at_utc,
        wall_elapsed_seconds=wall_elapsed,
        return_code=None,
        command_exit_code=None,
        command_signal=None,
    )
    return record


def abandoned(
    *,
    trial_id: str,
    sequence: int,
    command: list[str],
    started_at_utc: str,
    at_utc: str,
    wall_elapsed: float,
    owner_pid: int,
) -> dict[str, Any]:
    """A call reserved by a trial-tool that died before committing it: charged, nothing delivered."""
    record = _nothing_delivered(_base(trial_id, sequence, command, "abandoned"), None)
    record.update(
        charged=True,
        error=f"trial-tool pid {owner_pid} died before recording this call",
        started_at_utc=started_at_utc,
        ended_at_utc=at_utc,
        wall_elapsed_seconds=wall_elapsed,
        return_code=None,
        command_exit_code=None,
        command_signal=None,
    )
    return record


def call(*, trial_id: str, sequence: int, command: list[str], status: str, **fields: Any) -> dict[str, Any]:
    """A call that ran (or tried to: not found, not executable); `fields` are the rest."""
    record = _base(trial_id, sequence, command, status)
    record["charged"] = True
    record.update(fields)
    return record


__all__ = ["RECORD_TYPE", "RECORD_VERSION", "REFUSED", "abandoned", "call", "refusal"]
