"""What an agent reads back from a tool call, the same through every front door (MCP, OpenAI).

The delivered stdout and stderr are separate blocks, each exactly the text that
was counted: joined into one string, BPE could count the seam differently.
Delivered stderr follows a `[stderr]` label block: without it a model reading
a lone block (a failing command prints only to stderr) takes it for the
command's output. A last block is trial-tool's framing (exit code, status, budget left), in a
fixed format of a few dozen tokens. The label and the framing are not charged to the token
budget: it is the tool's answer about the call, not the command's output, and
it is the same for every trial, so budgets stay comparable.
"""

from __future__ import annotations

from ..errors import BudgetExhausted, TrialToolError
from ..types import Budget

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..types import CallResult


def left(budget: Budget) -> str:
    """`left: 11 calls, 49990 tokens, 3595 s`."""
    calls = f"{budget.calls_left} call" + ("" if budget.calls_left == 1 else "s")
    return f"left: {calls}, {budget.tokens_left} tokens, {budget.seconds_left:.0f} s"


def framing(result: CallResult) -> str:
    """The footer block: `[exit code 0 · ok · left: 11 calls, 49990 tokens, 3595 s]`."""
    clipped = " · output clipped" if result.output_truncated and result.status != "truncated" else ""
    return f"[exit code {result.exit_code} · {result.status}{clipped} · {left(result.budget)}]"


#: The block ahead of delivered stderr.
STDERR_LABEL = "[stderr]"


def output_blocks(result: CallResult) -> list[str]:
    """Non-empty delivered stdout, then non-empty delivered stderr after its label."""
    shown = [result.stdout] if result.stdout else []
    if result.stderr:
        shown += [STDERR_LABEL, result.stderr]
    return shown


def blocks(result: CallResult) -> list[str]:
    """The output blocks, then the framing."""
    return [*output_blocks(result), framing(result)]


def joined(texts: list[str]) -> str:
    """Blocks as one string, each ending its own line (the last as it is)."""
    return "".join(text if text.endswith("\n") or i == len(texts) - 1 else text + "\n" for i, text in enumerate(texts))


def refusal(error: TrialToolError) -> str:
    """What the agent reads when the call did not run (budget spent, bad arguments, a trial-tool failure)."""
    if isinstance(error, BudgetExhausted):
        return f"[trial-tool: {error.message}; the trial's budget is spent, no more tool calls will run]"
    return f"[trial-tool: the call did not run: {error.message}]"


__all__ = ["STDERR_LABEL", "blocks", "framing", "joined", "left", "output_blocks", "refusal"]
