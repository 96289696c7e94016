"""`Limits`: a trial's budgets, validated, frozen, and pinned in the state at creation."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .errors import LimitMismatch, UsageError

CLIP_MODES = ("headtail", "head")


class Limits(NamedTuple):
    """A trial's budgets. Plain frozen data; `validate` checks it, nothing else decides here.

    A NamedTuple rather than a dataclass: importing `dataclasses` costs ~9 ms here
    (it pulls in `inspect`), a tenth of the per-call budget.
    """

    #: Calls the trial may make, refused ones not counted (the reference's twelve).
    max_calls: int = 12
    #: o200k_base tokens delivered to the agent over the whole trial.
    max_tokens: int = 50_000
    #: o200k_base tokens delivered by one call (its allowance is also capped by what is left).
    max_call_tokens: int = 5_000
    #: Seconds of wall clock from the trial's creation; no call starts after it, none runs past it.
    trial_timeout: float = 3_600.0
    #: Seconds one call's command may run.
    call_timeout: float = 120.0
    #: Bytes kept per stream (stdout, stderr); at the cap the command is stopped.
    max_capture_bytes: int = 1_048_576
    #: Seconds between SIGTERM and SIGKILL when a command is stopped.
    kill_grace: float = 1.0
    #: How output over the allowance is cut: head and tail around a notice, or head only.
    clip: str = "headtail"
    #: Bytes of memory for the command's tree (memory cgroup), else per process (RLIMIT_AS); 0: none.
    max_memory: int = 0
    #: CPU seconds per process (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later); 0: none.
    max_cpu_seconds: float = 0.0
    #: Bytes of any one file the command writes (RLIMIT_FSIZE: SIGXFSZ); 0: none.
    max_file_size: int = 0
    #: Open file descriptors per process (RLIMIT_NOFILE); 0: inherit.
    max_open_files: int = 0
    #: Processes in the command's tree at once (pids cgroup, else the supervisor's sweep); 0: none.
    max_procs: int = 1024


#: Upper bounds that catch typos (an extra three zeros) rather than restrict real trials.
_BOUNDS: dict[str, tuple[float, float]] = {
    "max_calls": (1, 1_000_000),
    "max_tokens": (1, 1_000_000_000),
    "max_call_tokens": (1, 100_000_000),
    "trial_timeout": (0.001, 30 * 86_400),
    "call_timeout": (0.001, 30 * 86_400),
    "max_capture_bytes": (1, 1 << 30),
    "kill_grace": (0.0, 600.0),
    "max_memory": (0, 1 << 40),
    "max_cpu_seconds": (0.0, 30 * 86_400),
    "max_file_size": (0, 1 << 40),
    "max_open_files": (0, 1 << 20),
    "max_procs": (0, 1 << 22),
}
_INTEGER_FIELDS = frozenset(
    {
        "max_calls",
        "max_tokens",
        "max_call_tokens",
        "max_capture_bytes",
        "max_memory",
        "max_file_size",
        "max_open_files",
        "max_procs",
    }
)
#: Limits where 0 means "none", and the smallest value that still lets a command start.
_ZERO_IS_OFF = {
    "max_memory": 1 << 20,
    "max_file_size": 1,
    "max_open_files": 8,
    "max_cpu_seconds": 0.001,
    "max_procs": 1,
}

#: The CLI flag of each field, for messages that name what the user typed.
FLAG_OF = {name: "--" + name.replace("_", "-") for name in Limits._fields}


def _check_number(name: str, raw: Any) -> int | float:
    value: int | float
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        msg = f"{FLAG_OF[name]} must be a number, not {raw!r}"
        raise UsageError(msg)
    value = raw
    if isinstance(value, float) and not math.isfinite(value):
        msg = f"{FLAG_OF[name]} must be finite, not {value!r}"
        raise UsageError(msg)
    if name in _INTEGER_FIELDS:
        if isinstance(value, float):
            if not value.is_integer():
                msg = f"{FLAG_OF[name]} must be a whole number, not {value!r}"
                raise UsageError(msg)
            value = int(value)
    else:
        value = float(value)
    low, high = _BOUNDS[name]
    if name in _ZERO_IS_OFF and value != 0:
        low = _ZERO_IS_OFF[name]
    if not low <= value <= high:
        msg = f"{FLAG_OF[name]} must be between {low:g} and {high:g}, not {value:g}"
        raise UsageError(msg)
    return value


def validate(limits: Limits) -> Limits:
    """Return `limits` with numbers normalised, or raise UsageError naming the bad flag."""
    fields: dict[str, Any] = {}
    for name in _BOUNDS:
        fields[name] = _check_number(name, getattr(limits, name))
    if limits.clip not in CLIP_MODES:
        msg = f"--clip must be one of {', '.join(CLIP_MODES)}, not {limits.clip!r}"
        raise UsageError(msg)
    fields["clip"] = limits.clip
    return Limits(**fields)


def from_overrides(overrides: dict[str, Any]) -> Limits:
    """Defaults with `overrides` applied; unknown names are a UsageError."""
    unknown = sorted(set(overrides) - set(Limits._fields))
    if unknown:
        msg = f"unknown limit {unknown[0]!r}"
        raise UsageError(msg)
    return validate(Limits()._replace(**overrides))


def from_state(data: Any) -> Limits:
    """The pinned limits as stored in a state file (every field required)."""
    if not isinstance(data, dict) or set(data) != set(Limits._fields):
        msg = "pinned limits are missing or have unknown fields"
        raise ValueError(msg)
    return validate(Limits(**data))


def check_pinned(pinned: Limits, overrides: dict[str, Any]) -> None:
    """Refuse a call whose explicitly passed limits differ from the pinned ones."""
    wanted = from_overrides(overrides)
    for name in overrides:
        if getattr(wanted, name) != getattr(pinned, name):
            msg = (
                f"{FLAG_OF[name]} {getattr(wanted, name)!r} differs from the value "
                f"{getattr(pinned, name)!r} pinned when this trial was created"
            )
            raise LimitMismatch(msg)


__all__ = ["CLIP_MODES", "FLAG_OF", "Limits", "check_pinned", "from_overrides", "from_state", "validate"]
