"""The ledger: a trial's state document and audit log, and every change made to them.

`Ledger` reserves and commits calls under a lock (ledger.py); the state
document (state.py), the chained log (audit.py) and the records' schema
(records.py) are its data; mending.py brings them back into step after a
crash; verify.py re-checks a whole trial from the reading side only.
Nothing here imports a front door, the process room, or `trial`.

Names are loaded on first use (PEP 562): the CLI imports the lock module
before it forks a call's supervisor, and must not pay for the rest then.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .ledger import Ledger, Reservation
    from .state import TrialState

_LAZY = {"Ledger": "ledger", "Reservation": "ledger", "TrialState": "state"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["Ledger", "Reservation", "TrialState"]
