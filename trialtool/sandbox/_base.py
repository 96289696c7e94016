"""What a sandbox backend is: the few things the process room asks of one, as a module."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol


class Inside(Protocol):
    """A call's stops carried out where its command runs, when that is not the tree here."""

    def signal(self, signal_name: str) -> None:
        """Signal the command's processes there ("TERM", "KILL"); returns at once."""
        ...

    def finish(self) -> None:
        """After a stop: every process the call left there killed, and waited for."""
        ...


class Backend(Protocol):
    """A sandbox backend, as a module: see the seam's face (__init__.py)."""

    # Read-only (properties) so that a module's constants satisfy them: module constants, named so.

    @property
    def OWN_PROCESSES(self) -> int:
        """Processes of the backend's own at the top of the command's tree (the process cap allows for them)."""
        ...

    @property
    def STATUS_FD(self) -> int | None:
        """The descriptor (in the backend's process) it reports the command's exit status on; None: none."""
        ...

    @property
    def SETS_DIRECTORY(self) -> bool:
        """The backend changes to the call's directory itself (the supervisor does not)."""
        ...

    @property
    def SETS_OPEN_FILES(self) -> bool:
        """The backend sets the open-files limit itself, inside (the supervisor does not)."""
        ...

    @property
    def LIMITS_INSIDE(self) -> bool:
        """The backend holds the command's resource limits itself (a container's): none is set on its process."""
        ...

    def own(self, top: int, children: Callable[[int], list[int]]) -> set[int]:
        """Its own processes in the tree under `top`: a stop's SIGTERM spares them, so the command gets its grace."""
        ...

    def stops(self, client: str, container: str | None, env: Mapping[str, str] | None) -> Inside | None:
        """Where a stop signals the command, when not in the tree here (a container's); None: the tree here."""
        ...

    def exit_code(self, status: bytes) -> int | None:
        """The command's exit code from what the backend reported, or None when the command never ran."""
        ...

    def failure(self, stderr: bytes) -> tuple[str, str]:
        """Why the command never ran: ("not_found" | "not_executable" | "sandbox", the reason)."""
        ...


__all__ = ["Backend", "Inside"]
