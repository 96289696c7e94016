"""What a sandbox backend is: everything the rest of trial-tool asks of one, as a module.

A backend owns its whole life. At a trial's creation it pins the settings it
takes (`pin`), and reads them back from a state (`stored`). Under the lock,
before a call is charged, its `session` checks what the call needs and says how
the command runs (`Checked.wrap`) and what its record says of where it ran. In the
supervisor it opens what it binds by descriptor (`descriptors`), says which
processes of the tree are its own (`own`), where a stop signals the command
(`stops`), and reads the command's exit status back (`exit_code`, `failure`).
At the end it closes what it kept for the trial (`close`) and finds what trials
left behind (`leftovers`). The registry (_backends.py) is the one list of them;
nothing outside a backend's module names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from ..types import CallRequest, Limits
    from ._settings import Sandbox, Settings


class Asked(NamedTuple):
    """What a new trial asks of its sandbox: the settings checked, the paths canonical."""

    #: The backend asked for by name, or "auto".
    mode: str
    settings: Settings
    workspace: str
    writable: tuple[str, ...]

    @property
    def roots(self) -> tuple[str, ...]:
        """Every path the command may write, shortest first."""
        return tuple(sorted({self.workspace, *self.writable}, key=len))


class Unavailable(Exception):
    """The backend cannot run on this machine; `reason` says why, in its own words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TrialFiles(NamedTuple):
    """One trial's own files, as a backend's session keeps them from the command."""

    state_path: str
    log_path: str
    #: Every file a command must never reach: the state, the log, the lock, and any key.
    secret: tuple[str, ...]
    #: The tokenizer's rank file, where the call's check located it.
    rank_file: str | None


class CallAt(NamedTuple):
    """What a session's check is given of the call: the trial as its state says, and the request."""

    trial_id: str
    limits: Limits
    #: Calls charged so far.
    calls: int
    request: CallRequest


class Wrapped(NamedTuple):
    """A call's command as its backend runs it, for the supervisor's orders (process.Spec)."""

    argv: list[str]
    env: dict[str, str] | None
    #: Pinned paths the backend binds from a descriptor the supervisor opens: (index in argv, path, device, inode).
    binds: tuple[tuple[int, str, int, int], ...] = ()
    #: Where the command runs when not in the tree here (a container's name), for the stops.
    place: str | None = None
    #: Network "allow": the allowlist the call's proxy enforces.
    egress: tuple[str, ...] | None = None
    #: Network "allow" through a socket bound into the sandbox (gVisor's): the host path where the call's
    #: proxy listens, made before the command starts. None: in the sandbox's network namespace (bwrap's).
    egress_socket: str | None = None


class Checked(Protocol):
    """One call, checked: how its command runs, and what its record says of where it ran."""

    def wrap(self, request: CallRequest, env: dict[str, str] | None, limits: Limits) -> Wrapped:
        """The command of `request`, with the environment `env`, as the backend runs it."""
        ...

    def where(self) -> dict[str, object] | None:
        """What the call's record says of the container that ran it (its `container`: name, id, image), or None."""
        ...


class Session(Protocol):
    """One trial's sandbox as its calls use it: made once per pinned sandbox, in the process that calls."""

    @property
    def one_at_a_time(self) -> bool:
        """The trial's calls must not overlap (a container's, or a trial whose files a command could reach)."""
        ...

    @property
    def hides_files(self) -> bool:
        """The trial's log must exist before its sandbox starts, so that it is hidden there."""
        ...

    def prepare(self, call: CallAt) -> Checked:
        """Under the lock, before the call is charged: SandboxError or UsageError if it cannot run."""
        ...


class Inside(Protocol):
    """A call's stops carried out where its command runs, when that is not the tree here."""

    def signal(self, signal_name: str) -> None:
        """Signal the command's processes there ("TERM", "KILL"); returns at once."""
        ...

    def finish(self) -> None:
        """After a stop: every process the call left there killed, and waited for."""
        ...


class Leftover(NamedTuple):
    """Something a backend keeps for a trial between its calls (a container), found by `leftovers`."""

    name: str
    trial_id: str
    state_path: str
    log_path: str
    remove: Callable[[], object]


class Backend(Protocol):
    """A sandbox backend, as a module."""

    # Read-only (properties) so that a module's constants satisfy them: module constants, named so.

    @property
    def NETWORKS(self) -> tuple[str, ...]:
        """The networks it can hold, its default first."""
        ...

    @property
    def TAKES(self) -> frozenset[str]:
        """The sandbox settings of its own (`run_as`, `home`, `image`): any other given is refused."""
        ...

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

    def pin(self, asked: Asked) -> Sandbox:
        """The sandbox a new trial pins; Unavailable when it cannot run here, UsageError for settings it refuses."""
        ...

    def stored(self, data: Mapping[str, object]) -> bool:
        """Whether a state's sandbox holds its own fields well formed."""
        ...

    def session(self, sandbox: Sandbox, files: TrialFiles) -> Session:
        """The trial's sandbox as its calls use it; SandboxError or UsageError if it cannot be."""
        ...

    def ahead(self, sandbox: Sandbox) -> None:
        """Start, before the lock is taken, what a call's check will wait on (a cold call's probe); or nothing."""
        ...

    def close(self, sandbox: Sandbox, trial_id: str) -> bool:
        """End what the backend keeps for the trial between calls (a container); whether there was any."""
        ...

    def leftovers(self) -> list[Leftover]:
        """What the backend keeps for trials on this machine, for `gc`; [] when it keeps nothing or cannot ask."""
        ...

    def descriptors(
        self, argv: Sequence[str], binds: Sequence[tuple[int, str, int, int]]
    ) -> tuple[list[str], list[int]]:
        """In the supervisor, just before the start: `argv` with what it binds opened, and those descriptors."""
        ...

    def own(self, top: int, children: Callable[[int], list[int]]) -> set[int]:
        """Its own processes in the tree under `top`: a stop's SIGTERM spares them, so the command gets its grace."""
        ...

    def stops(self, client: str, place: str | None, env: Mapping[str, str] | None) -> Inside | None:
        """Where a stop signals the command, when not in the tree here (a container's); None: the tree here."""
        ...

    def exit_code(self, status: bytes, returncode: int | None) -> int | None:
        """The command's exit code from what the backend reported and its own exit status (`returncode`),
        or None when the command never ran."""
        ...

    def failure(self, stderr: bytes, returncode: int | None) -> tuple[str, str] | None:
        """Why the command never ran: ("not_found" | "not_executable" | "sandbox", the reason); None when
        the backend's exit status (`returncode`) says it was stopped from outside, the report as it is."""
        ...


# What a backend binds by name at a step where it has nothing to do.


def nothing_ahead(sandbox: Sandbox) -> None:
    """Nothing to start before the lock."""


def nothing_kept(sandbox: Sandbox, trial_id: str) -> bool:
    """Nothing is kept between calls, so nothing is closed."""
    return False


def nothing_left() -> list[Leftover]:
    """Nothing is kept between calls, so nothing is left over."""
    return []


def nothing_bound(argv: Sequence[str], binds: Sequence[tuple[int, str, int, int]]) -> tuple[list[str], list[int]]:
    """Nothing is bound by descriptor."""
    return list(argv), []


__all__ = [
    "Asked",
    "Backend",
    "CallAt",
    "Checked",
    "Inside",
    "Leftover",
    "Session",
    "TrialFiles",
    "Unavailable",
    "Wrapped",
    "nothing_ahead",
    "nothing_bound",
    "nothing_kept",
    "nothing_left",
]
