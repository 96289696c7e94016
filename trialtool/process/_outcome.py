"""What running one command produced (`Outcome`), read back from the supervisor's report and the spools."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import StorageError
from ._capture import EMPTY_SHA256
from ._orders import Report


class Outcome(NamedTuple):
    """What running a command produced: the bytes kept of each stream, and the supervisor's report of the rest."""

    stdout: bytes
    stderr: bytes
    #: Everything else the run came to: how it ended, its status, its stops, what it used (process.Report).
    report: Report

    @property
    def stdout_bytes(self) -> int:
        """Bytes the command wrote to stdout, kept or not."""
        return self.report.streams[0][0]

    @property
    def stderr_bytes(self) -> int:
        return self.report.streams[1][0]

    @property
    def stdout_sha256(self) -> str:
        return self.report.streams[0][1]

    @property
    def stderr_sha256(self) -> str:
        return self.report.streams[1][1]

    @property
    def exit_code(self) -> int | None:
        """The command's exit status when it exited by itself (None: it never ran, or a signal ended it)."""
        code = self.report.returncode
        return None if code is None or code < 0 or self.report.ended in _NEVER_RAN else code

    @property
    def signal(self) -> int | None:
        """The signal that ended the command, if one did (ours or not)."""
        code = self.report.returncode
        return -code if code is not None and code < 0 and self.report.ended not in _NEVER_RAN else None


#: How a command that never started ended.
_NEVER_RAN = ("not_found", "not_executable")


def outcome(report: Report, spools: tuple[int, int], cap: int) -> Outcome:
    """The supervisor's report as an Outcome, the captured bytes read from the spools."""
    if report.ended in _NEVER_RAN:
        empty = (0, EMPTY_SHA256)
        return Outcome(b"", b"", report._replace(elapsed=0.0, streams=(empty, empty)))
    (out_total, _), (err_total, _) = report.streams
    try:
        stdout = os.pread(spools[0], min(out_total, cap), 0) if out_total else b""
        stderr = os.pread(spools[1], min(err_total, cap), 0) if err_total else b""
    except OSError as exc:
        msg = f"cannot read the output spool: {exc}"
        raise StorageError(msg) from exc
    return Outcome(stdout, stderr, report)


__all__ = ["Outcome", "outcome"]
