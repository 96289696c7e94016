"""trialtool: run an agent's tool calls within a trial's exact budgets of calls, tokens and time.

The typed API is `Trial`, `Limits`, `CallResult` and the exception tree rooted
in `TrialToolError`. Importing the package has no side effects and imports
neither tiktoken nor psutil.
"""

from __future__ import annotations

from .errors import (
    EXIT_INTERNAL,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    BudgetExhausted,
    EncoderError,
    LimitMismatch,
    LockTimeout,
    StateError,
    StorageError,
    TrialExists,
    TrialToolError,
    UsageError,
)
from .limits import Limits
from .trial import CallResult, Trial

__version__ = "0.1.0"

__all__ = [
    "EXIT_INTERNAL",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "BudgetExhausted",
    "CallResult",
    "EncoderError",
    "LimitMismatch",
    "Limits",
    "LockTimeout",
    "StateError",
    "StorageError",
    "Trial",
    "TrialExists",
    "TrialToolError",
    "UsageError",
    "__version__",
]
