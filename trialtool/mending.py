"""Mending after a crash: what the ledger does when the files are not as a clean stop leaves them.

Pure decisions and small self-contained chores; the ledger does the writing,
under its lock. See ledger.py for the three shapes a crash can leave.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import time
from typing import Any

from . import audit, clock, liveness, records, statefile
from .errors import StateError

#: Record type of a log repair (a torn line cut off).
REPAIR = "trial_tool_repair"


def repair_record(trial_id: str, torn: bytes) -> dict[str, Any]:
    """The record saying that a torn last line of `torn` bytes was cut off."""
    return {
        "record_type": REPAIR,
        "record_version": records.RECORD_VERSION,
        "trial_id": trial_id,
        "status": "log_repaired",
        "charged": False,
        "removed_bytes": len(torn),
        "removed_sha256": hashlib.sha256(torn).hexdigest(),
        "removed_b64": base64.b64encode(torn).decode("ascii"),
        "at_utc": clock.utc(time.time()),
    }


def roll_forward(state: dict[str, Any], line: bytes, chain: audit.Chain, log_path: str) -> dict[str, Any]:
    """Apply to `state` the one record appended before a crash kept the state from being replaced."""
    head: audit.LogHead = state["log"]
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("prev_hash") != head.head:
        msg = f"log {log_path}: a record beyond the state is not chained to it; run `trial-tool verify`"
        raise StateError(msg)
    if record.get("status") in records.REFUSED:
        state["refused_calls"] += 1
    elif record.get("charged"):
        sequence = record.get("sequence")
        if isinstance(sequence, int) and sequence > state["calls"]:
            # The call's reservation was lost too (a power loss before the file system
            # wrote the replaced state): its record charges it.
            state["calls"] = sequence
        state["in_flight"].pop(str(sequence), None)
        state["emitted_tokens"] += int(record.get("delivered_emitted_tokens") or 0)
    if record.get("ledger_after") != statefile.totals(state):
        msg = f"log {log_path}: the record beyond the state does not follow from it; run `trial-tool verify`"
        raise StateError(msg)
    state["log"] = audit.LogHead(head.records + 1, head.bytes + len(line) + 1, chain.digest(line), head.bytes)
    return record


def sweep_temporaries(state_path: str) -> None:
    """Remove temp files of state writes cut short by a crash (their writer is dead)."""
    directory, name = os.path.split(state_path)
    directory = directory or "."
    prefix = f".{name}."
    try:
        names = [entry for entry in os.listdir(directory) if entry.startswith(prefix)]
    except OSError:
        return
    for entry in names:
        parts = entry[len(prefix) :].split(".")
        if len(parts) == 3 and parts[2] == "tmp" and parts[0].isdigit() and liveness.token(int(parts[0])) is None:
            try:
                os.unlink(os.path.join(directory, entry))
            except OSError:
                pass  # gone already, or not ours to remove


def stop_leftovers(entry: dict[str, Any]) -> int:
    """Stop what an abandoned call left running; return how many processes were killed.

    The supervisor, if it lives on, is told to stop (its parent is gone, so it kills
    the tree and exits), and any cgroup it made is emptied.
    """
    supervisor = entry.get("supervisor")
    if not isinstance(supervisor, int):
        return 0
    if liveness.alive(supervisor, entry.get("supervisor_token")):
        try:
            os.kill(supervisor, signal.SIGTERM)
        except ProcessLookupError:
            pass
    from .cgroups import kill_leftovers

    return kill_leftovers(supervisor)


__all__ = ["REPAIR", "repair_record", "roll_forward", "stop_leftovers", "sweep_temporaries"]
