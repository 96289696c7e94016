"""trialtool: run an agent's tool calls within a trial's exact budgets of calls, tokens and time.

The typed API is `Trial`, `CallRequest`, `Limits`, `CallResult`, `Budget`,
`TrialState` (what `Trial.init` and `Trial.status` return), `read_key_file`,
`read_signing_key` and `Attestation` (a signed trial's key, and its statement),
`toolreply` (what an agent reads back from a call, for a harness's own tools)
and the exception tree rooted in `TrialToolError`; `openai_tool` and `handle_tool_call` wire a
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

    from .doors import toolreply
    from .doors.containers import remove_container, sweep_command
    from .doors.openai_tools import ahandle_tool_call, handle_tool_call, openai_tool
    from .ledger import TrialState, read_key_file
    from .output import seed_tiktoken_cache
    from .signing import read_signing_key
    from .trial import Attestation, Trial
    from .types import Budget, CallRequest, CallResult, Limits, Ran

_LAZY = {
    "Budget": "types",
    "Limits": "types",
    "CallResult": "types",
    "CallRequest": "types",
    "Ran": "types",
    "read_key_file": "ledger",
    "TrialState": "ledger",
    "Trial": "trial",
    "Attestation": "trial",
    # A signed trial's key (`Trial(signing_key=...)`), read from its file.
    "read_signing_key": "signing",
    # Puts the bundled o200k_base file where tiktoken looks, for a harness that builds its own encoder.
    "seed_tiktoken_cache": "output",
    "openai_tool": "doors.openai_tools",
    "handle_tool_call": "doors.openai_tools",
    "ahandle_tool_call": "doors.openai_tools",
    # A module: what an agent reads back from a call, for a harness's own tools.
    "toolreply": "doors.toolreply",
    # A trial's container (--sandbox docker), removed when the harness is done with it.
    "remove_container": "doors.containers",
    "sweep_command": "doors.containers",
}


def _lazy(package: str, exports: dict[str, str], name: str) -> Any:
    """`name` of `package`'s exports, loaded on first use and kept: the package's `__getattr__` (PEP 562).

    `exports` gives each name's module, relative to the package; a name that is
    its module's own last part, less a private module's underscore, is that
    module (`verify`: the module ledger/_verify.py).
    """
    module = exports.get(name)
    if module is None:
        msg = f"module {package!r} has no attribute {name!r}"
        raise AttributeError(msg)
    import sys

    __import__(f"{package}.{module}")
    loaded = sys.modules[f"{package}.{module}"]
    value = loaded if module.rpartition(".")[2].lstrip("_") == name else getattr(loaded, name)
    setattr(sys.modules[package], name, value)
    return value


def __getattr__(name: str) -> Any:
    return _lazy(__name__, _LAZY, name)


__all__ = [
    "EXIT_INTERNAL",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "Attestation",
    "Budget",
    "BudgetExhausted",
    "CallRequest",
    "CallResult",
    "EncoderError",
    "Interrupted",
    "LimitMismatch",
    "Limits",
    "LockTimeout",
    "Ran",
    "StateError",
    "StorageError",
    "Trial",
    "TrialState",
    "TrialToolError",
    "UsageError",
    "__version__",
    "ahandle_tool_call",
    "handle_tool_call",
    "openai_tool",
    "read_key_file",
    "read_signing_key",
    "remove_container",
    "seed_tiktoken_cache",
    "sweep_command",
    "toolreply",
]
