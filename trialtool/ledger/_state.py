"""The state document (`TrialState`): its schema, validation, encoding, and its agreement with the log.

With a key, the state carries `mac`, an HMAC-SHA256 over its canonical JSON,
so that its counters cannot be edited without the key. Without one, a state
edited by hand is still caught by `check_against_log`: every record carries the
ledger's totals after it (`ledger_after`), and the state's counters must match
those of the last record. docs/state.md documents each key.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import StateError
from ..osio import plain
from ..sandbox import UNSANDBOXED, Sandbox
from ..sandbox import from_state as sandbox_from_state
from ..types import Limits
from ..types import limits as limit_rules
from . import _audit as audit
from . import _clock as clock
from ._records import Totals

SCHEMA = "trialtool.state"
VERSION = 1


class InFlight(NamedTuple):
    """A call charged and not yet recorded: who runs it, and what it may still deliver."""

    #: The trial-tool process that reserved it, and its liveness token (pid reuse).
    pid: int
    pid_token: str | None
    #: Tokens this call may deliver, held back from other calls meanwhile.
    allowance: int
    #: The call's supervisor, so that a recovery can stop what it left running.
    supervisor: int | None = None
    supervisor_token: str | None = None
    command: tuple[str, ...] | list[str] = ()
    started_at_utc: str | None = None
    #: The caller's name for the call (CallRequest.request_id), carried to its abandoned record.
    request_id: str | None = None


class TrialState:
    """One trial's state: pinned limits, counters, calls in flight, and where the log stands.

    Counters are changed only by the ledger, under its lock; the derived values
    (elapsed time, totals) are methods, never stored twice.
    """

    __slots__ = (
        "calls",
        "chain",
        "checkpoint",
        "checkpoint_every",
        "clock",
        "connections_allowed",
        "connections_denied",
        "elapsed_seconds",
        "emitted_tokens",
        "final_used",
        "in_flight",
        "labels",
        "limits",
        "log",
        "log_path",
        "log_stamp",
        "rank_file",
        "refused_calls",
        "sandbox",
        "signer",
        "started_at",
        "started_at_utc",
        "statement",
        "trial_id",
    )

    def __init__(
        self,
        *,
        trial_id: str,
        chain: str,
        limits: Limits,
        started_at: float,
        started_at_utc: str,
        clock: dict[str, Any],
        calls: int = 0,
        refused_calls: int = 0,
        emitted_tokens: int = 0,
        elapsed_seconds: float = 0.0,
        in_flight: dict[int, InFlight] | None = None,
        log: audit.LogHead | None = None,
        rank_file: dict[str, Any] | None = None,
        sandbox: Sandbox = UNSANDBOXED,
        labels: dict[str, str] | None = None,
        log_path: str | None = None,
        connections_allowed: int = 0,
        connections_denied: int = 0,
        final_used: bool = False,
        log_stamp: list[int] | None = None,
        signer: str | None = None,
        checkpoint_every: int = 1,
        checkpoint: dict[str, Any] | None = None,
        statement: dict[str, Any] | None = None,
    ) -> None:
        self.trial_id = trial_id
        #: How the log is chained and the state sealed: "sha256", or "hmac-sha256" with a key.
        self.chain = chain
        self.limits = limits
        #: Calls charged, in flight ones included; refused calls are not charged.
        self.calls = calls
        self.refused_calls = refused_calls
        #: o200k_base tokens delivered to the agent over the trial.
        self.emitted_tokens = emitted_tokens
        #: Wall-clock time of creation (for another boot), and the boot clock's reading then.
        self.started_at = started_at
        self.started_at_utc = started_at_utc
        self.clock = clock
        #: The largest trial time recorded so far: the trial's time never runs backwards.
        self.elapsed_seconds = elapsed_seconds
        self.in_flight: dict[int, InFlight] = {} if in_flight is None else in_flight
        self.log = audit.LogHead() if log is None else log
        #: What stat said of the log when this state was written (durable.stamp), under the lock:
        #: a call that finds the log so need not read it (docs/integrity.md, "What each call checks").
        self.log_stamp = log_stamp
        #: The rank file verified for this trial and its stamp, so it is not hashed on every call.
        self.rank_file = rank_file
        #: The sandbox pinned at creation (none for a trial older than sandboxes).
        self.sandbox = sandbox
        #: Who the trial is (_labels.py, beside this module): pinned at creation, never read back to decide anything.
        self.labels: dict[str, str] = {} if labels is None else labels
        #: The log's absolute path when the trial was created: where `report` looks first for it
        #: (it pairs a state with a log by trial id; the files may have moved since).
        self.log_path = log_path
        #: Network "allow": connections the calls' proxies allowed and denied, over the trial.
        self.connections_allowed = connections_allowed
        self.connections_denied = connections_denied
        #: Whether the harness's final act (CallRequest.final) ran once the budget was spent: once a trial.
        self.final_used = final_used
        #: A signed trial's key, by its fingerprint (signing/_keys.py): pinned at creation; None: unsigned.
        self.signer = signer
        #: How many records of the log may go unsigned: a checkpoint is signed once that many are added.
        self.checkpoint_every = checkpoint_every
        #: The last checkpoint: {"records": how many it covers, "envelope": its DSSE envelope}.
        self.checkpoint = checkpoint
        #: The last statement written beside the log: {"records", "sha256" (of the statement), "signed_on"}.
        self.statement = statement

    @classmethod
    def new(
        cls,
        limits: Limits,
        chain: audit.Chain,
        sandbox: Sandbox = UNSANDBOXED,
        labels: dict[str, str] | None = None,
        log_path: str | None = None,
        signer: str | None = None,
        checkpoint_every: int = 1,
    ) -> TrialState:
        """A fresh trial's state."""
        now = time.time()
        return cls(
            trial_id=os.urandom(16).hex(),
            chain=chain.name,
            limits=limits,
            started_at=now,
            started_at_utc=clock.utc(now),
            clock=clock.anchor(),
            sandbox=sandbox,
            labels=labels,
            log_path=log_path,
            signer=signer,
            checkpoint_every=checkpoint_every,
        )

    def elapsed(self) -> float:
        """Trial seconds now, never less than the last value recorded."""
        return clock.elapsed(self.clock, self.started_at, self.elapsed_seconds)

    def totals(self) -> Totals:
        """The ledger's totals as the last record must state them (`ledger_after`)."""
        charged = self.calls - len(self.in_flight)
        network = (self.connections_allowed, self.connections_denied)
        return Totals(charged, self.emitted_tokens, self.refused_calls, *network)

    def allowances_held(self) -> int:
        """Tokens held back for the calls in flight."""
        return sum(entry.allowance for entry in self.in_flight.values())

    def rules(self) -> dict[str, Any]:
        """Every rule the trial was pinned to, as a signed statement names them (and a check holds them to)."""
        from ..output import tokens

        return {
            "limits": self.limits._asdict(),
            "sandbox": self.sandbox.as_json(),
            "tokenizer": {"encoding": tokens.ENCODING_NAME, "rank_file_sha256": tokens.EXPECTED_SHA256},
            "chain": self.chain,
            "checkpoint_every": self.checkpoint_every,
        }

    def as_json(self) -> dict[str, Any]:
        """The document as stored (without `mac` and `updated_at_utc`, which `encode` adds)."""
        document: dict[str, Any] = {
            "schema": SCHEMA,
            "version": VERSION,
            "trial_id": self.trial_id,
            "chain": self.chain,
            "limits": self.limits._asdict(),
            "calls": self.calls,
            "refused_calls": self.refused_calls,
            "emitted_tokens": self.emitted_tokens,
            "started_at": self.started_at,
            "started_at_utc": self.started_at_utc,
            "elapsed_seconds": self.elapsed_seconds,
            "clock": self.clock,
            "in_flight": {str(sequence): entry._asdict() for sequence, entry in self.in_flight.items()},
            "log": {**self.log._asdict(), **({"stamp": self.log_stamp} if self.log_stamp is not None else {})},
        }
        if self.rank_file is not None:
            document["rank_file"] = self.rank_file
        if self.sandbox is not UNSANDBOXED:
            document["sandbox"] = self.sandbox.as_json()
        if self.labels:
            document["labels"] = self.labels
        if self.log_path is not None:
            document["log_path"] = self.log_path
        if self.connections_allowed or self.connections_denied:
            document["connections_allowed"] = self.connections_allowed
            document["connections_denied"] = self.connections_denied
        if self.final_used:
            document["final_used"] = True
        if self.signer is not None:
            document["signing"] = {"signer": self.signer, "checkpoint_every": self.checkpoint_every}
            if self.checkpoint is not None:
                document["signing"]["checkpoint"] = self.checkpoint
            if self.statement is not None:
                document["signing"]["statement"] = self.statement
        return document


def _canonical(document: dict[str, Any]) -> bytes:
    body = {key: value for key, value in document.items() if key not in ("mac", "updated_at_utc")}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(state: TrialState, chain: audit.Chain) -> bytes:
    document = state.as_json()
    if chain.key is not None:
        document["mac"] = chain.digest(_canonical(document))
    document["updated_at_utc"] = clock.utc(time.time())
    # One line: json's C encoder does not indent, and the state is written twice a call.
    return json.dumps(document, sort_keys=True).encode() + b"\n"


_FIELDS = frozenset(InFlight._fields)


def _document(raw: bytes, path: str, chain: audit.Chain) -> dict[str, Any]:
    """The JSON object, checked to be a trialtool state of this version, this chain, and (keyed) sealed."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        msg = f"state {path} is not valid JSON (corrupt or truncated): {exc}"
        raise StateError(msg) from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = f"schema is {plain(data.get('schema'))}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        msg = f"state {path} is not a trialtool state: {found}, expected an object of schema {plain(SCHEMA)}"
        raise StateError(msg + "; run `trial-tool verify`")
    if data.get("version") != VERSION:
        found = plain(data.get("version"))
        msg = f"state {path} has schema version {found}; this trial-tool reads version {VERSION} only"
        raise StateError(msg)
    if data.get("chain") != chain.name:
        if data.get("chain") == "hmac-sha256":
            msg = f"state {path} belongs to a keyed trial: pass its key (--key-file or TRIALTOOL_LEDGER_KEY)"
        else:
            msg = f"state {path} belongs to a trial without a key, but a key was given"
        raise StateError(msg)
    if chain.key is not None and not (
        isinstance(data.get("mac"), str) and chain.matches(_canonical(data), data["mac"])
    ):
        msg = f"state {path} fails its HMAC: edited, or the key is wrong; run `trial-tool verify`"
        raise StateError(msg)
    return data


def decode(raw: bytes, path: str, chain: audit.Chain) -> TrialState:
    """The validated state, or StateError naming what is wrong."""
    data = _document(raw, path, chain)

    def bad(what: str) -> StateError:
        return StateError(f"state {path} is not a trialtool state: {what}; run `trial-tool verify`")

    for key in ("calls", "emitted_tokens", "refused_calls", "connections_allowed", "connections_denied"):
        value = data.get(key, 0 if key.startswith("connections") else None)  # those two: absent while zero
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"{key} is {plain(value)}, expected a non-negative integer")
    for key in ("started_at", "elapsed_seconds"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad(f"{key} is {plain(value)}, expected a non-negative number")
    if not isinstance(data.get("trial_id"), str) or not isinstance(data.get("started_at_utc"), str):
        raise bad("trial_id or started_at_utc is missing")
    try:
        limits = limit_rules.from_state(data.get("limits"))
    except ValueError as exc:
        raise bad(f"limits: {exc}") from exc
    if not isinstance(data.get("in_flight"), dict) or not isinstance(data.get("clock"), dict):
        raise bad("in_flight or clock is missing")
    try:
        in_flight = {int(key): InFlight(**entry) for key, entry in data["in_flight"].items()}
        if not all(isinstance(entry.pid, int) and isinstance(entry.allowance, int) for entry in in_flight.values()):
            raise TypeError
    except (TypeError, ValueError) as exc:
        raise bad("a call in flight is malformed") from exc
    log: Any = data.get("log")  # its shape is checked by use: a TypeError is "malformed"
    try:
        head = audit.LogHead(int(log["records"]), int(log["bytes"]), str(log["head"]), int(log["last_offset"]))
    except (TypeError, KeyError, ValueError) as exc:
        raise bad("log binding is missing or malformed") from exc
    stamp = log.get("stamp")
    if stamp is not None and not (
        isinstance(stamp, list) and len(stamp) == 5 and all(type(value) is int for value in stamp)
    ):
        raise bad("the log's stamp is malformed")
    try:
        sandbox = sandbox_from_state(data.get("sandbox"))
    except ValueError as exc:
        raise bad(str(exc)) from exc
    rank_file = data.get("rank_file")
    if rank_file is not None and not isinstance(rank_file, dict):
        raise bad("rank_file is malformed")
    labels = data.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise bad("labels are malformed")
    log_path = data.get("log_path")
    if log_path is not None and not isinstance(log_path, str):
        raise bad("log_path is malformed")
    final_used = data.get("final_used", False)
    if not isinstance(final_used, bool):
        raise bad("final_used is malformed")
    signing = data.get("signing", {})
    if not isinstance(signing, dict) or not (
        not signing
        or (
            isinstance(signing.get("signer"), str)
            and type(signing.get("checkpoint_every")) is int
            and signing["checkpoint_every"] >= 1
            and isinstance(signing.get("checkpoint", {}), dict)
            and isinstance(signing.get("statement", {}), dict)
        )
    ):
        raise bad("signing is malformed")
    if data["calls"] > limits.max_calls or data["emitted_tokens"] > limits.max_tokens:
        raise bad("counters exceed the pinned limits")
    if len(in_flight) > data["calls"]:
        raise bad("more calls in flight than calls charged")
    return TrialState(
        trial_id=data["trial_id"],
        chain=data["chain"],
        limits=limits,
        calls=data["calls"],
        refused_calls=data["refused_calls"],
        emitted_tokens=data["emitted_tokens"],
        started_at=float(data["started_at"]),
        started_at_utc=data["started_at_utc"],
        elapsed_seconds=float(data["elapsed_seconds"]),
        clock=data["clock"],
        in_flight=in_flight,
        log=head,
        rank_file=rank_file,
        sandbox=sandbox,
        labels=labels,
        log_path=log_path,
        connections_allowed=data.get("connections_allowed", 0),
        connections_denied=data.get("connections_denied", 0),
        final_used=final_used,
        log_stamp=stamp,
        signer=signing.get("signer"),
        checkpoint_every=signing.get("checkpoint_every", 1),
        checkpoint=signing.get("checkpoint"),
        statement=signing.get("statement"),
    )


def check_against_log(state: TrialState, last: Mapping[str, Any] | None, path: str) -> None:
    """The state's counters must be those the last record states (or zero for an empty log)."""
    expected = state.totals().as_json()
    stated = last.get("ledger_after") if last is not None else Totals().as_json()
    if last is not None and last.get("trial_id") != state.trial_id:
        msg = f"state {path} and its log belong to different trials; run `trial-tool verify`"
        raise StateError(msg)
    if stated != expected:
        msg = (
            f"state {path} disagrees with its log: the state says {expected}, the last record {stated}; "
            "an edited or rolled-back state; run `trial-tool verify`"
        )
        raise StateError(msg)


__all__ = ["SCHEMA", "VERSION", "InFlight", "TrialState", "check_against_log", "decode", "encode"]
