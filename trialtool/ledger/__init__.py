"""The ledger: a trial's state document and audit log, and every change made to them.

`Ledger` (ledger.py) reserves and commits calls under a lock; store.py keeps
the state file and the log in step; the state document (state.py), the
chained log (audit.py) and the records' schema (records.py) are its data;
mending.py brings them back into step after a crash; verify.py re-checks a
whole trial from the reading side only. Nothing here imports a front door,
the process room, or `trial`.

This package imports nothing itself: the CLI loads the lock module before it
forks a call's supervisor, and must not pay for the rest then.
"""
