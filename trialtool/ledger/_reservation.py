"""`Reservation`: a call charged and ready to run; and its deadline, set here and nowhere else."""

from __future__ import annotations

import time
from typing import NamedTuple

from ..osio import process_token
from ..types import Limits
from . import _clock as clock
from ._records import GRADING_ALLOWANCE
from ._state import InFlight, TrialState


class Reservation(NamedTuple):
    """A charged call, ready to run."""

    trial_id: str
    sequence: int
    #: Tokens this call may deliver.
    allowance: int
    #: Seconds the command may run, and which limit set it ("call", "trial" or "request").
    run_seconds: float
    deadline_kind: str
    limits: Limits
    #: Trial seconds elapsed when the call was reserved.
    trial_elapsed: float
    started_at: float
    #: The harness's final act (CallRequest.final), run once the budget was spent: recorded as grading.
    final: bool = False


def deadline(limits: Limits, trial_left: float | None, timeout: float | None) -> tuple[float, str]:
    """How long the command may run, and which limit says so: the trial's call timeout, what is left of
    the trial's time (`trial_left`; None for a grading command, whose time is not the agent's), or the
    call's own shorter `timeout`."""
    seconds, kind = limits.call_timeout, "call"
    if trial_left is not None and trial_left < seconds:
        seconds, kind = trial_left, "trial"
    if timeout is not None and timeout < seconds:
        seconds, kind = float(timeout), "request"
    return seconds, kind


def charge(
    state: TrialState,
    command: list[str],
    allowance: int,
    owner: tuple[int, str | None],
    supervisor: int | None,
    timeout: float | None,
    request_id: str | None = None,
) -> Reservation:
    """Charge the next call in `state` (not yet written): counted, in flight, with its deadline."""
    limits = state.limits
    run_seconds, deadline_kind = deadline(limits, limits.trial_timeout - state.elapsed_seconds, timeout)
    now = time.time()
    sequence = state.calls + 1
    state.calls = sequence
    state.in_flight[sequence] = InFlight(
        pid=owner[0],
        pid_token=owner[1],
        supervisor=supervisor,
        supervisor_token=process_token(supervisor) if supervisor else None,
        allowance=allowance,
        command=command,
        started_at_utc=clock.utc(now),
        request_id=request_id,
    )
    return Reservation(
        state.trial_id, sequence, allowance, run_seconds, deadline_kind, limits, state.elapsed_seconds, now
    )


def grading(state: TrialState, timeout: float | None, *, final: bool = False) -> Reservation:
    """A grading command's reservation: sequence 0, nothing counted, the call timeout its deadline.

    Its output is the harness's, delivered whole (GRADING_ALLOWANCE): a harness never hands it
    to the agent. `final` marks the harness's final act (Ledger.reserve).
    """
    run_seconds, deadline_kind = deadline(state.limits, None, timeout)
    now = time.time()
    return Reservation(
        state.trial_id, 0, GRADING_ALLOWANCE, run_seconds, deadline_kind, state.limits, state.elapsed(), now, final
    )


__all__ = ["Reservation", "charge", "deadline", "grading"]
