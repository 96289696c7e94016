"""The sandbox seam: each backend one module, behind one small interface.

A backend answers what the supervisor asks of it (base.Backend): which
processes in the tree are its own (`OWN_PROCESSES`, `own`), how the command's
exit status is read back (`STATUS_FD`, `exit_code`, `failure`), and what it
does itself (`SETS_DIRECTORY`, `SETS_OPEN_FILES`, `LIMITS_INSIDE`); what it exposes is
docs/sandbox.md's, per backend. Whether it can run here and why not, and how
a call's command is wrapped, are bwrap's `available` and `Plan`, and the
container's `docker.available` and `Container` (`none` always runs,
unwrapped). `none` runs the command as it is; `bwrap` in bubblewrap; `docker`
in a container of the trial's own, whose limits it holds (`LIMITS_INSIDE`). A
trial pins its backend by name (sandbox.py), the supervisor gets that name,
and every record says which ran. A further backend is one module here, one row
in BACKENDS, and its pinning and wrapping beside the others'.

This face is what the other rooms use; the modules behind it are the seam's own.
"""

from __future__ import annotations

from . import _bwrap as bwrap
from . import _docker as docker
from . import _none as none
from ._base import Backend
from ._bwrap import Plan
from ._docker import Container, Started
from ._executable import available, probe_ahead, settle, unavailable
from ._layout import Layout

#: Every backend, by the name a trial pins.
BACKENDS: dict[str, Backend] = {"none": none, "bwrap": bwrap, "docker": docker}


def backend(mode: str) -> Backend:
    """The backend a trial pinned."""
    return BACKENDS[mode]


__all__ = [
    "BACKENDS",
    "Backend",
    "Container",
    "Layout",
    "Plan",
    "Started",
    "available",
    "backend",
    "docker",
    "probe_ahead",
    "settle",
    "unavailable",
]
