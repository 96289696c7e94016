"""`Budget`: what a trial has used and has left, as the harness and the agent are told it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .ledger.state import TrialState
    from .limits import Limits


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
        return self.calls_left <= 0 or self.tokens_left <= 0 or self.seconds_left <= 0

    def as_json(self) -> dict[str, Any]:
        return {**self._asdict(), "exhausted": self.exhausted}


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


__all__ = ["Budget", "fresh", "of"]
