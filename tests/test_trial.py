"""The Python API as a harness uses it: warm calls, threads, asyncio tasks, cancellation, budgets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TrialFiles, marked, wait_until
from tests.ledger.test_ledger import check_ledger
from trialtool import Budget, BudgetExhausted, CallRequest, CallResult, Trial, UsageError
from trialtool.ledger._verify import verify
from trialtool.output import tokens


@pytest.fixture
def api(trial: TrialFiles) -> Iterator[Trial]:
    """A Trial used in-process; closed afterwards, and its fork server checked gone."""
    before = {proc.pid for proc in psutil.Process().children()}
    with Trial(trial.state, trial.log, limits={"max_calls": 50}) as handle:
        yield handle
    after = {proc.pid for proc in psutil.Process().children()}
    assert after <= before, "the fork server outlived Trial.close()"


def test_argv_and_shell_string(api: Trial, trial: TrialFiles) -> None:
    first = api.run(["printf", "%s", "a b"])
    assert isinstance(first, CallResult)
    assert (first.status, first.exit_code, first.stdout, first.stderr) == ("ok", 0, "a b", "")
    second = api.run("echo out; echo err >&2; exit 3")
    assert (second.status, second.exit_code, second.stdout, second.stderr) == ("error", 3, "out\n", "err\n")
    assert second.record["command"] == ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]
    assert isinstance(second.budget, Budget)
    assert second.budget.calls_used == 2 and second.budget.calls_left == 48
    assert second.budget.tokens_used == first.delivered_tokens + second.delivered_tokens
    now, later = api.budget(), api.budget()
    assert (now.calls_used, now.tokens_used) == (2, second.budget.tokens_used)
    assert second.budget.seconds_used <= now.seconds_used <= later.seconds_used  # the trial clock only advances
    assert verify(trial.state, trial.log).ok


def test_a_request_is_checked_once_and_carried_whole(api: Trial, tmp_path: Path) -> None:
    """CallRequest.of checks every option where the call enters; Trial.call runs it as run would."""
    request = CallRequest.of(
        "cat; echo $GREETING; pwd >&2", cwd=tmp_path, env={"GREETING": "hi"}, input="piped\n", merge_output=True
    )
    assert request.argv == ("/bin/sh", "-c", "cat; echo $GREETING; pwd >&2") and request.stdin == b"piped\n"
    with pytest.raises(TypeError):
        request.env["GREETING"] = "changed"  # type: ignore[index]
    with pytest.raises(AttributeError):
        request.cwd = "/"  # type: ignore[misc]
    result = api.call(request)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"piped\nhi\n{tmp_path}\n", "")
    assert result.record["stdin_bytes"] == 6 and result.record["merged_output"] is True
    for bad in ({"timeout": 0}, {"env": {"A=B": "x"}}, {"cwd": tmp_path / "missing"}, {"reply": "xml"}):
        with pytest.raises(UsageError):
            CallRequest.of("true", **bad)  # type: ignore[arg-type]
    assert api.budget().calls_used == 1


def test_settings_are_checked_where_they_enter(trial: TrialFiles) -> None:
    """A bad limit, sandbox setting or label is refused by Trial() itself: no file is made."""
    for bad in ({"max_calls": -1}, {"clip": "middle"}, {"network": "wifi"}, {"labels": ["no-equals"]}, {"nope": 1}):
        with pytest.raises(UsageError):
            Trial(trial.state, trial.log, limits=bad)
    assert not trial.state.exists() and not trial.log.exists()
    settings = Trial(trial.state, trial.log, limits={"max_calls": 3.0, "labels": {"task": "t1"}}).settings
    assert (settings.limits.max_calls, settings.given, dict(settings.labels or {})) == (
        3,
        ("max_calls",),
        {"task": "t1"},
    )


def test_budget_and_open(trial: TrialFiles) -> None:
    with Trial(trial.state, trial.log, limits={"max_calls": 3, "max_tokens": 100}) as fresh:
        budget = fresh.open()  # creates the trial
        assert (budget.calls_used, budget.calls_left, budget.tokens_left, budget.exhausted) == (0, 3, 100, False)
        assert fresh.open().calls_left == 3  # opening again changes nothing
    assert trial.state_json()["calls"] == 0


def test_cwd_defaults_to_the_callers_directory_at_call_time(api: Trial, tmp_path: Path) -> None:
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert api.run("pwd").stdout == f"{tmp_path}\n"
    finally:
        os.chdir(here)
    assert api.run("pwd", cwd="/").stdout == "/\n"
    with pytest.raises(UsageError):
        api.run("pwd", cwd=str(tmp_path / "missing"))


def test_timeout_shortens_the_deadline(api: Trial) -> None:
    result = api.run(["sleep", "30"], timeout=0.3)
    assert (result.status, result.exit_code) == ("timeout", 124)
    assert result.record["deadline_kind"] == "request" and result.record["deadline_seconds"] == 0.3
    assert "the call's timeout" in result.stderr
    for bad in (0, -1, float("nan"), "1"):
        with pytest.raises(UsageError):
            api.run(["true"], timeout=bad)  # type: ignore[arg-type]


def test_bad_commands_are_usage_errors_and_not_charged(api: Trial) -> None:
    for bad in ([], "", "   ", ["echo", 3]):
        with pytest.raises(UsageError):
            api.run(bad)  # type: ignore[arg-type]
    assert api.budget().calls_used == 0


def test_threads_share_one_trial_exactly(trial: TrialFiles) -> None:
    with Trial(trial.state, trial.log, limits={"max_calls": 6}) as shared:

        def one(n: int) -> CallResult | str:
            try:
                return shared.run(f"echo {n}")
            except BudgetExhausted as exc:
                return exc.status

        with ThreadPoolExecutor(10) as pool:
            outcomes = list(pool.map(one, range(10)))
    ran = [o for o in outcomes if isinstance(o, CallResult)]
    assert len(ran) == 6 and outcomes.count("maximum_tool_calls") == 4
    assert sorted(o.sequence for o in ran) == [1, 2, 3, 4, 5, 6]
    state = trial.state_json()
    assert (state["calls"], state["refused_calls"], state["in_flight"]) == (6, 4, {})
    assert state["emitted_tokens"] == sum(o.delivered_tokens for o in ran)
    assert verify(trial.state, trial.log).ok


def test_async_tasks_run_at_once(trial: TrialFiles) -> None:
    # The trial's files beside the workspace: calls of a trial inside it run one at a time.
    workspace = trial.root / "ws"
    workspace.mkdir()
    api = Trial(trial.state, trial.log, limits={"workspace": str(workspace)})

    async def main() -> list[CallResult]:
        with api:
            return await asyncio.gather(*(api.arun(f"sleep 0.3; echo {n}", cwd=workspace) for n in range(4)))

    results = asyncio.run(main())
    assert sorted(r.stdout for r in results) == ["0\n", "1\n", "2\n", "3\n"]
    # They overlapped: some call started before another had ended (no clock is asserted).
    spans = sorted((r.record["started_at_utc"], r.record["ended_at_utc"]) for r in results)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
    assert asyncio.run(api.abudget()).calls_used == 4
    assert verify(trial.state, trial.log).ok


def test_cancelling_a_task_stops_its_command(api: Trial, trial: TrialFiles, marker: str, tmp_path: Path) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)

    async def main() -> None:
        task = asyncio.ensure_future(api.arun(f"echo started > {fifo}; sleep 60; : {marker}"))
        # The command announces itself through the FIFO: an event, not a sleep.
        await asyncio.to_thread(fifo.read_text)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: not marked(marker))
    (record,) = trial.records()
    assert record["status"] == "interrupted" and record["charged"] is True
    assert "cancelled" in record["trial_tool_notice"]
    assert trial.state_json()["in_flight"] == {}


def test_encoder_is_built_once_per_process(trial: TrialFiles, tmp_path: Path) -> None:
    other = TrialFiles(tmp_path / "other")
    other.root.mkdir()
    with Trial(trial.state, trial.log) as one, Trial(other.state, other.log) as two:
        one.run("echo one")
        two.run("echo two")
    path = tokens.locate()
    assert tokens.verified(path) is tokens.verified(path)
    assert tokens.verified(path).encoder() is tokens.verified(path, recheck=True).encoder()


HARNESS = textwrap.dedent(
    """
    import os, sys
    from trialtool import Trial
    trial = Trial(sys.argv[1], sys.argv[2])
    trial.run("echo warm")
    print("running", flush=True)
    trial.run(["sh", "-c", "sleep 60; : " + os.environ["MARKER"]])
    """
)


@contextlib.contextmanager
def harness_running(code: str, trial: TrialFiles, marker: str) -> Iterator[subprocess.Popen[bytes]]:
    """A harness process, yielded once its marked command runs; killed and reaped afterwards."""
    harness = subprocess.Popen(
        # The marker goes by the environment: only the command's command line carries it.
        [sys.executable, "-c", code, str(trial.state), str(trial.log)],
        stdout=subprocess.PIPE,
        env={**os.environ, "MARKER": marker},
    )
    try:
        assert harness.stdout is not None
        assert harness.stdout.readline() == b"running\n"
        assert wait_until(lambda: bool(marked(marker)))
        yield harness
    finally:
        harness.kill()
        harness.wait()
        assert harness.stdout is not None
        harness.stdout.close()


def test_a_killed_harness_leaves_nothing_running(trial: TrialFiles, marker: str) -> None:
    with harness_running(HARNESS, trial, marker) as harness:
        children = psutil.Process(harness.pid).children(recursive=True)
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=30)
    # The command, its supervisor and the fork server all go.
    assert wait_until(lambda: not marked(marker))
    assert wait_until(lambda: not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE])
    with Trial(trial.state, trial.log) as after:
        after.run("echo next")
    assert [row["status"] for row in trial.records()] == ["ok", "abandoned", "ok"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.integers(0, 80), min_size=1, max_size=10),
    threads=st.integers(1, 6),
    max_calls=st.integers(1, 8),
    max_tokens=st.integers(1, 150),
    max_call_tokens=st.integers(1, 60),
)
def test_threads_keep_the_ledger_exact(
    tmp_path_factory: pytest.TempPathFactory,
    words: list[int],
    threads: int,
    max_calls: int,
    max_tokens: int,
    max_call_tokens: int,
) -> None:
    root = tmp_path_factory.mktemp("threads")
    limits = {"max_calls": max_calls, "max_tokens": max_tokens, "max_call_tokens": max_call_tokens}

    def one(count: int) -> CallResult | None:
        try:
            return shared.run(f"printf 'w%.0s ' $(seq {count})")
        except BudgetExhausted:
            return None

    with Trial(root / "s.json", root / "l.jsonl", limits=limits) as shared, ThreadPoolExecutor(threads) as pool:
        outcomes = list(pool.map(one, words))
    ran = [o for o in outcomes if o is not None]
    state = check_ledger(root / "s.json", root / "l.jsonl")
    assert state["calls"] == len(ran) <= max_calls and state["in_flight"] == {}
    assert state["emitted_tokens"] == sum(o.delivered_tokens for o in ran) <= max_tokens
    assert all(o.delivered_tokens <= o.allowance <= max_call_tokens for o in ran)
    assert len({o.sequence for o in ran}) == len(ran)


INTERRUPTED_HARNESS = textwrap.dedent(
    """
    import os, signal, sys
    from trialtool import Trial
    # Ctrl-C raises KeyboardInterrupt even when this test runs where SIGINT is ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    trial = Trial(sys.argv[1], sys.argv[2])
    print("running", flush=True)
    try:
        trial.run(["sh", "-c", "sleep 60; : " + os.environ["MARKER"]])
    except KeyboardInterrupt:
        pass
    trial.run("echo after")  # the same process goes on: the interrupted call must not stay in flight
    print(trial.budget().in_flight, flush=True)
    """
)


def test_keyboard_interrupt_in_a_harness_is_recorded_abandoned(trial: TrialFiles, marker: str) -> None:
    with harness_running(INTERRUPTED_HARNESS, trial, marker) as harness:
        harness.send_signal(signal.SIGINT)
        assert harness.stdout is not None
        out = harness.stdout.read()
        harness.wait(timeout=60)
    assert out == b"0\n" and harness.returncode == 0
    assert wait_until(lambda: not marked(marker))
    assert [row["status"] for row in trial.records()] == ["abandoned", "ok"]


@pytest.mark.timeout(120)
def test_a_large_output_is_held_within_a_bound(tmp_path: Path) -> None:
    # 32 MiB captured: the process stays under the encoder plus six times the output (it
    # measures near three; holding every token as a Python int once took fifteen).
    text = tmp_path / "big.txt"
    line = "alpha beta 42 日本語 😀 gamma\n".encode()
    text.write_bytes((line * ((32 << 20) // len(line) + 1))[: 32 << 20])
    code = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
    )
    argv = [sys.executable, "-m", "trialtool", "--state", str(tmp_path / "s.json"), "--log", str(tmp_path / "l.jsonl")]
    argv += ["--max-capture-bytes", str(32 << 20), "--call-timeout", "100", "--", "cat", str(text)]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < (150 << 20) + 6 * (32 << 20)
    assert verify(tmp_path / "s.json", tmp_path / "l.jsonl").ok
