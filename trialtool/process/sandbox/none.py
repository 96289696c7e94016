"""The `none` backend: the command runs as it is, with the machine's view; nothing to wrap or read back."""

from __future__ import annotations

#: No processes of its own: the command is the top of its tree.
OWN_PROCESSES = 0


def exit_code(status: bytes) -> int | None:
    """Nothing reports for the command: its own exit status is the one."""
    return None


def failure(stderr: bytes) -> tuple[str, str]:
    """Never asked: an unwrapped command that cannot start fails at its exec."""
    return "sandbox", "no sandbox"


__all__ = ["OWN_PROCESSES", "exit_code", "failure"]
