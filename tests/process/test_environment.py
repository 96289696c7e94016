"""environment.build and parse_assignment, case by case: what reaches the command."""

from __future__ import annotations

from typing import Any

import pytest

from trialtool import UsageError
from trialtool.process._environment import build, parse_assignment

BASE = {"PATH": "/bin", "HOME": "/root", "SECRET": "s", "TRIALTOOL_LEDGER_KEY": "k", "LANG": "C"}

CASES = [
    # (keyword arguments, the environment the command gets)
    ({}, {"PATH": "/bin", "HOME": "/root", "SECRET": "s", "LANG": "C"}),
    ({"clean": True}, {"PATH": "/bin", "HOME": "/root", "LANG": "C"}),
    ({"unset": ["SECRET", "ABSENT"]}, {"PATH": "/bin", "HOME": "/root", "LANG": "C"}),
    ({"set_vars": {"A": "1", "PATH": "/x"}}, {"PATH": "/x", "HOME": "/root", "SECRET": "s", "LANG": "C", "A": "1"}),
    (
        {"clean": True, "set_vars": {"SECRET": "again"}},
        {"PATH": "/bin", "HOME": "/root", "LANG": "C", "SECRET": "again"},
    ),
    (
        {"unset": ["A"], "set_vars": {"A": "kept"}},
        {"PATH": "/bin", "HOME": "/root", "SECRET": "s", "LANG": "C", "A": "kept"},
    ),
]


@pytest.mark.parametrize(("options", "expected"), CASES)
def test_build(options: dict[str, Any], expected: dict[str, str]) -> None:
    assert build(base=BASE, **options) == expected


def test_trial_tools_own_variables_cannot_be_set() -> None:
    with pytest.raises(UsageError, match="trial-tool's own variable TRIALTOOL_X"):
        build(base=BASE, set_vars={"TRIALTOOL_X": "1"})


@pytest.mark.parametrize(
    ("text", "pair"), [("A=1", ("A", "1")), ("A=", ("A", "")), ("A=b=c", ("A", "b=c")), ("A= x ", ("A", " x "))]
)
def test_parse_assignment(text: str, pair: tuple[str, str]) -> None:
    assert parse_assignment(text) == pair


@pytest.mark.parametrize("text", ["A", "=1", "", "A=\0"])
def test_parse_assignment_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--env wants KEY=VALUE"):
        parse_assignment(text)
