"""Whatever comes in through a door, trial-tool's own failures cost nothing and the log stays strict.

Hypothesis generates argv (any bytes but NUL), environment values, working
directories, limits, malformed requests and odd file types, and drives them
through the CLI, the API, `serve`, the shim and `mcp`. After every example:
no traceback and no exit code outside the table; no call charged unless its
command started; `verify` clean; every log line parses strictly; nothing made
by a command that only reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TrialFiles, strict_records
from trialtool import Trial, TrialToolError
from trialtool.ledger._verify import verify

EXAMPLES = int(os.environ.get("TRIALTOOL_HYPOTHESIS_EXAMPLES", "150")) // 6 or 1
SLOW = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
PY = sys.executable
#: Exit codes a call may end with here: the commands' own (true, false), and the table's.
TABLE = {0, 1, 123, 124, 125, 126, 127}
#: Programs that print nothing (no encoder build per example), one missing, one not executable, none.
PROGRAMS = st.sampled_from(["true", "false", "no-such-command-here", "/etc/hostname", ""])
ARG_BYTES = st.binary(max_size=12).filter(lambda b: b"\0" not in b)
TEXT = st.text(max_size=12)  # may hold lone surrogates, NUL: what JSON and Python callers can send
FILE_KINDS = st.sampled_from(["missing", "missing", "empty", "garbage", "directory", "fifo", "link", "dangling"])


@contextmanager
def scratch() -> Iterator[TrialFiles]:
    root = Path(tempfile.mkdtemp(prefix="trialtool-prop-"))
    try:
        yield TrialFiles(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make(path: Path, kind: str) -> None:
    """Put a file of `kind` where trial-tool expects its own state or log."""
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(b'{"schema": null}\n\xff')
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (path.parent / f"{path.name}.target").write_bytes(b"")
        path.symlink_to(path.parent / f"{path.name}.target")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")


def check_trial(files: TrialFiles, charged_at_most: int) -> None:
    """A trial trial-tool made: strict log, verify clean, charges only for calls whose command started."""
    if not files.state.exists():
        assert not files.log.exists() or strict_records(files.log) == []
        return
    records = strict_records(files.log)
    assert sum(1 for row in records if row.get("charged")) <= charged_at_most
    assert verify(files.state, files.log).ok


@SLOW
@given(
    program=PROGRAMS,
    args=st.lists(ARG_BYTES, max_size=3),
    env=st.lists(st.tuples(st.text("ABC_=é", min_size=0, max_size=3), ARG_BYTES), max_size=2),
    cwd=st.sampled_from([None, ".", "missing", "a-file"]),
    limit=st.sampled_from([(), ("--max-calls", "2"), ("--max-calls", "0"), ("--call-timeout", "x"), ("--clip", "?")]),
    state_kind=FILE_KINDS,
    log_kind=FILE_KINDS,
)
def test_cli(
    program: str,
    args: list[bytes],
    env: list[tuple[str, bytes]],
    cwd: str | None,
    limit: tuple[str, ...],
    state_kind: str,
    log_kind: str,
) -> None:
    with scratch() as files:
        make(files.state, state_kind)
        make(files.log, log_kind)
        (files.root / "a-file").write_text("")
        flags: list[str | bytes] = [*limit]
        for key, value in env:
            flags += ["--env", key.encode() + b"=" + value]
        if cwd is not None:
            flags += ["--cwd", str(files.root / cwd)]
        before = files.snapshot() if state_kind != "fifo" and log_kind != "fifo" else None
        argv: list[str | bytes] = [*files.argv(), *flags, "--", program, *args]
        done = subprocess.run(argv, capture_output=True, timeout=60, cwd=files.root)
        assert done.returncode in TABLE, done.stderr
        assert b"Traceback" not in done.stderr
        if done.returncode == 125:
            assert done.stderr.startswith(b"trial-tool: ") and done.stderr.count(b"\n") == 1, done.stderr
            if before is not None:
                assert files.snapshot() == before
        else:
            check_trial(files, charged_at_most=1)


@SLOW
@given(
    command=st.one_of(TEXT, st.lists(TEXT, max_size=3), st.just(["true"]), st.just("echo hi")),
    env=st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=2)),
    cwd=st.one_of(st.none(), TEXT, st.just("/")),
    timeout=st.one_of(st.none(), st.floats(allow_nan=True), st.just(0.5)),
    limits=st.dictionaries(st.sampled_from(["max_calls", "max_tokens", "clip", "call_timeout"]), st.integers(-1, 3)),
)
def test_api(command: Any, env: Any, cwd: Any, timeout: Any, limits: dict[str, Any]) -> None:
    with scratch() as files:
        started = 0
        errors: list[TrialToolError] = []
        try:
            with Trial(files.state, files.log, limits=limits) as api:
                for _ in range(2):
                    try:
                        api.run(command, env=env, cwd=cwd, timeout=timeout)
                        started += 1
                    except TrialToolError as exc:
                        errors.append(exc)
        except TrialToolError as exc:  # the constructor's own checks
            errors.append(exc)
        assert all("\n" not in exc.message and exc.exit_code in TABLE for exc in errors)
        check_trial(files, charged_at_most=started + 2)
        if not started and not files.state.exists():
            assert not files.log.exists()


@SLOW
@given(state_kind=FILE_KINDS, log_kind=FILE_KINDS, made=st.booleans())
def test_reading_commands_change_nothing(state_kind: str, log_kind: str, made: bool) -> None:
    with scratch() as files:
        if made:
            assert files.call("true").returncode == 0
        else:
            make(files.state, state_kind)
            make(files.log, log_kind)
        before = sorted(path.name for path in files.root.iterdir())
        contents = files.snapshot() if "fifo" not in (state_kind, log_kind) or made else None
        for command in ("status", "verify"):
            done = files.cli(command, "--state", str(files.state), "--log", str(files.log), timeout=30)
            assert done.returncode in (0, 1, 125) and b"Traceback" not in done.stderr
        assert sorted(path.name for path in files.root.iterdir()) == before
        if contents is not None:
            assert files.snapshot() == contents


REQUESTS = st.one_of(
    st.builds(
        lambda ident, command, env, cwd: {"id": ident, "method": "run", "params": {"command": command, **env, **cwd}},
        st.one_of(st.integers(), TEXT, st.none()),
        st.one_of(TEXT, st.lists(TEXT, max_size=3), st.integers(), st.just(["true"])),
        st.one_of(st.just({}), st.builds(lambda e: {"env": e}, st.dictionaries(TEXT, st.one_of(TEXT, st.integers())))),
        st.one_of(st.just({}), st.builds(lambda c: {"cwd": c}, st.one_of(TEXT, st.integers()))),
    ),
    st.fixed_dictionaries({"id": st.integers(), "method": st.sampled_from(["budget", "ping", "nope", ""])}),
    st.builds(lambda text: {"raw": text}, TEXT),
)


def encode(request: dict[str, Any]) -> bytes:
    if "raw" in request:
        return request["raw"].encode("utf-8", "surrogatepass").replace(b"\n", b" ") + b"\n"
    return json.dumps(request).encode() + b"\n"  # lone surrogates go out as \ud800 escapes, as a client may send


@SLOW
@given(requests=st.lists(REQUESTS, min_size=1, max_size=5), state_kind=FILE_KINDS)
def test_serve(requests: list[dict[str, Any]], state_kind: str) -> None:
    with scratch() as files:
        make(files.state, state_kind)
        payload = b"".join(map(encode, requests))
        argv = [
            PY,
            "-m",
            "trialtool",
            "serve",
            "--state",
            str(files.state),
            "--log",
            str(files.log),
            "--max-calls",
            "50",
        ]
        done = subprocess.run(argv, input=payload, capture_output=True, timeout=120)
        assert done.returncode in (0, 125), done.stderr
        assert b"Traceback" not in done.stderr
        if done.returncode == 125:
            assert done.stdout == b"" and done.stderr.count(b"\n") == 1
            return
        answers = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(answers) == sum(1 for line in payload.split(b"\n") if line.strip())
        ran = sum(1 for answer in answers if "result" in answer and "sequence" in answer["result"])
        records = strict_records(files.log)
        assert sum(1 for row in records if row.get("charged")) == ran
        check_trial(files, charged_at_most=ran)


@SLOW
@given(script=st.one_of(TEXT, st.sampled_from(["exit 3", "true", "echo", ""])), extra=st.lists(ARG_BYTES, max_size=2))
def test_shim(script: str, extra: list[bytes]) -> None:
    with scratch() as files:
        shims = files.root / "shims"
        made = files.cli("shim", str(shims), "--state", str(files.state), "--log", str(files.log), "--max-calls", "50")
        assert made.returncode == 0, made.stderr
        body = script.encode("utf-8", "surrogatepass")
        if b"\0" in body:
            body = body.replace(b"\0", b"")
        done = subprocess.run([str(shims / "sh"), "-c", body, "shim", *extra], capture_output=True, timeout=60)
        assert b"Traceback" not in done.stderr
        assert 0 <= done.returncode <= 255
        check_trial(files, charged_at_most=1)


@pytest.mark.timeout(300)
@settings(max_examples=max(2, EXAMPLES // 4), deadline=None, suppress_health_check=list(HealthCheck))
@given(calls=st.lists(st.tuples(TEXT, st.one_of(st.none(), TEXT)), min_size=1, max_size=4))
def test_mcp(calls: list[tuple[str, str | None]]) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    with scratch() as files:
        args = ["-m", "trialtool", "mcp", "--state", str(files.state), "--log", str(files.log), "--max-calls", "50"]
        results: list[Any] = []

        async def main() -> None:
            async with Client(StdioServerParameters(command=PY, args=args)) as client:
                for command, cwd in calls:
                    arguments: dict[str, Any] = {"command": command.encode("utf-8", "replace").decode()}
                    if cwd is not None:
                        arguments["cwd"] = cwd.encode("utf-8", "replace").decode()
                    results.append(await client.call_tool("run_shell", arguments))

        anyio.run(main)
        ran = sum(1 for result in results if not result.is_error)
        check_trial(files, charged_at_most=ran)
        assert sum(1 for row in strict_records(files.log) if row.get("charged")) == ran
