"""The command line's grammar: one table of flags, read quickly for a call and by argparse for the rest.

A call (`run`) is read straight from `OPTIONS` before anything heavy is
imported, so that the call's supervisor is forked as early as possible;
`--help`, the other commands, and anything the quick reading does not take go
to argparse, built from the same table, which explains what is wrong in one
line. The table holds plain tuples, not NamedTuples, and this module imports
neither `typing` nor `argparse` until it must: both are imports a call would
pay for before that fork (docs/performance.md).
"""

from __future__ import annotations

from ..errors import UsageError
from ..ledger import DEFAULT_LOCK_TIMEOUT

TYPE_CHECKING = False  # typing's own is an import before the fork; mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: The commands on a trial; `server` is about the per-user server and takes no trial.
_TRIAL = ("run", "init", "status", "show", "verify", "serve", "mcp", "shim", "close", "attest")
#: The graders' commands over many trials, named by paths.
_MANY = ("report", "export")
SUBCOMMANDS = (*_TRIAL, *_MANY, "server", "gc", "keygen")
_CALLING = ("run", "init", "serve", "mcp", "shim")
#: The commands that write a trial's records, and so sign them when it is signed.
_SIGNING = (*_CALLING, "close", "attest")
#: The commands that check signatures against trusted public keys.
_CHECKING = ("verify", "status", *_MANY)
_SERVING = ("serve", "mcp")
_ENCODING = ("run", "serve", "mcp", "shim")
_LIMIT = "limits (pinned when the trial is created)"
_CALL = "this call's command (not pinned)"
_SERVER = "the server"
#: Every flag: (flag, dest, kind, commands, help group, help). Kinds: text, number (float),
#: whole (int), list (repeatable text), switch. Each field of `Limits` has a row in the
#: limits group, its dest the field's name; its range is in limits.BOUNDS.
OPTIONS: tuple[tuple[str, str, str, tuple[str, ...], str | None, str], ...] = (
    ("--state", "state", "text", _TRIAL, None, "the trial's JSON state file"),
    ("--log", "log", "text", _TRIAL, None, "the trial's JSONL audit log"),
    ("--lock-timeout", "lock_timeout", "number", _TRIAL, None, "seconds to wait for the ledger lock"),
    (
        "--key-file",
        "key_file",
        "text",
        (*_TRIAL, *_MANY),
        None,
        "file holding the ledger key (else $TRIALTOOL_LEDGER_KEY)",
    ),
    (
        "--signing-key",
        "signing_key",
        "text",
        _SIGNING,
        None,
        "the trial's Ed25519 signing key file (else $TRIALTOOL_SIGNING_KEY): a signed trial",
    ),
    (
        "--public-key",
        "public_key",
        "text",
        _CHECKING,
        None,
        "a file of trusted Ed25519 public keys: check each trial's signatures with them",
    ),
    ("--json", "json", "switch", ("verify", "status", "show", "init", "attest"), None, "print JSON instead of text"),
    ("--strict", "strict", "switch", ("verify", "report"), None, "exit non-zero for any trial that is not clean"),
    ("--heads", "heads", "text", _MANY, None, "trial_id and head the harness was given, CSV or JSONL"),
    ("--expect-head", "expect_head", "text", ("verify",), None, "the chain head the harness was last given"),
    ("--call", "call", "whole", ("show",), None, "one call's whole record and the text it delivered"),
    ("--record", "record", "whole", ("show",), None, "one record, by its number in the log (unique)"),
    (
        "--format",
        "format",
        "text",
        _MANY,
        None,
        "table, json, csv, markdown, html (report); jsonl, csv, parquet (export)",
    ),
    ("--output", "output", "text", (*_MANY, "keygen"), None, "write to this file (-o) instead of stdout"),
    ("--jobs", "jobs", "whole", _MANY, None, "worker processes (default: one per CPU)"),
    ("--scores", "scores", "text", _MANY, None, "the benchmark's scores: CSV or JSONL of score by trial_id or labels"),
    ("--trials", "trials", "text", ("export",), None, "also write the trials table (verdict, labels, ...) to FILE"),
    ("--connections", "connections", "text", ("export",), None, "also write the connections table to FILE"),
    ("--details", "details", "whole", ("report",), None, "html: trials whose calls the page embeds"),
    ("--text", "text", "switch", ("export",), None, "add the text each call delivered"),
    ("--max-calls", "max_calls", "number", _CALLING, _LIMIT, "calls the trial may make"),
    ("--max-tokens", "max_tokens", "number", _CALLING, _LIMIT, "o200k_base tokens delivered over the trial"),
    ("--max-call-tokens", "max_call_tokens", "number", _CALLING, _LIMIT, "o200k_base tokens one call may deliver"),
    ("--trial-timeout", "trial_timeout", "number", _CALLING, _LIMIT, "seconds of wall clock from the trial's start"),
    ("--call-timeout", "call_timeout", "number", _CALLING, _LIMIT, "seconds one command may run"),
    ("--max-capture-bytes", "max_capture_bytes", "number", _CALLING, _LIMIT, "bytes kept per stream, then a stop"),
    ("--kill-grace", "kill_grace", "number", _CALLING, _LIMIT, "seconds between SIGTERM and SIGKILL"),
    ("--clip", "clip", "text", _CALLING, _LIMIT, "how output over the allowance is cut: headtail or head"),
    ("--max-memory", "max_memory", "number", _CALLING, _LIMIT, "bytes of memory for the command's tree; 0: none"),
    ("--max-cpu-seconds", "max_cpu_seconds", "number", _CALLING, _LIMIT, "CPU seconds per process; 0: none"),
    ("--max-file-size", "max_file_size", "number", _CALLING, _LIMIT, "bytes of any file written; 0: none"),
    ("--max-open-files", "max_open_files", "number", _CALLING, _LIMIT, "open files per process; 0: inherit"),
    ("--max-procs", "max_procs", "number", _CALLING, _LIMIT, "processes in the command's tree at once; 0: none"),
    (
        "--max-stdin-bytes",
        "max_stdin_bytes",
        "number",
        _CALLING,
        _LIMIT,
        "bytes a call may pass to its command's stdin",
    ),
    (
        "--sandbox",
        "sandbox",
        "text",
        _CALLING,
        _LIMIT,
        "run commands in a sandbox: none, bwrap, gvisor, docker or podman (with --image), or auto (bwrap)",
    ),
    (
        "--image",
        "image",
        "text",
        _CALLING,
        _LIMIT,
        "the container image of --sandbox docker or podman (pinned by its id)",
    ),
    (
        "--network",
        "network",
        "text",
        _CALLING,
        _LIMIT,
        "the sandbox's network: none (default), host, or allow (only to what --allow lists)",
    ),
    ("--allow", "allow", "list", _CALLING, _LIMIT, "HOST[:PORT] sandboxed commands may reach (repeatable)"),
    ("--workspace", "workspace", "text", _CALLING, _LIMIT, "the directory sandboxed commands may write (default .)"),
    ("--writable", "writable", "list", _CALLING, _LIMIT, "another path sandboxed commands may write (repeatable)"),
    (
        "--home",
        "home",
        "text",
        _CALLING,
        _LIMIT,
        "sandboxed commands' $HOME: trial (a layer of its own, default) or host",
    ),
    (
        "--run-as",
        "run_as",
        "text",
        _CALLING,
        _LIMIT,
        "who sandboxed commands run as: user (uid 65534, the default for a root caller), root, or UID:GID",
    ),
    ("--label", "labels", "list", _CALLING, _LIMIT, "who the trial is: KEY=VALUE, such as task=t1 (repeatable)"),
    (
        "--checkpoint-every",
        "checkpoint_every",
        "whole",
        _CALLING,
        None,
        "a signed trial: sign the log's head once this many records were added (pinned; default 1)",
    ),
    ("--max-concurrent", "max_concurrent", "whole", _SERVING, _SERVER, "tool calls run at once; more wait"),
    ("--max-request-bytes", "max_request_bytes", "whole", ("serve",), _SERVER, "longest request line"),
    ("--cwd", "cwd", "text", ("run",), _CALL, "directory to run the command in"),
    ("--env", "env", "list", ("run",), _CALL, "set a variable: KEY=VALUE (repeatable)"),
    ("--unset-env", "unset_env", "list", ("run",), _CALL, "remove a variable (repeatable)"),
    ("--clean-env", "clean_env", "switch", ("run",), _CALL, "start from PATH, HOME, LANG, TERM and a few more"),
    ("--stdin", "stdin", "text", ("run",), _CALL, "the command's standard input: a file, or - for this one's"),
    (
        "--merge-output",
        "merge_output",
        "switch",
        ("run",),
        _CALL,
        "one stream: stderr into stdout, in the order written",
    ),
    ("--timeout", "timeout", "number", ("run",), _CALL, "seconds for this call, below the pinned --call-timeout"),
    ("--read-only", "read_only", "list", ("run",), _CALL, "a path in a writable one that the command may not change"),
    ("--json", "json", "switch", ("run",), None, "print the call's result as one JSON object (serve's shape)"),
    ("--o200k-file", "o200k_file", "text", (*_ENCODING, "show"), None, "the o200k_base.tiktoken rank file to use"),
    ("--in-process", "in_process", "switch", ("run",), None, "run the call in this process, not the per-user server"),
)
#: Defaults of the options that are not limits (a limit's default is the pinned value, or Limits').
_DEFAULTS: dict[str, object] = {
    "lock_timeout": DEFAULT_LOCK_TIMEOUT,
    "max_concurrent": 4,
    "max_request_bytes": 1 << 20,
    "details": 2000,
}
_LIMIT_DESTS = tuple(dest for _, dest, _, _, group, _ in OPTIONS if group == _LIMIT)

_DESCRIPTIONS = {
    "run": "Run one agent tool call within a trial's budgets of calls, tokens and time.",
    "init": "Create a trial and pin its limits.",
    "status": "Show what a trial has used and has left, and whether it is intact (reads only).",
    "show": "Show a trial's calls as a table, or one call's whole record and what it delivered (reads only).",
    "report": "Verify and compare many trials (directories or globs): fairness, integrity, budget use (reads only).",
    "export": "Every call of every trial as one flat row: JSON lines, CSV or Parquet, for SQL (reads only).",
    "verify": "Check a whole trial: the log's chain, every record's totals, the state.",
    "serve": "Serve a trial's tool calls as JSON lines on stdin and stdout (see docs/serve.md for the protocol).",
    "mcp": "Serve a trial's tool calls as a Model Context Protocol server over stdio (needs trialtool[mcp]).",
    "shim": "Write sh and bash shims into DIRECTORY: each `sh -c CMD` through them is one call of the trial.",
    "close": "End the trial's use: remove its container (a container backend's), sign its statement (a signed trial).",
    "attest": "Sign a signed trial's statement now and write it beside its log (docs/attestations.md).",
    "keygen": "Make an Ed25519 signing key for signed trials (-o FILE, mode 0600); print its public key.",
    "gc": "Remove the containers of trials that have ended, or whose state file is gone.",
    "server": "The per-user server that runs CLI calls warm (TRIALTOOL_SERVER=off: none): its status, or stop it.",
}


class Arguments:
    """Parsed flags, typed: each dest of OPTIONS that the command takes is set, as its kind says
    (text: str, number: float, whole: int, list: list[str], switch: bool; None when not given and
    without a default). tests/doors/test_options.py checks that these agree with the table."""

    command: str
    # Positional: shim's directory, server's action, the graders' paths; and --version.
    directory: str
    action: str
    paths: list[str]
    version: bool
    # The trial's files and how they are read.
    state: str  # required by every command that takes it, as is --log
    log: str
    lock_timeout: float
    key_file: str | None
    signing_key: str | None
    public_key: str | None
    checkpoint_every: int | None
    # What status, show, verify, report and export print.
    json: bool
    strict: bool
    heads: str | None
    expect_head: str | None
    call: int | None
    record: int | None
    format: str | None
    output: str | None
    jobs: int | None
    scores: str | None
    trials: str | None
    connections: str | None
    details: int
    text: bool
    # The limits (None: not given, the pinned value or Limits' default holds).
    max_calls: float | None
    max_tokens: float | None
    max_call_tokens: float | None
    trial_timeout: float | None
    call_timeout: float | None
    max_capture_bytes: float | None
    kill_grace: float | None
    clip: str | None
    max_memory: float | None
    max_cpu_seconds: float | None
    max_file_size: float | None
    max_open_files: float | None
    max_procs: float | None
    max_stdin_bytes: float | None
    # The sandbox's settings and the labels, pinned with the limits.
    sandbox: str | None
    image: str | None
    network: str | None
    allow: list[str]
    workspace: str | None
    writable: list[str]
    home: str | None
    run_as: str | None
    labels: list[str]
    # serve and mcp.
    max_concurrent: int
    max_request_bytes: int
    # This call's command.
    cwd: str | None
    env: list[str]
    unset_env: list[str]
    clean_env: bool
    stdin: str | None
    merge_output: bool
    timeout: float | None
    read_only: list[str]
    o200k_file: str | None
    in_process: bool

    def __init__(self, command: str, values: dict[str, object]) -> None:
        self.command = command
        self.__dict__.update(values)


def _empty(command: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for _, dest, kind, commands, _, _ in OPTIONS:
        if command in commands:
            values[dest] = [] if kind == "list" else False if kind == "switch" else _DEFAULTS.get(dest)
    return values


def quick(command: str, flags: list[str]) -> Arguments | None:
    """The flags read straight from OPTIONS, or None for argparse to read (and explain) them.

    Only exact, well-formed flags are taken; --help, an abbreviation, a bad
    number or a missing value go to argparse, which says what is wrong.
    """
    rows = {flag: (dest, kind) for flag, dest, kind, commands, _, _ in OPTIONS if command in commands}
    values = _empty(command)
    index = 0
    while index < len(flags):
        flag, equals, value = flags[index].partition("=")
        index += 1
        row = rows.get(flag)
        if row is None:
            return None
        dest, kind = row
        if kind == "switch":
            if equals:
                return None
            values[dest] = True
            continue
        if not equals:
            if index >= len(flags):
                return None
            value = flags[index]
            index += 1
        try:
            parsed: Any = float(value) if kind == "number" else int(value) if kind == "whole" else value
        except ValueError:
            return None
        if kind != "list":
            values[dest] = parsed
        elif isinstance(listed := values[dest], list):
            listed.append(parsed)
    if values["state"] is None or values["log"] is None:
        return None
    return Arguments(command, values)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        import argparse

        msg = f"not a number: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def parse(command: str, flags: list[str]) -> Arguments:
    """The flags read by argparse from OPTIONS: --help, and one-line errors (UsageError)."""
    import argparse

    from ..types import Limits

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            # argparse would exit 2 with a usage block; we promise one line and exit 125.
            raise UsageError(message)

    parser = _Parser(
        prog=f"trial-tool {command}" if command != "run" else "trial-tool",
        usage=_USAGE.get(command),
        description=_DESCRIPTIONS[command],
        epilog=(
            "other commands: init, status, show, verify, report, export, serve (JSON lines), mcp (MCP server), "
            "shim (sh/bash shims), server (the per-user server); "
            "`trial-tool COMMAND --help`"
        )
        if command == "run"
        else None,
    )
    if command == "shim":
        parser.add_argument("directory", help="where to write the sh and bash shims")
    if command == "server":
        parser.add_argument("action", choices=("status", "stop"), help="show the per-user server, or stop it")
    parser.add_argument("--version", action="store_true", help="print trial-tool's version and exit")
    if command in _MANY:
        parser.add_argument("paths", nargs="+", metavar="PATH", help="a trial's state, a directory, or a glob")
    groups: dict[str | None, Any] = {None: parser}
    defaults = Limits()
    for flag, dest, kind, commands, group, text in OPTIONS:
        if command not in commands:
            continue
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        options: dict[str, object] = {"dest": dest, "help": text}
        if kind == "switch":
            options["action"] = "store_true"
        elif kind == "list":
            options.update(action="append", default=[], metavar="VALUE")
        else:
            # A limit left out is None: the pinned value (or Limits' default) holds.
            shown = getattr(defaults, dest, None) if group == _LIMIT else _DEFAULTS.get(dest)
            options.update(
                type=int if kind == "whole" else _number if kind == "number" else str,
                default=None if group == _LIMIT else _DEFAULTS.get(dest),
                required=dest in ("state", "log"),
                metavar="N" if kind in ("whole", "number") else None,
                help=text if shown is None else f"{text} (default {shown})",
            )
        names = (flag, "-o") if dest == "output" else (flag,)
        groups[group].add_argument(*names, **options)
    return Arguments(command, vars(parser.parse_args(flags)))


#: The usage lines argparse would otherwise write without what follows `--`.
_USAGE = {
    "run": "trial-tool [run] --state S --log L [limits] [options] -- CMD ARGS...",
    "shim": "trial-tool shim DIRECTORY --state S --log L [limits] [options]",
}


def split(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(subcommand, its flags, the command after `--`)."""
    command = "run"
    if argv and argv[0] in SUBCOMMANDS:
        command, argv = argv[0], argv[1:]
    if "--" in argv:
        cut = argv.index("--")
        return command, argv[:cut], argv[cut + 1 :]
    return command, argv, []


def overrides(args: Arguments) -> dict[str, object]:
    """The limits given on the command line (absent ones are not overrides)."""
    given = {name: getattr(args, name) for name in _LIMIT_DESTS if getattr(args, name, None) is not None}
    for name in ("writable", "allow", "labels"):
        if not given.get(name, True):
            del given[name]  # a repeatable flag not used: absent, not an empty list pinned
    return given


__all__ = ["OPTIONS", "SUBCOMMANDS", "Arguments", "overrides", "parse", "quick", "split"]
