"""A mini-swe-agent run whose every action is a call of a trial.

mini's own DefaultAgent, with its DeterministicModel standing in for a real
model (no network, no key): it asks for three commands in a trial of two
calls, so the third is refused and the run ends as mini's own limits end it.

    python examples/minisweagent_run.py [TRIAL_DIR]

With a real model, keep the environment's config and use any of mini's models
(`mini -c config.yaml` with the `environment:` section of docs/minisweagent.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

if __name__ == "__main__":
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="mini-trial-"))
    env = get_environment(
        {
            "environment_class": "trialtool.integrations.minisweagent.TrialEnvironment",
            "state": str(directory / "state.json"),
            "log": str(directory / "log.jsonl"),
            "limits": {"max_calls": 2, "max_tokens": 5000},
            "cwd": str(directory),
        }
    )
    commands = ["echo start; ls / | head -3", "echo found >&2; python3 --version", "echo one too many"]
    model = DeterministicModel(outputs=[make_output(f"step {n}", [{"command": c}]) for n, c in enumerate(commands)])
    agent = DefaultAgent(
        model, env, system_template="You run commands.", instance_template="{{task}}", step_limit=10, cost_limit=0
    )
    outcome = agent.run("Look around.")
    env.close()
    print(f"exit status: {outcome['exit_status']}")
    print(f"trial: trial-tool status --state {directory / 'state.json'} --log {directory / 'log.jsonl'}")
