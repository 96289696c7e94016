"""The state file: locked, validated, atomically replaced; reserve a call before it runs, commit it after.

The lock is held only to reserve and to commit, never while a command runs:

    reserve  [lock] load; recover calls whose trial-tool died; refuse if a budget
             is spent (logging the refusal); charge the call; reserve its token
             allowance; note it in flight; write  [unlock]
    commit   [lock] load; append the audit record; add the delivered tokens;
             release the allowance; write  [unlock]

A call is charged from its reservation, so a trial-tool killed mid-call refunds
nothing. The log is appended before the state is replaced; the state records
the log's size, record count and last hash, and any disagreement stops the trial
(fail closed) rather than guessing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from . import audit, clock, fsio, records
from .errors import BudgetExhausted, StateError, StorageError, TrialExists
from .limits import FLAG_OF, Limits, check_pinned, from_overrides, from_state

SCHEMA = "trialtool.state"
VERSION = 1
DEFAULT_LOCK_TIMEOUT = 30.0


class Reservation(NamedTuple):
    """A charged call, ready to run."""

    trial_id: str
    sequence: int
    #: Tokens this call may deliver.
    allowance: int
    #: Seconds the command may run, and which limit set it ("call" or "trial").
    run_seconds: float
    deadline_kind: str
    limits: Limits
    #: Trial seconds elapsed when the call was reserved.
    trial_elapsed: float
    started_at: float


def _process_token(pid: int) -> str | None:
    """Something that tells a live process from a later one reusing its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        # Field 22 (start time in clock ticks since boot) follows the ")" closing the command name.
        return stat[stat.rindex(b")") + 2 :].split()[19].decode()
    except FileNotFoundError:
        return None
    except OSError:
        pass  # no procfs (macOS): ask psutil, imported only on this path
    import psutil

    try:
        return f"{psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        return None


def _validate(data: Any, path: Path) -> dict[str, Any]:
    def bad(what: str) -> StateError:
        return StateError(f"state {path} is not a trialtool state: {what}; run `trial-tool verify`")

    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, found {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise bad(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    if data.get("version") != VERSION:
        msg = f"state {path} has schema version {data.get('version')!r}; this trial-tool reads version {VERSION} only"
        raise StateError(msg)
    counters = ("calls", "emitted_tokens", "refused_calls")
    for key in counters:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"{key} is {value!r}, expected a non-negative integer")
    for key in ("started_at", "elapsed_seconds"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad(f"{key} is {value!r}, expected a non-negative number")
    if not isinstance(data.get("trial_id"), str):
        raise bad("trial_id is missing")
    try:
        data["limits"] = from_state(data.get("limits"))
    except ValueError as exc:
        raise bad(f"limits: {exc}") from exc
    if not isinstance(data.get("in_flight"), dict) or not isinstance(data.get("clock"), dict):
        raise bad("in_flight or clock is missing")
    log: Any = data.get("log")
    try:
        data["log"] = audit.LogHead(int(log["records"]), int(log["bytes"]), str(log["head"]))
    except (TypeError, KeyError, ValueError) as exc:
        raise bad("log binding is missing or malformed") from exc
    limits: Limits = data["limits"]
    if data["calls"] > limits.max_calls or data["emitted_tokens"] > limits.max_tokens:
        raise bad("counters exceed the pinned limits")
    return data


class Ledger:
    """One trial's state file and audit log."""

    def __init__(self, state_path: Path, log_path: Path, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        self.state_path = Path(state_path)
        self.log_path = Path(log_path)
        self.lock_timeout = lock_timeout

    # -- reading and writing -------------------------------------------------

    def _lock(self) -> Any:
        from .locking import LedgerLock

        return LedgerLock(self.state_path.with_name(self.state_path.name + ".lock"), self.lock_timeout)

    def load(self) -> dict[str, Any] | None:
        """The validated state, or None when the trial does not exist yet."""
        raw = fsio.read_bytes(self.state_path)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            msg = f"state {self.state_path} is not valid JSON (corrupt or truncated): {exc}"
            raise StateError(msg) from exc
        return _validate(data, self.state_path)

    def _write(self, state: dict[str, Any]) -> None:
        document = dict(state)
        document["limits"] = state["limits"]._asdict()
        document["log"] = state["log"]._asdict()
        document["updated_at_utc"] = clock.utc(time.time())
        fsio.atomic_write(self.state_path, json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")

    def _new_state(self, limits: Limits) -> dict[str, Any]:
        if self.log_path.exists() and self.log_path.stat().st_size > 0:
            msg = (
                f"log {self.log_path} already has records but there is no state {self.state_path}: "
                "refusing to start a trial over another trial's log"
            )
            raise StateError(msg)
        for directory in {self.state_path.parent, self.log_path.parent}:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                msg = f"cannot create directory {directory}: {exc.strerror or exc}"
                raise StorageError(msg) from exc
        now = time.time()
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "trial_id": os.urandom(16).hex(),
            "limits": limits,
            "calls": 0,
            "refused_calls": 0,
            "emitted_tokens": 0,
            "started_at": now,
            "started_at_utc": clock.utc(now),
            "elapsed_seconds": 0.0,
            "clock": clock.anchor(),
            "in_flight": {},
            "log": audit.LogHead(),
        }

    def _open(self, overrides: dict[str, Any], *, create: bool) -> dict[str, Any]:
        state = self.load()
        if state is None:
            if not create:
                msg = f"no trial at {self.state_path}: create it with `trial-tool init` or a first call"
                raise StateError(msg)
            return self._new_state(from_overrides(overrides))
        check_pinned(state["limits"], overrides)
        audit.check_size(self.log_path, state["log"])
        return state

    # -- the operations ------------------------------------------------------

    def init(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Create the trial with its limits pinned; TrialExists if it already exists."""
        limits = from_overrides(overrides)
        self.ensure_directory()
        with self._lock():
            if self.load() is not None:
                msg = f"a trial already exists at {self.state_path}"
                raise TrialExists(msg)
            state = self._new_state(limits)
            self._write(state)
        return state

    def status(self) -> dict[str, Any]:
        """The state as a reader sees it now, with the trial time brought up to date."""
        with self._lock():
            state = self._open({}, create=False)
        state["elapsed_seconds"] = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
        return state

    def ensure_directory(self) -> None:
        """Create the state's directory (and parents) if missing; StorageError if it cannot be."""
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create directory {self.state_path.parent}: {exc.strerror or exc}"
            raise StorageError(msg) from exc

    def reserve(
        self,
        overrides: dict[str, Any],
        command: list[str],
        preflight: Callable[[dict[str, Any]], None] | None = None,
    ) -> Reservation:
        """Charge a call and reserve its allowance, or log a refusal and raise BudgetExhausted.

        `preflight(state)` runs under the lock before anything is written; it may
        note facts in the state (written with the reservation) or raise to stop
        the call with nothing charged.
        """
        self.ensure_directory()
        with self._lock():
            state = self._open(overrides, create=True)
            if preflight is not None:
                preflight(state)
            self._recover(state)
            limits: Limits = state["limits"]
            elapsed = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
            state["elapsed_seconds"] = elapsed
            reserved = sum(int(entry["allowance"]) for entry in state["in_flight"].values())
            refusal = None
            if state["calls"] >= limits.max_calls:
                refusal = ("maximum_tool_calls", f"all {limits.max_calls} calls are spent ({FLAG_OF['max_calls']})")
            elif state["emitted_tokens"] >= limits.max_tokens:
                refusal = (
                    "maximum_emitted_tokens",
                    f"all {limits.max_tokens} delivered tokens are spent ({FLAG_OF['max_tokens']})",
                )
            elif elapsed >= limits.trial_timeout:
                refusal = (
                    "task_timeout_seconds",
                    f"the trial's {limits.trial_timeout:g} s are spent ({FLAG_OF['trial_timeout']})",
                )
            if refusal is not None:
                status, reason = refusal
                now = time.time()
                record = records.refusal(
                    trial_id=state["trial_id"],
                    sequence=state["calls"] + 1,
                    command=command,
                    status=status,
                    reason=reason,
                    at_utc=clock.utc(now),
                    wall_elapsed=elapsed,
                )
                state["log"] = audit.append(self.log_path, record, state["log"])
                state["refused_calls"] += 1
                self._write(state)
                raise BudgetExhausted(f"call refused: {reason}", status)
            sequence = state["calls"] + 1
            unreserved = limits.max_tokens - state["emitted_tokens"] - reserved
            allowance = max(0, min(limits.max_call_tokens, unreserved))
            trial_left = limits.trial_timeout - elapsed
            if limits.call_timeout <= trial_left:
                run_seconds, deadline_kind = limits.call_timeout, "call"
            else:
                run_seconds, deadline_kind = trial_left, "trial"
            now = time.time()
            state["calls"] = sequence
            state["in_flight"][str(sequence)] = {
                "pid": os.getpid(),
                "pid_token": _process_token(os.getpid()),
                "allowance": allowance,
                "command": command,
                "started_at_utc": clock.utc(now),
            }
            self._write(state)
        return Reservation(
            trial_id=state["trial_id"],
            sequence=sequence,
            allowance=allowance,
            run_seconds=run_seconds,
            deadline_kind=deadline_kind,
            limits=limits,
            trial_elapsed=elapsed,
            started_at=now,
        )

    def commit(self, reservation: Reservation, record: dict[str, Any]) -> dict[str, Any]:
        """Log the call's record and charge its delivered tokens; return the new state."""
        delivered = int(record["delivered_emitted_tokens"])
        if delivered > reservation.allowance:
            msg = f"refusing to record {delivered} delivered tokens against an allowance of {reservation.allowance}"
            raise StateError(msg)
        with self._lock():
            state = self._open({}, create=False)
            if state["trial_id"] != reservation.trial_id:
                msg = f"state {self.state_path} was replaced by another trial during the call"
                raise StateError(msg)
            state["in_flight"].pop(str(reservation.sequence), None)
            elapsed = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
            state["elapsed_seconds"] = elapsed
            record["wall_elapsed_seconds"] = elapsed
            state["log"] = audit.append(self.log_path, record, state["log"])
            state["emitted_tokens"] += delivered
            self._write(state)
        return state

    def _recover(self, state: dict[str, Any]) -> None:
        """Close calls whose trial-tool died: charged, nothing delivered, allowance released."""
        for key, entry in sorted(state["in_flight"].items(), key=lambda item: int(item[0])):
            pid = int(entry["pid"])
            if _process_token(pid) == entry.get("pid_token"):
                continue  # its owner is alive and still running it
            now = time.time()
            record = records.abandoned(
                trial_id=state["trial_id"],
                sequence=int(key),
                command=list(entry.get("command", [])),
                started_at_utc=str(entry.get("started_at_utc")),
                at_utc=clock.utc(now),
                wall_elapsed=clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"]),
                owner_pid=pid,
            )
            state["log"] = audit.append(self.log_path, record, state["log"])
            del state["in_flight"][key]


__all__ = ["DEFAULT_LOCK_TIMEOUT", "SCHEMA", "VERSION", "Ledger", "Reservation"]
