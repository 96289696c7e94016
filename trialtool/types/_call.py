"""One call: what its caller asks for (`CallRequest`), what it gives back (`CallResult`), what can stop it.

A door (the CLI, the per-user server, `serve`, the integrations) makes a request
with `CallRequest.of`, which checks every option before anything is charged;
`Trial.call` takes it whole to the ledger and the supervisor. Nothing on the way
lists its fields again.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple, Protocol

from ..errors import UsageError
from ..osio import os_text, plain
from ._budget import Budget

#: The shell that runs a command given as a string.
SHELL = "/bin/sh"
#: What a call's reply may be: "text" (the command's output, clipped), or "json-rpc" (a program's
#: JSON-RPC response, clipped inside its envelope: clipping.fit_reply). The record's `reply` field.
REPLIES = ("text", "json-rpc")

Command = list[str] | tuple[str, ...] | str


class CallRequest(NamedTuple):
    """One call, checked: what to run, where, with what, and how its reply is read. Immutable."""

    #: The command as argv (a string command is run by /bin/sh -c).
    argv: tuple[str, ...]
    #: Where it runs; None: the caller's working directory at the time of the call.
    cwd: str | None = None
    #: Variables added or replaced, removed, and whether to start from a minimal set.
    env: Mapping[str, str] | None = None
    unset_env: tuple[str, ...] = ()
    clean_env: bool = False
    #: Seconds: shortens the call's deadline below the trial's `call_timeout`, never lengthens it.
    timeout: float | None = None
    #: The command's standard input (None: /dev/null), at most the trial's `max_stdin_bytes`.
    stdin: bytes | None = None
    #: One pipe for stdout and stderr, so the text reads in the order written; all delivered as stdout.
    merge_output: bool = False
    #: The caller's environment, umask and resource limits ((resource, soft, hard) rows), when the call is
    #: made on behalf of another process (the per-user server's callers); None: this process's own.
    environ: Mapping[str, str] | None = None
    umask: int | None = None
    rlimits: tuple[tuple[int, int, int], ...] | None = None
    #: Paths (canonical) inside the writable ones that a sandboxed command may not change.
    read_only: tuple[str, ...] = ()
    #: The interpreter, prefixes and import path of the process the call is made for: kept from the command.
    caller_imports: tuple[str, ...] = ()
    #: The harness's own command, grading the agent's work: never refused or charged, recorded as grading.
    grading: bool = False
    #: The harness's final act (mini's submission): a call while the budget lasts; once it is spent,
    #: run once a trial instead of refused, as grading: its output is then the harness's, never the
    #: agent's (CallResult.sequence 0 says so; Ledger.reserve says how).
    final: bool = False
    #: The caller's name for the call, kept in its records (the per-user server's CLI finds its call by it).
    request_id: str | None = None
    #: How the reply is read: one of REPLIES.
    reply: str = "text"

    @classmethod
    def of(
        cls,
        command: Command,
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        unset_env: Sequence[str] = (),
        clean_env: bool = False,
        timeout: float | None = None,
        input: bytes | str | None = None,  # subprocess.run's name for it
        merge_output: bool = False,
        environ: Mapping[str, str] | None = None,
        umask: int | None = None,
        rlimits: Sequence[Sequence[int]] | None = None,
        read_only: Sequence[str | os.PathLike[str]] = (),
        caller_imports: Sequence[str] = (),
        grading: bool = False,
        final: bool = False,
        request_id: str | None = None,
        reply: str = "text",
    ) -> CallRequest:
        """A request from a caller's words, every option checked (UsageError); nothing is run or charged.

        `input` is bytes, or text sent as UTF-8; the rest are as the fields say.
        """
        if request_id is not None and not (
            isinstance(request_id, str) and 0 < len(request_id) <= 64 and request_id.isascii() and request_id.isalnum()
        ):
            raise UsageError("request_id must be 1 to 64 ASCII letters and digits")
        if reply not in REPLIES:
            raise UsageError(f"reply must be one of {', '.join(REPLIES)}, not {reply!r}")
        return cls(
            argv=tuple(command_argv(command)),
            cwd=_checked_cwd(cwd),
            env=None if env is None else MappingProxyType(_checked_env(env)),
            unset_env=tuple(unset_env),
            clean_env=bool(clean_env),
            timeout=_checked_timeout(timeout),
            stdin=checked_input(input),
            merge_output=bool(merge_output),
            environ=None if environ is None else MappingProxyType(dict(environ)),
            umask=umask,
            rlimits=None if rlimits is None else tuple((int(r[0]), int(r[1]), int(r[2])) for r in rlimits),
            read_only=tuple(os.path.realpath(path) for path in read_only),
            caller_imports=tuple(caller_imports),
            grading=bool(grading),
            final=bool(final),
            request_id=request_id,
            reply=reply,
        )


class Ran(NamedTuple):
    """What a command run elsewhere gave back (`Trial.acall_elsewhere`): the harness's own sandbox ran it."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    #: "exited"; "deadline": stopped at the call's deadline; "output_limit": the runner cut its output off.
    ended: str = "exited"
    #: Where it ran, for the call's record (`elsewhere`): such as {"sandbox": "docker"}.
    where: Mapping[str, object] = MappingProxyType({})


#: Runs a command elsewhere within (seconds, bytes of each stream to keep); what it gave back.
Runner = Callable[[float, int], Awaitable[Ran]]


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
    record: dict[str, object]
    #: The trial's budget just after this call was recorded.
    budget: Budget
    #: The log's chain head just after this call was recorded. Kept outside the trial, it lets
    #: `trial-tool verify --expect-head` catch any record appended after it, keyed or not.
    head: str = ""

    def as_json(self) -> dict[str, object]:
        """The result as the front doors (serve, mcp) report it: everything but the audit record."""
        shown = self._asdict()
        del shown["record"]
        shown["budget"] = self.budget.as_json()
        return shown


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


def command_argv(command: Command) -> list[str]:
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


def _checked_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and math.isfinite(timeout) and timeout > 0:
        return float(timeout)
    msg = f"timeout must be a positive number of seconds, not {plain(timeout)}"
    raise UsageError(msg)


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not os_text(key, "an environment variable's name") or "=" in key:
            msg = f"{plain(key)} cannot be an environment variable's name"
            raise UsageError(msg)
        os_text(value, f"environment variable {plain(key)}")
    return dict(env)


def _checked_cwd(cwd: str | os.PathLike[str] | None) -> str | None:
    if cwd is None:
        return None
    path = os_text(os.fspath(cwd), "cwd")
    if not os.path.isdir(path):
        msg = f"cwd {plain(path)} is not a directory"
        raise UsageError(msg)
    return path


def current_directory() -> str:
    """The caller's working directory, for a request that names none (UsageError if it is gone)."""
    try:
        return os.getcwd()
    except OSError as exc:
        msg = f"the current directory is gone ({exc.strerror}); pass cwd"
        raise UsageError(msg) from exc


__all__ = [
    "REPLIES",
    "SHELL",
    "CallRequest",
    "CallResult",
    "Command",
    "Interrupt",
    "Ran",
    "Runner",
    "checked_input",
    "command_argv",
    "current_directory",
]
