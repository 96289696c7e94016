"""trialtool: run an agent's tool calls within a trial's exact budgets of calls, tokens and time.

The typed API is `Trial`, `CallRequest`, `Limits`, `CallResult`, `Budget`,
`read_key_file` and the exception tree rooted in `TrialToolError`; `openai_tool` and `handle_tool_call` wire a
trial into OpenAI-style function calling. Importing the package has no side
effects and imports neither tiktoken nor psutil.
"""

from __future__ import annotations

# The exception tree is loaded at once (errors.py imports nothing); the rest on
# first use (PEP 562), so that `trial-tool` can fork the call's supervisor before
# it imports the rest of the package. Not typing.TYPE_CHECKING: importing typing
# here would be an import that fork waits for (docs/performance.md).
from ._version import __version__
from .errors import (
    EXIT_INTERNAL,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    BudgetExhausted,
    EncoderError,
    Interrupted,
    LimitMismatch,
    LockTimeout,
    StateError,
    StorageError,
    TrialToolError,
    UsageError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .budget import Budget
    from .call import CallRequest, CallResult
    from .doors.openai_tools import ahandle_tool_call, handle_tool_call, openai_tool
    from .ledger.keys import read_key_file
    from .limits import Limits
    from .trial import Trial

_LAZY = {
    "Budget": "budget",
    "Limits": "limits",
    "CallResult": "call",
    "CallRequest": "call",
    "read_key_file": "ledger.keys",
    "Trial": "trial",
    "openai_tool": "doors.openai_tools",
    "handle_tool_call": "doors.openai_tools",
    "ahandle_tool_call": "doors.openai_tools",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'trialtool' has no attribute {name!r}"
        raise AttributeError(msg)
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "EXIT_INTERNAL",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "Budget",
    "BudgetExhausted",
    "CallRequest",
    "CallResult",
    "EncoderError",
    "Interrupted",
    "LimitMismatch",
    "Limits",
    "LockTimeout",
    "StateError",
    "StorageError",
    "Trial",
    "TrialToolError",
    "UsageError",
    "__version__",
    "ahandle_tool_call",
    "handle_tool_call",
    "openai_tool",
    "read_key_file",
]
