"""The ledger: reserve a call before it runs, commit it after, recover what crashed.

The lock is held only to reserve and to commit, never while a command runs:

    reserve  [lock] open (check the log, mend a crash); recover calls whose
             trial-tool died; refuse if a budget is spent (logging it); wait
             (unlocked) while every unspent token is held by calls in flight;
             charge the call, reserve its allowance, note it in flight; write
    commit   [lock] open; drop it from in flight; add its delivered tokens;
             append its record; write

A call is charged from its reservation, so a trial-tool killed at any point
refunds nothing. Each locked step appends at most one record and then replaces
the state, so a crash leaves the log at most one record ahead of the state, or
with a torn last line: the next `open` rolls that record forward, or cuts the
torn line off and logs the repair. Anything else that disagrees fails closed.

Durability: every record is fsynced before its state is replaced, and every
state's bytes are fsynced before the rename; the directory is fsynced only when
the trial is created or mended, not on each call (two fsyncs a call saved).
After a power loss, then, the log holds every call whose output was delivered,
and the state is its last version or the one before; the next `open` rolls the
log's last record forward as above. A call that was running at that moment
and never delivered may come back uncharged if its reservation had not reached
the disk; its record, if written, charges it (mending.roll_forward).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from . import audit, clock, fsio, liveness, mending, records, statefile
from .errors import BudgetExhausted, StateError, TrialExists
from .limits import FLAG_OF, Limits, check_pinned, from_overrides
from .locking import DEFAULT_LOCK_TIMEOUT

REPAIR = mending.REPAIR


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


class Ledger:
    """One trial's state file and audit log.

    `owner` is who reserves calls: (pid, liveness token), this process by
    default. A call in flight whose owner is no longer alive was abandoned.
    """

    def __init__(
        self,
        state_path: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        key: bytes | None = None,
        owner: tuple[int, str | None] | None = None,
    ) -> None:
        # Plain strings: pathlib costs ~7 ms to import, on every call's path.
        self.state_path = os.fspath(state_path)
        self.log_path = os.fspath(log_path)
        self.directory = os.path.dirname(self.state_path) or "."
        self.lock_timeout = lock_timeout
        self.chain = audit.Chain(key)
        self._owner = owner
        #: (log stamp, head, last record's summary) as this process last wrote or checked the log.
        self._trusted: tuple[list[int], audit.LogHead, dict[str, Any] | None] | None = None
        #: Calls this process reserved and gave up on (a failed commit): recover them
        #: as abandoned although their owner, this process, lives on.
        self._abandoned: set[int] = set()

    def abandon(self, sequence: int) -> None:
        """Give up on a reserved call; the next reservation records it as abandoned."""
        self._abandoned.add(sequence)

    @property
    def owner(self) -> tuple[int, str | None]:
        if self._owner is None:
            self._owner = (os.getpid(), liveness.token(os.getpid()))
        return self._owner

    # -- reading and writing -------------------------------------------------

    def _lock(self, cancelled: Callable[[], None] | None = None) -> Any:
        from .locking import LedgerLock

        return LedgerLock(self.state_path + ".lock", self.lock_timeout, cancelled)

    def ensure_directory(self) -> None:
        """Create the state's directory (and parents) if missing; StorageError if it cannot be."""
        fsio.ensure_directory(self.directory)

    def load(self) -> dict[str, Any] | None:
        """The validated state, or None when the trial does not exist yet."""
        raw = fsio.read_bytes(self.state_path)
        return None if raw is None else statefile.decode(raw, self.state_path, self.chain)

    def _write(self, state: dict[str, Any], *, sync_directory: bool = False) -> None:
        # The directory is not fsynced after a call's writes (see "Durability" in the
        # module docstring): the log is, and a state one step behind it is mended.
        fsio.atomic_write(self.state_path, statefile.encode(state, self.chain), sync_directory=sync_directory)

    def _append(self, state: dict[str, Any], record: dict[str, Any]) -> None:
        """Append `record`, bound to this trial and stating the totals of `state` (already updated for it)."""
        record["trial_id"] = state["trial_id"]
        record["ledger_after"] = statefile.totals(state)
        state["log"] = audit.append(self.log_path, record, state["log"], self.chain)
        self._trust(state["log"], record)

    def _trust(self, head: audit.LogHead, last: dict[str, Any] | None) -> None:
        """Remember the log as this process last wrote or checked it, stamp and all."""
        stamp = fsio.stamp(self.log_path)
        summary = None if last is None else {"trial_id": last.get("trial_id"), "ledger_after": last.get("ledger_after")}
        self._trusted = None if stamp is None else (stamp, head, summary)

    def _read_tail(self, head: audit.LogHead) -> audit.Tail:
        """The log's tail, checked; the whole chain is walked unless the log is exactly as this process left it.

        "Exactly": same device, inode, size, mtime and ctime (which no unprivileged
        process can set back), against the same head. A long-lived process (the
        API, `serve`) then skips re-reading a log it wrote itself; a CLI call, or a
        log touched by anyone else in between, gets the full walk.
        """
        trusted = self._trusted
        if trusted is not None and trusted[1] == head and trusted[0] == fsio.stamp(self.log_path):
            return audit.Tail(trusted[2], b"")
        tail = audit.read_tail(self.log_path, head, self.chain)
        if not tail.extra:
            self._trust(head, tail.last)
        return tail

    def _new_state(self, limits: Limits) -> dict[str, Any]:
        if os.path.exists(self.log_path) and os.path.getsize(self.log_path) > 0:
            msg = (
                f"log {self.log_path} already has records but there is no state {self.state_path}: "
                "refusing to start a trial over another trial's log"
            )
            raise StateError(msg)
        fsio.ensure_directory(os.path.dirname(self.log_path) or ".")
        return statefile.new(limits, self.chain)

    def _open(self, overrides: dict[str, Any], *, create: bool) -> dict[str, Any]:
        """The state, checked against its log (and mended after a crash). Under the lock."""
        mending.sweep_temporaries(self.state_path)
        state = self.load()
        if state is None:
            if not create:
                msg = f"no trial at {self.state_path}: create it with `trial-tool init` or a first call"
                raise StateError(msg)
            return self._new_state(from_overrides(overrides))
        check_pinned(state["limits"], overrides)
        tail = self._read_tail(state["log"])
        last = tail.last
        if tail.extra:
            last = self._mend(state, tail.extra) or last
        statefile.check_against_log(state, last, self.state_path)
        return state

    def _mend(self, state: dict[str, Any], extra: bytes) -> dict[str, Any] | None:
        """Bring state and log back into step after a crash; return the new last record, if any."""
        complete, _, torn = extra.rpartition(b"\n")
        if not complete and torn:
            # A torn append: the writer died mid-line. Cut it off and say so in the log.
            head: audit.LogHead = state["log"]
            fsio.truncate(self.log_path, head.bytes)
            record = mending.repair_record(state["trial_id"], torn)
            self._append(state, record)
            self._write(state, sync_directory=True)
            return record
        lines = complete.split(b"\n") if complete else []
        if len(lines) == 1 and not torn:
            record = mending.roll_forward(state, lines[0], self.chain, self.log_path)
            self._write(state, sync_directory=True)
            return record
        msg = (
            f"log {self.log_path} has {len(lines)} records and {len(torn)} stray bytes the state does not know of: "
            "more than one crash can leave; run `trial-tool verify`"
        )
        raise StateError(msg)

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
            self._write(state, sync_directory=True)
        return state

    def open(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The trial's state, creating the trial if it does not exist; LimitMismatch if its limits differ."""
        self.ensure_directory()
        with self._lock():
            new = not os.path.lexists(self.state_path)
            state = self._open(overrides, create=True)
            if new:
                self._write(state, sync_directory=True)
        state["elapsed_seconds"] = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
        return state

    def status(self) -> dict[str, Any]:
        """The state as a reader sees it now, with the trial time brought up to date."""
        with self._lock():
            state = self._open({}, create=False)
        state["elapsed_seconds"] = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
        return state

    def reserve(
        self,
        overrides: dict[str, Any],
        command: list[str],
        preflight: Callable[[dict[str, Any]], None] | None = None,
        supervisor: int | None = None,
        cancelled: Callable[[], None] | None = None,
    ) -> Reservation:
        """Charge a call and reserve its allowance, or log a refusal and raise BudgetExhausted.

        `preflight(state)` runs under the lock before anything is written; it may
        note facts in the state or raise to stop the call with nothing charged.
        `supervisor` is the pid of the call's supervisor, so that a recovery can
        stop what it left running. `cancelled()` is called while waiting (for the
        lock, for tokens) and just before charging; it raises to give up uncharged.
        """
        self.ensure_directory()
        wait_until: float | None = None
        pause = 0.005
        while True:
            with self._lock(cancelled):
                state = self._open(overrides, create=True)
                if preflight is not None:
                    preflight(state)
                self._recover(state)
                limits: Limits = state["limits"]
                elapsed = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
                state["elapsed_seconds"] = elapsed
                trial_left = limits.trial_timeout - elapsed
                reserved = sum(int(entry["allowance"]) for entry in state["in_flight"].values())
                unreserved = limits.max_tokens - state["emitted_tokens"] - reserved
                refusal = _refusal(state, limits, elapsed)
                if refusal is None and unreserved <= 0:
                    # Every unspent token is held by calls in flight: wait for them to
                    # hand back what they do not deliver, within this call's own deadline.
                    now = time.monotonic()
                    if wait_until is None:
                        wait_until = now + min(limits.call_timeout, trial_left)
                    if now >= wait_until:
                        refusal = (
                            "maximum_emitted_tokens",
                            f"every unspent token stayed held by calls in flight ({FLAG_OF['max_tokens']})",
                        )
                if refusal is not None:
                    self._refuse(state, command, refusal, elapsed)
                if cancelled is not None:
                    cancelled()
                if unreserved > 0:
                    return self._charge(state, command, min(limits.max_call_tokens, unreserved), supervisor)
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _refuse(self, state: dict[str, Any], command: list[str], refusal: tuple[str, str], elapsed: float) -> None:
        status, reason = refusal
        state["refused_calls"] += 1
        record = records.refusal(
            trial_id=state["trial_id"],
            sequence=state["calls"] + 1,
            command=command,
            status=status,
            reason=reason,
            at_utc=clock.utc(time.time()),
            wall_elapsed=elapsed,
        )
        self._append(state, record)
        self._write(state)
        raise BudgetExhausted(f"call refused: {reason}", status)

    def _charge(self, state: dict[str, Any], command: list[str], allowance: int, supervisor: int | None) -> Reservation:
        limits: Limits = state["limits"]
        elapsed = state["elapsed_seconds"]
        trial_left = limits.trial_timeout - elapsed
        if limits.call_timeout <= trial_left:
            run_seconds, deadline_kind = limits.call_timeout, "call"
        else:
            run_seconds, deadline_kind = trial_left, "trial"
        now = time.time()
        sequence = state["calls"] + 1
        pid, token = self.owner
        state["calls"] = sequence
        state["in_flight"][str(sequence)] = {
            "pid": pid,
            "pid_token": token,
            "supervisor": supervisor,
            "supervisor_token": liveness.token(supervisor) if supervisor else None,
            "allowance": allowance,
            "command": command,
            "started_at_utc": clock.utc(now),
        }
        try:
            self._write(state)
        except BaseException:
            # The new state may or may not be in place (an interrupt can land just after
            # the rename): if it is, this call must be recovered, not left in flight.
            self._abandoned.add(sequence)
            raise
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
            if state["in_flight"].pop(str(reservation.sequence), None) is None:
                msg = f"call {reservation.sequence} is no longer in flight (recovered as abandoned?)"
                raise StateError(msg)
            elapsed = clock.elapsed(state["clock"], state["started_at"], state["elapsed_seconds"])
            state["elapsed_seconds"] = elapsed
            record["wall_elapsed_seconds"] = elapsed
            state["emitted_tokens"] += delivered
            self._append(state, record)
            self._write(state)
        return state

    def _recover(self, state: dict[str, Any]) -> None:
        """Close calls whose trial-tool died: charged, nothing delivered, allowance released.

        What their commands left running is stopped: the supervisor, if it lives on,
        is told to stop (its parent is gone, so it kills the tree and exits), and
        any cgroup it made is emptied.
        """
        for key, entry in sorted(state["in_flight"].items(), key=lambda item: int(item[0])):
            pid = int(entry["pid"])
            if int(key) not in self._abandoned and liveness.alive(pid, entry.get("pid_token")):
                continue  # its owner is alive and still running it
            self._abandoned.discard(int(key))
            killed = mending.stop_leftovers(entry)
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
            record["processes_killed"] = killed
            del state["in_flight"][key]
            self._append(state, record)
            self._write(state)


def _refusal(state: dict[str, Any], limits: Limits, elapsed: float) -> tuple[str, str] | None:
    """The refusal status and reason when a budget is spent, else None."""
    if state["calls"] >= limits.max_calls:
        return "maximum_tool_calls", f"all {limits.max_calls} calls are spent ({FLAG_OF['max_calls']})"
    if state["emitted_tokens"] >= limits.max_tokens:
        return "maximum_emitted_tokens", f"all {limits.max_tokens} delivered tokens are spent ({FLAG_OF['max_tokens']})"
    if elapsed >= limits.trial_timeout:
        return "task_timeout_seconds", f"the trial's {limits.trial_timeout:g} s are spent ({FLAG_OF['trial_timeout']})"
    return None


__all__ = ["DEFAULT_LOCK_TIMEOUT", "REPAIR", "Ledger", "Reservation"]
