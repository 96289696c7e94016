"""The JSONL audit log: one canonical JSON object a line, each chained to the one before.

A record carries `prev_hash`, the digest of the previous line's bytes (without
its newline; 64 zeros for the first): SHA-256, or HMAC-SHA256 when the trial has
a key, so that without the key no one can rewrite the log consistently. The
state holds the count, size, digest and offset of the last line (`LogHead`), and
every call walks the chain to check that the log is the one the state was
written against.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import StateError
from . import _durable as durable

if TYPE_CHECKING:
    from ._records import Record

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

    def hasher(self) -> Any:
        """A fresh hashlib-style object (update, hexdigest) for this chain's digest."""
        if self.key is None:
            return hashlib.sha256()
        import hmac  # only keyed trials pay for it

        return hmac.new(self.key, digestmod=hashlib.sha256)

    def digest(self, data: bytes) -> str:
        hasher = self.hasher()
        hasher.update(data)
        return str(hasher.hexdigest())

    def matches(self, data: bytes, expected: str) -> bool:
        import hmac

        return hmac.compare_digest(self.digest(data), expected)


def encode(record: Mapping[str, object]) -> bytes:
    """The record as one canonical line: sorted keys, no spaces, ASCII only."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


#: Fields that may be megabytes of base64 (the captured streams): written in slices.
_SPLICED = ("stdout_b64", "stderr_b64")
_SLICE = 1 << 20


def encode_parts(record: Mapping[str, object]) -> Iterator[bytes]:
    """`encode(record)`, byte for byte, as a series of parts.

    The captured streams' base64 is sliced straight into the line rather than
    copied into one JSON string and then one bytes object, so that a call with
    large output never holds its line twice over (docs/performance.md). Base64
    needs no JSON escaping, so the slices are its text as it is.
    """
    big = {key: value for key in _SPLICED if isinstance(value := record.get(key), str) and len(value) > _SLICE}
    if not big:
        yield encode(record)
        return
    line = encode({**record, **{key: f"\0{key}" for key in big}})
    for key in sorted(big):
        before, _, line = line.partition(json.dumps(f"\0{key}").encode())
        yield before + b'"'
        value = big[key]
        for start in range(0, len(value), _SLICE):
            yield value[start : start + _SLICE].encode("ascii")
        line = b'"' + line
    yield line


def append(path: str, record: Record, head: LogHead, chain: Chain, *, claim: bool = False) -> LogHead:
    """Chain `record` onto `head`, append it durably, and return the new head.

    `claim`: the log's first record, written only if no one wrote one first (durable.append's `only_at`).
    """
    record["prev_hash"] = head.head
    hasher = chain.hasher()

    def parts() -> Iterator[bytes]:
        for part in encode_parts(record):
            hasher.update(part)
            yield part
        yield b"\n"

    size = durable.append(path, parts(), only_at=head.bytes if claim else None)
    return LogHead(head.records + 1, size, hasher.hexdigest(), head.bytes)


def find_request(path: str, request_id: str, upto: int) -> dict[str, object] | None:
    """The last record of the log's first `upto` bytes that names `request_id`, read from the end.

    For the rare moment a CLI outlives the server that ran its call (doors/userclient.py): the
    records a recovery appends are last, so the search is short however long the log is.
    """
    needle = json.dumps(request_id).encode()
    with open(path, "rb") as handle:
        end, rest = upto, b""
        while end > 0:
            start = max(0, end - (1 << 20))
            handle.seek(start)
            chunk = handle.read(end - start) + rest
            lines = chunk.split(b"\n")
            rest = lines.pop(0) if start > 0 else b""  # a line begun before this chunk: read with the next
            for line in reversed(lines):
                if needle in line:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and record.get("request_id") == request_id:
                        return record
            end = start
    return None


def states(line: bytes, trial_id: str, totals: Mapping[str, object]) -> bool:
    """Whether `line`, a record as `encode` wrote it, is `trial_id`'s and states `totals` as its `ledger_after`.

    Found in the bytes, not parsed: in a canonical line the key and its quotes can only be a key's
    (a quote inside a string is escaped), so this is the check of `check_against_log` in time linear
    in one line, whatever the record holds (megabytes of base64, say).
    """
    return (b',"ledger_after":' + encode(totals)) in line and (b',"trial_id":' + json.dumps(trial_id).encode()) in line


class Tail(NamedTuple):
    """What the log holds at and after the point the state knows."""

    #: The last record the state knows of (None for an empty log).
    last: dict[str, object] | None
    #: Bytes after what the state knows of: a crash between appending and replacing the state.
    extra: bytes


_PREV = b'"prev_hash":"'


def read_tail(path: str, head: LogHead, chain: Chain) -> Tail:
    """Walk the whole chain up to the state's head; return the last known record and anything beyond.

    Every line's `prev_hash` must be the digest of the line before, and the last
    must digest to the state's head: a line deleted, edited or moved anywhere, a
    log cut or swapped, all fail here (StateError). It reads the whole log, in
    time linear in its size (docs/performance.md): what it costs to refuse a
    doctored log on every call rather than only at `verify` time.
    """
    data = durable.read_bytes(path) or b""

    def broken(what: str) -> StateError:
        return StateError(f"log {path} {what}; the trial stops here: run `trial-tool verify`")

    if len(data) < head.bytes:
        raise broken(
            f"has {len(data)} bytes but the state expects {head.bytes} ({head.records} records): cut or replaced"
        )
    known, extra = data[: head.bytes], data[head.bytes :]
    if head.records == 0:
        if known:
            raise broken("has records the state does not know of")
        return Tail(None, extra)
    if not known.endswith(b"\n"):
        raise broken("does not end where the state says it does")
    digest = GENESIS
    count = 0
    start = 0
    while start < len(known):
        end = known.index(b"\n", start)
        line = known[start:end]
        at = line.find(_PREV)
        if at < 0 or line[at + len(_PREV) : at + len(_PREV) + 64].decode("ascii", "replace") != digest:
            raise broken(f"is broken at line {count + 1}: a line deleted, edited or moved")
        digest = chain.digest(line)
        count += 1
        start = end + 1
    if count != head.records or not chain.matches(known[head.last_offset : -1], head.head):
        raise broken("is not the log the state was written against")
    return Tail(json.loads(known[head.last_offset : -1]), extra)


__all__ = ["GENESIS", "Chain", "LogHead", "Tail", "append", "encode", "find_request", "read_tail", "states"]
