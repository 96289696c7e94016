"""OpenAI-style function calling: the tool's schema, and one tool call run into its `role: "tool"` message.

Works with plain dicts (Chat Completions JSON) and with the `openai` package's
objects alike (anything with `.id` and `.function.name` / `.function.arguments`);
the `openai` package itself is not needed. Whatever the model gets wrong (an
unknown tool name, arguments that are not the schema's) comes back to it as
the tool message's text, uncharged, so that it can correct itself; a refused
call (budget spent) comes back the same way, charged as the ledger says.
`Trial.budget().exhausted` tells the harness when to stop asking the model.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from ..errors import TrialToolError
from ..trial import Trial
from ..types import CallResult
from . import toolreply

TOOL_NAME = "shell"

_DESCRIPTION = (
    "Run a shell command with /bin/sh -c and get back its output and exit code. stdin is empty. "
    "Every call counts against this task's budget of calls, output tokens and time; "
    "output beyond a call's token allowance is cut."
)


def openai_tool(name: str = TOOL_NAME, *, description: str = _DESCRIPTION) -> dict[str, object]:
    """The function tool's definition, for the `tools` list of a Chat Completions request."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the shell command to run"},
                    "cwd": {"type": "string", "description": "directory to run it in (default: the current one)"},
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    }


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


class ToolArguments(TypedDict):
    """A tool call's arguments, checked."""

    command: str
    cwd: str | None


def parse_tool_call(tool_call: Any, name: str = TOOL_NAME) -> tuple[str, ToolArguments | str]:
    """(the call's id, run arguments) or (the call's id, what to tell the model is wrong)."""
    call_id = _field(tool_call, "id") or ""
    function = _field(tool_call, "function")
    called = _field(function, "name") if function is not None else None
    if called != name:
        return call_id, f"[trial-tool: no tool named {called!r}; the tool is {name!r}]"
    raw = _field(function, "arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        return call_id, f"[trial-tool: the arguments are not JSON ({exc}); nothing ran]"
    if not isinstance(arguments, dict):
        return call_id, "[trial-tool: the arguments must be a JSON object; nothing ran]"
    command, cwd = arguments.get("command"), arguments.get("cwd")
    unknown = set(arguments) - {"command", "cwd"}
    if not isinstance(command, str) or not command.strip():
        return call_id, "[trial-tool: `command` must be a non-empty string; nothing ran]"
    if cwd is not None and not isinstance(cwd, str):
        return call_id, "[trial-tool: `cwd` must be a string; nothing ran]"
    if unknown:
        return call_id, f"[trial-tool: unknown arguments {sorted(unknown)}; nothing ran]"
    return call_id, {"command": command, "cwd": cwd}


def tool_message(call_id: str, outcome: CallResult | str, *, parts: bool = False) -> dict[str, object]:
    """The `role: "tool"` message: the blocks of toolreply.py, one string (or text parts with `parts`)."""
    texts = toolreply.blocks(outcome) if isinstance(outcome, CallResult) else [outcome]
    if parts:
        content: Any = [{"type": "text", "text": text} for text in texts]
    else:
        content = toolreply.joined(texts)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def handle_tool_call(trial: Trial, tool_call: Any, *, name: str = TOOL_NAME, parts: bool = False) -> dict[str, object]:
    """Run one tool call of the model's through `trial`; its `role: "tool"` message.

    `parts=True` gives the content as text parts (stdout, stderr, framing), each
    delivered block exactly as counted; the default joins them into one string.
    """
    call_id, parsed = parse_tool_call(tool_call, name)
    if isinstance(parsed, str):
        return tool_message(call_id, parsed, parts=parts)
    try:
        result = trial.run(parsed["command"], cwd=parsed["cwd"])
    except TrialToolError as exc:
        return tool_message(call_id, toolreply.refusal(exc), parts=parts)
    return tool_message(call_id, result, parts=parts)


async def ahandle_tool_call(
    trial: Trial, tool_call: Any, *, name: str = TOOL_NAME, parts: bool = False
) -> dict[str, object]:
    """`handle_tool_call` for asyncio harnesses (the call runs in the loop's executor)."""
    call_id, parsed = parse_tool_call(tool_call, name)
    if isinstance(parsed, str):
        return tool_message(call_id, parsed, parts=parts)
    try:
        result = await trial.arun(parsed["command"], cwd=parsed["cwd"])
    except TrialToolError as exc:
        return tool_message(call_id, toolreply.refusal(exc), parts=parts)
    return tool_message(call_id, result, parts=parts)


__all__ = [
    "TOOL_NAME",
    "ToolArguments",
    "ahandle_tool_call",
    "handle_tool_call",
    "openai_tool",
    "parse_tool_call",
    "tool_message",
]
