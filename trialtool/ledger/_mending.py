"""Mending after a crash: what the ledger does when the files are not as a clean stop leaves them,
and when a call's trial-tool died with it in flight (`recover_abandoned`).

Pure decisions and small self-contained chores; the store does the writing,
under the ledger's lock. See _store.py for the shapes a crash can leave.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from ..errors import StateError
from ..osio import alive, process_token
from . import _audit as audit
from . import _clock as clock
from . import _durable as durable
from . import _records as records

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._state import TrialState
    from ._store import Store


def roll_forward(state: TrialState, line: bytes, chain: audit.Chain, log_path: str) -> dict[str, object]:
    """Apply to `state` the one record appended before a crash kept the state from being replaced."""
    head = state.log
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("prev_hash") != head.head:
        msg = f"log {log_path}: a record beyond the state is not chained to it; run `trial-tool verify`"
        raise StateError(msg)
    if record.get("trial_id") != state.trial_id:
        msg = f"log {log_path} holds a record of another trial: two trials share this log; run `trial-tool verify`"
        raise StateError(msg)
    after = records.apply(state.totals(), record)
    sequence = record.get("sequence")
    if after is not None and record.get("charged") is True and isinstance(sequence, int):
        # The call's reservation may have been lost too (a power loss before the file
        # system wrote the replaced state): its record charges it.
        state.calls = max(state.calls, sequence)
        state.in_flight.pop(sequence, None)
    if after is not None:
        state.emitted_tokens, state.refused_calls = after.emitted_tokens, after.refused_calls
        state.connections_allowed, state.connections_denied = after.connections_allowed, after.connections_denied
    if after is None or state.totals() != after or record.get("ledger_after") != after.as_json():
        msg = f"log {log_path}: the record beyond the state does not follow from it; run `trial-tool verify`"
        raise StateError(msg)
    state.log = audit.LogHead(head.records + 1, head.bytes + len(line) + 1, chain.digest(line), head.bytes)
    return record


def sweep_temporaries(path: str) -> None:
    """Remove temp files of writes of `path` (the state, a statement) cut short by a crash (their writer is dead)."""
    directory, name = os.path.split(path)
    directory = directory or "."
    prefix = f".{name}."
    try:
        names = [entry for entry in os.listdir(directory) if entry.startswith(prefix)]
    except OSError:
        return
    for entry in names:
        parts = entry[len(prefix) :].split(".")
        if len(parts) == 3 and parts[2] == "tmp" and parts[0].isdigit() and process_token(int(parts[0])) is None:
            try:
                os.unlink(os.path.join(directory, entry))
            except OSError:
                pass  # gone already, or not ours to remove


def recover_abandoned(
    store: Store, state: TrialState, abandoned: set[int], stop_leftovers: Callable[[int, str | None], int] | None
) -> None:
    """Close the calls in flight whose trial-tool died (or that this process gave up on, `abandoned`):
    charged, nothing delivered, allowance released, and what their commands left running stopped."""
    for sequence in sorted(state.in_flight):
        entry = state.in_flight[sequence]
        if sequence not in abandoned and alive(entry.pid, entry.pid_token):
            continue  # its owner is alive and still running it
        abandoned.discard(sequence)
        killed = 0
        if stop_leftovers is not None and isinstance(entry.supervisor, int):
            killed = stop_leftovers(entry.supervisor, entry.supervisor_token)
        record = records.abandoned(
            trial_id=state.trial_id,
            sequence=sequence,
            command=list(entry.command),
            started_at_utc=str(entry.started_at_utc),
            at_utc=clock.utc(time.time()),
            wall_elapsed=state.elapsed(),
            owner_pid=entry.pid,
        )
        record["processes_killed"] = killed
        if entry.request_id is not None:
            record["request_id"] = entry.request_id
        del state.in_flight[sequence]
        store.append(state, record)
        store.write(state)
        if not state.in_flight:
            durable.release_tail(store.log_path)


__all__ = ["recover_abandoned", "roll_forward", "sweep_temporaries"]
