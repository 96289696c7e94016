"""One rule for a spent budget: the ledger's refusal, `Budget.exhausted` and the graders' `ended_by` agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trialtool import Limits
from trialtool.ledger._records import REFUSED
from trialtool.types import budget


@given(
    max_calls=st.integers(1, 50),
    max_tokens=st.integers(1, 10_000),
    trial_timeout=st.floats(0.5, 1000),
    calls=st.integers(0, 60),
    tokens=st.integers(0, 12_000),
    seconds=st.floats(0, 1200),
)
def test_a_refusal_and_exhausted_are_one_rule(
    max_calls: int, max_tokens: int, trial_timeout: float, calls: int, tokens: int, seconds: float
) -> None:
    limits = Limits(max_calls=max_calls, max_tokens=max_tokens, trial_timeout=trial_timeout)
    refused = budget.refusal(limits, calls, tokens, seconds)
    seen = budget.Budget(
        calls_used=calls,
        calls_left=max(0, max_calls - calls),
        tokens_used=tokens,
        tokens_left=max(0, max_tokens - tokens),
        seconds_used=seconds,
        seconds_left=max(0.0, trial_timeout - seconds),
        in_flight=0,
        refused_calls=0,
    )
    assert (refused is not None) == seen.exhausted
    expected = (
        "calls"
        if calls >= max_calls
        else "tokens"
        if tokens >= max_tokens
        else "time"
        if seconds >= trial_timeout
        else None
    )
    assert (None if refused is None else budget.BUDGET_OF[refused[0]]) == expected
    if refused is not None:
        assert refused[0] in REFUSED and refused[1].endswith(")")  # names the flag
