"""The process room: run one command as a contained tree, and report what happened.

A call's supervisor is forked ahead of the call (launcher.py), directly or by a
fork server for threaded callers (forkserver.py); it gets ready (supervisor.py),
spawns the command (spawn.py), watches it against its deadline, output cap and
resource limits (running.py, capture.py, cgroups.py), and reaps the whole tree
(reaper.py). The result comes back as an `Outcome` (outcome.py). Nothing here
imports the ledger's writing side, a front door, or `trial`.

This package is the room's face: what other rooms may use of it (the sandbox
seam, `sandbox`, is a face of its own), loaded on first use. Its other modules
are its own.
"""

from __future__ import annotations

from .. import _lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import environment, sandbox
    from .cgroups import kill_leftovers
    from .forkserver import ForkServer
    from .interrupts import Cancellation, InterruptWatch
    from .launcher import Launcher
    from .orders import Spec
    from .outcome import Outcome

#: What other rooms may use, by the module of this room that holds it (a name that is its module's: the module).
_FACE = {
    "Cancellation": "interrupts",
    "environment": "environment",
    "ForkServer": "forkserver",
    "InterruptWatch": "interrupts",
    "kill_leftovers": "cgroups",
    "Launcher": "launcher",
    "Outcome": "outcome",
    "sandbox": "sandbox",
    "Spec": "orders",
}


def __getattr__(name: str) -> object:
    # Loaded on first use: the CLI imports one module of this room before it forks, and no more.
    return _lazy(__name__, _FACE, name)


__all__ = [
    "Cancellation",
    "ForkServer",
    "InterruptWatch",
    "Launcher",
    "Outcome",
    "Spec",
    "environment",
    "kill_leftovers",
    "sandbox",
]
