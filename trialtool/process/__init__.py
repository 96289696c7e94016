"""The process room: run one command as a contained tree, and report what happened.

A call's supervisor is forked ahead of the call (_launcher.py), directly or by a
fork server for threaded callers (_forkserver.py); it gets ready (_supervisor.py),
spawns the command (_spawn.py), watches it against its deadline, output cap and
resource limits (_running.py, _capture.py, _cgroups.py), and reaps the whole tree
(_reaper.py). The result comes back as an `Outcome` (_outcome.py). Nothing here
imports the ledger's writing side, a front door, or `trial`.

This package is the room's face: what other rooms may use of it (the sandbox
seam, `sandbox`, is a face of its own), loaded on first use. Its other modules
are its own.
"""

from __future__ import annotations

from .. import _lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import _environment as environment
    from . import _netns as netns
    from . import sandbox
    from ._cgroups import kill_leftovers
    from ._forkserver import ForkServer
    from ._interrupts import Cancellation, InterruptWatch
    from ._launcher import Launcher
    from ._orders import Spec
    from ._outcome import Outcome

#: What other rooms may use, by the module of this room that holds it (a name that is its module's: the module).
_FACE = {
    "Cancellation": "_interrupts",
    "environment": "_environment",
    "ForkServer": "_forkserver",
    "InterruptWatch": "_interrupts",
    "kill_leftovers": "_cgroups",
    "Launcher": "_launcher",
    "netns": "_netns",
    "Outcome": "_outcome",
    "sandbox": "sandbox",
    "Spec": "_orders",
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
    "netns",
    "sandbox",
]
