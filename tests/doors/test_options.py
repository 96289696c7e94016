"""The command line's typed face: `Arguments` declares every flag of the table, as its kind says."""

from __future__ import annotations

import pytest

from trialtool.doors.options import _DEFAULTS, OPTIONS, SUBCOMMANDS, Arguments, parse, quick

#: What each kind of flag holds once parsed (None too, for a flag not given that has no default).
TYPE_OF = {"text": "str", "number": "float", "whole": "int", "list": "list[str]", "switch": "bool"}
#: What argparse adds besides the table: the command, the positionals, --version.
EXTRAS = {"command": "str", "directory": "str", "action": "str", "paths": "list[str]", "version": "bool"}
#: Required wherever they are taken, so never None.
REQUIRED = {"state", "log"}


def _declared() -> dict[str, str]:
    return {name: kind.split("  #")[0] for name, kind in Arguments.__annotations__.items()}


def test_every_flag_is_declared_with_the_type_its_kind_parses_to() -> None:
    wanted = dict(EXTRAS)
    for _, dest, kind, _, _, _ in OPTIONS:
        base = TYPE_OF[kind]
        optional = kind in ("text", "number", "whole") and _DEFAULTS.get(dest) is None and dest not in REQUIRED
        wanted[dest] = f"{base} | None" if optional else base
    assert _declared() == wanted


@pytest.mark.parametrize("command", [c for c in SUBCOMMANDS if c not in ("shim", "server", "report", "export")])
def test_a_parsed_command_sets_each_of_its_flags_and_no_other(command: str) -> None:
    args = parse(command, ["--state", "s.json", "--log", "l.jsonl"] if command not in ("gc", "keygen") else [])
    dests = {dest for _, dest, _, commands, _, _ in OPTIONS if command in commands}
    assert set(vars(args)) == {"command", "version", *dests}


def test_the_quick_reading_and_argparse_agree() -> None:
    flags = ["--state", "s.json", "--log", "l.jsonl", "--max-calls", "3", "--writable", "a", "--writable", "b"]
    quick_args, parsed = quick("run", flags), parse("run", flags)
    assert quick_args is not None
    assert {k: v for k, v in vars(parsed).items() if k != "version"} == vars(quick_args)
    assert quick_args.max_calls == 3.0 and quick_args.writable == ["a", "b"] and quick_args.sandbox is None
