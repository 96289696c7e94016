"""`Trial`: the one place policy lives. Reserve a call, run it, clip its output, commit it.

The rooms below do the work: the ledger reserves and commits (ledger/), the
process room runs the command as a contained tree (process/), verdict.py and
delivery.py decide what the call was and what the agent gets. This module
holds the order of those steps and what happens when one of them fails.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from . import budget, tokens, verdict
from .budget import Budget
from .call import CallRequest, CallResult, Command, Interrupt, current_directory
from .delivery import deliver
from .errors import EXIT_NOT_FOUND, Interrupted, StateError, StorageError, TrialToolError, UsageError
from .ledger import clock, durable, liveness, records
from .ledger.ledger import DEFAULT_LOCK_TIMEOUT, Ledger, Reservation
from .ledger.state import TrialState
from .limits import from_overrides
from .osio import reserve
from .process import environment
from .process import sandbox as seam
from .process.forkserver import ForkServer
from .process.launcher import Launcher
from .process.orders import Spec
from .process.outcome import Outcome
from .sandbox import Pin, Sandbox


def stop_leftovers(supervisor: int, token: str | None) -> int:
    """Stop what an abandoned call left running; how many processes were killed.

    The supervisor, if it lives on, is told to stop (its parent is gone, so it
    kills the tree and exits), and any cgroup it made is emptied.
    """
    if liveness.alive(supervisor, token):
        try:
            os.kill(supervisor, signal.SIGTERM)
        except ProcessLookupError:
            pass
    from .process.cgroups import kill_leftovers  # a recovery only: cgroups imports pathlib

    return kill_leftovers(supervisor)


class Trial:
    """A trial: its state and log, its limits, and the runs of its calls.

    `limits` are the values passed for this use; at creation they are pinned,
    afterwards any that differ from the pinned ones make every call fail. The
    sandbox settings (`sandbox`, `network`, `workspace`, `writable`) go there
    too (docs/sandbox.md); `hidden_files` names files besides the trial's own
    that its sandboxed commands must not reach, such as the file the key came from.
    `labels` say who the trial is (task, sample, epoch, model): pinned at creation
    like the limits, and shown by every graders' command (ledger/labels.py).

    `run` may be called from several threads at once (and `arun` from several
    asyncio tasks): each call is reserved, run and committed on its own. The
    supervisors come from a fork server started on the first call
    (forkserver.py), so the calling process may have threads; `close()` (or
    leaving a `with` block) stops it, else it ends with the process. The
    encoder is built once per process, on the first output that needs counting.
    """

    def __init__(
        self,
        state_path: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        *,
        limits: dict[str, Any] | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        rank_file: str | os.PathLike[str] | None = None,
        key: bytes | None = None,
        hidden_files: Sequence[str | os.PathLike[str]] = (),
        origin: str | os.PathLike[str] | None = None,
        fork_server: ForkServer | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.ledger = Ledger(
            state_path,
            log_path,
            lock_timeout=lock_timeout,
            key=key,
            stop_leftovers=stop_leftovers,
            sandbox_available=seam.available,
        )
        #: Files a sandboxed command must not reach besides the state, log and lock (a key file).
        self.hidden_files = [os.fspath(path) for path in hidden_files]
        self._plans: dict[Sandbox, seam.Plan] = {}
        self.overrides = dict(limits or {})
        if labels is not None:
            self.overrides["labels"] = dict(labels)
        if origin is not None:
            # Where the trial is created from when its caller is elsewhere (the per-user server).
            self.overrides["origin"] = os.fspath(origin)
        #: A fork server shared with other Trials (the per-user server's), not closed with this one.
        self._shared_forkserver = fork_server
        self._rank_file = rank_file
        self._rank_path: str | None = None
        self._forkserver: ForkServer | None = None
        #: A supervisor forked ahead by the caller, for the next call (use_launcher).
        self._ready: Launcher | None = None
        self._guard = threading.Lock()

    def __enter__(self) -> Trial:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the fork server (after the calls it started have ended). The trial itself stays as it is."""
        with self._guard:
            server, self._forkserver = self._forkserver, None
        if server is not None:
            server.close()
        seam.settle()

    def init(self) -> TrialState:
        """Create the trial (and its missing directories) and pin its limits; an existing one is fine if they match."""
        return self.ledger.open(self.overrides, create_directories=True)

    def open(self) -> Budget:
        """Create the trial if it does not exist yet, else check its pinned limits (LimitMismatch); its budget."""
        return budget.of(self.ledger.open(self.overrides))

    def status(self) -> TrialState:
        """The trial's state now."""
        return self.ledger.status()

    def budget(self) -> Budget:
        """What the trial has used and has left now (all of it, if it does not exist yet; nothing is created)."""
        try:
            return budget.of(self.ledger.status())
        except StateError:
            if os.path.lexists(self.ledger.state_path):
                raise
            return budget.fresh(from_overrides(self.overrides))  # (sandbox settings are not limits)

    async def arun(self, command: Command, **options: Any) -> CallResult:
        """`run` for asyncio: the call runs in the loop's default executor.

        Cancelling the awaiting task stops the command (status `interrupted`,
        recorded and charged like any call that ran) before CancelledError goes on.
        """
        import asyncio
        import functools

        from .process.interrupts import Cancellation

        cancellation = Cancellation()
        future = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.run, command, interrupt=cancellation, **options)
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

    async def abudget(self) -> Budget:
        """`budget` for asyncio."""
        import asyncio

        return await asyncio.to_thread(self.budget)

    def _plan(self, sandbox: Sandbox) -> seam.Plan:
        """The trial's sandbox plan (where its files are hidden), made once per pinned sandbox."""
        plan = self._plans.get(sandbox)
        if plan is None:
            path = self.ledger.state_path
            files = [path, self.ledger.log_path, path + ".lock", *self.hidden_files]
            # The rank file as the reservation's preflight located it (_check_rank_file, which runs first).
            plan = self._plans[sandbox] = seam.Plan(sandbox, path, files, self._rank_path)
        return plan

    def _check_rank_file(self, state: TrialState) -> None:
        """Reservation preflight: the rank file is there and has the right hash, or nothing is charged.

        A file verified before is recognised by its stamp (tokens.stamp), kept in
        the state, rather than hashed on every call; a changed file is hashed again.
        """
        path = self._rank_path = tokens.locate(self._rank_file)
        seen = {"path": str(path), "stamp": tokens.stamp(path)}
        if state.rank_file != seen:
            tokens.verified(path, recheck=True)
            state.rank_file = seen

    def run(self, command: Command, *, interrupt: Interrupt | None = None, **options: Any) -> CallResult:
        """Run one budgeted call; BudgetExhausted (logged) if a budget is spent.

        `command` is an argv list, or a string run by /bin/sh -c; `options` are
        CallRequest.of's (`cwd`, `env`, `unset_env`, `clean_env`, `timeout`,
        `input`, `merge_output`, `environ`, `umask`, `rlimits`, `read_only`,
        `caller_imports`, `grading`, `reply`: call.py says what each does).
        TRIALTOOL_* variables never reach the command. `interrupt` stops the
        command when it fires (status `interrupted`).
        """
        return self.call(CallRequest.of(command, **options), interrupt=interrupt)

    def call(self, request: CallRequest, *, interrupt: Interrupt | None = None) -> CallResult:
        """Run the call `request` asks for; as `run`.

        A `grading` request is the harness's own command, run to grade the agent's
        work (a scorer's test run) in the same sandbox and workspace: never refused,
        never charged, all of its output delivered, and recorded as a grading record
        outside the agent's counters (sequence 0 in the result). A "json-rpc" reply
        is one JSON-RPC response to a program (a harness's tool): the text inside it
        is clipped and charged, and the envelope stays valid JSON (replies.py).
        """
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
            outcome, reservation, started_wall, sandboxed = self._reserve_and_run(request, env, interrupt, launcher)
        try:
            return self._finish(reservation, request, outcome, started_wall, interrupt, sandboxed)
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
                self._forkserver = ForkServer()
                # A Trial dropped without close() still stops its server (at the
                # latest when the interpreter exits).
                weakref.finalize(self, self._forkserver.close)
            return self._forkserver

    def _reserve_and_run(
        self, request: CallRequest, env: dict[str, str], interrupt: Interrupt | None, launcher: Launcher
    ) -> tuple[Outcome, Reservation, float, bool]:
        def cancelled() -> None:
            if interrupt is not None and interrupt.signum is not None:
                msg = f"{interrupt.reason} before the call started; nothing ran and nothing is charged"
                raise Interrupted(msg, interrupt.signum)

        #: The sandbox plan, the trial's /tmp and what the call keeps from the command, when sandboxed.
        sandboxed: list[tuple[seam.Plan, Pin, seam.Layout]] = []

        def preflight(state: TrialState) -> None:
            stdin = request.stdin
            if stdin is not None and len(stdin) > state.limits.max_stdin_bytes:
                msg = (
                    f"the input is {len(stdin)} bytes, over the trial's --max-stdin-bytes "
                    f"{state.limits.max_stdin_bytes}; nothing ran and nothing is charged"
                )
                raise UsageError(msg)
            self._check_rank_file(state)
            _reserve_spools(launcher, state.limits.max_capture_bytes)
            sandboxed.clear()
            if state.sandbox.mode == "none":
                seam.settle()
            else:
                plan = self._plan(state.sandbox)
                cwd = request.cwd or os.getcwd()
                tmp, hide = plan.check(cwd, state.trial_id, request.environ, request.read_only, request.caller_imports)
                # The log must exist before the sandbox starts, to be hidden when it sits in a writable path.
                durable.touch(self.ledger.log_path)
                sandboxed.append((plan, tmp, hide))

        def one_at_a_time(state: TrialState) -> bool:
            return state.sandbox.mode != "none" and self._plan(state.sandbox).layout.exposed

        if self.overrides.get("sandbox") != "none":
            seam.probe_ahead(self.ledger.state_path)  # its few ms overlap the reservation
        overrides = self.overrides
        environ = request.environ
        if environ is not None:
            # The caller's PATH, where a trial created now finds its sandbox (the per-user server's callers).
            overrides = {**overrides, "search_path": environ.get("PATH", ""), "home_path": environ.get("HOME", "")}
        argv = list(request.argv)
        if request.grading:
            reservation = self.ledger.reserve_grading(overrides, argv, preflight=preflight)
        else:
            reservation = self.ledger.reserve(
                overrides,
                argv,
                preflight=preflight,
                supervisor=launcher.pid,
                cancelled=cancelled,
                one_at_a_time=one_at_a_time,
            )
        timeout = request.timeout
        if timeout is not None and timeout < reservation.run_seconds:
            reservation = reservation._replace(run_seconds=timeout, deadline_kind="request")
        started_wall = time.time()
        started = time.monotonic()
        try:
            run_argv, binds = argv, []
            if sandboxed:
                plan, tmp, hide = sandboxed[0]
                cwd = request.cwd or os.getcwd()
                run_argv, pinned = plan.wrap(argv, cwd, tmp, hide, reservation.limits.max_open_files)
                binds = [(index, *pin) for index, pin in pinned]
            spec = Spec(
                run_argv,
                request.cwd,
                env,
                started,
                started + reservation.run_seconds,
                reservation.limits,
                backend=sandboxed[0][0].sandbox.mode if sandboxed else "none",
                umask=request.umask,
                caller_rlimits=request.rlimits or (),
                stdin=request.stdin,
                merge=request.merge_output,
                binds=tuple(binds),
            )
            outcome = launcher.run(spec, None if interrupt is None else interrupt.fd)
        except TrialToolError as exc:
            fields = records.input_fields(request.stdin, request.merge_output)
            self._commit_failure(reservation, argv, started_wall, exc, fields)
            raise
        except BaseException:
            # KeyboardInterrupt in a harness, say: the supervisor has stopped the tree;
            # the call stays charged, and the next reservation records it as abandoned
            # (this process lives on, so nothing else would).
            self.ledger.abandon(reservation.sequence)
            raise
        return outcome, reservation, started_wall, bool(sandboxed)

    def _commit_failure(
        self,
        reservation: Reservation,
        argv: list[str],
        started_wall: float,
        exc: TrialToolError,
        fields: dict[str, Any],
    ) -> None:
        """Record a call that trial-tool itself failed to run; it stays charged."""
        record = records.failed(
            trial_id=reservation.trial_id,
            sequence=reservation.sequence,
            command=argv,
            error=exc.message,
            started_at_utc=clock.utc(started_wall),
            at_utc=clock.utc(time.time()),
            allowance=reservation.allowance,
        )
        record.update(fields)
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
        sandboxed: bool,
    ) -> CallResult:
        argv = list(request.argv)
        judged = verdict.judge(
            outcome,
            reservation.limits,
            argv,
            run_seconds=reservation.run_seconds,
            deadline_kind=reservation.deadline_kind,
            interrupt=interrupt,
        )
        if sandboxed and judged[1] == EXIT_NOT_FOUND:
            # Not found in the sandbox, but there on the host, where the sandbox shows something else.
            hint = verdict.hidden_path_notice(argv, outcome.stderr, os.path.exists)
            judged = (judged[0], judged[1], judged[2] + hint)
        assert self._rank_path is not None  # set by the reservation's preflight
        # A caller that gave up on the call (a cancelled task or request) receives nothing: nothing is charged.
        # An interrupt of the caller's own making, without `delivers`, is taken to deliver.
        withheld = interrupt is not None and interrupt.signum is not None and not getattr(interrupt, "delivers", True)
        out, err, status, record = deliver(
            outcome,
            reservation,
            argv,
            judged,
            self._rank_path,
            started_wall,
            withheld=withheld,
            call_fields=records.input_fields(request.stdin, request.merge_output),
            reply=request.reply,
        )
        if reservation.sequence == 0:  # a grading command (Ledger.reserve_grading)
            state = self.ledger.commit_grading(reservation, record)
        else:
            state = self.ledger.commit(reservation, record)
        return CallResult(
            sequence=reservation.sequence,
            status=status,
            exit_code=judged[1],
            stdout=out.text,
            stderr=err.text,
            delivered_tokens=out.tokens + err.tokens,
            allowance=reservation.allowance,
            output_truncated=out.clipped or err.clipped,
            record=record,
            budget=budget.of(state),
            head=state.log.head,
        )


def _reserve_spools(launcher: Launcher, capture_bytes: int) -> None:
    """Room for each stream's capture, taken before the call is charged: a command that
    fills the disk its spools are on cannot then cut its own capture short."""
    for fd in launcher.spools or ():
        try:
            reserve(fd, 0, capture_bytes)
        except OSError as exc:
            msg = f"cannot reserve {capture_bytes} bytes for the call's output beside the state: {exc.strerror}"
            raise StorageError(msg) from exc


def use_launcher(trial: Trial, launcher: Launcher) -> None:
    """Give `trial` a supervisor forked ahead of time, for its next call only.

    The CLI forks its supervisor before it imports this module, so that the
    supervisor gets ready while the rest loads; the call then runs in the
    launcher's working directory unless it names one.
    """
    with trial._guard:
        trial._ready = launcher


__all__ = ["CallResult", "Trial", "stop_leftovers", "use_launcher"]
