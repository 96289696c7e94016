"""Trial time that other processes agree on and that a stepped wall clock cannot refund.

Within one process, deadlines use `time.monotonic()`. Across the processes of
one trial (each call is its own trial-tool process) we need a clock they share:
on Linux, CLOCK_BOOTTIME, which counts from boot, includes suspend and is never
stepped; it is comparable only on the same boot, so the state records the boot
id (/proc/sys/kernel/random/boot_id) beside the reading. On another boot, or
where there is no boot id (macOS), elapsed time falls back to the wall clock.
Either way it never decreases: the state keeps the largest value seen.
"""

from __future__ import annotations

import time

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


_BOOT_ID: list[str | None] = []


def boot_id() -> str | None:
    """This boot's id on Linux, None elsewhere. Read once per process: no process outlives its boot."""
    if not _BOOT_ID:
        try:
            with open(_BOOT_ID_PATH, encoding="ascii") as handle:
                _BOOT_ID.append(handle.read().strip() or None)
        except OSError:
            _BOOT_ID.append(None)
    return _BOOT_ID[0]


def boot_clock() -> float:
    """Seconds on a clock shared by every process of this boot and never stepped."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return time.monotonic()
    return time.clock_gettime(clock_id)


def anchor() -> dict[str, object]:
    """What the state records at a trial's start so later processes can measure from it."""
    return {"boot_id": boot_id(), "boot_clock": boot_clock()}


def elapsed(anchor_: dict[str, object], started_at: float, floor: float) -> float:
    """Seconds since the trial started, never less than `floor` (the last value recorded)."""
    here, then = boot_id(), anchor_.get("boot_clock")
    if here is not None and here == anchor_.get("boot_id") and isinstance(then, int | float):
        seconds = boot_clock() - then
    else:
        seconds = time.time() - started_at
    return max(seconds, floor)


def utc(timestamp: float) -> str:
    """An RFC 3339 UTC timestamp with milliseconds (cheaper to import than datetime)."""
    whole = int(timestamp)
    millis = int((timestamp - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


__all__ = ["anchor", "boot_clock", "boot_id", "elapsed", "utc"]
