"""A minimal agent loop wired to trialtool through OpenAI-style function calling.

The "model" is scripted (no network, no API key): it asks for shell commands,
one tool call per turn, and answers in plain text once a call is refused. The
trial allows three calls, so the fourth request is refused, the model is told
so in the tool message, and the loop ends. Run it:

    python examples/agent_loop.py [TRIAL_DIR]

With a real model, replace `ScriptedModel.complete` by a Chat Completions
request that passes `tools=[openai_tool()]`; the loop stays the same.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from trialtool import Trial, handle_tool_call, openai_tool


class ScriptedModel:
    """Answers like a chat model would, from a script: a tool call per turn, then text."""

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands
        self.turn = 0

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        assert tools[0]["function"]["name"] == "shell"
        last = messages[-1]
        if last["role"] == "tool" and "budget is spent" in last["content"]:
            return {"role": "assistant", "content": "I am out of tool calls; stopping here."}
        if self.turn >= len(self.commands):
            return {"role": "assistant", "content": "Done."}
        command = self.commands[self.turn]
        self.turn += 1
        call = {
            "id": f"call_{self.turn}",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"command": command})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


def agent_loop(trial: Trial, model: ScriptedModel, task: str) -> list[dict[str, Any]]:
    """Ask, run the tool calls, feed the results back, until the model answers in text."""
    tools = [openai_tool()]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    while True:
        reply = model.complete(messages, tools)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            return messages
        for call in calls:
            messages.append(handle_tool_call(trial, call))


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="trial-"))
    model = ScriptedModel(["echo hello from the agent", "ls /", "seq 1 3", "cat /etc/hostname"])
    with Trial(root / "state.json", root / "log.jsonl", limits={"max_calls": 3}) as trial:
        messages = agent_loop(trial, model, "Look around the machine.")
        for message in messages:
            if message["role"] == "assistant" and message.get("tool_calls"):
                print("assistant> shell:", json.loads(message["tool_calls"][0]["function"]["arguments"])["command"])
            else:
                print(f"{message['role']}>", str(message["content"]).rstrip())
        budget = trial.budget()
    print(f"budget: {budget.calls_used} calls used, {budget.refused_calls} refused, {budget.tokens_used} tokens")
    print(f"trial: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
