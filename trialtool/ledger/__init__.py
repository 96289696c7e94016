"""The ledger: a trial's state document and audit log, and every change made to them.

`Ledger` (ledger.py) reserves and commits calls under a lock; store.py keeps
the state file and the log in step; the state document (state.py), the
chained log (audit.py) and the records' schema (records.py) are its data;
mending.py brings them back into step after a crash; verify.py re-checks a
whole trial from the reading side only. Nothing here imports a front door,
the process room, or `trial`.

This package is the room's face: what other rooms may use of it, loaded on
first use (the CLI loads the lock module before it forks a call's supervisor,
and must not pay for the rest then). Its other modules are its own.
"""

from __future__ import annotations

from .. import _lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import audit, clock, durable, liveness, records, snapshot, verify
    from .keys import key_from_environ, read_key_file
    from .ledger import Ledger
    from .locking import DEFAULT_LOCK_TIMEOUT
    from .records import GRADING, GRADING_ALLOWANCE, REFUSED, REPAIR, START, whole
    from .reservation import Reservation
    from .settings import Settings
    from .state import TrialState, decode

#: What other rooms may use, by the module of this room that holds it (a name that is its module's: the module).
_FACE = {
    "audit": "audit",
    "clock": "clock",
    "decode": "state",
    "DEFAULT_LOCK_TIMEOUT": "locking",
    "durable": "durable",
    "GRADING": "records",
    "GRADING_ALLOWANCE": "records",
    "key_from_environ": "keys",
    "Ledger": "ledger",
    "liveness": "liveness",
    "read_key_file": "keys",
    "records": "records",
    "REFUSED": "records",
    "REPAIR": "records",
    "Reservation": "reservation",
    "Settings": "settings",
    "snapshot": "snapshot",
    "START": "records",
    "TrialState": "state",
    "verify": "verify",
    "whole": "records",
}


def __getattr__(name: str) -> object:
    # Loaded on first use: the CLI imports one module of this room before it forks, and no more.
    return _lazy(__name__, _FACE, name)


__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "GRADING",
    "GRADING_ALLOWANCE",
    "REFUSED",
    "REPAIR",
    "START",
    "Ledger",
    "Reservation",
    "Settings",
    "TrialState",
    "audit",
    "clock",
    "decode",
    "durable",
    "key_from_environ",
    "liveness",
    "read_key_file",
    "records",
    "snapshot",
    "verify",
    "whole",
]
