"""The sandbox seam: each backend one module, behind one small interface.

A backend answers five things (base.Backend): whether it can run here and why
not (`available`), how a call's command is wrapped (`Plan`), what it exposes
(docs/sandbox.md, per backend), how the command's exit status is read back
(`exit_code`, `failure`), and which processes in the tree are its own
(`OWN_PROCESSES`). `none` runs the command as it is; `bwrap` in bubblewrap.
A trial pins its backend by name (sandbox.py), and every record says which
ran. A further backend is one module here and one row in BACKENDS.

This face is what the other rooms use; the modules behind it are the seam's own.
"""

from __future__ import annotations

from . import bwrap, none
from .base import Backend
from .bwrap import Plan
from .executable import available, probe_ahead, settle, unavailable
from .layout import Layout

#: Every backend, by the name a trial pins.
BACKENDS: dict[str, Backend] = {"none": none, "bwrap": bwrap}


def backend(mode: str) -> Backend:
    """The backend a trial pinned."""
    return BACKENDS[mode]


__all__ = [
    "BACKENDS",
    "Backend",
    "Layout",
    "Plan",
    "available",
    "backend",
    "probe_ahead",
    "settle",
    "unavailable",
]
