"""verdict.judge, case by case: what each way a command can end is called, and what the CLI exits with."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from trialtool.process._capture import EMPTY_SHA256
from trialtool.process._orders import Report
from trialtool.process._outcome import Outcome
from trialtool.trial._verdict import judge
from trialtool.types._limits import Limits

LIMITS = Limits(max_capture_bytes=100, max_procs=8, max_memory=1 << 30, max_cpu_seconds=2, max_file_size=1000)


def outcome(ended: str = "exited", exit_code: int | None = 0, sig: int | None = None, **fields: Any) -> Outcome:
    """An Outcome as the supervisor would report it: `sig` as minus its number, the streams' sizes as given."""
    sizes = fields.pop("stdout_bytes", 0), fields.pop("stderr_bytes", 0)
    streams = ((sizes[0], EMPTY_SHA256), (sizes[1], EMPTY_SHA256))
    code = -sig if sig is not None else exit_code
    return Outcome(b"", b"", Report(ended, code, 0.1, streams=streams, **fields))


class Stop:
    """An Interrupt that has fired."""

    fd = -1
    signum = signal.SIGTERM
    reason = "trial-tool received SIGTERM"


CASES = [
    # (name, outcome, interrupt, deadline kind, expected status, expected exit code, a word of the notice)
    ("exit 0", outcome(), None, "call", "ok", 0, None),
    ("exit 3", outcome(exit_code=3), None, "call", "error", 3, None),
    ("killed by a signal of its own", outcome(exit_code=None, sig=signal.SIGSEGV), None, "call", "error", 139, None),
    ("not found", outcome("not_found", None, error="No such file"), None, "call", "command_error", 127, "not found"),
    ("not executable", outcome("not_executable", None, error="denied"), None, "call", "command_error", 126, "execute"),
    ("interrupted", outcome("interrupted", None, signal.SIGTERM), Stop(), "call", "interrupted", 143, "SIGTERM"),
    ("call deadline", outcome("deadline", None, signal.SIGTERM), None, "call", "timeout", 124, "--call-timeout"),
    ("trial deadline", outcome("deadline", None, signal.SIGTERM), None, "trial", "timeout", 124, "--trial-timeout"),
    ("request deadline", outcome("deadline", None, signal.SIGTERM), None, "request", "timeout", 124, "call's timeout"),
    (
        "deadline after the process cap refused forks",
        outcome("deadline", None, signal.SIGTERM, process_cap_hit=True),
        None,
        "call",
        "process_limit",
        124,
        "--max-procs",
    ),
    (
        "stdout over the capture cap",
        outcome("output_limit", None, signal.SIGTERM, stdout_bytes=101),
        None,
        "call",
        "output_limit",
        124,
        "stdout passed 100 bytes",
    ),
    (
        "stderr over the capture cap",
        outcome("output_limit", None, signal.SIGTERM, stderr_bytes=101),
        None,
        "call",
        "output_limit",
        124,
        "stderr passed",
    ),
    (
        "process sweep",
        outcome("process_limit", None, signal.SIGKILL),
        None,
        "call",
        "process_limit",
        124,
        "8 processes",
    ),
    (
        "out of memory",
        outcome(exit_code=None, sig=signal.SIGKILL, oom_kills=1),
        None,
        "call",
        "memory_limit",
        137,
        "memory",
    ),
    ("SIGXCPU", outcome(exit_code=None, sig=signal.SIGXCPU), None, "call", "cpu_limit", 128 + signal.SIGXCPU, "CPU"),
    (
        "SIGKILL at the hard CPU limit",
        outcome(exit_code=None, sig=signal.SIGKILL, cpu_user=2.5),
        None,
        "call",
        "cpu_limit",
        137,
        "CPU",
    ),
    (
        "a shell reporting SIGXFSZ",
        outcome(exit_code=128 + signal.SIGXFSZ),
        None,
        "call",
        "file_size_limit",
        153,
        "file",
    ),
    ("exit 0 but forks refused", outcome(process_cap_hit=True), None, "call", "process_limit", 0, "cap of 8"),
    ("exited, stream past the cap", outcome(exit_code=0, stdout_bytes=500), None, "call", "output_limit", 0, None),
]


@pytest.mark.parametrize(
    ("given", "interrupt", "kind", "status", "code", "word"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_judge(given: Outcome, interrupt: Any, kind: str, status: str, code: int, word: str | None) -> None:
    got_status, got_code, notice = judge(
        given, LIMITS, ["cmd"], run_seconds=5.0, deadline_kind=kind, interrupt=interrupt
    )
    assert (got_status, got_code) == (status, code)
    if word is None:
        assert notice == ""
    else:
        assert word in notice and notice.startswith(("trial-tool", "[trial-tool"))


def test_a_sigkill_without_a_cpu_limit_is_the_commands_own_error() -> None:
    plain = Limits()
    assert judge(
        outcome(exit_code=None, sig=signal.SIGKILL, cpu_user=99.0), plain, ["x"], run_seconds=1, deadline_kind="call"
    )[:2] == (
        "error",
        137,
    )
