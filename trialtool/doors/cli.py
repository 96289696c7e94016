"""The command line: arguments in, exit code out. No decisions are made here.

    trial-tool [run] --state S --log L [limits] [options] -- CMD ARGS...
    trial-tool init  --state S --log L [limits]
    trial-tool status --state S --log L
    trial-tool verify --state S --log L [--json]
    trial-tool serve --state S --log L [limits] [--max-concurrent N]   JSON lines on stdin/stdout
    trial-tool mcp   --state S --log L [limits] [--max-concurrent N]   an MCP stdio server
    trial-tool shim DIR --state S --log L [limits]   write DIR/sh, DIR/bash: budgeted shells
    trial-tool server status|stop                   the per-user server that runs calls warm
    trial-tool keygen -o FILE                       an Ed25519 signing key; prints its public key
    trial-tool attest --state S --log L --signing-key K   sign the trial's statement now

Everything after the first `--` is the command, untouched. Every TrialToolError
becomes one line on stderr and its class's exit code, in `main` and nowhere else.

The grammar is options.py's; this module runs what it reads.
"""

from __future__ import annotations

import os
import sys

from ..errors import TrialToolError, UsageError
from ..osio import make_undumpable, plain
from .options import SUBCOMMANDS, Arguments, overrides, parse, quick, split

TYPE_CHECKING = False  # typing's own costs an import before the fork; mypy reads any TYPE_CHECKING as true
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

    from ..ledger import TrialState


def read_stdin(args: Arguments) -> bytes | None:
    """What `--stdin` names (a file, or - for this process's own stdin), read whole; None without it.

    Read here, by the caller, in both modes: the per-user server cannot open
    this process's stdin. The read stops one byte past the bound (the flag's
    value, else the largest any trial allows), so a huge file is never read
    whole only to be refused; the trial checks its own pinned bound.
    """
    if args.stdin is None:
        return None
    from ..types import BOUNDS

    bound = int(BOUNDS["max_stdin_bytes"].high)
    if isinstance(args.max_stdin_bytes, int | float) and 0 <= args.max_stdin_bytes < bound:
        bound = int(args.max_stdin_bytes)
    data = bytearray()
    try:
        fd = 0 if args.stdin == "-" else os.open(args.stdin, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while len(data) <= bound:
                chunk = os.read(fd, min(1 << 20, bound + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
        finally:
            if fd != 0:
                os.close(fd)
    except OSError as exc:
        msg = f"cannot read --stdin {plain(args.stdin)}: {exc.strerror}"
        raise UsageError(msg) from exc
    if len(data) > bound:
        msg = f"--stdin {plain(args.stdin)} holds more than {bound} bytes (--max-stdin-bytes); nothing ran"
        raise UsageError(msg)
    return bytes(data)


def _call(args: Arguments, tool_argv: list[str]) -> int:
    """One tool call; with --json, a failure is also one JSON error object on stdout."""
    try:
        return _run_call(args, tool_argv)
    except TrialToolError as exc:
        if args.json:
            from ..server import client as userclient

            userclient.write_json({"error": exc.as_json()})
        raise


def _trial_of(args: Arguments, **given: Any) -> Any:
    """fromflags.trial_of, imported only when a call needs its trial here: never on the warm path."""
    from .fromflags import trial_of

    return trial_of(args, **given)


def _run_call(args: Arguments, tool_argv: list[str]) -> int:
    """One tool call: fork the supervisor, reserve, run, deliver; the call's exit code."""
    if not tool_argv:
        msg = "no command after `--`"
        raise UsageError(msg)
    if args.cwd is not None and not os.path.isdir(args.cwd):
        msg = f"--cwd {plain(args.cwd)} is not a directory"
        raise UsageError(msg)
    stdin = read_stdin(args)
    from ..server import client as userclient

    if userclient.wanted() and not args.in_process:
        code = userclient.call(args, tool_argv, stdin, _trial_of)
        if code is not None:
            return code
        # This process has just started the server: this one call runs here.
    from ..process import Launcher

    # Fork the call's supervisor now, so that it gets ready (prctl, cgroup) while
    # this process imports the rest of trialtool and reserves the call.
    with Launcher(os.path.dirname(os.path.abspath(args.state))) as launcher:
        # After the fork, so that the supervisor gets ready meanwhile; before the command
        # starts, so that it cannot open this process's stdout through /proc.
        make_undumpable()
        from .. import sandbox

        # What the pinned backend's check waits on (bwrap's probe), started while the rest loads.
        sandbox.probe_ahead(os.path.abspath(args.state))
        from ..process import InterruptWatch
        from ..trial import use_launcher
        from .fromflags import request_of, trial_of

        trial = trial_of(args)
        use_launcher(trial, launcher)
        request = request_of(args, tool_argv, stdin)
        with InterruptWatch() as interrupt:
            result = trial.call(request, interrupt=interrupt)
    _keep_until_exit(trial)
    return userclient.write_answer({"exit": result.exit_code, "result": result.as_json()}, as_json=args.json)


def _serve(args: Arguments) -> int:
    make_undumpable()  # no command may open the protocol's descriptors through /proc
    if args.max_concurrent < 1:
        raise UsageError("--max-concurrent must be at least 1")
    from .fromflags import trial_of

    trial = trial_of(args)
    # The trial is made (or its limits checked) before the first request: a mismatch
    # stops the server at once. Its clock starts then, so the MCP SDK is loaded first.
    if args.command == "serve":
        from . import serve

        if args.max_request_bytes < 2:
            raise UsageError("--max-request-bytes must be at least 2")
        trial.open()
        return serve.run(trial, max_concurrent=args.max_concurrent, max_request_bytes=args.max_request_bytes)
    from . import mcp_server

    return mcp_server.run(trial, max_concurrent=args.max_concurrent)


def _install_shim(args: Arguments) -> int:
    """Create (or check) the trial, then write shims that run calls of it with these flags."""
    from . import shim
    from .fromflags import trial_of

    trial_of(args).open()
    # Absolute paths: the shims run from whatever directory the harness is in.
    flags = ["--state", os.path.abspath(args.state), "--log", os.path.abspath(args.log)]
    flags += ["--lock-timeout", repr(args.lock_timeout)]
    for name, value in overrides(args).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):  # writable, allow, labels: the flag once for each
            for item in value:
                flags += [
                    "--label" if name == "labels" else flag,
                    os.path.abspath(item) if name == "writable" else item,
                ]
            continue
        if name == "workspace" and isinstance(value, str):
            value = os.path.abspath(value)
        shown = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        flags += [flag, shown]
    for flag, value in (
        ("--key-file", args.key_file),
        ("--signing-key", args.signing_key),
        ("--o200k-file", args.o200k_file),
    ):
        if value is not None:
            flags += [flag, os.path.abspath(value)]
    if args.checkpoint_every is not None:
        flags += ["--checkpoint-every", str(args.checkpoint_every)]
    for path in shim.install(args.directory, flags):
        print(path)
    return 0


def _server_command(action: str) -> int:
    """`trial-tool server status|stop`: print the server's status (or that there is none); stop it."""
    import json

    from ..server import client as userclient
    from ..server import wire as userwire

    status = userclient.control(action)
    if status is None:
        print(json.dumps({"running": False, "socket": userwire.socket_path()}, indent=2))
        return 0
    print(json.dumps({"running": action != "stop", **status}, indent=2))
    return 0


def describe(state: TrialState) -> dict[str, object]:
    """The state as `status` and `init` print it: the document, and what is left of each budget."""
    from ..types import budget

    left = budget.of(state)
    return {
        **state.as_json(),
        "left": {"calls": left.calls_left, "tokens": left.tokens_left, "seconds": left.seconds_left},
    }


def _run(argv: list[str]) -> int:
    command, flags, tool_argv = split(argv)
    if "--version" in flags:  # any command's flags, before `--`
        from .._version import __version__

        print(f"trial-tool {__version__}")
        return 0
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        msg = f"unknown command {argv[0]!r}: {', '.join(SUBCOMMANDS[1:])}, or flags then `-- CMD ARGS...` to run one"
        raise UsageError(msg)
    if command == "run" and "--" not in argv and not any(f in ("-h", "--help") for f in flags):
        msg = "missing `--` before the command: trial-tool --state S --log L -- CMD ARGS..."
        raise UsageError(msg)
    args = (quick(command, flags) if command == "run" else None) or parse(command, flags)
    if command == "run":
        return _call(args, tool_argv)
    if tool_argv:
        raise UsageError(f"`trial-tool {command}` takes no command")
    if command == "verify":
        import json

        from ..ledger import verify as verifying
        from .fromflags import key_of
        from .graders import trusted_of, verdict_exit

        report = verifying.verify(args.state, args.log, key_of(args), args.expect_head, trusted_of(args))
        print(json.dumps(report.as_json(), indent=2) if args.json else verifying.render(report))
        return verdict_exit(report.verdict, strict=args.strict)
    if command in ("status", "show", "report", "export"):
        from . import graders
        from .fromflags import key_of

        reader: Callable[[Arguments, bytes | None], int] = getattr(graders, command)
        return reader(args, key_of(args))
    if command == "shim":
        return _install_shim(args)
    if command == "server":
        return _server_command(args.action)
    if command in ("close", "gc"):
        from . import containers

        return containers.close(args) if command == "close" else containers.gc(args)
    if command in ("attest", "keygen"):
        from . import signed

        return signed.attest(args) if command == "attest" else signed.keygen(args)
    if command in ("serve", "mcp"):
        return _serve(args)
    import json

    from .fromflags import trial_of

    existed = os.path.lexists(args.state)
    state = trial_of(args).init()
    print(json.dumps(describe(state), indent=2, sort_keys=True) if args.json else _made(state, args.state, existed))
    return 0


def _made(state: TrialState, path: str, existed: bool) -> str:
    """What `init` made, in one line: the trial, where, and the limits it pinned."""
    limits, sandbox = state.limits, state.sandbox
    what = "trial already made, same limits" if existed else "made trial"
    return (
        f"{what}: {state.trial_id} at {path}: {limits.max_calls} calls, {limits.max_tokens} tokens "
        f"({limits.max_call_tokens} a call), {limits.trial_timeout:g} s ({limits.call_timeout:g} s a call), "
        f"sandbox {sandbox.mode} (network {sandbox.network}); `trial-tool status` shows it all"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the API for embedding and tests)."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # The reader of a report or an export went away (`| head`): what it read is what it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except TrialToolError as exc:
        print(f"trial-tool: {exc.message}", file=sys.stderr)
        return exc.exit_code


#: Set by `exit_after`: the process ends with os._exit, so big objects (the encoder's
#: 200k-entry rank table) are kept here rather than freed one by one at the end.
_KEEP_UNTIL_EXIT: list[object] | None = None


def _keep_until_exit(thing: object) -> None:
    if _KEEP_UNTIL_EXIT is not None:
        _KEEP_UNTIL_EXIT.append(thing)


def exit_after(run: Callable[[], int]) -> NoReturn:
    """Run a whole trial-tool process (`run` returns its exit code), then leave without the interpreter's teardown.

    Everything durable was fsynced and the output flushed by then; what the
    teardown would free is freed by the kernel at once (docs/performance.md).
    """
    global _KEEP_UNTIL_EXIT
    _KEEP_UNTIL_EXIT = []
    code = run()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass  # the reader went away; the call is recorded all the same
    os._exit(code)


def entry() -> NoReturn:
    """The `trial-tool` and `python -m trialtool` process."""
    exit_after(main)


__all__ = ["describe", "entry", "exit_after", "main"]
