"""A trial's identity labels (`--label KEY=VALUE`): the task, sample, epoch or model a grader joins on.

Labels are pinned at creation like limits: stored in the state and in the log's
first record, shown by every graders' command, and refused on a later call
that names a label with another value. They say who the trial is, never how it
runs: nothing in trialtool reads them back to decide anything.
"""

from __future__ import annotations

from ..errors import LimitMismatch, UsageError
from ..osio import plain

#: The override's name (the flag is repeatable: `--label task=t1 --label epoch=2`).
NAME = "labels"
_KEY_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_KEY = 64
MAX_VALUE = 1024
MAX_LABELS = 64


def parse(given: object) -> dict[str, str]:
    """Labels from `KEY=VALUE` texts or a mapping, checked; UsageError naming what is wrong."""
    if isinstance(given, dict):
        pairs = list(given.items())
    elif isinstance(given, list | tuple):
        pairs = []
        for item in given:
            if not isinstance(item, str) or "=" not in item:
                msg = f"--label takes KEY=VALUE, not {plain(item)}"
                raise UsageError(msg)
            key, _, value = item.partition("=")
            pairs.append((key, value))
    else:
        msg = f"labels must be KEY=VALUE texts or a mapping, not {plain(given)}"
        raise UsageError(msg)
    labels: dict[str, str] = {}
    for key, value in pairs:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # an epoch or a sample number given as a number
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY or not set(key) <= _KEY_CHARACTERS:
            msg = f"a label's key is letters, digits, '_', '.' or '-' (at most {MAX_KEY}), not {plain(key)}"
            raise UsageError(msg)
        if not isinstance(value, str) or len(value) > MAX_VALUE or not value.isprintable():
            msg = f"label {key}: its value is printable text of at most {MAX_VALUE} characters, not {plain(value)}"
            raise UsageError(msg)
        if labels.get(key, value) != value:
            msg = f"label {key} is given twice, as {plain(labels[key])} and {plain(value)}"
            raise UsageError(msg)
        labels[key] = value
    if len(labels) > MAX_LABELS:
        msg = f"at most {MAX_LABELS} labels, not {len(labels)}"
        raise UsageError(msg)
    return dict(sorted(labels.items()))


def split(overrides: dict[str, object]) -> tuple[dict[str, str] | None, dict[str, object]]:
    """(the labels given, checked, or None; the other overrides)."""
    if NAME not in overrides:
        return None, overrides
    rest = {name: value for name, value in overrides.items() if name != NAME}
    return parse(overrides[NAME]), rest


def check_pinned(pinned: dict[str, str], given: dict[str, str] | None) -> None:
    """Refuse labels given now that differ from the pinned ones (naming fewer is fine)."""
    for key, value in (given or {}).items():
        if pinned.get(key) != value:
            was = "none" if key not in pinned else plain(pinned[key])
            msg = f"--label {key}={plain(value)} differs from the label pinned when this trial was created ({was})"
            raise LimitMismatch(msg)


__all__ = ["NAME", "check_pinned", "parse", "split"]
