"""What a sandbox backend is: the few things the rest of trial-tool asks of one."""

from __future__ import annotations

from typing import Protocol


class Backend(Protocol):
    """A sandbox backend, as a module: see the seam's face (__init__.py)."""

    #: Processes of the backend's own at the top of the command's tree (spared a stop's SIGTERM).
    OWN_PROCESSES: int

    def exit_code(self, status: bytes) -> int | None:
        """The command's exit code from what the backend reported, or None when the command never ran."""
        ...

    def failure(self, stderr: bytes) -> tuple[str, str]:
        """Why the command never ran: ("not_found" | "not_executable" | "sandbox", the reason)."""
        ...


__all__ = ["Backend"]
