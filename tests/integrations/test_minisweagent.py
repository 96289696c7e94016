"""mini-swe-agent's own DefaultAgent and DeterministicModel, driving a trial through TrialEnvironment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install 'trialtool[test]')")
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

from tests.conftest import strict_records
from tests.dockerengine import Engine
from trialtool.integrations.minisweagent import SUBMIT
from trialtool.ledger._verify import verify

AGENT = {"system_template": "You run commands.", "instance_template": "{{task}}", "step_limit": 10, "cost_limit": 0}


def agent_over(tmp_path: Path, commands: list[str], **environment: Any) -> DefaultAgent:
    """An agent whose model emits one command a step, in an environment named as mini's config names it."""
    env = get_environment(
        {
            "environment_class": "trialtool.integrations.minisweagent.TrialEnvironment",
            "state": str(tmp_path / "state.json"),
            "log": str(tmp_path / "log.jsonl"),
            "cwd": str(tmp_path),
            **environment,
        }
    )
    model = DeterministicModel(outputs=[make_output(f"step {n}", [{"command": c}]) for n, c in enumerate(commands)])
    return DefaultAgent(model, env, **AGENT)


def observations(agent: DefaultAgent) -> list[dict[str, Any]]:
    return [message for message in agent.messages if message["role"] == "user"][1:]


def test_a_spent_budget_ends_the_run_as_minis_own_limits_do(tmp_path: Path) -> None:
    agent = agent_over(
        tmp_path,
        ["echo 1; echo 2 >&2; echo 3", "exit 4", "echo never"],
        limits={"max_calls": 2, "sandbox": "none"},
        labels={"task": "django__django-11099", "model": "deterministic"},
    )
    try:
        outcome = agent.run("go")
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "LimitsExceeded"
    assert outcome["trial_tool"] == {"refusal": "maximum_tool_calls"}
    first, second = observations(agent)
    # One stream, in the order written, as mini's local environment shows it.
    assert first["extra"]["raw_output"] == "1\n2\n3\n" and first["extra"]["returncode"] == 0
    assert second["extra"]["returncode"] == 4
    assert second["extra"]["trial_tool"]["budget"]["calls_left"] == 0
    records = strict_records(tmp_path / "log.jsonl")
    assert [r["status"] for r in records] == ["ok", "error", "maximum_tool_calls"]
    assert all(r["merged_output"] for r in records[:2])
    assert verify(tmp_path / "state.json", tmp_path / "log.jsonl").ok
    # The trajectory says where the trial is and what it used.
    info = agent.serialize()["info"]["trial_tool"]
    assert info["state"] == str(tmp_path / "state.json") and info["budget"]["calls_used"] == 2
    stored = json.loads((tmp_path / "state.json").read_text())
    assert info["trial_id"] == stored["trial_id"] and info["head"] == stored["log"]["head"]
    assert info["labels"] == stored["labels"] == {"model": "deterministic", "task": "django__django-11099"}
    assert second["extra"]["trial_tool"]["head"] != info["head"]  # the refusal's record came after it


def test_observe_lets_the_model_read_the_refusal(tmp_path: Path) -> None:
    agent = agent_over(
        tmp_path, ["echo one", "echo two", "echo three"], limits={"max_calls": 1}, on_exhausted="observe"
    )
    agent.config.step_limit = 2
    try:
        outcome = agent.run("go")
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "LimitsExceeded"  # mini's own step limit, after the refusal was read
    _, refused = observations(agent)
    assert refused["extra"]["returncode"] == -1
    assert "[trial-tool: " in refused["content"] and "budget is spent" in refused["content"]
    assert [r["status"] for r in strict_records(tmp_path / "log.jsonl")] == ["ok", "maximum_tool_calls"]


@pytest.mark.parametrize("on_exhausted", ["observe", "raise"])
def test_the_agent_submits_after_its_budget_is_spent(tmp_path: Path, on_exhausted: str) -> None:
    """mini's submission is a command too: refused like any other it could never end the run. With the
    budget spent it runs as the harness's own, uncharged and recorded as grading, and the run ends Submitted."""
    # Under "raise" a refusal ends the run: there the agent submits right after its last call.
    more = ["echo more"] if on_exhausted == "observe" else []
    commands = ["echo work", *more, f"echo {SUBMIT} && echo the patch"]
    agent = agent_over(tmp_path, commands, limits={"max_calls": 1}, on_exhausted=on_exhausted)
    agent.config.step_limit = 5
    try:
        outcome = agent.run("go")
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "Submitted" and outcome["submission"] == "the patch\n", outcome
    log = tmp_path / "log.jsonl"
    records = strict_records(log)
    kinds = [(r["record_type"], r["status"], r["charged"]) for r in records]
    expected = [("trial_tool_call", "ok", True)]
    if on_exhausted == "observe":
        expected.append(("trial_tool_call", "maximum_tool_calls", False))
    assert kinds == [*expected, ("trial_tool_grading", "ok", False)]
    assert verify(log.with_name("state.json"), log).verdict == "clean"


@pytest.mark.parametrize("on_exhausted", ["observe", "raise"])
def test_a_submission_that_does_not_submit_buys_nothing_after_the_budget(tmp_path: Path, on_exhausted: str) -> None:
    """The agent's words pick no grading run: once the budget is spent, "submitting" with more work and a
    failing exit runs once a trial, its output reaches no observation, and the next ones are refused."""
    marker = tmp_path / "ran"
    sneak = f"echo {SUBMIT}; echo x >> {marker}; seq 1 30000; exit 1"
    agent = agent_over(
        tmp_path,
        ["echo work", *[sneak] * 7],
        limits={"max_calls": 1, "max_call_tokens": 100},
        on_exhausted=on_exhausted,
    )
    agent.config.step_limit = 8
    try:
        outcome = agent.run("go")
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "LimitsExceeded", outcome  # the trial's, or (observe) mini's step limit
    assert marker.read_text() == "x\n"  # it ran once
    records = strict_records(tmp_path / "log.jsonl")
    kinds = [(r["record_type"], r["status"], r["charged"], r.get("final")) for r in records]
    refused = [("trial_tool_call", "maximum_tool_calls", False, None)] * (6 if on_exhausted == "observe" else 0)
    assert kinds == [("trial_tool_call", "ok", True, None), ("trial_tool_grading", "error", False, True), *refused]
    seen = [str(message["content"]) for message in observations(agent)]
    assert len(seen) == (8 if on_exhausted == "observe" else 1)  # the first call's, then the refusals
    assert not any("29999" in text or "\n2\n3\n" in text for text in seen), seen
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["calls"] == 1 and state["final_used"] is True
    assert verify(tmp_path / "state.json", tmp_path / "log.jsonl").verdict == "clean"


def test_submission_and_a_timeout(tmp_path: Path) -> None:
    agent = agent_over(
        tmp_path,
        ["sleep 30", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"],
        timeout=1,  # mini's per-call timeout: shorter than the trial's
    )
    try:
        outcome = agent.run("go")
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "Submitted" and outcome["submission"] == "the patch\n"
    stopped = observations(agent)[0]
    assert stopped["extra"]["returncode"] == 124 and "timeout" in stopped["extra"]["exception_info"]
    records = strict_records(tmp_path / "log.jsonl")
    assert [(r["status"], r["deadline_kind"]) for r in records] == [("timeout", "request"), ("ok", "request")]


def test_the_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "minisweagent_run.py"
    done = subprocess.run([sys.executable, str(example), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "exit status: LimitsExceeded" in done.stdout
    statuses = [r["status"] for r in strict_records(tmp_path / "log.jsonl")]
    assert statuses == ["ok", "ok", "maximum_tool_calls"]


@pytest.mark.parametrize("engine", ["docker"], indirect=True)  # mini's docker environment: trial-tool's docker
def test_over_a_container_of_the_tasks_image(tmp_path: Path, engine: Engine) -> None:
    """TrialDockerEnvironment: mini's docker settings, each command a call in the trial's own container."""
    state, log = tmp_path / "run" / "state.json", tmp_path / "run" / "log.jsonl"
    env = get_environment(
        {
            "environment_class": "trialtool.integrations.minisweagent.TrialDockerEnvironment",
            "state": str(state),
            "log": str(log),
            "image": engine.tag,
            "cwd": "/etc",
            "interpreter": ["sh", "-c"],  # the test image has busybox's sh, no bash
            "env": {"GREETING": "hi"},
            "limits": {"max_calls": 3, "call_timeout": 2, "kill_grace": 0.5},
        }
    )
    commands = ["cat image; pwd; echo $GREETING", "sleep 100 & sleep 50", f"echo {SUBMIT}; echo done"]
    model = DeterministicModel(outputs=[make_output(f"step {n}", [{"command": c}]) for n, c in enumerate(commands)])
    agent = DefaultAgent(model, env, **AGENT)
    try:
        outcome = agent.run("go")
        name = f"trialtool-{json.loads(state.read_text())['trial_id']}"
        left = engine.processes(name)  # after a call stopped at its deadline: the container's own two
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "Submitted" and outcome["submission"] == "done\n"
    first, second = observations(agent)[:2]
    assert first["extra"]["raw_output"] == f"{engine.tag}\n/etc\nhi\n"
    assert second["extra"]["trial_tool"]["status"] == "timeout"
    assert len(left) == 2, left
    records = strict_records(log)
    assert [r["status"] for r in records] == ["ok", "timeout", "ok"]
    assert {r["container"]["image_id"] for r in records} == {engine.image_id}
    assert engine.state_of(name) is None  # close() removed the trial's container


def test_a_signed_trial_ends_in_a_statement_the_trajectory_names(tmp_path: Path) -> None:
    """With a signing key, the agent's submission signs the trial's statement before mini saves the run:
    the trajectory names the statement's digest, which the public key alone checks."""
    from trialtool.ledger._verify import verify as check
    from trialtool.signing import generate, read_public_keys

    key = generate(str(tmp_path / "trial.key"))
    (tmp_path / "trial.pub").write_text(key.public.pem())
    agent = agent_over(
        tmp_path,
        ["echo work", f"echo {SUBMIT} && echo done"],
        limits={"max_calls": 5, "sandbox": "none"},
        signing_key=str(tmp_path / "trial.key"),
    )
    try:
        outcome = agent.run("go")
    finally:
        agent.env.close()
    assert outcome["exit_status"] == "Submitted"
    info = agent.serialize()["info"]["trial_tool"]
    assert info["signer"] == key.fingerprint and info["statement"]["signed_on"] == "close"
    found = check(
        tmp_path / "state.json", tmp_path / "log.jsonl", trusted=read_public_keys(str(tmp_path / "trial.pub"))
    )
    assert found.verdict == "clean" and found.signatures is not None
    assert found.signatures.statement_sha256 == info["statement"]["sha256"]
    assert info["statement"]["path"] == str(tmp_path / "log.jsonl.intoto.json")
