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

# This face is lazy, and the only room's face that is: the CLI imports one module of this
# room (_launcher.py) before it forks the call's supervisor, and a plain face would load
# the rest first (about 16 ms of imports measured with `python -X importtime`, against
# 1.2 ms for the launcher alone: docs/performance.md). The imports below are what the face
# exports, for readers and the type checker; `_FACE` names the module of each.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import _environment as environment
    from ._cgroups import kill_leftovers
    from ._forkserver import ForkServer
    from ._interrupts import Cancellation, InterruptWatch
    from ._launcher import Launcher
    from ._orders import Report, Spec
    from ._outcome import Outcome

_FACE = {
    "Cancellation": "_interrupts",
    "environment": "_environment",
    "ForkServer": "_forkserver",
    "InterruptWatch": "_interrupts",
    "kill_leftovers": "_cgroups",
    "Launcher": "_launcher",
    "Outcome": "_outcome",
    "Report": "_orders",
    "Spec": "_orders",
}


def __getattr__(name: str) -> object:
    return _lazy(__name__, _FACE, name)


__all__ = [
    "Cancellation",
    "ForkServer",
    "InterruptWatch",
    "Launcher",
    "Outcome",
    "Report",
    "Spec",
    "environment",
    "kill_leftovers",
]
