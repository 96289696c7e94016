"""trialtool over another inspect sandbox: inspect's own eval loop and mock model, the commands run by the inner one.

The inner sandbox here is inspect's `local` one (each sample's own directory on
this machine), and a container of the test image per sample. Over inspect's own
`docker` sandbox, with compose: tests/integrations/test_inspect_docker.py.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="inspect-ai is not installed (pip install 'trialtool[test]')")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import Tool, tool
from inspect_ai.util import ExecResult, SandboxEnvironment, SandboxEnvironmentConfigType, sandbox, sandboxenv
from inspect_ai.util import subprocess as run_async

from tests.conftest import strict_records
from tests.dockerengine import Engine
from tests.integrations.test_inspect import CODE, INSPECTS_WARNINGS, offline_tiktoken, run_eval, scripted_by
from trialtool.integrations.inspectai import TrialSandboxConfig
from trialtool.ledger._verify import verify

__all__ = ["offline_tiktoken"]  # inspect's mock model needs o200k_base offline: the fixture is autouse

pytestmark = INSPECTS_WARNINGS  # inspect's own, on the way through its eval loop


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


@sandboxenv(name="trialtool-test-container")
class ContainerSandbox(SandboxEnvironment):
    """inspect's docker sandbox in miniature (no compose): one container of the test image per sample."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        image, root = str(config).split("|")
        name = f"trialtool-inner-{uuid.uuid4().hex[:12]}"
        labels = ["--label", "trialtool.trial=inner", "--label", f"trialtool.state={root}/inner"]
        done = await run_async(["docker", "run", "-d", "-i", "--init", "--name", name, *labels, image, "sh"])
        assert done.success, done.stderr
        return {"default": cls(name)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            await run_async(["docker", "rm", "--force", environment.as_type(ContainerSandbox).name])

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        options = ["-i"] if input is not None else []
        options += ["-w", cwd] if cwd else []
        return await run_async(["docker", "exec", *options, self.name, *cmd], input=input, timeout=timeout)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        done = await self.exec(["sh", "-c", 'cat > "$1"', "sh", file], input=contents)
        assert done.success, done.stderr

    async def read_file(self, file: str, text: bool = True) -> Any:
        return (await self.exec(["cat", file])).stdout


@tool
def shell() -> Tool:
    async def execute(command: str) -> str:
        """Run a shell command in the sample's container.

        Args:
            command: the command
        """
        done = await sandbox().exec(["sh", "-c", command])
        return done.stdout + done.stderr

    return execute


@pytest.mark.parametrize("engine", ["docker"], indirect=True)  # the test's own container sandbox runs docker
def test_a_deadline_in_a_container_sandbox_leaves_nothing_there(tmp_path: Path, engine: Engine) -> None:
    """busybox's `timeout` signals the command only; the sweep after the deadline takes what it started."""
    plan = [
        ("shell", {"command": "cat id.txt; (setsid sleep 300 &); sleep 200 & exec sleep 100"}),
        ("shell", {"command": "ps -o pid,args"}),
    ]
    config = TrialSandboxConfig(
        inner="trialtool-test-container",
        inner_config=f"{engine.tag}|{tmp_path}",
        inner_sweep=True,
        limits={"call_timeout": 1.5, "kill_grace": 0.3, "sandbox": "none"},
    )
    task = Task(
        dataset=[Sample(id="s1", input="go", files={"id.txt": "sample 1"})],
        solver=[use_tools(shell()), generate()],
        sandbox=("trialtool", config),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    (sample,) = log.samples
    records = strict_records(Path(sample.metadata["trialtool"]["log"]))
    assert [r["status"] for r in records] == ["timeout", "ok"]
    assert records[0]["elsewhere"]["sandbox"] == "trialtool-test-container"
    tool_texts = [message.text for message in sample.messages if message.role == "tool"]
    assert "sample 1" in tool_texts[0]
    listed = tool_texts[1]
    assert "sleep" not in listed, listed  # nothing of the stopped call is left in the container
    assert "docker-init" in listed
