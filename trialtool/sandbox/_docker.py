"""The container backend, a registry row per engine: docker's here, podman's in _podman.py.

A trial's commands run in a container of its own (_container.py says what it is
and how a call runs in it). What a row adds is the engine's client, pinned by
identity when the trial is created, with the image by its id; the rest of the
backend's life (its session, stops, exit status, `close`, and `gc`'s leftovers)
is the same for every engine, through `Engine`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from ..errors import SandboxError, UsageError
from ..osio import plain
from ._base import Asked, Leftover, TrialFiles, Unavailable, nothing_ahead, nothing_bound
from ._container import Container, client_run, name_of, stops
from ._engine import listed, remove, said
from ._executable import check_binary, find
from ._settings import Binary, Sandbox, identity, pinned_run_as

#: The client's exec runs the command: no process of the backend's own in the command's tree.
OWN_PROCESSES = 0
#: The client reports the command's own exit status.
STATUS_FD = None
#: The script changes to the call's directory inside the container, and the container holds the limits.
SETS_DIRECTORY = True
SETS_OPEN_FILES = True
#: The command's resource limits are the container's: none is set on the client's process.
LIMITS_INSIDE = True
#: No network, or the host's: a container has no way through trial-tool's proxy (docs/sandbox.md).
NETWORKS = ("none", "host")
#: Who the command is, and the image its container is made from.
TAKES = frozenset({"run_as", "image"})


def own(top: int, children: Callable[[int], list[int]]) -> set[int]:
    """The client is all there is of the command on this side: a stop signals inside the container instead."""
    return {top}


def exit_code(status: bytes, returncode: int | None) -> int | None:
    """The client's exit status is the command's."""
    return None


def failure(stderr: bytes, returncode: int | None) -> tuple[str, str] | None:
    """Never asked: a container that cannot start fails the call's checks, before anything is charged."""
    return "sandbox", stderr.decode(errors="replace").strip()[-300:]


def available(
    clients: Sequence[str], image: str, search_path: str | None, roots: Sequence[str] = ()
) -> tuple[Binary | None, str | None, str | None]:
    """(The client to pin, the image's id, None), or (None, None, why not) when no container can run here."""
    binary, reason = find(roots, search_path, clients, f"{' or '.join(clients)} is not installed")
    if binary is None:
        return None, None, reason
    try:
        done = client_run(binary, "image", "inspect", "--format", "{{.Id}}", image)
    except SandboxError as exc:
        return None, None, exc.message
    if done.returncode != 0:
        reason = said(done.stderr)
        if "no such" in reason.lower() or "image not known" in reason.lower():  # docker's words, podman's
            return None, None, f"no image {plain(image)} on this machine's engine (pull, load or build it first)"
        return None, None, f"the container engine cannot be reached: {reason}"
    image_id = done.stdout.decode().strip()
    return (binary, image_id, None) if image_id else (None, None, f"the engine named no id for image {plain(image)}")


class Engine:
    """The container backend over one engine's client: a registry row (Backend)."""

    NETWORKS = NETWORKS
    TAKES = TAKES
    OWN_PROCESSES = OWN_PROCESSES
    STATUS_FD = STATUS_FD
    SETS_DIRECTORY = SETS_DIRECTORY
    SETS_OPEN_FILES = SETS_OPEN_FILES
    LIMITS_INSIDE = LIMITS_INSIDE

    def __init__(self, name: str, clients: tuple[str, ...], caller_limits: bool = False) -> None:
        #: The backend's name in the registry, and each client looked for, in order, when a trial is created.
        self.name, self.clients = name, clients
        #: Its containers get this process's open-files and process limits (_callers_limits).
        self.caller_limits = caller_limits

    def pin(self, asked: Asked) -> Sandbox:
        """The engine's client pinned, and the image by its id; the home is the image's."""
        settings = asked.settings
        image = settings.get("image")
        if not isinstance(image, str):
            raise UsageError(f"--sandbox {self.name} needs --image IMAGE")
        network = settings.get("network") or NETWORKS[0]
        if network not in NETWORKS:
            msg = f"--network {network} cannot hold in a container: it has {' or '.join(NETWORKS)} (docs/sandbox.md)"
            raise UsageError(msg)
        binary, image_id, reason = available(self.clients, image, settings.get("search_path"), asked.roots)
        if binary is None or image_id is None:
            raise Unavailable(reason or "no container can run here")
        pins = tuple(identity(path) for path in (asked.workspace, *asked.writable))
        ids = pinned_run_as(settings)
        return Sandbox(
            self.name,
            network,
            asked.workspace,
            asked.writable,
            binary,
            pins,
            image=image,
            image_id=image_id,
            run_as=ids,
        )

    def stored(self, data: Mapping[str, object]) -> bool:
        """A container trial has its workspace, its image and the image's id."""
        return all(isinstance(data.get(name), str) for name in ("workspace", "image", "image_id"))

    def session(self, sandbox: Sandbox, files: TrialFiles) -> Container:
        return Container(sandbox, files.state_path, files.log_path, files.secret, self.caller_limits)

    # Nothing to start: the container is asked about under the lock, in a millisecond.
    ahead = staticmethod(nothing_ahead)

    def close(self, sandbox: Sandbox, trial_id: str) -> bool:
        """Stop and remove the trial's container, through its own pinned client (checked, never looked up again)."""
        if sandbox.binary is None:
            return False
        check_binary(sandbox.binary)
        return remove(sandbox.binary.path, name_of(trial_id))

    def leftovers(self) -> list[Leftover]:
        """The containers trial-tool made on this engine, through the client on PATH ([] where there is none)."""
        binary, _ = find((), None, self.clients)
        if binary is None:
            return []
        client = binary.path
        return [
            Leftover(name, trial_id, state, log, functools.partial(remove, client, name))
            for name, trial_id, state, log in listed(client)
        ]

    # Nothing is bound by descriptor: the paths go to the engine by name, checked at the container's start.
    descriptors = staticmethod(nothing_bound)

    own = staticmethod(own)
    stops = staticmethod(stops)
    exit_code = staticmethod(exit_code)
    failure = staticmethod(failure)


#: The docker engine's row.
DOCKER = Engine("docker", ("docker",))

__all__ = [
    "DOCKER",
    "LIMITS_INSIDE",
    "NETWORKS",
    "OWN_PROCESSES",
    "SETS_DIRECTORY",
    "SETS_OPEN_FILES",
    "STATUS_FD",
    "TAKES",
    "Engine",
    "available",
    "exit_code",
    "failure",
    "own",
]
