"""An inspect-ai eval whose every tool call runs through a trial of its own sample.

The task gives the model bash() and python(); the sandbox `trialtool` makes a
trial for each sample and epoch (three calls each here) beside the eval log.
Run it offline with a scripted mock model:

    python examples/inspect_eval.py [LOG_DIR]

or with a real model, as any inspect task:

    inspect eval examples/inspect_eval.py --model openai/gpt-4o

The scripted run prints, for each sample, where its trial is and what it used.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python

from trialtool import seed_tiktoken_cache
from trialtool.integrations.inspectai import TrialSandboxConfig


@task
def count_files() -> Task:
    return Task(
        dataset=[
            Sample(id="etc", input="How many entries are in /etc? Use the tools.", files={"notes.txt": "etc"}),
            Sample(id="usr", input="How many entries are in /usr? Use the tools.", files={"notes.txt": "usr"}),
        ],
        solver=[use_tools(bash(), python()), generate()],
        sandbox=("trialtool", TrialSandboxConfig(limits={"max_calls": 3, "max_tokens": 2000})),
    )


def scripted(messages: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
    """A model that asks for three tools calls, one too many, then answers."""
    steps = [
        ("bash", {"command": "ls /$(cat notes.txt) | wc -l"}),
        ("python", {"code": "import os; print(len(os.listdir('/' + open('notes.txt').read())))"}),
        ("bash", {"command": "echo checked"}),
        ("bash", {"command": "echo one call too many"}),
    ]
    done = sum(1 for message in messages if message.role == "tool")
    if done < len(steps):
        name, arguments = steps[done]
        return ModelOutput.for_tool_call(model="mockllm/model", tool_name=name, tool_arguments=arguments)
    return ModelOutput.from_content(model="mockllm/model", content="Counted.")


if __name__ == "__main__":
    log_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="inspect-logs-")
    seed_tiktoken_cache()  # inspect's mock model counts tokens with tiktoken's o200k_base: no download
    [log] = eval(
        count_files(), model=get_model("mockllm/model", custom_outputs=scripted), log_dir=log_dir, display="none"
    )
    for sample in log.samples or []:
        account = sample.metadata["trialtool"]
        budget = account["budget"]
        used = f"{budget['calls_used']} calls, {budget['tokens_used']} tokens, {budget['refused_calls']} refused"
        print(f"{sample.id}: {used}")
        print(f"  trial-tool show --state {account['state']} --log {account['log']}")
