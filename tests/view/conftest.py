"""Trials made for the graders' view: real trial-tool files, written through the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trialtool import BudgetExhausted, Trial

FAST = {"sandbox": "none"}


def make_trial(
    state: Path, log: Path, commands: list[Any], limits: dict[str, Any] | None = None, **options: Any
) -> list[Any]:
    """A trial at `state`/`log` that ran `commands` (refused ones included); what each call returned."""
    results: list[Any] = []
    with Trial(state, log, limits={**FAST, **(limits or {})}, **options) as trial:
        for command in commands:
            try:
                results.append(trial.run(command))
            except BudgetExhausted as exc:
                results.append(exc)
    return results


def make_trials(
    root: Path, names: str | list[str], commands: list[Any], limits: dict[str, Any], **options: Any
) -> None:
    """One trial per name, each in a directory of its own as a benchmark leaves them (NAME/s.json, NAME/l.jsonl)."""
    for name in names:
        (root / name).mkdir()
        make_trial(root / name / "s.json", root / name / "l.jsonl", commands, limits, **options)
