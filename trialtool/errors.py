"""The exception tree: every failure trial-tool reports, its exit code and status.

    TrialToolError                 exit 125, trial-tool's own failure
    ├── UsageError(ValueError)        a bad flag, limit or command line
    │   └── LimitMismatch             a limit differs from the one pinned in the state
    ├── StateError(ValueError)        the state file is corrupt, of an unknown schema,
    │                                 or disagrees with its log
    ├── StorageError(OSError)         a read, write, fsync or replace failed
    ├── LockTimeout(TimeoutError)     the ledger lock was not acquired in time
    ├── EncoderError(RuntimeError)    o200k_base data missing or of the wrong hash
    ├── SandboxError(RuntimeError)    the trial's sandbox cannot be made on this machine
    ├── Interrupted                   SIGINT/SIGTERM/SIGHUP before the call was charged (128+N)
    └── BudgetExhausted               a call refused because a budget is spent (exit 123)

The CLI maps these to exit codes in one place (`exit_code` on each class); the
command's own outcomes (its exit code, 124, 126, 127) are not exceptions.
"""

from __future__ import annotations

#: trial-tool's own failure: bad input, bad state, storage, lock, encoder.
EXIT_INTERNAL = 125
#: A call refused before it ran because calls, tokens or trial time are spent.
EXIT_REFUSED = 123
#: The command was stopped at a deadline or at the output cap (as timeout(1)).
EXIT_TIMEOUT = 124
#: The command was found but could not be executed.
EXIT_NOT_EXECUTABLE = 126
#: The command was not found.
EXIT_NOT_FOUND = 127
#: The JSON-RPC error code of a TrialToolError (serve, `run --json`): a server error of its own range.
ERROR_CODE = -32000


class TrialToolError(Exception):
    """Root of every error trial-tool raises on purpose."""

    exit_code: int = EXIT_INTERNAL
    status: str = "trial_tool_error"

    def __init__(self, message: str) -> None:
        # One line, always: a message may quote what a caller sent, newlines and all.
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        super().__init__(message)
        self.message = message

    def as_json(self) -> dict[str, object]:
        """The error as `serve` and `run --json` report it (a JSON-RPC error object)."""
        data = {"kind": type(self).__name__, "exit_code": self.exit_code, "status": self.status}
        return {"code": ERROR_CODE, "message": self.message, "data": data}

    def __reduce__(self) -> tuple[type[TrialToolError], tuple[str]]:
        # Subclasses with extra fields override this; the default keeps the
        # message so errors survive pickling across process pools.
        return (type(self), (self.message,))


class UsageError(TrialToolError, ValueError):
    """A bad flag, limit value or command line."""

    status = "usage_error"


class LimitMismatch(UsageError):
    """A limit passed on this call differs from the one pinned at creation."""

    status = "limit_mismatch"


class StateError(TrialToolError, ValueError):
    """The state file cannot be trusted: corrupt, unknown schema, or out of step with its log."""

    status = "state_error"


class StorageError(TrialToolError, OSError):
    """A read, write, fsync or replace of the ledger, the log or a spool failed."""

    status = "storage_error"

    @classmethod
    def no_room(cls, what: str, needed: int, directory: str, capture_bytes: int) -> StorageError:
        """The one line for a call that cannot have the room it needs (before anything is charged).

        It says how much `what` needs and where, how much is free there, and the
        setting that makes a call need less: the trial's capture cap, which sizes both
        the spools and the record's room.
        """
        import os

        directory = os.path.abspath(directory)
        try:
            info = os.statvfs(directory)
            free = f"{info.f_bavail * info.f_frsize} bytes are free there"
        except OSError:
            free = "its free space cannot be read"
        return cls(
            f"no room on the disk: {what} needs {needed} bytes free in {directory}, and {free}; "
            f"free some, or make the trial with a smaller --max-capture-bytes (now {capture_bytes}; "
            "docs/bad-input.md, small disks); nothing ran and nothing is charged"
        )


class LockTimeout(TrialToolError, TimeoutError):
    """The ledger lock stayed held by another process past the lock timeout."""

    status = "lock_timeout"


class EncoderError(TrialToolError, RuntimeError):
    """The o200k_base rank file is missing or does not have the expected SHA-256."""

    status = "tokenizer_error"


class SandboxError(TrialToolError, RuntimeError):
    """The sandbox pinned for the trial cannot be made here (bwrap missing, namespaces refused)."""

    status = "sandbox_error"


class Interrupted(TrialToolError):
    """trial-tool got SIGINT, SIGTERM or SIGHUP before the call was charged: nothing ran, nothing is charged.

    Exits 128 + the signal's number, as a shell would.
    """

    status = "interrupted"

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum

    def __reduce__(self) -> tuple[type[Interrupted], tuple[str, int]]:  # type: ignore[override]
        return (type(self), (self.message, self.signum))


class BudgetExhausted(TrialToolError):
    """A call was refused, and its command not run, because a trial budget is spent.

    `status` is the refusal's status word: `maximum_tool_calls`,
    `maximum_emitted_tokens` or `task_timeout_seconds`.
    """

    exit_code = EXIT_REFUSED

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[type[BudgetExhausted], tuple[str, str]]:  # type: ignore[override]
        return (type(self), (self.message, self.status))


__all__ = [
    "ERROR_CODE",
    "EXIT_INTERNAL",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "BudgetExhausted",
    "EncoderError",
    "Interrupted",
    "LimitMismatch",
    "LockTimeout",
    "SandboxError",
    "StateError",
    "StorageError",
    "TrialToolError",
    "UsageError",
]
