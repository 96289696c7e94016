"""`trial-tool mcp`: the trial as a Model Context Protocol server over stdio.

Built on the official MCP Python SDK, 2.x (`MCPServer`; the 1.x `FastMCP` API
differs), an optional extra: `pip install 'trialtool[mcp]'`. Two tools:

- `run_shell(command, cwd=None)`: one budgeted call of `/bin/sh -c command`.
  Its content is what toolreply.py describes (the delivered stdout, the
  delivered stderr, then a framing line with the exit code, status and budget
  left); its structured content is the whole result as JSON, described by the
  tool's output schema. A call refused because a budget is spent, or that
  trial-tool could not run, is a tool error (`is_error`) whose text is
  toolreply's refusal line as it stands: returned, not raised, so the SDK
  neither prefixes it ("Error executing tool ...") nor logs it.
- `budget()`: calls, tokens and seconds used and left.

The SDK's stdio transport points descriptor 0 at /dev/null and 1 at stderr
while it serves, and commands get stdin from /dev/null and their output on
pipes, so nothing but protocol messages reaches the client. A client's
cancellation of a `run_shell` request stops the command; the call is recorded.
"""

# No `from __future__ import annotations` here: the SDK reads the tools' annotations
# to build their schemas, and they name classes imported inside `build`.
import json
from typing import Annotated, Any, get_type_hints

from ..errors import TrialToolError, UsageError
from ..trial import Trial
from ..types import Budget, CallResult
from . import toolreply

INSTRUCTIONS = (
    "Every run_shell call is charged to this trial's budget of calls, output tokens and time, "
    "whether or not the command succeeds. Output beyond a call's token allowance is cut. "
    "Call budget to see what is left."
)


def build(trial: Trial, *, max_concurrent: int = 4) -> Any:
    """The MCPServer for `trial` (an `mcp.server.MCPServer`; typed Any to keep mcp optional)."""
    try:
        import anyio
        from mcp.server import MCPServer
        from mcp.types import CallToolResult, TextContent, ToolAnnotations
        from typing_extensions import TypedDict  # pydantic's requirement before Python 3.12
    except ImportError as exc:
        msg = f"`trial-tool mcp` needs the MCP SDK: pip install 'trialtool[mcp]' ({exc})"
        raise UsageError(msg) from exc

    # The structured results' schemas, read off the NamedTuples they are the JSON of.
    budget_fields: dict[str, object] = {**get_type_hints(Budget), "exhausted": bool}
    BudgetLeft = TypedDict("BudgetLeft", budget_fields)  # type: ignore[misc]
    shell_fields: dict[str, object] = {**get_type_hints(CallResult), "budget": BudgetLeft}
    del shell_fields["record"]  # the audit record is the grader's, not the agent's
    ShellResult = TypedDict("ShellResult", shell_fields)  # type: ignore[misc]

    def refused(exc: TrialToolError) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=toolreply.refusal(exc))], is_error=True)

    from .._version import __version__

    server = MCPServer("trialtool", instructions=INSTRUCTIONS, version=__version__)
    slots = anyio.Semaphore(max_concurrent)

    @server.tool(
        annotations=ToolAnnotations(title="Run a shell command", destructive_hint=True, open_world_hint=True),
    )
    async def run_shell(command: str, cwd: str | None = None) -> Annotated[CallToolResult, ShellResult]:
        """Run a shell command (/bin/sh -c) and return its output, exit code and the budget left.

        stdin is empty; output over the call's token allowance is cut.
        """
        async with slots:
            try:
                result = await trial.arun(command, cwd=cwd)
            except TrialToolError as exc:
                return refused(exc)
        return CallToolResult(
            content=[TextContent(type="text", text=text) for text in toolreply.blocks(result)],
            structured_content=result.as_json(),
        )

    @server.tool(annotations=ToolAnnotations(title="Budget left", read_only_hint=True))
    async def budget() -> Annotated[CallToolResult, BudgetLeft]:
        """Calls, output tokens and seconds this trial has used and has left."""
        try:
            left = (await trial.abudget()).as_json()
        except TrialToolError as exc:
            return refused(exc)
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(left))], structured_content=left)

    return server


def run(trial: Trial, *, max_concurrent: int) -> int:
    """The `trial-tool mcp` process: serve until the client closes stdin."""
    server = build(trial, max_concurrent=max_concurrent)
    trial.open()
    try:
        server.run("stdio")
    finally:
        trial.close()
    return 0


__all__ = ["INSTRUCTIONS", "build", "run"]
