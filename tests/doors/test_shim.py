"""The drop-in shell shim: which invocations are calls, and each one budgeted end to end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TrialFiles
from trialtool.doors.shim import runs_something
from trialtool.ledger._verify import verify


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        (["-c", "echo"], True),
        (["-lc", "echo"], True),
        (["-e", "-c", "echo"], True),
        (["--login", "-c", "echo"], True),
        (["script.sh", "arg"], True),
        (["-x", "script.sh"], True),
        ([], False),
        (["-s"], False),
        (["-i"], False),
        (["--login"], False),
        (["-o", "pipefail"], False),
        (["-o", "pipefail", "-c", "echo"], True),
        (["-O", "extglob", "script.sh"], True),
    ],
)
def test_what_the_shim_counts_as_a_call(args: list[str], runs: bool) -> None:
    assert runs_something(args) is runs


@pytest.fixture
def shimmed(trial: TrialFiles, tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH starts with shims of `trial` (3 calls)."""
    shims = tmp_path / "shims"
    made = trial.cli("shim", str(shims), "--state", str(trial.state), "--log", str(trial.log), "--max-calls", "3")
    assert made.returncode == 0, made.stderr
    assert (shims / "sh").exists()
    return {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}


def test_shell_shim_budgets_each_invocation(trial: TrialFiles, shimmed: dict[str, str], tmp_path: Path) -> None:
    def sh(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["sh", *args], env=shimmed, capture_output=True, timeout=60, cwd=tmp_path)

    first = sh("-c", 'echo "$PWD"; sh -c "echo nested"; exit 5')
    assert first.returncode == 5
    assert first.stdout == f"{tmp_path}\nnested\n".encode()  # the nested sh is the real one, not a call
    script = tmp_path / "script.sh"
    script.write_text('echo "script $1"\n')
    assert sh(str(script), "arg").stdout == b"script arg\n"
    interactive = subprocess.run(["sh"], env=shimmed, input=b"echo hi\n", capture_output=True, timeout=60)
    assert interactive.returncode == 125 and b"nothing to run" in interactive.stderr
    assert sh("-c", "echo third").returncode == 0
    refused = sh("-c", "echo fourth")
    assert refused.returncode == 123 and refused.stdout == b""
    rows = trial.records()
    assert [row["status"] for row in rows] == ["error", "ok", "ok", "maximum_tool_calls"]
    assert rows[0]["command"][1:] == ["-c", 'echo "$PWD"; sh -c "echo nested"; exit 5']
    assert verify(trial.state, trial.log).ok
