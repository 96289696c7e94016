"""The command's resource limits: the trial's, on top of the caller's own (the per-user server's callers)."""

from __future__ import annotations

import os
import resource

from ..sandbox import Backend
from ..types import Limits
from ._cgroups import CallGroup
from ._orders import Spec


def for_exec(limits: Limits, group: CallGroup, backend: Backend) -> list[tuple[int, tuple[int, int]]]:
    """The command's resource limits; no core dumps is set on the supervisor itself, and inherited.

    A backend may set the open-files limit inside its sandbox (bwrap: it needs more
    descriptors than a small limit allows while it sets the sandbox up).
    """
    rlimits = []
    if limits.max_cpu_seconds:
        # The soft limit sends SIGXCPU; one second later the hard limit sends SIGKILL.
        soft = max(1, int(limits.max_cpu_seconds + 0.999))
        rlimits.append((resource.RLIMIT_CPU, (soft, soft + 1)))
    if limits.max_file_size:
        rlimits.append((resource.RLIMIT_FSIZE, (limits.max_file_size, limits.max_file_size)))
    if limits.max_open_files and not backend.SETS_OPEN_FILES:
        rlimits.append((resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files)))
    if limits.max_memory and group.memory is None:
        # No memory cgroup: a per-process address-space cap is the fallback.
        rlimits.append((resource.RLIMIT_AS, (limits.max_memory, limits.max_memory)))
    return rlimits


def take_callers(spec: Spec) -> None:
    """Make the caller's umask and resource limits the supervisor's own, for the command to inherit.

    The supervisor exists for this one command, so they are simply set on it; a hard
    limit above the supervisor's own (which only a privileged process may raise) is
    capped at it. The trial's own limits then apply on top, in the command.
    """
    if spec.umask is not None:
        os.umask(spec.umask)
    for which, soft, hard in spec.caller_rlimits:
        if which == resource.RLIMIT_CORE:
            continue  # never a core dump: set on the supervisor at start
        try:
            hard = hard if _at_most(hard, resource.getrlimit(which)[1]) else resource.getrlimit(which)[1]
            resource.setrlimit(which, (soft if _at_most(soft, hard) else hard, hard))
        except (ValueError, OSError):
            continue


def _at_most(value: int, bound: int) -> bool:
    """`value` <= `bound` for resource limits, where RLIM_INFINITY is above everything."""
    infinity = resource.RLIM_INFINITY
    return bound == infinity or (value != infinity and value <= bound)


__all__ = ["for_exec", "take_callers"]
