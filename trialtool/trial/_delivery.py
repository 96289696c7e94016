"""What a call that ran delivers and records: its captured bytes decoded, clipped to the allowance, audited.

`settle` judges a call that ran (trial/_verdict.py) and delivers it; `deliver` turns
the command's `Outcome` into the text the agent reads and the audit record a
grader reads, given the verdict and the call's reservation; `failed` is the
record of a call trial-tool itself could not run. Nothing here reads a file
or takes a lock; the ledger commits the record.
"""

from __future__ import annotations

import binascii
import hashlib
import time
from typing import TYPE_CHECKING, NamedTuple

from ..errors import EXIT_NOT_FOUND
from ..ledger import clock, records
from ..output import clipping, tokens
from . import _verdict as verdict
from ._verdict import after_delivery

if TYPE_CHECKING:
    from ..ledger import Reservation
    from ..process import Outcome
    from ..types import CallRequest, Interrupt, Ran


class Delivery(NamedTuple):
    """The delivered streams and the call's audit record (not yet bound to the log)."""

    stdout: clipping.StreamDelivery
    stderr: clipping.StreamDelivery
    status: str
    record: records.CallRecord


def _base64(data: bytes) -> str:
    """Base64 of `data`, built window by window into one string.

    `text +=` on a string nothing else refers to grows it in place (CPython), so
    a large stream's base64 never exists twice (as bytes and as text) at once.
    Windows are a multiple of 3 bytes long: they encode to the same text as the whole.
    """
    text = ""
    view = memoryview(data)
    step = 3 << 20
    for start in range(0, len(data), step):
        text += binascii.b2a_base64(view[start : start + step], newline=False).decode("ascii")
    return text


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def deliver(
    outcome: Outcome,
    reservation: Reservation,
    argv: list[str],
    verdict: tuple[str, int, str],
    rank_path: str,
    started_wall: float,
    *,
    withheld: bool = False,
    call_fields: records.Given | None = None,
    reply: str = "text",
) -> Delivery:
    """Clip the outcome's streams (and trial-tool's notice) to the allowance; the record of it all.

    `withheld`: the caller gave up on the call, so nothing is delivered and no
    token charged; what the command printed is still counted (`observed_*`).
    `call_fields` are what the call was given besides its command (records.input_fields).
    `reply` "json-rpc": stdout is a program's reply, clipped inside (clipping.fit_reply).
    """
    status, exit_code, notice = verdict
    limits = reservation.limits
    stdout_cut = outcome.stdout_bytes > limits.max_capture_bytes
    stderr_cut = outcome.stderr_bytes > limits.max_capture_bytes
    if notice and outcome.stderr and not outcome.stderr.endswith(b"\n"):
        # The notice starts a line of its own; a newline the agent pays for only where one is missing.
        notice = "\n" + notice
    if outcome.stdout or outcome.stderr or notice:
        encoder = tokens.verified(rank_path).encoder()
        # The captured bytes, not decoded text: clipping decodes them window by window, replacing
        # a command's own invalid bytes with U+FFFD and dropping half a character our cap cut off.
        stdout = clipping.Captured(outcome.stdout, stdout_cut)
        stderr = clipping.Captured(outcome.stderr, stderr_cut)
        out, err = clipping.fit_reply(encoder, stdout, stderr, reservation.allowance, limits.clip, notice, reply)
    else:
        # Nothing printed: nothing to count, and the encoder is never built.
        out = err = clipping.StreamDelivery("", 0, 0, False)
    if withheld:
        out = out._replace(text="", tokens=0, clipped=False)
        err = err._replace(text="", tokens=0, clipped=False)
    clipped = out.clipped or err.clipped
    status = after_delivery(status, clipped)
    ran_to_end = outcome.report.ended == "exited"
    # One field a line, in the order docs/records.md lists them: a long literal, not logic.
    record = records.call(
        trial_id=reservation.trial_id,
        sequence=reservation.sequence,
        command=argv,
        status=status,
        complete_delivery=ran_to_end and not (clipped or stdout_cut or stderr_cut or withheld),
        stdout_b64=_base64(outcome.stdout),
        stderr_b64=_base64(outcome.stderr),
        stdout_bytes=outcome.stdout_bytes,
        stderr_bytes=outcome.stderr_bytes,
        stdout_sha256=outcome.stdout_sha256,
        stderr_sha256=outcome.stderr_sha256,
        stdout_capture_truncated=stdout_cut,
        stderr_capture_truncated=stderr_cut,
        delivered_stdout_bytes=len(out.text.encode("utf-8")),
        delivered_stderr_bytes=len(err.text.encode("utf-8")),
        delivered_stdout_sha256=_sha256(out.text),
        delivered_stderr_sha256=_sha256(err.text),
        observed_stdout_tokens=out.observed_tokens,
        observed_stderr_tokens=err.observed_tokens,
        observed_emitted_tokens=out.observed_tokens + err.observed_tokens,
        delivered_stdout_tokens=out.tokens,
        delivered_stderr_tokens=err.tokens,
        delivered_emitted_tokens=out.tokens + err.tokens,
        allowance_tokens=reservation.allowance,
        clip=limits.clip,
        tokenizer=tokens.ENCODING_NAME,
        token_cost_censored=not ran_to_end or stdout_cut or stderr_cut,
        output_truncated=clipped,
        trial_tool_notice=notice or None,
        elapsed_seconds=outcome.report.elapsed,
        started_at_utc=clock.utc(started_wall),
        ended_at_utc=clock.utc(time.time()),
        deadline_seconds=reservation.run_seconds,
        deadline_kind=reservation.deadline_kind,
        ended=outcome.report.ended,
        command_exit_code=outcome.exit_code,
        command_signal=outcome.signal,
        return_code=exit_code,
        error=outcome.report.error,
        stop_signal=outcome.report.stop_signal,
        deadline_overshoot_seconds=outcome.report.deadline_overshoot,
        exited_after_deadline_seconds=outcome.report.exited_after_deadline,
        processes_killed=outcome.report.killed,
        processes_surviving=list(outcome.report.survivors),
        peak_rss_bytes=outcome.report.peak_rss,
        peak_rss_scope=outcome.report.peak_rss_scope,
        cpu_user_seconds=outcome.report.cpu_user,
        cpu_system_seconds=outcome.report.cpu_system,
        containment=outcome.report.containment,
        **(call_fields or {}),
    )
    if outcome.report.network is not None:
        record["network"] = outcome.report.network
    if withheld:
        record["withheld"] = True
    if reply != "text":
        record["reply"] = reply
    return Delivery(out, err, status, record)


def settle(
    outcome: Outcome,
    reservation: Reservation,
    request: CallRequest,
    interrupt: Interrupt | None,
    rank_path: str,
    started_wall: float,
    sandboxed: bool,
    *,
    withheld: bool = False,
) -> tuple[Delivery, int]:
    """A call that ran, judged and delivered: what the agent gets and the record; and the call's exit code.

    `withheld`: the caller went away before it had the output (as an interrupt without `delivers` says).
    """
    import os

    argv = list(request.argv)
    status, code, notice = verdict.judge(
        outcome,
        reservation.limits,
        argv,
        run_seconds=reservation.run_seconds,
        deadline_kind=reservation.deadline_kind,
        interrupt=interrupt,
    )
    if sandboxed and code == EXIT_NOT_FOUND:
        # Not found in the sandbox, but there on the host, where the sandbox shows something else.
        notice += verdict.hidden_path_notice(argv, outcome.stderr, os.path.exists)
    # A caller that gave up on the call (a cancelled task or request) receives nothing: nothing is charged.
    # An interrupt of the caller's own making, without `delivers`, is taken to deliver.
    withheld = withheld or (
        interrupt is not None and interrupt.signum is not None and not getattr(interrupt, "delivers", True)
    )
    delivered = deliver(
        outcome,
        reservation,
        argv,
        (status, code, notice),
        rank_path,
        started_wall,
        withheld=withheld,
        call_fields=_call_fields(request),
        reply=request.reply,
    )
    return delivered, code


def outcome_of(ran: Ran, elapsed: float, cap: int) -> Outcome:
    """A command run elsewhere (`Trial.acall_elsewhere`) as an `Outcome`: its streams kept to `cap` bytes each."""
    from ..process import Outcome, Report

    out, err = ran.stdout, ran.stderr
    code = ran.exit_code if ran.ended == "exited" else None
    streams = ((len(out), hashlib.sha256(out).hexdigest()), (len(err), hashlib.sha256(err).hexdigest()))
    return Outcome(out[:cap], err[:cap], Report(ran.ended, code, elapsed, streams=streams))


def failed(reservation: Reservation, request: CallRequest, started_wall: float, error: str) -> records.CallRecord:
    """The record of a call that trial-tool itself failed to run (it stays charged)."""
    return records.failed(
        trial_id=reservation.trial_id,
        sequence=reservation.sequence,
        command=list(request.argv),
        error=error,
        started_at_utc=clock.utc(started_wall),
        at_utc=clock.utc(time.time()),
        allowance=reservation.allowance,
        given=_call_fields(request),
    )


def _call_fields(request: CallRequest) -> records.Given:
    """What a call's record says of it besides its command (records.input_fields), and the caller's name for it."""
    fields = records.input_fields(request.stdin, request.merge_output)
    if request.request_id is not None:
        fields["request_id"] = request.request_id
    return fields


__all__ = ["Delivery", "deliver", "failed", "settle"]
