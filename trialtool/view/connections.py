"""A trial's connections through the egress proxy (network "allow"): as `show --call` lists them, and as
export's table of their own.

A call's record carries its connections in `network`: the first of each kind
listed (host, port, address, and what happened), and the exact counts. The
table has a row for each listed connection, keyed by (`trial_id`, `record`,
`kind`, `index`); how many were counted but not listed is in the calls table
(`connections_allowed`, `connections_denied` against the rows here).
"""

from __future__ import annotations

from ..errors import TrialToolError
from ..ledger import START
from .calls import mapping, typed
from .render import visible

#: The connections table's columns, with their kinds (docs/graders.md).
SCHEMA = (
    ("trial_id", "text"),
    ("record", "int"),
    ("sequence", "int"),
    ("kind", "text"),
    ("index", "int"),
    ("host", "text"),
    ("port", "int"),
    ("address", "text"),
    ("via", "text"),
    ("rule", "text"),
    ("error", "text"),
    ("sent", "int"),
    ("received", "int"),
    ("seconds", "float"),
    ("at", "float"),
    ("state", "text"),
)
#: The kinds of connection a record lists, in the order a call's rows come.
KINDS = ("allowed", "denied")


def lines(network: dict[str, object]) -> list[str]:
    """A call's connections, one line each, as `show --call` lists them (what the command named, made visible)."""
    allowed, denied = _listed(network, "allowed"), _listed(network, "denied")
    counts = (network.get("allowed_count", len(allowed)), network.get("denied_count", len(denied)))
    sent, received = network.get("bytes_sent", 0), network.get("bytes_received", 0)
    found = [f"--- network: {counts[0]} allowed, {counts[1]} denied ({sent} bytes sent, {received} received) ---"]
    for entry in allowed:
        where = f"{entry.get('host')}:{entry.get('port')} {entry.get('address') or '-'} via {entry.get('via')}"
        done = f"{entry.get('sent')} sent, {entry.get('received')} received, {entry.get('seconds')} s"
        error = f", {entry['error']}" if entry.get("error") else ""
        found.append(f"allowed {where}, {done}{error}, at {entry.get('at')} s")
    for entry in denied:
        address = f" ({entry['address']})" if entry.get("address") else ""
        where = f"{entry.get('host') or '?'}:{entry.get('port')}{address} {entry.get('rule')} via {entry.get('via')}"
        found.append(f"denied {where}, at {entry.get('at')} s")
    for kind, count, listed in (("allowed", counts[0], allowed), ("denied", counts[1], denied)):
        if isinstance(count, int) and count > len(listed):
            found.append(f"... and {count - len(listed)} more {kind}, counted but not listed")
    return [visible(line) for line in found]


def _listed(network: dict[str, object], kind: str) -> list[dict[str, object]]:
    entries = network.get(kind)
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def rows(job: tuple[str, str, bool]) -> list[dict[str, object]]:
    """Every listed connection of one trial's calls, as rows of SCHEMA (an unreadable trial has none)."""
    from ..ledger import snapshot
    from .summary import records_of

    state_path, log_path, _ = job
    try:
        taken = snapshot.read(state_path, log_path)
    except TrialToolError:
        return []
    found = []
    for record in records_of(taken.log):
        network = mapping(record.get("network"))
        if record.get("record_type") == START or not network:
            continue
        call = {"trial_id": record.get("trial_id"), "record": record.get("record"), "sequence": record.get("sequence")}
        for kind in KINDS:
            for index, entry in enumerate(_listed(network, kind)):
                values = {**entry, **call, "kind": kind, "index": index, "state": state_path}
                found.append({name: typed(kind_of, values.get(name)) for name, kind_of in SCHEMA})
    return found


__all__ = ["KINDS", "SCHEMA", "lines", "rows"]
