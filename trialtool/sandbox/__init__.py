"""The sandbox room: a trial's sandbox settings, pinned at creation, and the backends that hold a call to them.

A trial's settings (_settings.py: `Sandbox`) are resolved once, when it is
created, and kept in its state; the network allowlist's rules are _egress.py's
(`egress`), and `--network allow`'s namespace and proxy are the `network`
sub-room's, imported only by a call that needs them.

Each backend is one module behind one interface (_base.py), and owns its whole
life: what it pins, what it checks before a call is charged, how it wraps the
command, its stops, how it reads the exit status back, and what it closes.
`none` runs the command as it is; `bwrap` in bubblewrap; `docker` and `podman`
in a container of the trial's own, whose limits it holds. `BACKENDS`
(_backends.py) is the one list of them: a trial pins its backend by name, the
supervisor gets that name, and every record says which ran.

This face is what the other rooms use; the modules behind it are the room's own.
"""

from __future__ import annotations

from . import _bwrap as bwrap
from . import _egress as egress
from . import _settings as settings
from ._backends import AUTO, BACKENDS, MODES, PinSandbox, backend, check_pinned, checked, from_state, pin, probe_ahead
from ._base import Backend, CallAt, Checked, Leftover, Session, TrialFiles, Wrapped
from ._container import sweep_argv
from ._executable import settle, unavailable
from ._settings import UNSANDBOXED, Binary, Pin, Sandbox

__all__ = [
    "AUTO",
    "BACKENDS",
    "MODES",
    "UNSANDBOXED",
    "Backend",
    "Binary",
    "CallAt",
    "Checked",
    "Leftover",
    "Pin",
    "PinSandbox",
    "Sandbox",
    "Session",
    "TrialFiles",
    "Wrapped",
    "backend",
    "bwrap",
    "check_pinned",
    "checked",
    "egress",
    "from_state",
    "pin",
    "probe_ahead",
    "settings",
    "settle",
    "sweep_argv",
    "unavailable",
]
