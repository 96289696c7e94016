"""Limits: what validation accepts, normalises and refuses, flag by flag; every limit has its flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trialtool import LimitMismatch, Limits, UsageError
from trialtool.doors.options import OPTIONS
from trialtool.types._limits import (
    BOUNDS,
    FLAG_OF,
    SANDBOX_SETTINGS,
    check_pinned,
    from_overrides,
    from_state,
    validate,
)

ACCEPTED = [
    # (overrides, the field to look at, its normalised value)
    ({"max_calls": 12.0}, "max_calls", 12),
    ({"max_calls": 1}, "max_calls", 1),
    ({"max_tokens": 1_000_000_000}, "max_tokens", 1_000_000_000),
    ({"call_timeout": 2}, "call_timeout", 2.0),
    ({"kill_grace": 0}, "kill_grace", 0.0),
    ({"max_memory": 0}, "max_memory", 0),
    ({"max_memory": 1 << 20}, "max_memory", 1 << 20),
    ({"max_open_files": 8}, "max_open_files", 8),
    ({"max_procs": 0}, "max_procs", 0),
    ({"clip": "head"}, "clip", "head"),
]

REFUSED = [
    # (overrides, words the one-line message must hold)
    ({"max_calls": 0}, "--max-calls must be between 1"),
    ({"max_calls": 2.5}, "--max-calls must be a whole number"),
    ({"max_calls": "12"}, "--max-calls must be a number"),
    ({"max_calls": True}, "--max-calls must be a number"),
    ({"max_tokens": float("nan")}, "--max-tokens must be finite"),
    ({"trial_timeout": float("inf")}, "--trial-timeout must be finite"),
    ({"call_timeout": 0}, "--call-timeout must be between"),
    ({"call_timeout": 31 * 86_400}, "--call-timeout must be between"),
    ({"max_capture_bytes": 2 << 30}, "--max-capture-bytes must be between"),
    ({"max_capture_bytes": (256 << 20) + 1}, "--max-capture-bytes must be between 1 and 268435456"),
    ({"max_memory": 1000}, "--max-memory must be between 1048576 and 1099511627776, not 1000"),
    ({"max_calls": 5e6}, "--max-calls must be between 1 and 1000000, not 5000000"),
    ({"max_calls": "12"}, '--max-calls must be a number, not "12"'),
    ({"max_calls": None}, "--max-calls must be a number, not null"),
    ({"max_open_files": 3}, "--max-open-files must be between 8"),
    ({"kill_grace": -1}, "--kill-grace must be between 0"),
    ({"clip": "tail"}, "--clip must be one of headtail, head"),
    ({"max_call": 3}, 'unknown limit "max_call"'),
]


@pytest.mark.parametrize(("overrides", "field", "value"), ACCEPTED)
def test_accepted(overrides: dict[str, Any], field: str, value: Any) -> None:
    got = getattr(from_overrides(overrides), field)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(("overrides", "words"), REFUSED)
def test_refused(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(UsageError) as caught:
        from_overrides(overrides)
    assert words in caught.value.message and "\n" not in caught.value.message


def test_defaults_validate_to_themselves() -> None:
    assert validate(Limits()) == Limits()


def test_every_limit_is_in_every_place() -> None:
    """The places limits.py's checklist marks: a bound, a flag, and a row in the README's table."""
    flags = {dest for _, dest, _, _, group, _ in OPTIONS if group and group.startswith("limits")}
    assert flags == set(Limits._fields) | set(SANDBOX_SETTINGS) | {"labels"}
    assert set(BOUNDS) == set(Limits._fields) - {"clip"}
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    undocumented = [name for name in Limits._fields if f"| `{FLAG_OF[name]} " not in readme]
    assert not undocumented, undocumented


def test_pinned_limits_round_trip_and_refuse_a_difference() -> None:
    pinned = from_overrides({"max_calls": 3})
    assert from_state(pinned._asdict()) == pinned
    check_pinned(pinned, {"max_calls": 3.0})  # the same value, as the CLI passes it
    with pytest.raises(LimitMismatch, match="--max-calls 4 differs from the value 3 pinned"):
        check_pinned(pinned, {"max_calls": 4})
    with pytest.raises(ValueError, match="missing or have unknown fields"):
        from_state({**pinned._asdict(), "extra": 1})


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"sandbox": 3}, "--sandbox must be one of"),
        ({"sandbox": "chroot"}, "--sandbox must be one of none, bwrap, gvisor, docker, podman, auto"),
        ({"image": ""}, "--image must name an image"),
        ({"home": "somewhere"}, "--home must be one of host, trial"),
        ({"workspace": 7}, "--workspace must be a directory"),
        ({"writable": "one/path"}, "--writable takes one path per use"),
        ({"run_as": "someone"}, "--run-as must be root, user or UID:GID"),
        ({"origin": 1}, "the sandbox's origin must be a path"),
        ({"image": "busybox"}, "--image goes with --sandbox docker or --sandbox podman"),
        ({"sandbox": "none", "home": "trial"}, "--home goes with --sandbox bwrap"),
    ],
)
def test_sandbox_settings_are_checked_one_by_one_and_named(given: dict[str, object], words: str) -> None:
    from trialtool import sandbox

    with pytest.raises(UsageError) as raised:
        sandbox.checked(given)
    assert words in raised.value.message


def test_checked_sandbox_settings_keep_only_what_was_given() -> None:
    from trialtool import sandbox

    checked = sandbox.checked({"sandbox": "bwrap", "writable": ["a", "b"], "run_as": "user", "home": "host"})
    assert checked == {"sandbox": "bwrap", "writable": ("a", "b"), "run_as": "65534:65534", "home": "host"}
