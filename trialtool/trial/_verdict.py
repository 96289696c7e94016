"""A call's verdict: its status word, the exit code to report, and trial-tool's notice for the agent.

A pure decision over what running the command produced; tests/test_verdict.py
lists its cases as a table.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_TIMEOUT
from ..osio import shown
from ..types import FLAG_OF

if TYPE_CHECKING:
    from ..process import Outcome
    from ..types import Interrupt, Limits


def judge(
    outcome: Outcome,
    limits: Limits,
    argv: list[str],
    *,
    run_seconds: float,
    deadline_kind: str,
    interrupt: Interrupt | None = None,
) -> tuple[str, int, str]:
    """The call's status, the exit code to report, and trial-tool's notice for the agent (or "").

    124 means trial-tool stopped the command (deadline, output cap, process-cap
    sweep); a command the kernel stopped at a limit keeps its own code (128 + signal).
    `deadline_kind` says which limit set the deadline: "call", "trial" or "request".
    """
    stdout_cut = outcome.stdout_bytes > limits.max_capture_bytes
    stderr_cut = outcome.stderr_bytes > limits.max_capture_bytes
    ended = outcome.report.ended
    if ended == "not_found":
        return "command_error", EXIT_NOT_FOUND, f"trial-tool: {shown(argv[0])}: command not found\n"
    if ended == "not_executable":
        message = f"trial-tool: {shown(argv[0])}: cannot execute: {outcome.report.error}\n"
        return "command_error", EXIT_NOT_EXECUTABLE, message
    if ended == "interrupted":
        sig = (interrupt.signum if interrupt is not None else None) or signal.SIGINT
        reason = interrupt.reason if interrupt is not None else "trial-tool was told to stop"
        return "interrupted", 128 + sig, f"[trial-tool: stopped: {reason}]\n"
    if ended == "deadline":
        flag = {"call": FLAG_OF["call_timeout"], "trial": FLAG_OF["trial_timeout"]}.get(
            deadline_kind, "the call's timeout"
        )
        what = f"stopped at the {run_seconds:.3g} s {deadline_kind} deadline ({flag})"
        if outcome.report.process_cap_hit:
            # The cap refused its forks and it waited on until the deadline: the cap is the cause.
            what += f" after hitting the cap of {limits.max_procs} processes ({FLAG_OF['max_procs']})"
            return "process_limit", EXIT_TIMEOUT, f"[trial-tool: {what}]\n"
        return "timeout", EXIT_TIMEOUT, f"[trial-tool: {what}]\n"
    if ended == "output_limit":
        stream = "stdout" if stdout_cut else "stderr"
        what = f"stopped: {stream} passed {limits.max_capture_bytes} bytes ({FLAG_OF['max_capture_bytes']})"
        return "output_limit", EXIT_TIMEOUT, f"[trial-tool: {what}]\n"
    if ended == "process_limit":
        what = f"stopped: more than {limits.max_procs} processes ({FLAG_OF['max_procs']})"
        return "process_limit", EXIT_TIMEOUT, f"[trial-tool: {what}]\n"
    return _exited(outcome, limits, stdout_cut or stderr_cut)


def _exited(outcome: Outcome, limits: Limits, capture_cut: bool) -> tuple[str, int, str]:
    """The verdict on a command that ended by itself or by the kernel's hand: its own code, and why."""
    code = 128 + outcome.signal if outcome.signal is not None else (outcome.exit_code or 0)
    cpu_used = outcome.report.cpu_user + outcome.report.cpu_system

    def died_of(sig: int) -> bool:
        # Killed by it, or a shell reporting a child killed by it (128 + N): tool calls are mostly `sh -c`.
        return code == 128 + sig

    if outcome.report.oom_kills:
        what = f"killed: out of memory at {limits.max_memory} bytes ({FLAG_OF['max_memory']})"
        return "memory_limit", code, f"[trial-tool: {what}]\n"
    if limits.max_cpu_seconds and (
        died_of(signal.SIGXCPU) or (died_of(signal.SIGKILL) and cpu_used >= limits.max_cpu_seconds)
    ):
        what = f"killed: {limits.max_cpu_seconds:g} CPU seconds used ({FLAG_OF['max_cpu_seconds']})"
        return "cpu_limit", code, f"[trial-tool: {what}]\n"
    if limits.max_file_size and died_of(signal.SIGXFSZ):
        what = f"killed: a file passed {limits.max_file_size} bytes ({FLAG_OF['max_file_size']})"
        return "file_size_limit", code, f"[trial-tool: {what}]\n"
    if outcome.report.process_cap_hit:
        what = f"the command hit the cap of {limits.max_procs} processes ({FLAG_OF['max_procs']})"
        return "process_limit", code, f"[trial-tool: {what}]\n"
    if capture_cut:
        return "output_limit", code, ""
    return ("ok" if code == 0 else "error"), code, ""


#: Where a path on the host is not what a sandboxed command sees there: the sandbox has /tmp of its own.
_OWN_IN_SANDBOX = ("/tmp/", "/var/tmp/", "/dev/shm/")
_PATHS = re.compile(r"(?:/tmp|/var/tmp|/dev/shm)/[^\s:'\"`]+")


def after_delivery(status: str, clipped: bool) -> str:
    """The call's status once its output is delivered: "truncated" when an "ok" call's text was clipped."""
    return "truncated" if clipped and status == "ok" else status


def hidden_path_notice(argv: list[str], stderr: bytes, exists: Callable[[str], bool]) -> str:
    """A sandboxed command not found (127): a line naming the host path it ran into that the sandbox hides.

    The program named (or a path the shell's own complaint names) lies in the host's
    /tmp, /var/tmp or /dev/shm, which the sandbox replaces with its own; `exists` says
    it is there on the host. "" when nothing explains it so.
    """
    named = [argv[0]] if argv and argv[0].startswith(_OWN_IN_SANDBOX) else []
    named += _PATHS.findall(stderr[-4096:].decode("utf-8", "replace"))
    for path in named:
        if exists(path):
            where = next(root.rstrip("/") for root in _OWN_IN_SANDBOX if path.startswith(root))
            return (
                f"[trial-tool: {shown(path)} is on the host's {where}, which the sandbox does not show (it has a "
                f"{where} of its own): keep it in the workspace, or name its directory with --writable]\n"
            )
    return ""


__all__ = ["after_delivery", "hidden_path_notice", "judge"]
