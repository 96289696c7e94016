"""The JSONL audit log: one canonical JSON object a line, each chained to the one before.

A record carries `prev_hash`, the SHA-256 of the previous line's bytes (without
its newline; 64 zeros for the first). The state holds the count, size and hash
of the last line, so a log edited, cut or swapped under a state is noticed.
Appends go through `fsio.append`, which fsyncs, under the ledger lock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from . import fsio
from .errors import StateError

GENESIS = "0" * 64


class LogHead(NamedTuple):
    """Where the log stands: what the state records about it."""

    records: int = 0
    bytes: int = 0
    head: str = GENESIS


def encode(record: dict[str, Any]) -> bytes:
    """The record as one canonical line: sorted keys, no spaces, ASCII only."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def append(path: Path, record: dict[str, Any], head: LogHead) -> LogHead:
    """Chain `record` onto `head`, append it durably, and return the new head."""
    record["prev_hash"] = head.head
    line = encode(record)
    size = fsio.append(path, line + b"\n")
    return LogHead(head.records + 1, size, hashlib.sha256(line).hexdigest())


def check_size(path: Path, head: LogHead) -> None:
    """Refuse to go on when the log's size is not the size the state recorded."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    except OSError as exc:
        msg = f"cannot stat log {path}: {exc.strerror or exc}"
        raise StateError(msg) from exc
    if size != head.bytes:
        msg = (
            f"log {path} has {size} bytes but the state expects {head.bytes} "
            f"({head.records} records): the two are out of step; run `trial-tool verify`"
        )
        raise StateError(msg)


def read(path: Path) -> Iterator[tuple[int, bytes, dict[str, Any] | None]]:
    """Each line of the log as (1-based line number, raw bytes, parsed object or None)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.rstrip(b"\n")
            try:
                value = json.loads(line)
            except ValueError:
                value = None
            yield number, raw, value if isinstance(value, dict) else None


__all__ = ["GENESIS", "LogHead", "append", "check_size", "encode", "read"]
