"""The `none` backend: the command runs as it is, with the machine's view; nothing to wrap or read back."""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: No processes of its own: the command is the top of its tree.
OWN_PROCESSES = 0
#: No status channel: the command's own exit status is the one.
STATUS_FD = None
#: The supervisor changes to the call's directory and sets the open-files limit.
SETS_DIRECTORY = False
SETS_OPEN_FILES = False
#: The supervisor sets the command's resource limits.
LIMITS_INSIDE = False


def own(top: int, children: Callable[[int], list[int]]) -> set[int]:
    """None of the tree is the backend's."""
    return set()


def stops(client: str, container: str | None, env: Mapping[str, str] | None) -> None:
    """A stop signals the tree here: nothing of the command is elsewhere."""
    return None


def exit_code(status: bytes) -> int | None:
    """Nothing reports for the command: its own exit status is the one."""
    return None


def failure(stderr: bytes) -> tuple[str, str]:
    """Never asked: an unwrapped command that cannot start fails at its exec."""
    return "sandbox", "no sandbox"


__all__ = [
    "LIMITS_INSIDE",
    "OWN_PROCESSES",
    "SETS_DIRECTORY",
    "SETS_OPEN_FILES",
    "STATUS_FD",
    "exit_code",
    "failure",
    "own",
    "stops",
]
