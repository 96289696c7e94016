"""`Limits`: a trial's budgets, validated, frozen, and pinned in the state at creation."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from ..errors import LimitMismatch, UsageError
from ..osio import plain

#: Settings that travel with the limits but are the sandbox's (sandbox/_settings.py), each a flag; and two
#: that are not flags: `origin`, the directory a trial is created from (the default workspace),
#: and `search_path`, the caller's PATH, where the sandbox's executable is looked for then, and
#: `home_path`, the caller's $HOME, which the sandbox's home layer goes over (`--home trial`).
#: `labels` travel with them too (ledger/_labels.py): who the trial is, pinned like a limit.
SANDBOX_SETTINGS = ("sandbox", "network", "allow", "workspace", "writable", "home", "image", "run_as")
NOT_LIMITS = (*SANDBOX_SETTINGS, "origin", "search_path", "home_path", "labels")

CLIP_MODES = ("headtail", "head")


class Limits(NamedTuple):
    """A trial's budgets. Plain frozen data; `validate` checks it, nothing else decides here.

    A NamedTuple rather than a dataclass: `dataclasses` pulls in `inspect`, too
    slow an import for a call's path (docs/performance.md).
    """

    #: Calls the trial may make, refused ones not counted.
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
    #: Bytes a call may pass to its command's standard input.
    max_stdin_bytes: int = 1_048_576


class Bound(NamedTuple):
    """How one limit is checked: its range, and whether 0 switches it off."""

    #: The range a value must lie in; the upper bounds catch typos (an extra three zeros)
    #: rather than restrict real trials.
    low: float
    high: float
    #: Where 0 means "none": the smallest other value that still lets a command start.
    off_low: float | None
    integer: bool


#: One row per numeric limit of `Limits` (`clip` is a choice of CLIP_MODES).
#:
#: Adding a limit, every place (tests/test_limits.py checks those marked *):
#: 1. * a field of `Limits` above, with its default, and * its row here;
#: 2. its name in LATER_FIELDS, so that the states of trials made before it still open;
#: 3. * its flag: a row of the limits group in doors/options.py's OPTIONS, its dest the field's name;
#: 4. * its row in README.md's table of limits;
#: 5. the code that enforces it: a per-call limit in process/ (process/_rlimits.py for a resource
#:    limit, _running.py for one the supervisor watches); a budget of the whole trial in types/_budget.py
#:    (BUDGETS, `refusal`: the ledger and the graders' view follow);
#: 6. if reaching it is a call status of its own: trial/_verdict.py's `judge`, docs/records.md's statuses.
#: The graders' view and the export show every pinned limit as it is; the fairness check compares them all.
BOUNDS: dict[str, Bound] = {
    "max_calls": Bound(1, 1_000_000, None, True),
    "max_tokens": Bound(1, 1_000_000_000, None, True),
    "max_call_tokens": Bound(1, 100_000_000, None, True),
    "trial_timeout": Bound(0.001, 30 * 86_400, None, False),
    "call_timeout": Bound(0.001, 30 * 86_400, None, False),
    # A call holds about 3 times its captured bytes at its peak, besides the encoder
    # (docs/performance.md): 256 MiB a stream keeps two full streams near 1.5 GiB.
    "max_capture_bytes": Bound(1, 1 << 28, None, True),
    "kill_grace": Bound(0.0, 600.0, None, False),
    "max_memory": Bound(0, 1 << 40, 1 << 20, True),
    "max_cpu_seconds": Bound(0.0, 30 * 86_400, 0.001, False),
    "max_file_size": Bound(0, 1 << 40, 1, True),
    "max_open_files": Bound(0, 1 << 20, 8, True),
    "max_procs": Bound(0, 1 << 22, 1, True),
    # The input travels whole in one message (to the per-user server, to the supervisor):
    # 32 MiB keeps that message within the server's 64 MiB request bound.
    "max_stdin_bytes": Bound(0, 1 << 25, None, True),
}

#: Limits a state written before they existed may lack; it has their defaults.
LATER_FIELDS = ("max_stdin_bytes",)

#: The CLI flag of each field, for messages that name what the user typed.
FLAG_OF = {name: "--" + name.replace("_", "-") for name in Limits._fields}


def _check_number(name: str, raw: object) -> int | float:
    value: int | float
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        msg = f"{FLAG_OF[name]} must be a number, not {plain(raw)}"
        raise UsageError(msg)
    value = raw
    if isinstance(value, float) and not math.isfinite(value):
        msg = f"{FLAG_OF[name]} must be finite, not {plain(value)}"
        raise UsageError(msg)
    bound = BOUNDS[name]
    if bound.integer:
        if isinstance(value, float):
            if not value.is_integer():
                msg = f"{FLAG_OF[name]} must be a whole number, not {plain(value)}"
                raise UsageError(msg)
            value = int(value)
    else:
        value = float(value)
    low, high = bound.low, bound.high
    if bound.off_low is not None and value != 0:
        low = bound.off_low
    if not low <= value <= high:
        msg = f"{FLAG_OF[name]} must be between {plain(low)} and {plain(high)}, not {plain(value)}"
        raise UsageError(msg)
    return value


def validate(limits: Limits) -> Limits:
    """Return `limits` with numbers normalised, or raise UsageError naming the bad flag."""
    if limits.clip not in CLIP_MODES:
        msg = f"--clip must be one of {', '.join(CLIP_MODES)}, not {plain(limits.clip)}"
        raise UsageError(msg)
    checked = (_check_number(name, value) if name in BOUNDS else value for name, value in limits._asdict().items())
    return Limits._make(checked)


def from_overrides(overrides: dict[str, object]) -> Limits:
    """Defaults with `overrides` applied; unknown names are a UsageError (sandbox settings are not limits)."""
    overrides = {name: value for name, value in overrides.items() if name not in NOT_LIMITS}
    unknown = sorted(set(overrides) - set(Limits._fields))
    if unknown:
        msg = f"unknown limit {plain(unknown[0])}"
        raise UsageError(msg)
    # Unchecked values in a Limits for a moment: validate checks every field before it leaves.
    return validate(Limits._make(overrides.get(name, default) for name, default in Limits()._asdict().items()))


def from_state(data: object) -> Limits:
    """The pinned limits as stored in a state file (every field required but those of LATER_FIELDS)."""
    if not isinstance(data, dict) or not set(Limits._fields) - set(LATER_FIELDS) <= set(data) <= set(Limits._fields):
        msg = "pinned limits are missing or have unknown fields"
        raise ValueError(msg)
    return validate(Limits(**data))


def check_pinned(pinned: Limits, overrides: dict[str, object]) -> None:
    """Refuse a call whose explicitly passed limits differ from the pinned ones."""
    check_given(pinned, from_overrides(overrides), [name for name in overrides if name not in NOT_LIMITS])


def check_given(pinned: Limits, wanted: Limits, given: Iterable[str]) -> None:
    """Refuse limits `wanted` whose `given` ones differ from the pinned ones (LimitMismatch)."""
    for name in given:
        if getattr(wanted, name) != getattr(pinned, name):
            msg = (
                f"{FLAG_OF[name]} {plain(getattr(wanted, name))} differs from the value "
                f"{plain(getattr(pinned, name))} pinned when this trial was created"
            )
            raise LimitMismatch(msg)


__all__ = [
    "BOUNDS",
    "CLIP_MODES",
    "FLAG_OF",
    "LATER_FIELDS",
    "Bound",
    "Limits",
    "check_given",
    "check_pinned",
    "from_overrides",
    "from_state",
    "validate",
]
