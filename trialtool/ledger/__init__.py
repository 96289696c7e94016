"""The ledger: a trial's state document and audit log, and every change made to them.

`Ledger` (_ledger.py) reserves and commits calls under a lock; _store.py keeps
the state file and the log in step; the state document (_state.py), the
chained log (_audit.py) and the records' schema (_records.py) are its data;
_mending.py brings them back into step after a crash; _verify.py re-checks a
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
    from . import _audit as audit
    from . import _clock as clock
    from . import _durable as durable
    from . import _records as records
    from . import _snapshot as snapshot
    from . import _verify as verify
    from ._attest import statement_path
    from ._keys import key_from_environ, read_key_file
    from ._ledger import Ledger
    from ._locking import DEFAULT_LOCK_TIMEOUT
    from ._records import GRADING, GRADING_ALLOWANCE, REFUSED, REPAIR, START, whole
    from ._reservation import Reservation
    from ._settings import Settings
    from ._state import TrialState, decode

#: What other rooms may use, by the module of this room that holds it (a name that is its module's: the module).
_FACE = {
    "audit": "_audit",
    "clock": "_clock",
    "decode": "_state",
    "DEFAULT_LOCK_TIMEOUT": "_locking",
    "durable": "_durable",
    "GRADING": "_records",
    "GRADING_ALLOWANCE": "_records",
    "key_from_environ": "_keys",
    "Ledger": "_ledger",
    "read_key_file": "_keys",
    "records": "_records",
    "REFUSED": "_records",
    "REPAIR": "_records",
    "Reservation": "_reservation",
    "Settings": "_settings",
    "snapshot": "_snapshot",
    "statement_path": "_attest",
    "START": "_records",
    "TrialState": "_state",
    "verify": "_verify",
    "whole": "_records",
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
    "read_key_file",
    "records",
    "snapshot",
    "statement_path",
    "verify",
    "whole",
]
