"""inspect-ai's own eval loop and mock model, each sample's execs running through a trial of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="inspect-ai is not installed (pip install 'trialtool[test]')")
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log
from inspect_ai.model import ModelOutput, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, scorer
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python
from inspect_ai.util import sandbox

from tests.conftest import strict_records
from trialtool.integrations.inspectai import TrialSandboxConfig
from trialtool.ledger._verify import verify
from trialtool.output._tokens import seed_tiktoken_cache

# inspect and its dependencies warn of deprecations of theirs and leave anyio streams of
# their own unclosed; neither is this test's to fix.
#: The warnings inspect's eval loop gives on the way (its own deprecations, its unclosed streams).
INSPECTS_WARNINGS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
pytestmark = INSPECTS_WARNINGS

#: Each sample's script, one tool call a turn: bash, python (its code on stdin), a slow bash, one too many.
PLAN = [
    ("bash", {"command": "cat id.txt; echo; echo to-stderr >&2"}),
    ("python", {"code": "import sys\nprint(sum(range(10)), sys.stdin.read() == '')"}),
    ("bash", {"command": "sleep 0.5; echo slept"}),
    ("bash", {"command": "echo one too many"}),
]
CODE = PLAN[1][1]["code"]


@pytest.fixture(autouse=True)
def offline_tiktoken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # inspect's mock model counts tokens with tiktoken.get_encoding("o200k_base"), which
    # downloads the file unless tiktoken's cache holds it: filled from trialtool's own copy.
    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    seed_tiktoken_cache(cache)


def scripted_by(plan: list[tuple[str, dict[str, Any]]]) -> Any:
    """A mock model's outputs: the next step of `plan`, by how many tool results the sample has so far.

    Counted per sample, from its own messages: samples run at once.
    """

    def next_output(messages: list[Any], tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        done = sum(1 for message in messages if message.role == "tool")
        if done < len(plan):
            name, arguments = plan[done]
            return ModelOutput.for_tool_call(model="mockllm/model", tool_name=name, tool_arguments=arguments)
        return ModelOutput.from_content(model="mockllm/model", content="done")

    return next_output


def run_eval(tmp_path: Path, config: Any, plan: list[tuple[str, dict[str, Any]]] = PLAN) -> Any:
    task = Task(
        dataset=[Sample(id=f"s{n}", input="go", files={"id.txt": f"sample {n}"}) for n in (1, 2)],
        solver=[use_tools(bash(), python()), generate()],
        sandbox=("trialtool", config),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_samples=2)
    assert log.status == "success", log.error
    return log


def test_each_sample_runs_in_a_trial_of_its_own(tmp_path: Path) -> None:
    log = run_eval(tmp_path, {"limits": {"max_calls": 3}})
    spans = []
    for sample in log.samples:
        account = sample.metadata["trialtool"]
        state, trial_log = Path(account["state"]), Path(account["log"])
        # Beside the eval log, one directory per sample and epoch.
        assert state.parent.name == f"{sample.id}-epoch1"
        assert state.parent.parent == Path(log.location).with_suffix(".trials")
        assert not Path(account["workspace"]).exists()  # removed at cleanup; the state and log stay
        records = strict_records(trial_log)
        assert [r["status"] for r in records] == ["ok", "ok", "ok", "maximum_tool_calls"]
        # The python tool's code went in on stdin, recorded by size.
        assert records[1]["command"] == ["bash", "--login", "-c", "python3 -"]
        assert records[1]["stdin_bytes"] == len(CODE.encode())
        tool_texts = [message.text for message in sample.messages if message.role == "tool"]
        assert f"sample {sample.id[1:]}" in tool_texts[0] and "to-stderr" in tool_texts[0]
        assert "45 True" in tool_texts[1]
        assert "slept" in tool_texts[2]
        # The refusal is a failed exec: the model reads trial-tool's line.
        assert tool_texts[3].startswith("[trial-tool: call refused: all 3 calls are spent")
        # The budget is exact, and the metadata says what the state says.
        stored = json.loads(state.read_text())
        assert (stored["calls"], stored["refused_calls"]) == (3, 1)
        assert stored["emitted_tokens"] == sum(r["delivered_emitted_tokens"] for r in records)
        assert account["budget"]["calls_used"] == 3 and account["budget"]["tokens_used"] == stored["emitted_tokens"]
        assert account["budget"]["refused_calls"] == 1 and account["budget"]["exhausted"]
        assert account["limits"]["max_calls"] == 3
        # The trial's identity and its chain head (after the refusal's record), to join and anchor it.
        assert account["trial_id"] == stored["trial_id"] and account["head"] == stored["log"]["head"]
        assert verify(state, trial_log, expect_head=account["head"]).verdict == "clean"
        # Labelled with what inspect knows of the sample, in the state and the log's first line alike.
        labels = account["labels"]
        assert labels["sample"] == str(sample.id) and labels["epoch"] == "1" and labels["model"] == "mockllm/model"
        assert labels["task"] and labels["run"] == log.eval.run_id and labels["eval"] == log.eval.eval_id
        assert stored["labels"] == labels == json.loads(trial_log.read_text().splitlines()[0])["labels"]
        spans.append((records[0]["started_at_utc"], records[2]["ended_at_utc"]))
    # The two samples ran at the same time, each against its own budget.
    (start1, end1), (start2, end2) = spans
    assert start1 < end2 and start2 < end1
    # The eval log on disk carries the same account, for a grader.
    on_disk = read_eval_log(log.location)
    assert {s.metadata["trialtool"]["state"] for s in on_disk.samples} == {
        s.metadata["trialtool"]["state"] for s in log.samples
    }


def test_config_root_and_kept_workspace(tmp_path: Path) -> None:
    config = TrialSandboxConfig(root=str(tmp_path / "trials"), limits={"max_calls": 3}, keep_workspace=True)
    log = run_eval(tmp_path, config)
    for sample in log.samples:
        account = sample.metadata["trialtool"]
        assert Path(account["state"]).is_relative_to(tmp_path / "trials")
        assert (Path(account["workspace"]) / "id.txt").read_text() == f"sample {sample.id[1:]}"
    # A second eval into the same root, configured from a file, makes trials of its own: nothing is reused.
    config_file = tmp_path / "trialtool.yaml"
    config_file.write_text(f"root: {tmp_path / 'trials'}\nlimits:\n  max_calls: 3\n")
    again = run_eval(tmp_path, str(config_file))
    first = {s.metadata["trialtool"]["state"] for s in log.samples}
    second = {s.metadata["trialtool"]["state"] for s in again.samples}
    assert not first & second


def test_the_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "inspect_eval.py"
    done = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "logs")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum("3 calls" in line and "1 refused" in line for line in lines) == 2


def test_text_editor_runs_in_the_call_and_inspects_own_commands_are_not_charged(tmp_path: Path) -> None:
    from inspect_ai.tool import bash_session, text_editor

    plan = [
        ("text_editor", {"command": "create", "path": "hello.txt", "file_text": "hi\n"}),
        ("text_editor", {"command": "view", "path": "hello.txt"}),
        ("bash_session", {"action": "type_submit", "input": "echo kept between calls"}),
    ]

    task = Task(
        # The setup script is inspect's own command: run, not charged.
        dataset=[Sample(id="edit", input="go", setup="echo ready > setup.txt")],
        solver=[use_tools(text_editor(), bash_session()), generate()],
        sandbox=("trialtool", TrialSandboxConfig(keep_workspace=True, limits={"max_calls": 5})),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    # bash_session needs inspect's tools server, which would run commands outside every call: refused.
    assert log.status == "error" and "tools server" in log.error.message
    [sample] = log.samples
    account = sample.metadata["trialtool"]
    workspace = Path(account["workspace"])
    assert (workspace / "setup.txt").read_text() == "ready\n"
    assert (workspace / "hello.txt").read_text() == "hi\n"
    tool_texts = [message.text for message in sample.messages if message.role == "tool"]
    assert "1\thi" in tool_texts[1]
    # Each text_editor use is one call; inspect's setup, tool installation and the refused
    # bash_session are not calls.
    records = strict_records(Path(account["log"]))
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["command"][1:] == ["exec"] for r in records)
    assert json.loads(Path(account["state"]).read_text())["calls"] == 2


def test_a_tool_cannot_make_the_agents_text_inspects_own_by_its_opening_words(tmp_path: Path) -> None:
    """A task's tool that runs the agent's text with `/bin/sh -c`: text that begins as inspect's own
    scripts begin is still the agent's call, charged and recorded (who asked decides, not the words)."""
    from inspect_ai.tool import tool

    @tool
    def shell() -> Any:
        async def run(command: str) -> str:
            """Run a shell command.

            Args:
                command: the command.
            """
            result = await sandbox().exec(["/bin/sh", "-c", command])
            return result.stdout

        return run

    disguised = "inspect_image_path=${PATH-}\necho disguised > made.txt; echo done"
    task = Task(
        dataset=[Sample(id="s", input="go")],
        solver=[use_tools(shell()), generate()],
        sandbox=("trialtool", TrialSandboxConfig(keep_workspace=True, limits={"max_calls": 1})),
    )
    plan = [("shell", {"command": disguised}), ("shell", {"command": disguised})]
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    [sample] = log.samples
    account = sample.metadata["trialtool"]
    records = strict_records(Path(account["log"]))
    assert [(r["status"], r["command"][:2]) for r in records] == [
        ("ok", ["/bin/sh", "-c"]),
        ("maximum_tool_calls", ["/bin/sh", "-c"]),
    ]
    assert json.loads(Path(account["state"]).read_text())["calls"] == 1


@scorer(metrics=[accuracy()])
def runs_a_command() -> Any:
    """A scorer that checks the agent's work by running a command in the sample's sandbox."""

    async def score(state: Any, target: Any) -> Score:
        result = await sandbox().exec(["sh", "-c", "cat id.txt && test -f made.txt"])
        return Score(value=CORRECT if result.success else INCORRECT, explanation=result.stdout + result.stderr)

    return score


def test_a_scorer_after_the_budget_is_spent_grades_uncharged(tmp_path: Path) -> None:
    """The agent spends every call; the scorer's command still runs, in the same workspace, recorded as
    grading: never refused, never charged, never what ended the trial."""
    plan = [("bash", {"command": "echo made > made.txt"}), ("bash", {"command": "echo two"})]
    task = Task(
        dataset=[Sample(id=f"s{n}", input="go", files={"id.txt": f"sample {n}"}) for n in (1, 2)],
        solver=[use_tools(bash()), generate()],
        scorer=runs_a_command(),
        sandbox=("trialtool", {"limits": {"max_calls": 2}}),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_samples=2)
    assert log.status == "success", log.error
    assert log.samples is not None
    for sample in log.samples:
        assert sample.scores is not None
        [score] = sample.scores.values()
        assert score.value == CORRECT, score.explanation
        account = sample.metadata["trialtool"]
        records = strict_records(Path(account["log"]))
        assert [r["record_type"] for r in records] == ["trial_tool_call"] * 2 + ["trial_tool_grading"]
        grading = records[-1]
        assert grading["charged"] is False and grading["sequence"] is None and grading["status"] == "ok"
        assert grading["ledger_after"] == records[1]["ledger_after"]  # the agent's counters, unchanged
        stored = json.loads(Path(account["state"]).read_text())
        assert stored["calls"] == 2 and stored["refused_calls"] == 0
        assert verify(Path(account["state"]), Path(account["log"])).verdict == "clean"
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "trialtool",
                "status",
                "--json",
                "--state",
                account["state"],
                "--log",
                account["log"],
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        shown = json.loads(status.stdout)
        assert shown["ended_by"] == "calls" and shown["statuses"] == {"ok": 2}


def test_text_editor_views_a_file_far_over_the_allowance(tmp_path: Path) -> None:
    """The reply is JSON the tool parses: the text inside it is clipped to the allowance, the envelope
    kept; the model reads a clipped view and the sample goes on."""
    from inspect_ai.tool import text_editor

    big = "".join(f"line {n} of a long file\n" for n in range(1, 2001))  # over 20 000 tokens: 50 allowances
    plan = [("text_editor", {"command": "view", "path": "big.txt"}), ("bash", {"command": "echo after"})]
    task = Task(
        dataset=[Sample(id="view", input="go", files={"big.txt": big})],
        solver=[use_tools(text_editor(), bash()), generate()],
        sandbox=("trialtool", TrialSandboxConfig(limits={"max_call_tokens": 400})),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    [sample] = log.samples
    viewed, after = [message.text for message in sample.messages if message.role == "tool"]
    assert "line 1 of a long file" in viewed and "line 1000 of a long file" not in viewed  # the middle cut
    assert "tokens" in viewed and viewed.rstrip().endswith("</NOTE>")  # said inside; the tool's tail kept
    assert after.strip().endswith("after")
    account = sample.metadata["trialtool"]
    records = strict_records(Path(account["log"]))
    assert records[0]["reply"] == "json-rpc" and records[0]["output_truncated"] is True
    assert records[0]["delivered_emitted_tokens"] <= 400 and records[0]["observed_emitted_tokens"] > 10 * 400
    files = ["--state", account["state"], "--log", account["log"]]
    shown = subprocess.run(
        [sys.executable, "-m", "trialtool", "show", "--json", "--call", "1", *files],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(shown.stdout)["delivered"]["matches"] is True  # show reproduces the reply


def test_a_text_editor_call_over_its_deadline_lets_the_eval_go_on(tmp_path: Path) -> None:
    """Stopped at its deadline, the tool's exec raises what inspect expects (TimeoutError): the model is
    told, every sample is scored, the eval succeeds; the call is recorded and charged as stopped."""
    from inspect_ai.tool import text_editor

    plan = [("text_editor", {"command": "view", "path": "id.txt"})]
    task = Task(
        dataset=[Sample(id=f"s{n}", input="go", files={"id.txt": f"sample {n}"}) for n in (1, 2)],
        solver=[use_tools(text_editor()), generate()],
        scorer=runs_a_command(),
        # A millisecond: the tools' program cannot even start in it.
        sandbox=("trialtool", TrialSandboxConfig(limits={"call_timeout": 0.001})),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", max_samples=2)
    assert log.status == "success", log.error
    assert log.samples is not None and len(log.samples) == 2
    for sample in log.samples:
        assert sample.scores is not None and sample.error is None
        [told] = [message for message in sample.messages if message.role == "tool"]
        assert told.error is not None and told.error.type == "timeout", told
        records = strict_records(Path(sample.metadata["trialtool"]["log"]))
        assert records[0]["status"] == "timeout" and records[0]["charged"] is True


def test_a_login_shell_whose_profile_writes_under_home_leaves_the_model_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inspect's bash() runs `bash --login`; a profile that writes under $HOME (as pyenv's rehash does)
    writes into the sample's home layer, and the model reads only the command's output."""
    from trialtool import sandbox as seam

    if seam.unavailable() is not None:
        pytest.skip(f"the bwrap sandbox cannot run here: {seam.unavailable()}")
    home = tmp_path / "home"
    (home / ".pyenv" / "shims").mkdir(parents=True)
    (home / ".profile").write_text(
        'touch "$HOME/.pyenv/shims/.rehash" 2>/dev/null '
        '|| echo "pyenv: cannot rehash: $HOME/.pyenv/shims is not writable" >&2\n'
    )
    monkeypatch.setenv("HOME", str(home))
    plan = [("bash", {"command": "echo hi"}), ("bash", {"command": "ls -A ~/.pyenv/shims"})]
    task = Task(
        dataset=[Sample(id="s1", input="go")],
        solver=[use_tools(bash()), generate()],
        sandbox=("trialtool", {"limits": {"sandbox": "bwrap"}}),
    )
    model = get_model("mockllm/model", custom_outputs=scripted_by(plan))
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    assert log.samples is not None
    [sample] = log.samples
    texts = [message.text for message in sample.messages if message.role == "tool"]
    assert texts == ["hi\n", ".rehash\n"]
    # The host's home: untouched by the command (inspect itself, on the host, keeps its data in ~/.local).
    assert list((home / ".pyenv" / "shims").iterdir()) == []


def test_a_signed_samples_metadata_carries_its_statements_digest(tmp_path: Path) -> None:
    from trialtool.ledger._verify import verify as check
    from trialtool.signing import generate, read_public_keys

    key = generate(str(tmp_path / "trial.key"))
    (tmp_path / "trial.pub").write_text(key.public.pem())
    log = run_eval(tmp_path, {"limits": {"max_calls": 3}, "signing_key": str(tmp_path / "trial.key")})
    trusted = read_public_keys(str(tmp_path / "trial.pub"))
    for sample in read_eval_log(log.location).samples:
        account = sample.metadata["trialtool"]
        found = check(account["state"], account["log"], trusted=trusted)
        assert found.verdict == "clean" and found.signatures is not None, found.why
        assert account["statement"]["statement_sha256"] == found.signatures.statement_sha256
        assert account["statement"]["signer"] == key.fingerprint
