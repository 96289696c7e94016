"""`Trial`: the one place policy lives. Reserve a call, run it, clip its output, commit it."""

from __future__ import annotations

import base64
import codecs
import hashlib
import math
import os
import threading
import time
import weakref
from typing import Any

from . import budget, clipping, clock, environment, process, records, tokens, verdict
from .budget import Budget
from .callresult import CallResult, Interrupt, command_argv
from .errors import (
    Interrupted,
    StateError,
    TrialToolError,
    UsageError,
)
from .forkserver import ForkServer
from .launcher import Launcher
from .ledger import DEFAULT_LOCK_TIMEOUT, Ledger, Reservation
from .limits import from_overrides


def _decode(data: bytes, cut_at_cap: bool) -> str:
    """UTF-8 with replacement; a sequence cut by the capture cap is dropped, not replaced.

    A command's own invalid bytes become U+FFFD (they are what it printed); half a
    character that only our cap cut off would be a character it never printed.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(data, final=not cut_at_cap)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Trial:
    """A trial: its state and log, its limits, and the runs of its calls.

    `limits` are the values passed for this use; at creation they are pinned,
    afterwards any that differ from the pinned ones make every call fail.

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
    ) -> None:
        self.ledger = Ledger(state_path, log_path, lock_timeout=lock_timeout, key=key)
        self.overrides = dict(limits or {})
        self._rank_file = rank_file
        self._rank_path: str | None = None
        self._forkserver: ForkServer | None = None
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

    def init(self) -> dict[str, Any]:
        """Create the trial and pin its limits."""
        return self.ledger.init(self.overrides)

    def open(self) -> Budget:
        """Create the trial if it does not exist yet, else check its pinned limits (LimitMismatch); its budget."""
        return budget.of(self.ledger.open(self.overrides))

    def status(self) -> dict[str, Any]:
        """The trial's state now."""
        return self.ledger.status()

    def budget(self) -> Budget:
        """What the trial has used and has left now (all of it, if it does not exist yet; nothing is created)."""
        try:
            return budget.of(self.ledger.status())
        except StateError:
            if os.path.lexists(self.ledger.state_path):
                raise
            return budget.fresh(from_overrides(self.overrides))

    async def arun(self, command: list[str] | tuple[str, ...] | str, **options: Any) -> CallResult:
        """`run` for asyncio: the call runs in the loop's default executor.

        Cancelling the awaiting task stops the command (status `interrupted`,
        recorded and charged like any call that ran) before CancelledError goes on.
        """
        import asyncio
        import functools

        from .interrupts import Cancellation

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

    def _check_rank_file(self, state: dict[str, Any]) -> None:
        """Reservation preflight: the rank file is there and has the right hash, or nothing is charged.

        Hashing 3.6 MB costs ~5 ms, so a file verified before is recognised by its
        stamp (tokens.stamp), kept in the state; a changed file is hashed again.
        """
        path = self._rank_path = tokens.locate(self._rank_file)
        seen = {"path": str(path), "stamp": tokens.stamp(path)}
        if state.get("rank_file") != seen:
            tokens.verified(path, recheck=True)
            state["rank_file"] = seen

    def run(
        self,
        command: list[str] | tuple[str, ...] | str,
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        unset_env: tuple[str, ...] = (),
        clean_env: bool = False,
        interrupt: Interrupt | None = None,
        launcher: Launcher | None = None,
    ) -> CallResult:
        """Run one budgeted call; BudgetExhausted (logged) if a budget is spent.

        `command` is an argv list, or a string run by /bin/sh -c. `cwd` defaults to
        the caller's working directory at the time of the call. `env` adds or
        replaces variables, `unset_env` removes them, `clean_env` starts from a
        minimal set; TRIALTOOL_* variables never reach the command. `timeout`
        (seconds) shortens this call's deadline below the trial's `call_timeout`,
        never lengthens it. `interrupt` stops the command when it fires (status
        `interrupted`). `launcher` is a supervisor forked earlier by the caller
        (the CLI forks one before importing this module); else the fork server
        provides one.
        """
        argv = command_argv(command)
        if timeout is not None and not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            msg = f"timeout must be a positive number of seconds, not {timeout!r}"
            raise UsageError(msg)
        if cwd is None and launcher is None:
            # The fork server's supervisors do not share our working directory: name it.
            try:
                cwd = os.getcwd()
            except OSError as exc:
                msg = f"the current directory is gone ({exc.strerror}); pass cwd"
                raise UsageError(msg) from exc
        elif cwd is not None and not os.path.isdir(cwd):
            msg = f"--cwd {os.fspath(cwd)} is not a directory"
            raise UsageError(msg)
        command_env = environment.build(clean=clean_env, set_vars=env, unset=unset_env)
        self.ledger.ensure_directory()
        if launcher is not None:
            outcome, reservation, started_wall = self._reserve_and_run(
                argv, cwd, command_env, timeout, interrupt, launcher
            )
        else:
            with self._guard:
                if self._forkserver is None:
                    self._forkserver = ForkServer()
                    # A Trial dropped without close() still stops its server (at the
                    # latest when the interpreter exits).
                    weakref.finalize(self, self._forkserver.close)
                server = self._forkserver
            # The supervisor is forked first and gets ready while the call is reserved.
            with Launcher(self.ledger.directory, server) as own:
                outcome, reservation, started_wall = self._reserve_and_run(
                    argv, cwd, command_env, timeout, interrupt, own
                )
        try:
            return self._finish(reservation, argv, outcome, started_wall, interrupt)
        except BaseException:
            # Not committed (a disk error, say): the call stays charged, and the next
            # reservation, in this process or another, records it as abandoned.
            self.ledger.abandon(reservation.sequence)
            raise

    def _reserve_and_run(
        self,
        argv: list[str],
        cwd: str | os.PathLike[str] | None,
        command_env: dict[str, str],
        timeout: float | None,
        interrupt: Interrupt | None,
        launcher: Launcher,
    ) -> tuple[process.Outcome, Reservation, float]:
        def cancelled() -> None:
            if interrupt is not None and interrupt.signum is not None:
                msg = f"{interrupt.reason} before the call started; nothing ran and nothing is charged"
                raise Interrupted(msg, interrupt.signum)

        reservation = self.ledger.reserve(
            self.overrides, argv, preflight=self._check_rank_file, supervisor=launcher.pid, cancelled=cancelled
        )
        if timeout is not None and timeout < reservation.run_seconds:
            reservation = reservation._replace(run_seconds=float(timeout), deadline_kind="request")
        limits = reservation.limits
        started_wall = time.time()
        deadline = time.monotonic() + reservation.run_seconds
        try:
            outcome = launcher.run(
                argv,
                deadline=deadline,
                capture_cap=limits.max_capture_bytes,
                kill_grace=limits.kill_grace,
                cwd=None if cwd is None else os.fspath(cwd),
                env=command_env,
                resources=process.Resources(
                    max_memory=limits.max_memory,
                    max_cpu_seconds=limits.max_cpu_seconds,
                    max_file_size=limits.max_file_size,
                    max_open_files=limits.max_open_files,
                    max_procs=limits.max_procs,
                ),
                interrupt_fd=None if interrupt is None else interrupt.fd,
            )
        except TrialToolError as exc:
            self._commit_failure(reservation, argv, started_wall, exc)
            raise
        except BaseException:
            # KeyboardInterrupt in a harness, say: the supervisor has stopped the tree;
            # the call stays charged, and the next reservation records it as abandoned
            # (this process lives on, so nothing else would).
            self.ledger.abandon(reservation.sequence)
            raise
        return outcome, reservation, started_wall

    def _commit_failure(
        self, reservation: Reservation, argv: list[str], started_wall: float, exc: TrialToolError
    ) -> None:
        """Record a call that trial-tool itself failed to run; it stays charged."""
        record = records.call(
            trial_id=reservation.trial_id,
            sequence=reservation.sequence,
            command=argv,
            status="trial_tool_error",
            error=exc.message,
            started_at_utc=clock.utc(started_wall),
            ended_at_utc=clock.utc(time.time()),
            allowance_tokens=reservation.allowance,
            delivered_emitted_tokens=0,
            complete_delivery=False,
            token_cost_censored=True,
        )
        try:
            self.ledger.commit(reservation, record)
        except TrialToolError:
            # The original failure is the one to report; the call stays charged and in
            # flight, and the next reservation records it as abandoned.
            self.ledger.abandon(reservation.sequence)

    def _finish(
        self,
        reservation: Reservation,
        argv: list[str],
        outcome: process.Outcome,
        started_wall: float,
        interrupt: Interrupt | None,
    ) -> CallResult:
        limits = reservation.limits
        stdout_cut = outcome.stdout_bytes > limits.max_capture_bytes
        stderr_cut = outcome.stderr_bytes > limits.max_capture_bytes
        status, exit_code, notice = verdict.judge(outcome, reservation, argv, stdout_cut, stderr_cut, interrupt)
        stdout_text = _decode(outcome.stdout, stdout_cut)
        stderr_text = _decode(outcome.stderr, stderr_cut)
        if stdout_text or stderr_text or notice:
            assert self._rank_path is not None  # set by the reservation's preflight
            encoder = tokens.verified(self._rank_path).encoder()
            out, err = clipping.deliver(encoder, stdout_text, stderr_text, reservation.allowance, limits.clip, notice)
        else:
            # Nothing printed: nothing to count, and the encoder is never built.
            out = err = clipping.StreamDelivery("", 0, 0, False)
        clipped = out.clipped or err.clipped
        if clipped and status == "ok":
            status = "truncated"
        ran_to_end = outcome.ended == "exited"
        delivered = out.tokens + err.tokens
        record = records.call(
            trial_id=reservation.trial_id,
            sequence=reservation.sequence,
            command=argv,
            status=status,
            complete_delivery=ran_to_end and not (clipped or stdout_cut or stderr_cut),
            stdout_b64=base64.b64encode(outcome.stdout).decode("ascii"),
            stderr_b64=base64.b64encode(outcome.stderr).decode("ascii"),
            stdout_bytes=outcome.stdout_bytes,
            stderr_bytes=outcome.stderr_bytes,
            stdout_sha256=outcome.stdout_sha256,
            stderr_sha256=outcome.stderr_sha256,
            stdout_capture_truncated=stdout_cut,
            stderr_capture_truncated=stderr_cut,
            delivered_stdout_bytes=len(out.text.encode("utf-8")),
            delivered_stderr_bytes=len(err.text.encode("utf-8")),
            delivered_stdout_sha256=_sha256(out.text),
            delivered_stderr_sha256=_sha256(err.text),
            observed_stdout_tokens=out.observed_tokens,
            observed_stderr_tokens=err.observed_tokens,
            observed_emitted_tokens=out.observed_tokens + err.observed_tokens,
            delivered_stdout_tokens=out.tokens,
            delivered_stderr_tokens=err.tokens,
            delivered_emitted_tokens=delivered,
            allowance_tokens=reservation.allowance,
            clip=limits.clip,
            tokenizer=tokens.ENCODING_NAME,
            token_cost_censored=not ran_to_end or stdout_cut or stderr_cut,
            output_truncated=clipped,
            trial_tool_notice=notice or None,
            elapsed_seconds=outcome.elapsed,
            started_at_utc=clock.utc(started_wall),
            ended_at_utc=clock.utc(time.time()),
            deadline_seconds=reservation.run_seconds,
            deadline_kind=reservation.deadline_kind,
            ended=outcome.ended,
            command_exit_code=outcome.exit_code,
            command_signal=outcome.signal,
            return_code=exit_code,
            error=outcome.error,
            stop_signal=outcome.stop_signal,
            deadline_overshoot_seconds=outcome.deadline_overshoot,
            exited_after_deadline_seconds=outcome.exited_after_deadline,
            processes_killed=outcome.killed,
            processes_surviving=list(outcome.survivors),
            peak_rss_bytes=outcome.peak_rss,
            peak_rss_scope=outcome.peak_rss_scope,
            cpu_user_seconds=outcome.cpu_user,
            cpu_system_seconds=outcome.cpu_system,
            containment=outcome.containment,
        )
        state = self.ledger.commit(reservation, record)
        return CallResult(
            sequence=reservation.sequence,
            status=status,
            exit_code=exit_code,
            stdout=out.text,
            stderr=err.text,
            delivered_tokens=delivered,
            allowance=reservation.allowance,
            output_truncated=clipped,
            record=record,
            budget=budget.of(state),
        )


__all__ = ["CallResult", "Trial"]
