"""OpenAI-style function calling and the example agent loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import TrialFiles
from trialtool import Trial, handle_tool_call, openai_tool
from trialtool.ledger._verify import verify

ROOT = Path(__file__).resolve().parents[2]


def call(command: Any, call_id: str = "call_1", name: str = "shell") -> dict[str, Any]:
    arguments = command if isinstance(command, str) and command.startswith("{") else json.dumps({"command": command})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_schema() -> None:
    tool = openai_tool()
    assert tool["type"] == "function" and tool["function"]["name"] == "shell"
    parameters = tool["function"]["parameters"]
    assert parameters["required"] == ["command"] and set(parameters["properties"]) == {"command", "cwd"}
    assert openai_tool("bash")["function"]["name"] == "bash"


def test_tool_calls_become_tool_messages(trial: TrialFiles) -> None:
    with Trial(trial.state, trial.log, limits={"max_calls": 2}) as api:
        message = handle_tool_call(api, call("echo out; echo err >&2"))
        assert message["role"] == "tool" and message["tool_call_id"] == "call_1"
        assert message["content"].startswith("out\n[stderr]\nerr\n[exit code 0 · ok · left: 1 call, ")
        # The openai package's objects work the same (attributes instead of keys).
        obj = SimpleNamespace(id="call_2", function=SimpleNamespace(name="shell", arguments='{"command": "printf x"}'))
        parts = handle_tool_call(api, obj, parts=True)["content"]
        assert [part["text"] for part in parts][:1] == ["x"] and parts[-1]["text"].startswith("[exit code 0")
        refused = handle_tool_call(api, call("echo never", "call_3"))
        assert "budget is spent" in refused["content"] and api.budget().exhausted
    assert [row["status"] for row in trial.records()] == ["ok", "ok", "maximum_tool_calls"]


@pytest.mark.parametrize(
    ("tool_call", "says"),
    [
        (call("echo hi", name="python"), "no tool named 'python'"),
        (call("{not json"), "not JSON"),
        (call('{"command": ""}'), "non-empty string"),
        (call('{"command": "ls", "sudo": true}'), "unknown arguments"),
        (call('{"command": "ls", "cwd": 7}'), "`cwd` must be a string"),
        (call('{"command": "ls", "cwd": "/no/such/dir"}'), "not a directory"),
    ],
)
def test_a_models_mistakes_come_back_uncharged(trial: TrialFiles, tool_call: dict[str, Any], says: str) -> None:
    with Trial(trial.state, trial.log) as api:
        message = handle_tool_call(api, tool_call)
        assert says in message["content"]
        assert api.budget().calls_used == 0


def test_example_agent_loop_runs_out_of_calls(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent_loop.py"), str(tmp_path)],
        capture_output=True,
        timeout=60,
        check=True,
    )
    out = done.stdout.decode()
    assert "hello from the agent" in out and "I am out of tool calls" in out
    assert "budget: 3 calls used, 1 refused" in out
    files = TrialFiles(tmp_path)
    assert [row["status"] for row in files.records()] == ["ok", "ok", "ok", "maximum_tool_calls"]
    assert verify(files.state, files.log).ok
