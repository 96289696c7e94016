"""What a call takes (a command as argv, its options checked), what it gives back (`CallResult`), what stops it."""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple, Protocol

from .budget import Budget
from .errors import UsageError
from .osio import os_text, plain


class CallResult(NamedTuple):
    """One call as the agent and the harness see it."""

    sequence: int
    #: The record's status word (ok, error, truncated, timeout, output_limit, command_error).
    status: str
    #: What the CLI exits with: the command's code, 124, 126, 127, or 128+signal.
    exit_code: int
    #: The text delivered to the agent, already clipped to the allowance.
    stdout: str
    stderr: str
    #: o200k_base tokens of stdout + stderr as delivered (a recount of exactly that text).
    delivered_tokens: int
    allowance: int
    #: True when the delivered text is not all the command printed.
    output_truncated: bool
    #: The audit record as written to the log.
    record: dict[str, Any]
    #: The trial's budget just after this call was recorded.
    budget: Budget
    #: The log's chain head just after this call was recorded. Kept outside the trial, it lets
    #: `trial-tool verify --expect-head` catch any record appended after it, keyed or not.
    head: str = ""

    def as_json(self) -> dict[str, Any]:
        """The result as the front doors (serve, mcp) report it: everything but the audit record."""
        shown = self._asdict()
        del shown["record"]
        shown["budget"] = self.budget.as_json()
        return shown


#: The shell that runs a command given as a string.
SHELL = "/bin/sh"


class Interrupt(Protocol):
    """Something that can stop a call: interrupts.InterruptWatch (signals) or interrupts.Cancellation."""

    @property
    def fd(self) -> int:
        """Readable once the call should stop."""

    @property
    def signum(self) -> int | None:
        """Set once the call should stop."""

    @property
    def reason(self) -> str:
        """Why, for the agent's notice."""

    @property
    def delivers(self) -> bool:
        """Whether the call's text still reaches the caller once it fired (else it is charged as nothing)."""


def checked_input(data: bytes | str | None) -> bytes | None:
    """A call's standard input as bytes (a str as UTF-8), or None for /dev/null."""
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8", "surrogateescape")
    msg = f"input must be bytes or text, not {type(data).__name__}"
    raise UsageError(msg)


def checked_request(
    *, timeout: float | None, cwd: str | os.PathLike[str] | None, env: dict[str, str] | None, default_cwd: bool
) -> str | None:
    """A call's options checked before anything is charged; the working directory to run in.

    `default_cwd`: with no `cwd`, the caller's current directory (else None: wherever the supervisor is).
    """
    if timeout is not None and not (
        isinstance(timeout, int | float) and not isinstance(timeout, bool) and math.isfinite(timeout) and timeout > 0
    ):
        msg = f"timeout must be a positive number of seconds, not {plain(timeout)}"
        raise UsageError(msg)
    for key, value in (env or {}).items():
        if not os_text(key, "an environment variable's name") or "=" in key:
            msg = f"{plain(key)} cannot be an environment variable's name"
            raise UsageError(msg)
        os_text(value, f"environment variable {plain(key)}")
    if cwd is None:
        if not default_cwd:
            return None
        try:
            return os.getcwd()
        except OSError as exc:
            msg = f"the current directory is gone ({exc.strerror}); pass cwd"
            raise UsageError(msg) from exc
    path = os_text(os.fspath(cwd), "cwd")
    if not os.path.isdir(path):
        msg = f"cwd {plain(path)} is not a directory"
        raise UsageError(msg)
    return path


def command_argv(command: list[str] | tuple[str, ...] | str) -> list[str]:
    """A command as argv: a string runs under /bin/sh -c, as a shell tool call would."""
    if isinstance(command, str):
        if not command.strip():
            msg = "empty command"
            raise UsageError(msg)
        return [SHELL, "-c", os_text(command, "the command")]
    argv = list(command)
    if not argv:
        msg = "no command given"
        raise UsageError(msg)
    for index, part in enumerate(argv):
        os_text(part, f"argument {index} of the command")
    if not argv[0]:
        msg = "the command's name is empty"
        raise UsageError(msg)
    return argv


__all__ = ["SHELL", "CallResult", "Interrupt", "checked_input", "checked_request", "command_argv"]
