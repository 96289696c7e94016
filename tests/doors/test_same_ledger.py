"""Budgets stay exact through every front door: the same calls leave the same ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import TrialFiles
from trialtool import BudgetExhausted, Trial, handle_tool_call
from trialtool.ledger._verify import verify

LIMITS = {"max_calls": 3, "max_call_tokens": 40}
FLAGS = ["--max-calls", "3", "--max-call-tokens", "40"]
#: ok, clipped to 40 tokens, a failing command, then a refusal (the fourth call).
COMMANDS = ["echo one", "printf 'word %.0s' $(seq 1 300)", "echo err >&2; exit 3", "echo refused"]


def through_cli(files: TrialFiles) -> None:
    for command in COMMANDS:
        files.call("/bin/sh", "-c", command, flags=tuple(FLAGS))


def through_api(files: TrialFiles) -> None:
    with Trial(files.state, files.log, limits=LIMITS) as api:
        for command in COMMANDS:
            try:
                api.run(command)
            except BudgetExhausted:
                pass


def through_serve(files: TrialFiles) -> None:
    requests = b"".join(
        json.dumps({"id": n, "method": "run", "params": {"command": c}}).encode() + b"\n"
        for n, c in enumerate(COMMANDS)
    )
    argv = [sys.executable, "-m", "trialtool", "serve", "--state", str(files.state), "--log", str(files.log)]
    subprocess.run(
        [*argv, *FLAGS, "--max-concurrent", "1"], input=requests, capture_output=True, timeout=60, check=True
    )


def through_mcp(files: TrialFiles) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    args = ["-m", "trialtool", "mcp", "--state", str(files.state), "--log", str(files.log), *FLAGS]

    async def main() -> None:
        async with Client(StdioServerParameters(command=sys.executable, args=args)) as client:
            for command in COMMANDS:
                await client.call_tool("run_shell", {"command": command})

    anyio.run(main)


def through_openai(files: TrialFiles) -> None:
    with Trial(files.state, files.log, limits=LIMITS) as api:
        for n, command in enumerate(COMMANDS):
            arguments = json.dumps({"command": command})
            handle_tool_call(api, {"id": str(n), "function": {"name": "shell", "arguments": arguments}})


def through_shim(files: TrialFiles) -> None:
    shims = files.root / "shims"
    files.cli("shim", str(shims), "--state", str(files.state), "--log", str(files.log), *FLAGS)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    for command in COMMANDS:
        subprocess.run(["sh", "-c", command], env=env, capture_output=True, timeout=60)


DOORS = {
    "cli": through_cli,
    "api": through_api,
    "serve": through_serve,
    "mcp": through_mcp,
    "openai": through_openai,
    "shim": through_shim,
}
SAME = (
    "status",
    "return_code",
    "allowance_tokens",
    "stdout_sha256",
    "delivered_stdout_sha256",
    "delivered_stderr_sha256",
    "delivered_emitted_tokens",
    "output_truncated",
)


def ledger(files: TrialFiles) -> dict[str, Any]:
    state = files.state_json()
    return {
        "totals": (state["calls"], state["emitted_tokens"], state["refused_calls"], state["in_flight"]),
        "records": [{key: row.get(key) for key in SAME} for row in files.records()],
    }


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    files = TrialFiles(tmp_path_factory.mktemp("reference"))
    through_cli(files)
    return ledger(files)


@pytest.mark.parametrize("door", list(DOORS))
def test_same_calls_same_ledger(door: str, tmp_path: Path, expected: dict[str, Any]) -> None:
    files = TrialFiles(tmp_path)
    DOORS[door](files)
    assert ledger(files) == expected
    statuses = [row["status"] for row in expected["records"]]
    assert statuses == ["ok", "truncated", "error", "maximum_tool_calls"]
    assert verify(files.state, files.log).ok
