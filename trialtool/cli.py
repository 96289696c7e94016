"""The command line: arguments in, exit code out. No decisions are made here.

    trial-tool [run] --state S --log L [limits] [options] -- CMD ARGS...
    trial-tool init  --state S --log L [limits]
    trial-tool status --state S --log L
    trial-tool verify --state S --log L [--json]
    trial-tool serve --state S --log L [limits] [--max-concurrent N]   JSON lines on stdin/stdout
    trial-tool mcp   --state S --log L [limits] [--max-concurrent N]   an MCP stdio server
    trial-tool shim DIR --state S --log L [limits]   write DIR/sh, DIR/bash: budgeted shells

Everything after the first `--` is the command, untouched. Every TrialToolError
becomes one line on stderr and its class's exit code, in `main` and nowhere else.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from .errors import TrialToolError, UsageError
from .locking import DEFAULT_LOCK_TIMEOUT

# Not typing.TYPE_CHECKING: importing typing costs ~6 ms, paid before the supervisor's
# fork if done here (mypy treats any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any, NoReturn

    from .limits import Limits
    from .trial import Trial

SUBCOMMANDS = ("run", "init", "status", "verify", "serve", "mcp", "shim")
#: Subcommands that create trials or run calls, and so take the limits.
_CALLING = ("run", "init", "serve", "mcp", "shim")
#: Set by `entry`: the process ends with os._exit, so big objects (the encoder's
#: 200k-entry rank table takes ~0.1 s to free) are kept here rather than freed.
_KEEP_UNTIL_EXIT: list[object] | None = None
#: The ledger key, when not given by --key-file. Never passed to the command.
KEY_ENV = "TRIALTOOL_LEDGER_KEY"
#: `verify` found a problem.
EXIT_VERIFY_FAILED = 1

_LIMIT_HELP = {
    "max_calls": "calls the trial may make (default %(default)s)",
    "max_tokens": "o200k_base tokens delivered over the whole trial (default %(default)s)",
    "max_call_tokens": "o200k_base tokens one call may deliver (default %(default)s)",
    "trial_timeout": "seconds of wall clock from the trial's start (default %(default)s)",
    "call_timeout": "seconds one command may run (default %(default)s)",
    "max_capture_bytes": "bytes kept per stream; past it the command is stopped (default %(default)s)",
    "kill_grace": "seconds between SIGTERM and SIGKILL when stopping a command (default %(default)s)",
    "max_memory": "bytes of memory for the command's tree; 0: none (default %(default)s)",
    "max_cpu_seconds": "CPU seconds per process; 0: none (default %(default)s)",
    "max_file_size": "bytes of any file the command writes; 0: none (default %(default)s)",
    "max_open_files": "open files per process; 0: inherit (default %(default)s)",
    "max_procs": "processes in the command's tree at once; 0: none (default %(default)s)",
}


_DESCRIPTIONS = {
    "run": "Run one agent tool call within a trial's budgets of calls, tokens and time.",
    "init": "Create a trial and pin its limits.",
    "status": "Show what a trial has spent and has left.",
    "verify": "Check a whole trial: the log's chain, every record's totals, the state.",
    "serve": "Serve a trial's tool calls as JSON lines on stdin and stdout (see the README for the protocol).",
    "mcp": "Serve a trial's tool calls as a Model Context Protocol server over stdio (needs trialtool[mcp]).",
    "shim": "Write sh and bash shims into DIRECTORY: each `sh -c CMD` through them is one call of the trial.",
}


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        import argparse

        msg = f"not a number: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _parser(command: str) -> argparse.ArgumentParser:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            # argparse would exit 2 with a usage block; we promise one line and exit 125.
            raise UsageError(message)

    parser = _Parser(
        prog=f"trial-tool {command}" if command != "run" else "trial-tool",
        description=_DESCRIPTIONS[command],
        epilog=(
            "other commands: init, status, verify, serve (JSON lines), mcp (MCP server), shim (sh/bash shims); "
            "`trial-tool COMMAND --help`"
        )
        if command == "run"
        else None,
    )
    parser.add_argument("--state", required=True, help="the trial's JSON state file")
    parser.add_argument("--log", required=True, help="the trial's JSONL audit log")
    parser.add_argument(
        "--lock-timeout",
        type=_number,
        default=DEFAULT_LOCK_TIMEOUT,
        help="seconds to wait for the ledger lock (default %(default)s)",
    )
    parser.add_argument(
        "--key-file",
        default=None,
        help=f"file holding the ledger key (HMAC-SHA256 chain and state); else ${KEY_ENV}; pinned at creation",
    )
    if command == "verify":
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
    if command in _CALLING:
        from .limits import CLIP_MODES, Limits

        defaults = Limits()
        limits = parser.add_argument_group("limits (pinned when the trial is created)")
        for name, text in _LIMIT_HELP.items():
            limits.add_argument(
                "--" + name.replace("_", "-"),
                dest=name,
                type=_number,
                default=None,
                metavar="N",
                help=text % {"default": getattr(defaults, name)},
            )
        limits.add_argument(
            "--clip",
            choices=CLIP_MODES,
            default=None,
            help=f"how to cut output over the allowance (default {defaults.clip})",
        )
    if command in ("serve", "mcp"):
        server = parser.add_argument_group("the server")
        server.add_argument(
            "--max-concurrent",
            type=int,
            default=4,
            metavar="N",
            help="tool calls run at once; more wait (default %(default)s)",
        )
    if command == "serve":
        server.add_argument(
            "--max-request-bytes",
            type=int,
            default=1 << 20,
            metavar="N",
            help="longest request line; longer ones get an error (default %(default)s)",
        )
    if command == "run":
        call = parser.add_argument_group("this call's command (not pinned)")
        call.add_argument("--cwd", default=None, help="directory to run the command in")
        call.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set a variable")
        call.add_argument("--unset-env", action="append", default=[], metavar="NAME", help="remove a variable")
        call.add_argument(
            "--clean-env", action="store_true", help="start from PATH, HOME, LANG, TERM and a few more only"
        )
    if command == "shim":
        parser.add_argument("directory", help="where to write the sh and bash shims")
    if command in ("run", "serve", "mcp", "shim"):
        parser.add_argument(
            "--o200k-file",
            default=None,
            help="the o200k_base.tiktoken rank file (else TRIALTOOL_O200K_FILE, the bundled copy, tiktoken's cache)",
        )
    return parser


def _split(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(subcommand, its flags, the command after `--`)."""
    command = "run"
    if argv and argv[0] in SUBCOMMANDS:
        command, argv = argv[0], argv[1:]
    if "--" in argv:
        cut = argv.index("--")
        return command, argv[:cut], argv[cut + 1 :]
    return command, argv, []


_FAST_VALUES = {
    "--state": "state",
    "--log": "log",
    "--lock-timeout": "lock_timeout",
    "--key-file": "key_file",
    "--o200k-file": "o200k_file",
    "--cwd": "cwd",
    "--clip": "clip",
    **{"--" + name.replace("_", "-"): name for name in _LIMIT_HELP},
}
_FAST_LISTS = {"--env": "env", "--unset-env": "unset_env"}
_FAST_NUMBERS = frozenset({"lock_timeout", *_LIMIT_HELP})


def _fast_run_args(flags: list[str]) -> SimpleNamespace | None:
    """The run command's flags without argparse (~9 ms to import and build here), or None.

    Only exact, well-formed flags are taken; anything else (--help, an
    abbreviation, a bad number, a missing value) goes to argparse, which says
    what is wrong in its own words.
    """
    values: dict[str, Any] = dict.fromkeys(_FAST_VALUES.values())
    values.update(lock_timeout=DEFAULT_LOCK_TIMEOUT, env=[], unset_env=[], clean_env=False)
    index = 0
    while index < len(flags):
        flag, equals, value = flags[index].partition("=")
        index += 1
        if flag == "--clean-env" and not equals:
            values["clean_env"] = True
            continue
        name = _FAST_VALUES.get(flag) or _FAST_LISTS.get(flag)
        if name is None or not flag.startswith("--"):
            return None
        if not equals:
            if index >= len(flags):
                return None
            value = flags[index]
            index += 1
        if name in _FAST_NUMBERS:
            try:
                values[name] = float(value)
            except ValueError:
                return None
        elif flag in _FAST_LISTS:
            values[name].append(value)
        else:
            values[name] = value
    if values["state"] is None or values["log"] is None:
        return None
    return SimpleNamespace(**values)


def _overrides(args: argparse.Namespace | SimpleNamespace) -> dict[str, Any]:
    names = [*_LIMIT_HELP, "clip"]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _key(args: argparse.Namespace | SimpleNamespace) -> bytes | None:
    """The ledger key from --key-file or the environment; at least 16 bytes."""
    if args.key_file is not None:
        try:
            with open(args.key_file, "rb") as handle:
                key = handle.read().rstrip(b"\r\n")
        except OSError as exc:
            msg = f"cannot read --key-file {args.key_file}: {exc.strerror or exc}"
            raise UsageError(msg) from exc
    else:
        value = os.environ.get(KEY_ENV)
        if not value:
            return None
        key = value.encode()
    if len(key) < 16:
        msg = "the ledger key must be at least 16 bytes"
        raise UsageError(msg)
    return key


def _run(argv: list[str]) -> int:
    command, flags, tool_argv = _split(argv)
    if command == "run" and "--" not in argv and not any(f in ("-h", "--help") for f in flags):
        msg = "missing `--` before the command: trial-tool --state S --log L -- CMD ARGS..."
        raise UsageError(msg)
    args = (_fast_run_args(flags) if command == "run" else None) or _parser(command).parse_args(flags)
    if command == "run":
        if not tool_argv:
            msg = "no command after `--`"
            raise UsageError(msg)
        from .launcher import Launcher

        # Fork the call's supervisor now, so that it gets ready (prctl, cgroup) while
        # this process imports the rest of trialtool and reserves the call.
        with Launcher(os.path.dirname(os.path.abspath(args.state))) as launcher:
            from . import environment
            from .interrupts import InterruptWatch

            trial = _trial(args)
            env = dict(environment.parse_assignment(item) for item in args.env)
            with InterruptWatch() as interrupt:
                result = trial.run(
                    tool_argv,
                    cwd=args.cwd,
                    env=env,
                    unset_env=tuple(args.unset_env),
                    clean_env=args.clean_env,
                    interrupt=interrupt,
                    launcher=launcher,
                )
        if _KEEP_UNTIL_EXIT is not None:
            _KEEP_UNTIL_EXIT.append(trial)
        # Written as UTF-8 bytes: exactly the text that was counted, whatever the locale.
        sys.stdout.buffer.write(result.stdout.encode("utf-8"))
        sys.stdout.flush()
        sys.stderr.buffer.write(result.stderr.encode("utf-8"))
        sys.stderr.flush()
        return result.exit_code
    if tool_argv:
        raise UsageError(f"`trial-tool {command}` takes no command")
    if command == "verify":
        from .verify import render, verify

        report = verify(args.state, args.log, _key(args))
        import json

        print(json.dumps(report.as_json(), indent=2) if args.json else render(report))
        return 0 if report.ok else EXIT_VERIFY_FAILED
    if command == "shim":
        return _install_shim(args)
    if command in ("serve", "mcp"):
        if args.max_concurrent < 1:
            raise UsageError("--max-concurrent must be at least 1")
        trial = _trial(args)
        # The trial is made (or its limits checked) before the first request: a mismatch
        # stops the server at once. Its clock starts then, so the MCP SDK is loaded first.
        if command == "serve":
            from . import serve

            if args.max_request_bytes < 2:
                raise UsageError("--max-request-bytes must be at least 2")
            trial.open()
            return serve.run(trial, max_concurrent=args.max_concurrent, max_request_bytes=args.max_request_bytes)
        from . import mcp_server

        return mcp_server.run(trial, max_concurrent=args.max_concurrent)
    trial = _trial(args)
    state = trial.init() if command == "init" else trial.status()
    import json

    print(json.dumps(_describe(state), indent=2, sort_keys=True))
    return 0


def _trial(args: argparse.Namespace | SimpleNamespace) -> Trial:
    """The Trial the flags name."""
    from .trial import Trial

    return Trial(
        args.state,
        args.log,
        limits=_overrides(args),
        lock_timeout=args.lock_timeout,
        rank_file=getattr(args, "o200k_file", None),
        key=_key(args),
    )


def _install_shim(args: argparse.Namespace | SimpleNamespace) -> int:
    """Create (or check) the trial, then write shims that run calls of it with these flags."""
    from . import shim

    _trial(args).open()
    # Absolute paths: the shims run from whatever directory the harness is in.
    flags = ["--state", os.path.abspath(args.state), "--log", os.path.abspath(args.log)]
    flags += ["--lock-timeout", repr(args.lock_timeout)]
    for name, value in _overrides(args).items():
        shown = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        flags += ["--" + name.replace("_", "-"), shown]
    for flag, value in (("--key-file", args.key_file), ("--o200k-file", args.o200k_file)):
        if value is not None:
            flags += [flag, os.path.abspath(value)]
    for path in shim.install(args.directory, flags):
        print(path)
    return 0


def _describe(state: dict[str, Any]) -> dict[str, Any]:
    """The state as JSON, with what is left of each budget."""
    limits: Limits = state["limits"]
    shown = dict(state)
    shown["limits"] = limits._asdict()
    shown["log"] = state["log"]._asdict()
    shown["left"] = {
        "calls": limits.max_calls - state["calls"],
        "tokens": limits.max_tokens - state["emitted_tokens"],
        "seconds": max(0.0, limits.trial_timeout - state["elapsed_seconds"]),
    }
    return shown


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the API for embedding and tests)."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except TrialToolError as exc:
        print(f"trial-tool: {exc.message}", file=sys.stderr)
        return exc.exit_code


def entry() -> NoReturn:
    """The `trial-tool` and `python -m trialtool` process: main, then a quick exit.

    Everything durable was fsynced and the output flushed by then; skipping the
    interpreter's teardown saves ~15 ms a call here.
    """
    global _KEEP_UNTIL_EXIT
    _KEEP_UNTIL_EXIT = []
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass  # the reader went away; the call is recorded all the same
    os._exit(code)


__all__ = ["entry", "main"]
