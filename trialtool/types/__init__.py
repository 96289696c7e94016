"""The public types: a call's request and result, a trial's limits and its budget. Values, checked; no I/O.

Every other room speaks in these: a door builds a `CallRequest`, the ledger
pins `Limits` and reports a `Budget`, the Trial returns a `CallResult`. The
modules `limits` and `budget` are exported whole for their tables and rules
(`limits.from_state`, `budget.refusal`): one rule, read by the ledger, the
Trial and the graders' view alike.
"""

from __future__ import annotations

from . import _budget as budget
from . import _call as call
from . import _limits as limits
from ._budget import BUDGETS, Budget
from ._call import CallRequest, CallResult, Command, Interrupt, Ran, Runner, current_directory
from ._limits import BOUNDS, FLAG_OF, LATER_FIELDS, SANDBOX_SETTINGS, Limits

__all__ = [
    "BOUNDS",
    "BUDGETS",
    "FLAG_OF",
    "LATER_FIELDS",
    "SANDBOX_SETTINGS",
    "Budget",
    "CallRequest",
    "CallResult",
    "Command",
    "Interrupt",
    "Limits",
    "Ran",
    "Runner",
    "budget",
    "call",
    "current_directory",
    "limits",
]
