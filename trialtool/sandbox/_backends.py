"""The registry: every backend by the name a trial pins, and what is decided across them.

`BACKENDS` is the one list of backends. What is decided here is what no single
backend can: which of them "auto" means (`AUTO`, with `none` where it cannot
run), which backend takes a setting (each says, `TAKES`), and which backend a
state's pinned sandbox belongs to. Everything else is the backend's own.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping

from ..errors import SandboxError, UsageError
from ..osio import plain
from . import _bwrap as bwrap
from . import _docker as docker
from . import _gvisor as gvisor
from . import _none as none
from . import _podman as podman
from . import _settings as settings
from ._base import Asked, Backend, Unavailable
from ._settings import OWNED_SETTINGS, UNSANDBOXED, Sandbox

#: Every backend, by the name a trial pins.
BACKENDS: dict[str, Backend] = {
    "none": none,
    "bwrap": bwrap,
    "gvisor": gvisor,
    "docker": docker.DOCKER,
    "podman": podman.PODMAN,
}
#: What "auto" tries; `UNSANDBOXED`'s backend where it cannot run, saying why.
AUTO = "bwrap"
MODES = tuple(BACKENDS)
#: What pins a new trial's sandbox, given its settings (`pin`, handed to the ledger).
PinSandbox = Callable[[Mapping[str, object]], Sandbox]


def backend(mode: str) -> Backend:
    """The backend a trial pinned."""
    return BACKENDS[mode]


def checked(given: Mapping[str, object]) -> settings.Settings:
    """`given` with their values checked (UsageError naming the flag); paths not yet resolved."""
    mode = given.get("sandbox")
    if mode is not None and (not isinstance(mode, str) or mode not in (*MODES, "auto")):
        raise UsageError(f"--sandbox must be one of {', '.join((*MODES, 'auto'))}, not {plain(mode)}")
    values = settings.checked(given)
    asked = values.get("sandbox", "auto")
    taker = BACKENDS[AUTO if asked == "auto" else asked]
    for name in OWNED_SETTINGS:
        if name in values and name not in taker.TAKES:
            takers = [f"--sandbox {other}" for other, row in BACKENDS.items() if name in row.TAKES]
            raise UsageError(f"{settings.FLAG_OF[name]} goes with {' or '.join(takers)}")
    return values


def pin(given: Mapping[str, object], *, here: bool = True) -> Sandbox:
    """The sandbox a new trial pins: "auto" resolved on this machine, and the backend's own settings pinned.

    SandboxError when the backend asked for (or a network that needs one) cannot run here;
    UsageError for settings the backend refuses. `here=False` (a ledger used on its own, with no
    machine to run on): every backend but none is unavailable.
    """
    values = checked(given)
    workspace, writable = settings.paths(values)
    mode = values.get("sandbox") or "auto"
    asked = Asked(mode, values, workspace, writable)
    if not here and mode != UNSANDBOXED.mode:
        if mode != "auto":
            raise SandboxError(f"--sandbox {mode}: no sandbox backend was given")
        return none.pin(asked, fallback="no sandbox backend was given")
    if mode != "auto":
        try:
            return BACKENDS[mode].pin(asked)
        except Unavailable as exc:
            raise SandboxError(f"--sandbox {mode} cannot run here: {exc.reason}") from None
    try:
        return BACKENDS[AUTO].pin(asked)
    except Unavailable as exc:
        network = values.get("network")
        if network is not None and network not in none.NETWORKS:
            raise SandboxError(f"--network {network} needs the {AUTO} sandbox: {exc.reason}") from None
        return none.pin(asked, fallback=exc.reason)


def check_pinned(pinned: Sandbox, given: Mapping[str, object]) -> None:
    """Refuse settings passed now that differ from the pinned ones ("auto" accepts whatever was pinned)."""
    if given:
        settings.check_pinned(pinned, checked(given))


def from_state(data: object) -> Sandbox:
    """The pinned sandbox as stored in a state file; ValueError if it is malformed."""
    if data is None:
        return UNSANDBOXED
    if not isinstance(data, dict) or data.get("mode") not in BACKENDS or not BACKENDS[data["mode"]].stored(data):
        raise ValueError("the sandbox is malformed")
    return settings.parsed(data)


def probe_ahead(state_path: str) -> None:
    """Start what the pinned backend's check will wait on, from the state read without the ledger's lock.

    For a cold call: only the pinned sandbox is taken from the state, and the backend checks what it
    starts again; the reservation reads the state properly. Nothing is started for a trial that does
    not exist yet, or whose state cannot be read.
    """
    try:
        # Non-blocking: a FIFO in the state's place must not hang the call (the ledger refuses it).
        fd = os.open(state_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return
    try:
        with os.fdopen(fd, "rb") as handle:
            pinned = from_state(json.loads(handle.read(1 << 20)).get("sandbox"))
    except (OSError, ValueError, TypeError, AttributeError):
        return
    BACKENDS[pinned.mode].ahead(pinned)


__all__ = [
    "AUTO",
    "BACKENDS",
    "MODES",
    "PinSandbox",
    "backend",
    "check_pinned",
    "checked",
    "from_state",
    "pin",
    "probe_ahead",
]
