"""`trial-tool mcp` end to end, driven by the MCP SDK's own client over stdio."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import ESCAPE, TrialFiles
from trialtool.ledger._verify import verify

mcp = pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'trialtool[mcp]')")
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402


def with_client(
    trial: TrialFiles, body: Callable[[Any], Awaitable[None]], *flags: str, stderr: Path | None = None
) -> None:
    argv = [sys.executable, "-m", "trialtool", "mcp", "--state", str(trial.state), "--log", str(trial.log), *flags]
    if stderr is not None:
        # The server's own stderr, kept in a file to be read afterwards.
        argv = ["/bin/sh", "-c", f"exec {shlex.join(argv)} 2>{shlex.quote(str(stderr))}"]
    params = StdioServerParameters(command=argv[0], args=argv[1:])

    async def main() -> None:
        async with Client(params) as client:
            await body(client)

    anyio.run(main)


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content]


def test_tools_run_and_report(trial: TrialFiles) -> None:
    async def body(client: Any) -> None:
        listed = await client.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert set(tools) == {"run_shell", "budget"}
        assert tools["run_shell"].input_schema["required"] == ["command"]
        # Both tools describe their structured result.
        shell_schema = tools["run_shell"].output_schema
        assert {"stdout", "stderr", "exit_code", "status", "budget"} <= set(shell_schema["properties"])
        assert "calls_left" in tools["budget"].output_schema["properties"]

        result = await client.call_tool("run_shell", {"command": "echo out; echo err >&2; exit 3"})
        assert not result.is_error
        out, label, err, framing = texts(result)
        assert (out, label, err) == ("out\n", "[stderr]", "err\n")
        assert re.fullmatch(r"\[exit code 3 · error · left: 3 calls, 49996 tokens, 3\d\d\d s\]", framing)
        assert result.structured_content["exit_code"] == 3
        assert result.structured_content["budget"]["calls_left"] == 3

        # stdin is /dev/null: `cat` ends at once instead of reading the protocol stream.
        result = await client.call_tool("run_shell", {"command": "cat; pwd", "cwd": "/"})
        assert texts(result)[0] == "/\n"

        # Writing to the stdout of every process above it reaches nothing but stderr or /dev/null.
        result = await client.call_tool("run_shell", {"command": ESCAPE})
        assert not result.is_error

        left = await client.call_tool("budget", {})
        assert left.structured_content["calls_used"] == 3 and left.structured_content["exhausted"] is False
        assert left.structured_content["head"] == json.loads(trial.state.read_text())["log"]["head"]

    with_client(trial, body, "--max-calls", "4")
    assert verify(trial.state, trial.log).ok


def test_spent_budget_is_a_tool_error(trial: TrialFiles) -> None:
    async def body(client: Any) -> None:
        assert not (await client.call_tool("run_shell", {"command": "true"})).is_error
        for _ in range(2):
            refused = await client.call_tool("run_shell", {"command": "echo never"})
            assert refused.is_error
            # The refusal as trial-tool words it: no SDK prefix in front.
            (text,) = texts(refused)
            assert text.startswith("[trial-tool: ") and "budget is spent" in text and "--max-calls" in text
        left = await client.call_tool("budget", {})
        assert left.structured_content["exhausted"] is True

    errors = trial.root / "server-stderr.txt"
    with_client(trial, body, "--max-calls", "1", stderr=errors)
    # A refusal is the model's to read, not a server error to log.
    assert errors.read_text() == ""
    rows = trial.records()
    assert [row["status"] for row in rows] == ["ok", "maximum_tool_calls", "maximum_tool_calls"]


def test_calls_run_at_once(trial: TrialFiles) -> None:
    # The trial's files beside the workspace: calls of a trial inside it run one at a time.
    workspace = trial.root / "ws"
    workspace.mkdir()

    async def body(client: Any) -> None:
        async with anyio.create_task_group() as group:
            for n in range(3):
                request = {"command": f"sleep 0.3; echo {n}", "cwd": str(workspace)}
                group.start_soon(client.call_tool, "run_shell", request)

    with_client(trial, body, "--workspace", str(workspace))
    spans = sorted((row["started_at_utc"], row["ended_at_utc"]) for row in trial.records())
    assert len(spans) == 3
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
