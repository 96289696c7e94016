"""The JSONL audit log: one canonical JSON object a line, each chained to the one before.

A record carries `prev_hash`, the digest of the previous line's bytes (without
its newline; 64 zeros for the first): SHA-256, or HMAC-SHA256 when the trial has
a key, so that without the key no one can rewrite the log consistently. The
state holds the count, size, digest and offset of the last line (`LogHead`), so
every call can check, by reading one line, that the log is the one the state
was written against.
"""

from __future__ import annotations

import hashlib
import json
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
    #: Byte offset where the last line starts.
    last_offset: int = 0


class Chain:
    """How lines are digested: SHA-256, or HMAC-SHA256 under the trial's key."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key

    @property
    def name(self) -> str:
        return "hmac-sha256" if self.key else "sha256"

    def digest(self, data: bytes) -> str:
        if self.key is None:
            return hashlib.sha256(data).hexdigest()
        import hmac  # only keyed trials pay for it

        return hmac.new(self.key, data, hashlib.sha256).hexdigest()

    def matches(self, data: bytes, expected: str) -> bool:
        import hmac

        return hmac.compare_digest(self.digest(data), expected)


def encode(record: dict[str, Any]) -> bytes:
    """The record as one canonical line: sorted keys, no spaces, ASCII only."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def append(path: Path, record: dict[str, Any], head: LogHead, chain: Chain) -> LogHead:
    """Chain `record` onto `head`, append it durably, and return the new head."""
    record["prev_hash"] = head.head
    line = encode(record)
    size = fsio.append(path, line + b"\n")
    return LogHead(head.records + 1, size, chain.digest(line), head.bytes)


class Tail(NamedTuple):
    """What the log holds at and after the point the state knows."""

    #: The last record the state knows of (None for an empty log).
    last: dict[str, Any] | None
    #: Bytes after what the state knows of: a crash between appending and replacing the state.
    extra: bytes


def read_tail(path: Path, head: LogHead, chain: Chain) -> Tail:
    """Check the last known line against the state's head; return it and anything beyond.

    StateError when the log is shorter than the state says (cut or rolled back) or
    its last known line is not the one the state was written against.
    """
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, 2)
            if size < head.bytes:
                msg = (
                    f"log {path} has {size} bytes but the state expects {head.bytes} ({head.records} records): "
                    "the log was cut or replaced; run `trial-tool verify`"
                )
                raise StateError(msg)
            handle.seek(head.last_offset)
            known = handle.read(head.bytes - head.last_offset)
            extra = handle.read()
    except FileNotFoundError:
        if head.bytes:
            msg = f"log {path} is missing but the state expects {head.records} records; run `trial-tool verify`"
            raise StateError(msg) from None
        return Tail(None, b"")
    except OSError as exc:
        msg = f"cannot read log {path}: {exc.strerror or exc}"
        raise StateError(msg) from exc
    if head.records == 0:
        return Tail(None, extra)
    line = known[:-1]
    if not known.endswith(b"\n") or b"\n" in line or not chain.matches(line, head.head):
        msg = f"log {path}: its last record is not the one the state was written against; run `trial-tool verify`"
        raise StateError(msg)
    return Tail(json.loads(line), extra)


def lines(path: Path) -> list[bytes]:
    """Every line of the log, newline included on all but perhaps a torn last one."""
    try:
        with open(path, "rb") as handle:
            return handle.readlines()
    except FileNotFoundError:
        return []


__all__ = ["GENESIS", "Chain", "LogHead", "Tail", "append", "encode", "lines", "read_tail"]
