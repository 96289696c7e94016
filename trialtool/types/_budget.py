"""`Budget`: what a trial has used and has left, as the harness and the agent are told it; and the one rule
for when a budget is spent (`spent`, `refusal`), which the ledger, `Budget.exhausted` and the graders' view use."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..ledger import TrialState
    from ._limits import Limits


class Budget(NamedTuple):
    """A trial's budgets at one moment. Calls in flight count as used calls."""

    calls_used: int
    calls_left: int
    #: o200k_base tokens delivered so far, and what is left (allowances of calls in flight not deducted).
    tokens_used: int
    tokens_left: int
    seconds_used: float
    seconds_left: float
    #: Calls charged whose commands are still running (in this process or another).
    in_flight: int
    #: Calls refused so far.
    refused_calls: int
    #: The log's chain head as of this reading: `verify --expect-head` checks a log ends there.
    head: str = "0" * 64

    @property
    def exhausted(self) -> bool:
        """True when the next call would be refused (no calls, tokens or time left)."""
        return spent(self.calls_left, self.tokens_left, self.seconds_left) is not None

    @property
    def refusal_status(self) -> str | None:
        """The status a next call would be refused with (`maximum_tool_calls`, ...), or None while it would run."""
        name = spent(self.calls_left, self.tokens_left, self.seconds_left)
        return None if name is None else BUDGETS[name][0]

    def as_json(self) -> dict[str, object]:
        return {**self._asdict(), "exhausted": self.exhausted}


#: Each budget by the name `ended_by` gives it: the status of a call refused because it is spent, and its limit.
BUDGETS = {
    "calls": ("maximum_tool_calls", "max_calls"),
    "tokens": ("maximum_emitted_tokens", "max_tokens"),
    "time": ("task_timeout_seconds", "trial_timeout"),
}
#: The budget a refusal status names.
BUDGET_OF = {status: name for name, (status, _) in BUDGETS.items()}


def spent(calls_left: float, tokens_left: float, seconds_left: float) -> str | None:
    """The budget spent ("calls", "tokens", "time", asked in that order) from what is left of each, or None.

    A budget is spent when nothing of it is left: the next call is refused.
    """
    for name, left in (("calls", calls_left), ("tokens", tokens_left), ("time", seconds_left)):
        if left <= 0:
            return name
    return None


def refusal(limits: Limits, calls: int, tokens: int, seconds: float) -> tuple[str, str] | None:
    """(the refusal status, why) for a trial that has used `calls`, `tokens` and `seconds`, or None."""
    from ..osio import plain
    from ._limits import FLAG_OF

    name = spent(limits.max_calls - calls, limits.max_tokens - tokens, limits.trial_timeout - seconds)
    if name is None:
        return None
    status, limit = BUDGETS[name]
    why = {
        "calls": f"all {limits.max_calls} calls are spent",
        "tokens": f"all {limits.max_tokens} delivered tokens are spent",
        "time": f"the trial's {plain(limits.trial_timeout)} s are spent",
    }
    return status, f"{why[name]} ({FLAG_OF[limit]})"


def of(state: TrialState) -> Budget:
    """The budget of a state read under the ledger lock, with the trial's time brought up to now."""
    limits = state.limits
    elapsed = state.elapsed()
    return Budget(
        calls_used=state.calls,
        calls_left=max(0, int(limits.max_calls) - state.calls),
        tokens_used=state.emitted_tokens,
        tokens_left=max(0, int(limits.max_tokens) - state.emitted_tokens),
        seconds_used=round(elapsed, 6),
        seconds_left=round(max(0.0, limits.trial_timeout - elapsed), 6),
        in_flight=len(state.in_flight),
        refused_calls=state.refused_calls,
        head=state.log.head,
    )


def fresh(limits: Limits) -> Budget:
    """The budget of a trial not started yet."""
    return Budget(0, int(limits.max_calls), 0, int(limits.max_tokens), 0.0, float(limits.trial_timeout), 0, 0)


__all__ = ["BUDGETS", "BUDGET_OF", "Budget", "fresh", "of", "refusal", "spent"]
