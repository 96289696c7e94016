"""trialtool over inspect's own docker sandbox: a compose service per sample, inspect's eval loop and mock model.

The image is built here, offline, from busybox (tests/dockerengine.py), with a
`bash` that is busybox's shell: inspect's bash tool runs `bash --login -c`.
docs/inspect.md's example is this test's compose file and config.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="inspect-ai is not installed (pip install 'trialtool[test]')")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash
from inspect_ai.util import sandbox

from tests.conftest import strict_records
from tests.dockerengine import BUILT, BUSYBOX, build
from tests.integrations.test_inspect import INSPECTS_WARNINGS, offline_tiktoken, scripted_by
from trialtool.integrations.inspectai import TrialSandboxConfig

__all__ = ["offline_tiktoken"]  # inspect's mock model needs o200k_base offline: the fixture is autouse

pytestmark = INSPECTS_WARNINGS  # inspect's own, on the way through its eval loop

#: docs/inspect.md shows this file: each sample's image is named in its metadata (`image`).
COMPOSE = """\
services:
  default:
    image: ${SAMPLE_METADATA_IMAGE}
    pull_policy: never
    init: true
    network_mode: none
    working_dir: /tmp
    command: ["sh", "-c", "while true; do sleep 3600; done"]
"""

#: docs/inspect.md shows this config.
CONFIG = dict(
    inner="docker",
    limits={"max_calls": 3, "max_call_tokens": 200, "call_timeout": 2, "kill_grace": 0.5, "sandbox": "none"},
)

#: Each sample's scripted bash calls: read its file, print far over the allowance, run past the deadline
#: leaving a process behind, and one call more than the budget has.
PLAN = [
    ("bash", {"command": "cat id.txt; echo to-stderr >&2"}),
    ("bash", {"command": "yes 'a line of output far over the allowance' | head -c 400000"}),
    ("bash", {"command": "sleep 300 & sleep 300"}),
    ("bash", {"command": "echo one call too many"}),
]


def _compose_answers() -> str | None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode != 0:
        return "no docker engine answers here (install docker.io, and start dockerd; .ci/run does)"
    served = subprocess.run(
        [docker, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=60
    ).stdout.strip()
    if tuple(int(part) for part in re.findall(r"\d+", served)[:3]) < (24, 0, 6):
        return f"inspect's docker sandbox needs a Docker engine of 24.0.6 or later, not {served} (.ci/run starts one)"
    if subprocess.run([docker, "compose", "version"], capture_output=True, timeout=60).returncode != 0:
        return "inspect's docker sandbox drives `docker compose` v2 (scripts/install-compose; .ci/run does)"
    if not Path(BUSYBOX).exists():
        return "the test image is built from busybox-static (apt-get install busybox-static; .ci/run does)"
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = _compose_answers()
    if reason is not None:
        pytest.skip(reason)
    tag = f"trialtool-inspect-{uuid.uuid4().hex[:12]}:busybox"
    image_id = build("docker", tmp_path_factory.mktemp("inspect-image"), tag, scripts={"bin/bash": BASH})
    try:
        yield tag
    finally:
        subprocess.run(["docker", "image", "rm", "--force", image_id], capture_output=True, timeout=120)
        BUILT.remove(("docker", image_id))


BASH = '#!/bin/sh\nexec /bin/sh "$@"\n'


@scorer(metrics=[accuracy()])
def nothing_left_running() -> Any:
    """Run after the budget is spent: a grading command in the sample's container, uncharged, with its own
    directory, environment and user; and the container's way in for a person."""

    async def score(state: TaskState, target: Target) -> Score:
        script = 'ps -o pid,args; echo "in $(pwd) as $(id -u) with $X"'
        done = await sandbox().exec(["sh", "-c", script], cwd="/etc", env={"X": "x-value"}, user="1000")
        left = [line for line in done.stdout.splitlines() if "sleep 300" in line]
        way_in = await sandbox().connection()
        right = done.success and not left and "in /etc as 1000 with x-value" in done.stdout
        right = right and way_in.type == "docker" and "exec" in way_in.command
        return Score(value=CORRECT if right else INCORRECT, explanation=f"{done.stdout}{done.stderr}{way_in}")

    return score


def _containers(tag: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "--all", "--filter", f"ancestor={tag}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.split()


def test_a_task_over_inspects_docker_sandbox(tmp_path: Path, image: str) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text(COMPOSE)
    config = TrialSandboxConfig(**CONFIG, inner_config=str(compose))
    samples = [
        Sample(id=f"s{n}", input="go", files={"id.txt": f"sample {n}"}, metadata={"image": image}) for n in (1, 2, 3)
    ]
    task = Task(
        dataset=samples,
        solver=[use_tools(bash()), generate()],
        scorer=nothing_left_running(),
        sandbox=("trialtool", config),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(PLAN))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_samples=3)
    assert log.status == "success", log.error
    assert len(log.samples) == 3
    for sample in log.samples:
        account = sample.metadata["trialtool"]
        records = strict_records(Path(account["log"]))
        statuses = [(r["record_type"], r["status"]) for r in records]
        assert statuses == [
            ("trial_tool_call", "ok"),
            ("trial_tool_call", "truncated"),
            ("trial_tool_call", "timeout"),
            ("trial_tool_call", "maximum_tool_calls"),
            ("trial_tool_grading", "ok"),
        ], statuses
        assert all(r["elsewhere"]["sandbox"] == "docker" for r in records[:3] + records[4:])
        tool_texts = [message.text for message in sample.messages if message.role == "tool"]
        assert f"sample {sample.id[1:]}" in tool_texts[0] and "to-stderr" in tool_texts[0]
        assert records[1]["delivered_emitted_tokens"] <= 200 and records[1]["output_truncated"]
        assert records[2]["elapsed_seconds"] < 30
        assert tool_texts[3].startswith("[trial-tool: call refused: all 3 calls are spent")
        # The scorer ran after the budget was spent, and found nothing of the timed-out call left.
        assert sample.scores is not None
        [score] = sample.scores.values()
        assert score.value == CORRECT, score.explanation
        assert account["trial_id"] and account["head"]
    report = subprocess.run(
        [sys.executable, "-m", "trialtool", "report", "--strict", "--format", "json", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    overview = json.loads(report.stdout)["overview"]
    assert overview["trials"] == 3 and overview["integrity"] == {"clean": 3}
    assert _containers(image) == []  # every sample's container gone at cleanup


def test_the_docs_example_is_this_tests_own() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "inspect.md").read_text(encoding="utf-8")
    assert COMPOSE in docs
    limits = repr(CONFIG["limits"]).replace("'", '"')
    assert f'inner="{CONFIG["inner"]}",\n    limits={limits},\n    inner_config="compose.yaml"' in docs
