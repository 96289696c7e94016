"""The `none` backend: the command runs as it is, with the machine's view; nothing to wrap or read back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import UsageError
from ._base import Asked, CallAt, TrialFiles, Wrapped, nothing_ahead, nothing_bound, nothing_kept, nothing_left
from ._executable import settle
from ._settings import Sandbox

if TYPE_CHECKING:
    from ..types import CallRequest, Limits

#: The command reaches whatever the machine reaches.
NETWORKS = ("host",)
#: No settings of its own: it holds the command to nothing but the limits.
TAKES: frozenset[str] = frozenset()
#: No processes of its own: the command is the top of its tree.
OWN_PROCESSES = 0
#: No status channel: the command's own exit status is the one.
STATUS_FD = None
#: The supervisor changes to the call's directory and sets the open-files limit.
SETS_DIRECTORY = False
SETS_OPEN_FILES = False
#: The supervisor sets the command's resource limits.
LIMITS_INSIDE = False


def pin(asked: Asked, fallback: str | None = None) -> Sandbox:
    """No sandbox; `fallback`: why "auto" came to this (the sandbox's own words)."""
    network = asked.settings.get("network")
    if network is not None and network not in NETWORKS:
        raise UsageError(f"--network {network} needs a sandbox; it cannot hold with --sandbox none")
    if asked.settings.get("home") == "trial" and asked.mode != "auto":  # asked for by name, not fallen back to
        raise UsageError("--home trial needs a sandbox; it cannot hold with --sandbox none")
    if asked.settings.get("run_as") is not None:
        raise UsageError("--run-as needs a sandbox: with --sandbox none a command runs as its caller")
    return Sandbox("none", "host", asked.workspace, asked.writable, fallback=fallback)


def stored(data: Mapping[str, object]) -> bool:
    """Nothing of its own is stored."""
    return True


class _Session:
    """A trial without a sandbox: its calls may overlap, and run as they are."""

    one_at_a_time = False
    hides_files = False

    def prepare(self, call: CallAt) -> _Session:
        settle()  # a probe started ahead for a trial that turned out to need none
        return self

    def wrap(self, request: CallRequest, env: dict[str, str] | None, limits: Limits) -> Wrapped:
        return Wrapped(list(request.argv), env)

    def where(self) -> None:
        return None


_SESSION = _Session()


def session(sandbox: Sandbox, files: TrialFiles) -> _Session:
    return _SESSION


ahead = nothing_ahead
close = nothing_kept
leftovers = nothing_left
descriptors = nothing_bound


def own(top: int, children: Callable[[int], list[int]]) -> set[int]:
    """None of the tree is the backend's."""
    return set()


def stops(client: str, place: str | None, env: Mapping[str, str] | None) -> None:
    """A stop signals the tree here: nothing of the command is elsewhere."""
    return None


def exit_code(status: bytes, returncode: int | None) -> int | None:
    """Nothing reports for the command: its own exit status is the one."""
    return None


def failure(stderr: bytes, returncode: int | None) -> tuple[str, str] | None:
    """Never asked: an unwrapped command that cannot start fails at its exec."""
    return "sandbox", "no sandbox"


__all__ = [
    "LIMITS_INSIDE",
    "NETWORKS",
    "OWN_PROCESSES",
    "SETS_DIRECTORY",
    "SETS_OPEN_FILES",
    "STATUS_FD",
    "TAKES",
    "ahead",
    "close",
    "descriptors",
    "exit_code",
    "failure",
    "leftovers",
    "own",
    "pin",
    "session",
    "stops",
    "stored",
]
