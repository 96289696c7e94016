"""The sandbox room: a trial's sandbox settings, pinned at creation, and the backends that hold a call to them.

A trial's settings (_settings.py: `Sandbox`, `pin`, `check_pinned`) are
resolved once, when it is created, and kept in its state; the network
allowlist's rules are _egress.py's (`egress`), and `--network allow`'s
namespace and proxy are the `network` sub-room's, imported only by a call
that needs them.

Each backend is one module behind one small interface (_base.py): which
processes in the tree are its own, how the command's exit status is read
back, and what it does itself. `none` runs the command as it is; `bwrap` in
bubblewrap; `docker` in a container of the trial's own, whose limits it holds.
`BACKENDS` is the one list of them. A trial pins its backend by name, the
supervisor gets that name, and every record says which ran.

This face is what the other rooms use; the modules behind it are the room's own.
"""

from __future__ import annotations

from . import _bwrap as bwrap
from . import _docker as docker
from . import _egress as egress
from . import _none as none
from . import _settings as settings
from ._base import Backend
from ._bwrap import Plan
from ._docker import Container, Started
from ._executable import available, probe_ahead, settle, unavailable
from ._layout import Layout
from ._settings import UNSANDBOXED, Available, Binary, ContainerAvailable, Pin, Sandbox, from_state

#: Every backend, by the name a trial pins.
BACKENDS: dict[str, Backend] = {"none": none, "bwrap": bwrap, "docker": docker}


def backend(mode: str) -> Backend:
    """The backend a trial pinned."""
    return BACKENDS[mode]


__all__ = [
    "BACKENDS",
    "UNSANDBOXED",
    "Available",
    "Backend",
    "Binary",
    "Container",
    "ContainerAvailable",
    "Layout",
    "Pin",
    "Plan",
    "Sandbox",
    "Started",
    "available",
    "backend",
    "bwrap",
    "docker",
    "egress",
    "from_state",
    "probe_ahead",
    "settings",
    "settle",
    "unavailable",
]
