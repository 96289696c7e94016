"""The ledger: reserve a call before it runs, commit it after, recover what crashed.

The lock is held only to reserve and to commit, never while a command runs:

    reserve  [lock] open (check the log, mend a crash); recover calls whose
             trial-tool died; refuse if a budget is spent (logging it); wait
             (unlocked) while every unspent token is held by calls in flight;
             charge the call, reserve its allowance, note it in flight; write
    commit   [lock] open; drop it from in flight; add its delivered tokens;
             append its record; write

A call is charged from its reservation, so a trial-tool killed at any point
refunds nothing. How the files stay in step across crashes, and what is
durable when, is _store.py's. A call that was running at a power loss and
never delivered may come back uncharged if its reservation had not reached
the disk; its record, if written, charges it (mending.roll_forward).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..errors import BudgetExhausted, LockTimeout, StateError, StorageError, UsageError
from ..osio import plain, process_token, require_directory
from ..sandbox import PinSandbox
from ..types import FLAG_OF, budget
from . import _audit as audit
from . import _clock as clock
from . import _durable as durable
from . import _mending as mending
from . import _records as records
from . import _reservation as reservation_of
from ._locking import DEFAULT_LOCK_TIMEOUT, LedgerLock
from ._records import GRADING_ALLOWANCE
from ._reservation import Reservation
from ._settings import Settings
from ._state import TrialState
from ._store import Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .. import signing

#: Stops what an abandoned call left running, given its supervisor's pid and liveness
#: token; returns how many processes it killed. The process room provides it.
StopLeftovers = Callable[[int, "str | None"], int]


class Ledger:
    """One trial's state file and audit log, and the operations on its budgets.

    `owner` is who reserves calls: (pid, liveness token), this process by
    default. A call in flight whose owner is no longer alive was abandoned;
    `stop_leftovers` then stops what its command left running.
    """

    def __init__(
        self,
        state_path: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        key: bytes | None = None,
        owner: tuple[int, str | None] | None = None,
        stop_leftovers: StopLeftovers | None = None,
        pin_sandbox: PinSandbox | None = None,
        signing_key: signing.SigningKey | None = None,
        checkpoint_every: int | None = None,
    ) -> None:
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, int | float) or not 0 <= lock_timeout < 1e9:
            msg = f"the lock timeout must be a number of seconds, 0 or more, not {plain(lock_timeout)}"
            raise UsageError(msg)
        # Plain strings: pathlib is not imported on a call's path (docs/performance.md).
        self.state_path = os.fspath(state_path)
        self.log_path = os.fspath(log_path)
        self.directory = os.path.dirname(self.state_path) or "."
        self.lock_timeout = lock_timeout
        if key is not None and signing_key is not None:
            msg = (
                "a trial is keyed (--key-file: a secret that whoever verifies must hold) or signed "
                "(--signing-key: checked with its public key alone), not both"
            )
            raise UsageError(msg)
        if checkpoint_every is not None and (
            isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1
        ):
            msg = f"--checkpoint-every must be a whole number of records, 1 or more, not {plain(checkpoint_every)}"
            raise UsageError(msg)
        self.chain = audit.Chain(key)
        self.signing_key = signing_key
        #: What pins a new trial's sandbox on this machine (the sandbox room's `pin`): handed in by the
        #: call (trial/), so that a ledger used on its own probes nothing; None pins no sandbox.
        self.store = Store(self.state_path, self.log_path, self.chain, pin_sandbox, signing_key, checkpoint_every)
        self._owner = owner
        self._stop_leftovers = stop_leftovers
        #: Calls this process reserved and gave up on (a failed commit): recover them
        #: as abandoned although their owner, this process, lives on.
        self._abandoned: set[int] = set()

    def settle_request(self, request_id: str) -> tuple[dict[str, object] | None, TrialState]:
        """After the process that ran a call died: what it left in flight recovered, and `request_id`'s record.

        None: no record names it, and nothing of it is in flight: it was never charged.
        """
        with self._lock():
            state = self.store.open(None, create=False)
            mending.recover_abandoned(self.store, state, self._abandoned, self._stop_leftovers)
        state.elapsed_seconds = state.elapsed()
        return audit.find_request(self.log_path, request_id, state.log.bytes), state

    def abandon(self, sequence: int) -> None:
        """Give up on a reserved call; the next reservation records it as abandoned."""
        if sequence:  # 0: a grading command, never in flight
            self._abandoned.add(sequence)

    @property
    def owner(self) -> tuple[int, str | None]:
        if self._owner is None:
            self._owner = (os.getpid(), process_token(os.getpid()))
        return self._owner

    def _lock(self, cancelled: Callable[[], None] | None = None) -> LedgerLock:
        return LedgerLock(self.state_path + ".lock", self.lock_timeout, cancelled)

    def directories(self, *, create: bool = False) -> None:
        """The state's and the log's directories: made if `create` (init), else StorageError if missing."""
        for directory in {self.directory, os.path.dirname(self.log_path) or "."}:
            if create:
                durable.ensure_directory(directory)
            else:
                require_directory(directory)

    def load(self) -> TrialState | None:
        """The validated state as it is on disk (unlocked, unmended), or None when there is no trial."""
        return self.store.load()

    # -- the operations ------------------------------------------------------

    def open(self, settings: Settings, *, create_directories: bool = False) -> TrialState:
        """The trial's state, creating the trial if it does not exist; LimitMismatch if its limits differ."""
        self.directories(create=create_directories)
        with self._lock():
            new = not os.path.lexists(self.state_path)
            state = self.store.open(settings, create=True)
            self.store.check_signer(state)
            self._claim(state, new)
        state.elapsed_seconds = state.elapsed()
        return state

    def status(self) -> TrialState:
        """The state as a reader sees it now, with the trial time brought up to date; nothing is created."""
        if self.store.load() is None:  # also refuses an odd or corrupt state before the lock file is made
            msg = f"no trial at {self.state_path}: create it with `trial-tool init` or a first call"
            raise StateError(msg)
        with self._lock():
            state = self.store.open(None, create=False)
        state.elapsed_seconds = state.elapsed()
        return state

    def reserve(
        self,
        settings: Settings,
        command: list[str],
        preflight: Callable[[TrialState], None] | None = None,
        supervisor: int | None = None,
        cancelled: Callable[[], None] | None = None,
        one_at_a_time: Callable[[TrialState], bool] | None = None,
        timeout: float | None = None,
        final: bool = False,
        request_id: str | None = None,
        merged: bool = False,
    ) -> Reservation:
        """Charge a call and reserve its allowance, or log a refusal and raise BudgetExhausted.

        `preflight(state)` runs under the lock before anything is written; it may
        note facts in the state or raise to stop the call with nothing charged.
        `supervisor` is the pid of the call's supervisor, so that a recovery can
        stop what it left running. `cancelled()` is called while waiting (for the
        lock, for tokens) and just before charging; it raises to give up uncharged.
        While `one_at_a_time(state)` is true, the call waits (writing nothing) until
        no other call is in flight: a sandbox whose trial files sit in a writable
        path needs the state left alone while a command runs (sandbox/_bwrap.py).
        `timeout` (seconds) shortens the call's deadline (reservation.deadline).
        `final`: the harness's final act (mini's submission, say). While the budget lasts it is a
        call like any other; once a budget is spent it runs instead of being refused, once a trial,
        as a grading command: uncharged, bounded by the call timeout, its output the harness's
        alone. The state keeps that it ran (`final_used`); a later one is refused as any call.
        `request_id`, the caller's name for the call, is kept in flight and in its records.
        `merged`: the call's stderr goes to its stdout, so its record needs room for one stream.
        """
        self.directories()
        wait_until: float | None = None
        serial: list[float] = []
        pause = 0.005
        while True:
            with self._lock(cancelled):
                state = self._ready(settings, preflight)
                if self._wait_for_others(state, one_at_a_time, serial):
                    if cancelled is not None:
                        cancelled()
                else:
                    limits = state.limits
                    state.elapsed_seconds = elapsed = state.elapsed()
                    unreserved = limits.max_tokens - state.emitted_tokens - state.allowances_held()
                    refusal = budget.refusal(limits, state.calls, state.emitted_tokens, elapsed)
                    if refusal is None and unreserved <= 0:
                        # Every unspent token is held by calls in flight: wait for them to
                        # hand back what they do not deliver, within this call's own deadline.
                        now = time.monotonic()
                        if wait_until is None:
                            wait_until = now + min(limits.call_timeout, limits.trial_timeout - elapsed)
                        if now >= wait_until:
                            refusal = (
                                "maximum_emitted_tokens",
                                f"every unspent token stayed held by calls in flight ({FLAG_OF['max_tokens']})",
                            )
                    if refusal is not None and final and not state.final_used:
                        self._room_for_record(state, command, merged)
                        state.final_used = True
                        self.store.write(state)
                        return reservation_of.grading(state, timeout, final=True)
                    if refusal is not None:
                        self._refuse(state, command, refusal, request_id)
                    if cancelled is not None:
                        cancelled()
                    if unreserved > 0:
                        allowance = min(limits.max_call_tokens, unreserved)
                        return self._charge(state, command, allowance, supervisor, timeout, request_id, merged)
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _ready(self, settings: Settings, preflight: Callable[[TrialState], None] | None) -> TrialState:
        """Under the lock, before a command: the trial opened (made, mended), checked, its log claimed,
        and calls whose trial-tool died recovered."""
        new = not os.path.lexists(self.state_path)
        state = self.store.open(settings, create=True)
        self.store.check_signer(state)
        # The log must take this call's record: found out now, not after the command ran.
        durable.preflight_append(self.log_path)
        if preflight is not None:
            preflight(state)
        self._claim(state, new)
        mending.recover_abandoned(self.store, state, self._abandoned, self._stop_leftovers)
        return state

    def _claim(self, state: TrialState, new: bool) -> None:
        """A trial whose log has no line yet claims it (store.claim), its state written first.

        The state first: a crash between the two leaves a trial with an empty log,
        which the next call claims, rather than a log with no state, which no trial can use.
        """
        if new:
            self.store.write(state, sync_directory=True)
        if state.log.records == 0:
            try:
                self.store.claim(state)
            except StateError:
                if new:  # the state this call wrote for a trial that cannot have this log
                    os.unlink(self.state_path)
                raise
            self.store.write(state)

    @staticmethod
    def _wait_for_others(
        state: TrialState, one_at_a_time: Callable[[TrialState], bool] | None, serial: list[float]
    ) -> bool:
        """True while this call must wait for the calls in flight; LockTimeout once that is past reason."""
        if not state.in_flight or one_at_a_time is None or not one_at_a_time(state):
            return False
        now = time.monotonic()
        if not serial:
            # The call in flight ends by its deadline and kill grace; beyond that, it is stuck.
            serial.append(now + state.limits.call_timeout + state.limits.kill_grace + 30.0)
        if now >= serial[0]:
            msg = (
                "another call of this trial is still running, and calls of a trial in a container, or whose "
                "files sit in its writable paths, run one at a time (docs/sandbox.md)"
            )
            raise LockTimeout(msg)
        return True

    def _refuse(
        self, state: TrialState, command: list[str], refusal: tuple[str, str], request_id: str | None = None
    ) -> None:
        status, reason = refusal
        state.refused_calls += 1
        record = records.refusal(
            trial_id=state.trial_id,
            sequence=state.calls + 1,
            command=command,
            status=status,
            reason=reason,
            at_utc=clock.utc(time.time()),
            wall_elapsed=state.elapsed_seconds,
        )
        if request_id is not None:
            record["request_id"] = request_id
        self.store.append(state, record)
        self.store.write(state)
        self._ended(state)
        raise BudgetExhausted(f"call refused: {reason}", status)

    def _room_for_record(self, state: TrialState, command: list[str], merged: bool) -> None:
        """Room in the log for every call in flight's record, this one's included, taken now:
        a command that fills the disk cannot then keep its own call from being recorded."""
        capture = state.limits.max_capture_bytes
        bound = records.size_bound(capture, command, state.sandbox.network == "allow", 1 if merged else 2)
        needed = bound * (len(state.in_flight) + 1)
        try:
            durable.reserve_tail(self.log_path, needed)
        except durable.NoRoom:
            what = "the call's record (at its largest, for each call in flight)"
            raise StorageError.no_room(what, needed, os.path.dirname(self.log_path) or ".", capture) from None

    def _charge(
        self,
        state: TrialState,
        command: list[str],
        allowance: int,
        supervisor: int | None,
        timeout: float | None,
        request_id: str | None,
        merged: bool,
    ) -> Reservation:
        self._room_for_record(state, command, merged)
        reservation = reservation_of.charge(state, command, allowance, self.owner, supervisor, timeout, request_id)
        try:
            self.store.write(state)
        except BaseException:
            # The new state may or may not be in place (an interrupt can land just after
            # the rename): if it is, this call must be recovered, not left in flight.
            self._abandoned.add(reservation.sequence)
            raise
        return reservation

    def reserve_grading(
        self,
        settings: Settings,
        command: list[str],
        preflight: Callable[[TrialState], None] | None = None,
        timeout: float | None = None,
        merged: bool = False,
    ) -> Reservation:
        """Ready a command the harness runs to grade the agent's work: never refused, never charged.

        The trial is opened (and mended) as for a call, and room for the record taken
        in the log; nothing is counted. Its deadline is the trial's call timeout: the
        trial's own time limit is the agent's, not the grader's. Its `sequence` is 0.
        """
        self.directories()
        with self._lock():
            state = self._ready(settings, preflight)
            self._room_for_record(state, command, merged)
            return reservation_of.grading(state, timeout)

    def commit_grading(self, reservation: Reservation, record: records.CallRecord) -> TrialState:
        """Log a grading command's record (records.grading); the agent's counters do not change."""
        with self._lock():
            state = self.store.open(None, create=False)
            if state.trial_id != reservation.trial_id:
                msg = f"state {self.state_path} was replaced by another trial during the call"
                raise StateError(msg)
            state.elapsed_seconds = state.elapsed()
            record["wall_elapsed_seconds"] = state.elapsed_seconds
            if reservation.final:
                record["final"] = True
            self.store.append(state, records.grading(record))
            if not state.in_flight:
                durable.release_tail(self.log_path)
            try:
                self.store.write(state)
            except StorageError:
                pass  # the record is durable; the next open rolls the state forward (commit's rule)
        return state

    def commit(self, reservation: Reservation, record: records.CallRecord) -> TrialState:
        """Log the call's record and charge its delivered tokens; return the new state."""
        delivered = int(record["delivered_emitted_tokens"])
        if delivered > reservation.allowance:
            msg = f"refusing to record {delivered} delivered tokens against an allowance of {reservation.allowance}"
            raise StateError(msg)
        with self._lock():
            state = self.store.open(None, create=False)
            if state.trial_id != reservation.trial_id:
                msg = f"state {self.state_path} was replaced by another trial during the call"
                raise StateError(msg)
            if state.in_flight.pop(reservation.sequence, None) is None:
                msg = f"call {reservation.sequence} is no longer in flight (recovered as abandoned?)"
                raise StateError(msg)
            state.elapsed_seconds = state.elapsed()
            record["wall_elapsed_seconds"] = state.elapsed_seconds
            state.emitted_tokens += delivered
            allowed, denied = records.network_counts(record)
            state.connections_allowed += allowed
            state.connections_denied += denied
            self.store.append(state, record)
            if not state.in_flight:
                durable.release_tail(self.log_path)  # no call in flight needs the room reserved for its record
            try:
                self.store.write(state)
            except StorageError:
                # The record is durable in the log, which is the ledger's truth: the state
                # is one step behind, as after a crash there, and the next open rolls it
                # forward. The call is delivered as recorded, not failed after the fact.
                return state
            self._ended(state)
        return state

    def _ended(self, state: TrialState) -> None:
        """A signed trial whose budget is now spent, with nothing in flight, gets its statement (once)."""
        if self.signing_key is None or state.in_flight:
            return
        from . import _attest as attest  # a signed trial's only: an unsigned call loads none of it

        if attest.ended_by(state) is None:
            return
        if state.statement is not None and state.statement.get("signed_on") == "budget_spent":
            return  # signed at its end already: later refusals are covered by checkpoints
        try:
            attest.write_statement(state, self.state_path, self.log_path, self.signing_key, "budget_spent")
            self.store.write(state)
        except (StateError, StorageError):
            # The call is recorded and delivered; the trial stays signed up to its checkpoint, and
            # `trial-tool attest` (or close) signs its statement once the files allow it.
            pass

    def attest(self, signed_on: str = "attest") -> tuple[str, str, TrialState]:
        """Sign the trial's statement now and write it beside the log: (its path, its SHA-256, the state).

        UsageError for a trial that is not signed, or without its key; StateError if it fails its check.
        """
        if self.signing_key is None:
            msg = "attesting a trial needs its signing key (--signing-key or $TRIALTOOL_SIGNING_KEY)"
            raise UsageError(msg)
        from . import _attest as attest

        with self._lock():
            state = self.store.open(None, create=False)
            self.store.check_signer(state)
            digest = attest.write_statement(state, self.state_path, self.log_path, self.signing_key, signed_on)
            self.store.write(state)
        state.elapsed_seconds = state.elapsed()
        return attest.statement_path(self.log_path), digest, state


__all__ = ["DEFAULT_LOCK_TIMEOUT", "GRADING_ALLOWANCE", "Ledger", "Reservation", "StopLeftovers"]
