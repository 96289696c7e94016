"""trialtool over another inspect sandbox: inspect's own eval loop and mock model, the commands run by the inner one.

The inner sandbox here is inspect's `local` one (each sample's own directory on
this machine). Over `docker` the same code runs where the machine has `docker
compose` v2, which inspect's docker sandbox drives; Debian's packages carry none,
and that test says so when it skips.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="inspect-ai is not installed (pip install 'trialtool[test]')")

from tests.conftest import strict_records
from tests.integrations.test_inspect import CODE, offline_tiktoken, run_eval
from trialtool.integrations.inspectai import TrialSandboxConfig
from trialtool.ledger._verify import verify

__all__ = ["offline_tiktoken"]  # inspect's mock model needs o200k_base offline: the fixture is autouse

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def test_each_exec_runs_in_the_inner_sandbox_and_is_budgeted_on_this_side(tmp_path: Path) -> None:
    config = TrialSandboxConfig(inner="local", limits={"max_calls": 3, "sandbox": "none"})
    log = run_eval(tmp_path, config)
    for sample in log.samples:
        account = sample.metadata["trialtool"]
        state, trial_log = Path(account["state"]), Path(account["log"])
        records = strict_records(trial_log)
        assert [r["status"] for r in records] == ["ok", "ok", "ok", "maximum_tool_calls"]
        # Each call says where it ran; the python tool's code went in on stdin.
        assert all(r["elsewhere"] == {"sandbox": "local", "environment": "default"} for r in records[:3])
        assert records[1]["stdin_bytes"] == len(CODE.encode())
        tool_texts = [message.text for message in sample.messages if message.role == "tool"]
        # The file inspect wrote went to the inner sandbox, and the command read it there.
        assert f"sample {sample.id[1:]}" in tool_texts[0] and "to-stderr" in tool_texts[0]
        assert "45 True" in tool_texts[1] and "slept" in tool_texts[2]
        assert tool_texts[3].startswith("[trial-tool: call refused: all 3 calls are spent")
        stored = json.loads(state.read_text())
        assert (stored["calls"], stored["refused_calls"]) == (3, 1)
        assert stored["emitted_tokens"] == sum(r["delivered_emitted_tokens"] for r in records)
        assert account["budget"]["calls_used"] == 3 and account["budget"]["exhausted"]
        assert verify(state, trial_log, expect_head=account["head"]).verdict == "clean"


def test_the_deadline_stops_the_command_in_the_inner_sandbox(tmp_path: Path) -> None:
    marker = f"trialtool-inner-{tmp_path.name}"
    plan = [("bash", {"command": f"sleep 300 & exec -a {marker} sleep 200; echo late"})]
    config = TrialSandboxConfig(inner="local", limits={"call_timeout": 1.5, "kill_grace": 0.5, "sandbox": "none"})
    log = run_eval(tmp_path, config, plan)
    for sample in log.samples:
        records = strict_records(Path(sample.metadata["trialtool"]["log"]))
        assert records[0]["status"] == "timeout" and records[0]["elapsed_seconds"] < 30
        tool_text = next(message.text for message in sample.messages if message.role == "tool")
        assert "late" not in tool_text
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert not left, f"processes outlived the call: {left}"


def test_over_inspects_docker_sandbox(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    compose = docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if not compose:
        pytest.skip("inspect's docker sandbox drives `docker compose` v2, which this machine lacks")
    config = TrialSandboxConfig(inner="docker", limits={"max_calls": 3, "sandbox": "none"})
    log = run_eval(tmp_path, config)
    for sample in log.samples:
        records = strict_records(Path(sample.metadata["trialtool"]["log"]))
        assert [r["status"] for r in records] == ["ok", "ok", "ok", "maximum_tool_calls"]
        assert records[0]["elsewhere"]["sandbox"] == "docker"
