"""What running one command produced (`Outcome`), read back from the supervisor's report and the spools."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from ..errors import StorageError
from ._capture import EMPTY_SHA256
from ._orders import Report


class Outcome(NamedTuple):
    """What running a command produced."""

    stdout: bytes
    stderr: bytes
    #: Bytes the command wrote to each stream, kept or not.
    stdout_bytes: int
    stderr_bytes: int
    stdout_sha256: str
    stderr_sha256: str
    #: exited, deadline, output_limit, interrupted, process_limit, not_found, not_executable.
    ended: str
    #: The command's exit status when it exited by itself.
    exit_code: int | None
    #: The signal that ended the command, if one did (ours or not).
    signal: int | None
    #: Seconds on the monotonic clock from start to the command's end.
    elapsed: float
    #: Why the command could not start (not_found, not_executable).
    error: str | None = None
    #: The last signal trial-tool sent the tree to stop it (SIGTERM, SIGKILL), if any.
    stop_signal: int | None = None
    #: Seconds between the deadline and the SIGTERM sent for it, and the command's exit.
    deadline_overshoot: float | None = None
    exited_after_deadline: float | None = None
    #: Processes still alive after the command ended, and killed then.
    killed: int = 0
    #: Processes that could not be killed (should be empty).
    survivors: tuple[int, ...] = ()
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_rss: int = 0
    peak_rss_scope: str = "largest_process"
    oom_kills: int = 0
    process_cap_hit: bool = False
    #: Which mechanism enforced what (cgroup2, cgroup1, sweep, rlimit_as, subreaper).
    containment: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    #: Network "allow": the connections the call's proxy allowed and denied (_proxy.Proxy.finish).
    network: dict[str, Any] | None = None


#: What an Outcome takes from the supervisor's Report as it is: the fields the two share, by name.
_SHARED = tuple(name for name in Outcome._fields if name in Report._fields)


def outcome(report: Report, spools: tuple[int, int], cap: int) -> Outcome:
    """The supervisor's report as an Outcome, the captured bytes read from the spools."""
    shared = {name: getattr(report, name) for name in _SHARED}
    if report.ended in ("not_found", "not_executable"):
        empty = EMPTY_SHA256
        return Outcome(b"", b"", 0, 0, empty, empty, exit_code=None, signal=None, **{**shared, "elapsed": 0.0})
    (out_total, out_sha), (err_total, err_sha) = report.streams
    try:
        stdout = os.pread(spools[0], min(out_total, cap), 0) if out_total else b""
        stderr = os.pread(spools[1], min(err_total, cap), 0) if err_total else b""
    except OSError as exc:
        msg = f"cannot read the output spool: {exc}"
        raise StorageError(msg) from exc
    code = report.returncode
    return Outcome(
        stdout,
        stderr,
        out_total,
        err_total,
        out_sha,
        err_sha,
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        **shared,
    )


__all__ = ["Outcome", "outcome"]
