"""`Trial`: the one place policy lives. Reserve a call, run it, clip its output, commit it.

The rooms below do the work: the ledger reserves and commits (ledger/), the
process room runs the command as a contained tree (process/), trial/_verdict.py and
trial/_delivery.py decide what the call was and what the agent gets. This module
holds the order of those steps and what happens when one of them fails.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import sandbox as seam
from ..errors import Interrupted, StateError, TrialToolError
from ..ledger import DEFAULT_LOCK_TIMEOUT, Ledger, Reservation, Settings, TrialState, records
from ..osio import alive
from ..process import Launcher, Outcome, environment
from ..types import Budget, CallRequest, CallResult, Command, Interrupt, Runner, budget, current_directory
from . import _delivery as delivery
from ._preflight import Placed, Preflight

if TYPE_CHECKING:
    from ..process import ForkServer
    from ..signing import SigningKey


class Attestation(NamedTuple):
    """A signed trial's statement as written: where, its SHA-256 (of the in-toto statement), who signed,
    and how many records of the log it covers."""

    path: str
    sha256: str
    signer: str
    records: int

    def as_json(self) -> dict[str, object]:
        return {"statement": self.path, "statement_sha256": self.sha256, "signer": self.signer, "records": self.records}


def stop_leftovers(supervisor: int, token: str | None) -> int:
    """Stop what an abandoned call left running; how many processes were killed. The supervisor,
    if it lives on, is told to stop (it kills the tree and exits), and any cgroup it made is emptied."""
    if alive(supervisor, token):
        try:
            os.kill(supervisor, signal.SIGTERM)
        except ProcessLookupError:
            pass
    from ..process import kill_leftovers  # a recovery only: cgroups imports pathlib

    return kill_leftovers(supervisor)


class Trial:
    """A trial: its state and log, its limits, and the runs of its calls.

    `limits` are the values passed for this use; at creation they are pinned,
    afterwards any that differ from the pinned ones make every call fail. The
    sandbox settings (`sandbox`, `network`, `workspace`, `writable`) go there
    too (docs/sandbox.md); `hidden_files` names files besides the trial's own
    that its sandboxed commands must not reach, such as the file the key came from.
    `labels` say who the trial is (task, sample, epoch, model): pinned at creation
    like the limits, and shown by every graders' command (ledger/_labels.py).

    `run` may be called from several threads at once (and `arun` from several
    asyncio tasks): each call is reserved, run and committed on its own. The
    supervisors come from a fork server started on the first call, so the caller
    may have threads; `close()` (or leaving a `with` block) stops it, else it
    ends with the process.
    """

    def __init__(
        self,
        state_path: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        *,
        limits: dict[str, object] | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        rank_file: str | os.PathLike[str] | None = None,
        key: bytes | None = None,
        hidden_files: Sequence[str | os.PathLike[str]] = (),
        origin: str | os.PathLike[str] | None = None,
        fork_server: ForkServer | None = None,
        labels: dict[str, str] | None = None,
        signing_key: SigningKey | None = None,
        checkpoint_every: int | None = None,
    ) -> None:
        self.ledger = Ledger(
            state_path,
            log_path,
            lock_timeout=lock_timeout,
            key=key,
            stop_leftovers=stop_leftovers,
            pin_sandbox=seam.pin,
            signing_key=signing_key,
            checkpoint_every=checkpoint_every,
        )
        #: The statement written by the last `attest` (or `close`) of a signed trial, else None.
        self.attestation: Attestation | None = None
        #: Files a sandboxed command must not reach besides the state, log and lock (a key file).
        self.hidden_files = [os.fspath(path) for path in hidden_files]
        self._preflight = Preflight(self.ledger.state_path, self.ledger.log_path, self.hidden_files, rank_file)
        given = dict(limits or {})
        if labels is not None:
            given["labels"] = dict(labels)
        if origin is not None:
            # Where the trial is created from when its caller is elsewhere (the per-user server).
            given["origin"] = os.fspath(origin)
        #: The limits, sandbox settings and labels asked for: checked here, once (UsageError).
        self.settings = Settings.of(given)
        #: A fork server shared with other Trials (the per-user server's), not closed with this one.
        self._shared_forkserver = fork_server
        self._forkserver: ForkServer | None = None
        #: A supervisor forked ahead by the caller, for the next call (use_launcher).
        self._ready: Launcher | None = None
        self._guard = threading.Lock()

    def __enter__(self) -> Trial:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the fork server (after the calls it started have ended); a signed trial that exists
        then gets its statement (`attest`). The trial itself stays as it is, and may be called again."""
        with self._guard:
            server, self._forkserver = self._forkserver, None
        try:
            if server is not None:
                server.close()
            seam.settle()
        finally:
            if self.ledger.signing_key is not None and os.path.lexists(self.ledger.state_path):
                self.attest("close")

    @property
    def statement_path(self) -> str:
        """Where a signed trial's statement is written: beside its log."""
        from ..ledger import statement_path

        return os.path.abspath(statement_path(self.ledger.log_path))

    def attest(self, signed_on: str = "attest") -> Attestation:
        """Sign the trial's statement now (a signed trial, with its key) and write it beside the log.

        StateError if the trial fails its check: nothing is signed then.
        """
        path, digest, state = self.ledger.attest(signed_on)
        assert state.signer is not None  # the ledger signs only a signed trial
        self.attestation = Attestation(os.path.abspath(path), digest, state.signer, state.log.records)
        return self.attestation

    def init(self) -> TrialState:
        """Create the trial (and its missing directories) and pin its limits; an existing one is fine if they match."""
        return self.ledger.open(self.settings, create_directories=True)

    def open(self) -> Budget:
        """Create the trial if it does not exist yet, else check its pinned limits (LimitMismatch); its budget."""
        return budget.of(self.ledger.open(self.settings))

    def status(self) -> TrialState:
        """The trial's state now."""
        return self.ledger.status()

    def settle_request(self, request_id: str) -> tuple[dict[str, Any] | None, Budget]:
        """What became of the call a caller named `request_id`, once the process running it died.

        Calls that process left in flight are recorded abandoned first (the ledger's recovery),
        so the answer is final: the call's last record, or None if it was never charged; and the
        budget now.
        """
        record, state = self.ledger.settle_request(request_id)
        return record, budget.of(state)

    def budget(self) -> Budget:
        """What the trial has used and has left now (all of it, if it does not exist yet; nothing is created)."""
        try:
            return budget.of(self.ledger.status())
        except StateError:
            if os.path.lexists(self.ledger.state_path):
                raise
            return budget.fresh(self.settings.limits)

    async def arun(self, command: Command, **options: Any) -> CallResult:
        """`run` for asyncio (`acall`)."""
        return await self.acall(CallRequest.of(command, **options))

    async def acall(self, request: CallRequest) -> CallResult:
        """`call` for asyncio: the call runs in the loop's default executor.

        Cancelling the awaiting task stops the command (status `interrupted`,
        recorded and charged like any call that ran) before CancelledError goes on.
        """
        import asyncio
        import functools

        from ..process import Cancellation

        cancellation = Cancellation()
        future = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.call, request, interrupt=cancellation)
        )
        # The pipe is closed only once the thread is done with it.
        future.add_done_callback(lambda _: cancellation.close())
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancellation.cancel()
            # Wait for the call to be recorded; ignore its own outcome, the cancellation is the answer.
            await asyncio.wait([future])
            raise

    async def acall_elsewhere(self, request: CallRequest, run: Runner, *, one_at_a_time: bool = False) -> CallResult:
        """A call the harness runs in a sandbox of its own (inspect's docker or k8s, say), budgeted here.

        Reserved and charged as any call (`one_at_a_time`: after the trial's calls in flight); `run(seconds,
        max_bytes)` runs it, stopped at the deadline; what it gives back (`Ran`) is clipped, recorded, committed.
        """
        import asyncio
        import functools

        checks = self._preflight.for_call(request, None)
        options: dict[str, Any] = {"preflight": checks, "timeout": request.timeout}
        if one_at_a_time and not request.grading:
            options["one_at_a_time"] = lambda state: True
        reserve = functools.partial(self.ledger.reserve_grading if request.grading else self.ledger.reserve, **options)
        reservation = await asyncio.to_thread(reserve, self.settings, list(request.argv))
        started_wall, started = time.time(), time.monotonic()
        try:
            ran = await run(reservation.run_seconds, reservation.limits.max_capture_bytes)
        except BaseException:
            self.ledger.abandon(reservation.sequence)  # the next reservation records it as abandoned
            raise
        outcome = delivery.outcome_of(ran, time.monotonic() - started, reservation.limits.max_capture_bytes)
        where = Placed(True, elsewhere=dict(ran.where))
        return await asyncio.to_thread(self._finish, reservation, request, outcome, started_wall, None, where)

    async def abudget(self) -> Budget:
        """`budget` for asyncio."""
        import asyncio

        return await asyncio.to_thread(self.budget)

    def run(self, command: Command, *, interrupt: Interrupt | None = None, **options: Any) -> CallResult:
        """Run one budgeted call; BudgetExhausted (logged) if a budget is spent.

        `command` is an argv list, or a string run by /bin/sh -c; `options` are
        CallRequest.of's (`cwd`, `env`, `unset_env`, `clean_env`, `timeout`,
        `input`, `merge_output`, `environ`, `umask`, `rlimits`, `read_only`,
        `caller_imports`, `grading`, `final`, `reply`: types/_call.py says what each does).
        TRIALTOOL_* variables never reach the command. `interrupt` stops the
        command when it fires (status `interrupted`).
        """
        return self.call(CallRequest.of(command, **options), interrupt=interrupt)

    def call(self, request: CallRequest, *, interrupt: Interrupt | None = None) -> CallResult:
        """Run the call `request` asks for (types/_call.py says what each of its fields does); as `run`."""
        with self._guard:
            ready, self._ready = self._ready, None
        # The fork server's supervisors do not share our working directory: a call through
        # it names one; a supervisor forked by the caller (the CLI's) runs where it is.
        if request.cwd is None and ready is None:
            request = request._replace(cwd=current_directory())
        # Built (and a TRIALTOOL_* variable refused) before anything is charged.
        env = environment.build(
            base=request.environ, clean=request.clean_env, set_vars=request.env, unset=request.unset_env
        )
        self.ledger.directories()
        # The supervisor is forked first and gets ready while the call is reserved.
        with nullcontext(ready) if ready is not None else Launcher(self.ledger.directory, self._server()) as launcher:
            outcome, reservation, started_wall, placed = self._reserve_and_run(request, env, interrupt, launcher)
        try:
            return self._finish(reservation, request, outcome, started_wall, interrupt, placed)
        except BaseException:
            # Not committed (a disk error, say): the call stays charged, and the next
            # reservation, in this process or another, records it as abandoned.
            self.ledger.abandon(reservation.sequence)
            raise

    def _server(self) -> ForkServer:
        """The fork server of this trial's supervisors, started on the first call."""
        if self._shared_forkserver is not None:
            return self._shared_forkserver
        with self._guard:
            if self._forkserver is None:
                from ..process import ForkServer  # a socket module's import: only when a fork server is wanted

                self._forkserver = ForkServer()
                # A Trial dropped without close() still stops its server (at the
                # latest when the interpreter exits).
                weakref.finalize(self, self._forkserver.close)
            return self._forkserver

    def _reserve_and_run(
        self, request: CallRequest, env: dict[str, str], interrupt: Interrupt | None, launcher: Launcher
    ) -> tuple[Outcome, Reservation, float, Placed]:
        def cancelled() -> None:
            if interrupt is not None and interrupt.signum is not None:
                msg = f"{interrupt.reason} before the call started; nothing ran and nothing is charged"
                raise Interrupted(msg, interrupt.signum)

        checks = self._preflight.for_call(request, launcher)

        self._preflight.ahead()  # a probe's few ms overlap the reservation
        settings = self.settings if request.environ is None else self.settings.for_caller(request.environ)
        argv = list(request.argv)
        if request.grading:
            reservation = self.ledger.reserve_grading(
                settings, argv, preflight=checks, timeout=request.timeout, merged=request.merge_output
            )
        else:
            reservation = self.ledger.reserve(
                settings,
                argv,
                preflight=checks,
                supervisor=launcher.pid,
                cancelled=cancelled,
                one_at_a_time=self._preflight.one_at_a_time,
                timeout=request.timeout,
                final=request.final,
                merged=request.merge_output,
                request_id=request.request_id,
            )
        started_wall = time.time()
        started = time.monotonic()
        try:
            spec = checks.spec(env, started, started + reservation.run_seconds, reservation.limits)
            outcome = launcher.run(spec, None if interrupt is None else interrupt.fd)
        except TrialToolError as exc:
            self._commit_failure(reservation, delivery.failed(reservation, request, started_wall, exc.message))
            raise
        except BaseException:
            # KeyboardInterrupt in a harness, say: the supervisor has stopped the tree;
            # the call stays charged, and the next reservation records it as abandoned
            # (this process lives on, so nothing else would).
            self.ledger.abandon(reservation.sequence)
            raise
        return outcome, reservation, started_wall, checks.placed()

    def _commit_failure(self, reservation: Reservation, record: records.CallRecord) -> None:
        """Record a call that trial-tool itself failed to run; it stays charged."""
        try:
            if reservation.sequence == 0:  # a grading command (Ledger.reserve_grading)
                self.ledger.commit_grading(reservation, record)
            else:
                self.ledger.commit(reservation, record)
        except TrialToolError:
            # The original failure is the one to report; the call stays charged and in
            # flight, and the next reservation records it as abandoned.
            self.ledger.abandon(reservation.sequence)

    def _finish(
        self,
        reservation: Reservation,
        request: CallRequest,
        outcome: Outcome,
        started_wall: float,
        interrupt: Interrupt | None,
        placed: Placed,
    ) -> CallResult:
        rank_path = self._preflight.rank_path
        assert rank_path is not None  # set by the reservation's preflight
        settle = functools.partial(
            delivery.settle, outcome, reservation, request, interrupt, rank_path, started_wall, placed.sandboxed
        )
        (out, err, status, record), code = settle()
        hand_over = getattr(interrupt, "hand_over", None)
        if hand_over is not None and not hand_over(out.text, err.text):
            # A caller that takes the output before the call is committed (the per-user server's CLI)
            # went away without it: nothing was delivered, and the record must not say otherwise.
            (out, err, status, record), code = settle(withheld=True)
        if placed.container is not None:
            record["container"] = placed.container
        if placed.elsewhere is not None:
            record["elsewhere"] = placed.elsewhere
        if reservation.sequence == 0:  # a grading command (Ledger.reserve_grading)
            state = self.ledger.commit_grading(reservation, record)
        else:
            state = self.ledger.commit(reservation, record)
        return CallResult(
            sequence=reservation.sequence,
            status=status,
            exit_code=code,
            stdout=out.text,
            stderr=err.text,
            delivered_tokens=out.tokens + err.tokens,
            allowance=reservation.allowance,
            output_truncated=out.clipped or err.clipped,
            record=dict(record),
            budget=budget.of(state),
            head=state.log.head,
        )


def use_launcher(trial: Trial, launcher: Launcher) -> None:
    """Give `trial` a supervisor forked ahead of time, for its next call only.

    The CLI forks its supervisor before it imports this module, so that the
    supervisor gets ready while the rest loads; the call then runs in the
    launcher's working directory unless it names one.
    """
    with trial._guard:
        trial._ready = launcher


__all__ = ["Attestation", "CallResult", "Trial", "stop_leftovers", "use_launcher"]
