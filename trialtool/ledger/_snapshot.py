"""A trial's state and log as they stood at one moment, read without the lock.

The graders' commands (`status`, `show`, `report`, `export`, `verify`) only
read: they never create, lock or change a trial's files, so that looking at a
trial cannot slow it down or leave a file behind. Without the lock, a call may
be committing while we read. The writers' order makes one moment easy to find:
a record is appended to the log before the state that counts it replaces the
old one (by rename, so a state is always read whole), and the log only grows.
So the state is read, then the log, then the state again: the same state
twice means the log read in between holds at least everything that state
counts. Anything after that is a commit under way, or what a crash left, and
`moving` says which of the two it may be.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from . import _durable as durable

#: Reads of state, log, state before the trial is called "moving" (a writer at work the whole time).
_ATTEMPTS = 5


class Snapshot(NamedTuple):
    """The state's bytes (None: no state file) and the log's bytes (b"": none), read at one moment."""

    state: bytes | None
    log: bytes
    #: The state changed under every attempt: the log may run ahead of it by a commit in progress.
    moving: bool = False


def read(state_path: str | os.PathLike[str], log_path: str | os.PathLike[str]) -> Snapshot:
    """The trial's files as they stood at one moment; StorageError if one cannot be read."""
    state_path, log_path = os.fspath(state_path), os.fspath(log_path)
    state = durable.read_bytes(state_path)
    for _ in range(_ATTEMPTS):
        log = durable.read_bytes(log_path) or b""
        again = durable.read_bytes(state_path)
        if again == state:
            return Snapshot(state, log)
        state = again
    return Snapshot(state, log, moving=True)


__all__ = ["Snapshot", "read"]
