"""A call's own options, on every door: stdin, merged output, a shorter timeout, --json, --version."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TrialFiles
from tests.doors.test_serve import by_id, lines, session
from trialtool import Trial
from trialtool.errors import UsageError
from trialtool.ledger._verify import verify

#: Writes to both streams, in an order a reader of two pipes could not keep.
INTERLEAVED = "echo 1; echo 2 >&2; echo 3; echo 4 >&2"


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert text.startswith("trial-tool: ") and text.count("\n") == 1, text
    return text


# -- stdin -------------------------------------------------------------------


def test_stdin_from_a_file_reaches_the_command_and_is_recorded(trial: TrialFiles, tmp_path: Path) -> None:
    data = "naïve\nline two\n".encode()
    source = tmp_path / "input.txt"
    source.write_bytes(data)
    done = trial.call("cat", flags=("--stdin", str(source)))
    assert (done.returncode, done.stdout) == (0, data)
    [record] = trial.records()
    assert record["stdin_bytes"] == len(data)
    assert record["stdin_sha256"] == hashlib.sha256(data).hexdigest()
    assert "stdin_b64" not in record  # the input is the agent's: its size and digest only
    # Not charged: only what the command printed is counted.
    assert record["delivered_emitted_tokens"] == record["observed_emitted_tokens"]
    assert verify(trial.state, trial.log).ok


def test_stdin_dash_is_trial_tools_own(trial: TrialFiles) -> None:
    done = subprocess.run(
        trial.argv("--stdin", "-", "--", "wc", "-c"), input=b"x" * 70_000, capture_output=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, b"70000")
    assert trial.records()[0]["stdin_bytes"] == 70_000


def test_without_stdin_the_record_says_none(trial: TrialFiles) -> None:
    assert trial.call("true").returncode == 0
    record = trial.records()[0]
    assert (record["stdin_bytes"], record["stdin_sha256"], record["merged_output"]) == (None, None, False)


def test_a_command_that_does_not_read_its_input_does_not_block(trial: TrialFiles, tmp_path: Path) -> None:
    # Far more than a pipe holds (64 KiB): a blocking write would hang until the deadline.
    source = tmp_path / "big"
    source.write_bytes(b"y" * (3 << 20))
    flags = ("--stdin", str(source), "--max-stdin-bytes", str(4 << 20), "--call-timeout", "20")
    for command in (("true",), ("head", "-c", "5"), ("sh", "-c", "exec 0<&-; sleep 0.2; echo done")):
        done = trial.call(*command, flags=flags)
        assert done.returncode == 0, done.stderr
    statuses = [record["status"] for record in trial.records()]
    assert statuses == ["ok", "ok", "ok"]
    assert all(record["elapsed_seconds"] < 10 for record in trial.records())


def test_input_over_the_pinned_bound_changes_nothing(trial: TrialFiles, tmp_path: Path) -> None:
    assert (
        trial.cli("init", "--state", str(trial.state), "--log", str(trial.log), "--max-stdin-bytes", "10").returncode
        == 0
    )
    source = tmp_path / "input"
    source.write_bytes(b"z" * 11)
    before = trial.snapshot()
    # The pinned bound, not given on this call.
    done = trial.call("cat", flags=("--stdin", str(source)))
    assert done.returncode == 125 and "--max-stdin-bytes 10" in one_line(done.stderr)
    # The flag's own bound, checked while reading.
    done = trial.call("cat", flags=("--stdin", str(source), "--max-stdin-bytes", "10"))
    assert done.returncode == 125 and "more than 10 bytes" in one_line(done.stderr)
    done = trial.call("cat", flags=("--stdin", str(tmp_path / "missing")))
    assert done.returncode == 125 and "cannot read --stdin" in one_line(done.stderr)
    assert trial.snapshot() == before
    source.write_bytes(b"z" * 10)
    assert trial.call("cat", flags=("--stdin", str(source))).stdout == b"z" * 10


def test_a_state_from_before_the_stdin_bound_is_read_with_its_default(tmp_path: Path) -> None:
    state, log = tmp_path / "state.json", tmp_path / "log.jsonl"
    with Trial(state, log, limits={"sandbox": "none"}) as trial:
        trial.run(["true"])
    document = json.loads(state.read_text())
    del document["limits"]["max_stdin_bytes"]
    state.write_text(json.dumps(document))
    with Trial(state, log) as trial:
        assert trial.status().limits.max_stdin_bytes == 1 << 20
        assert trial.run(["cat"], input="again").stdout == "again"
    assert verify(state, log).ok


def test_api_input_as_text_or_bytes(tmp_path: Path) -> None:
    with Trial(tmp_path / "s.json", tmp_path / "l.jsonl", limits={"max_stdin_bytes": 16}) as trial:
        assert trial.run(["cat"], input="héllo").stdout == "héllo"
        assert trial.run(["od", "-An", "-tx1"], input=b"\xff\x00").stdout.split() == ["ff", "00"]
        assert trial.run(["cat"], input="").stdout == ""
        with pytest.raises(UsageError, match="input must be bytes or text"):
            trial.run(["cat"], input=42)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="max-stdin-bytes 16"):
            trial.run(["cat"], input="x" * 17)
        assert trial.budget().calls_used == 3  # the refused two charged nothing


# -- merged output ------------------------------------------------------------


def test_merged_output_keeps_the_order_written(trial: TrialFiles) -> None:
    apart = trial.call("sh", "-c", INTERLEAVED)
    assert (apart.stdout, apart.stderr) == (b"1\n3\n", b"2\n4\n")
    merged = trial.call("sh", "-c", INTERLEAVED, flags=("--merge-output",))
    assert (merged.returncode, merged.stdout, merged.stderr) == (0, b"1\n2\n3\n4\n", b"")
    first, second = trial.records()
    assert first["merged_output"] is False and second["merged_output"] is True
    assert (second["stdout_bytes"], second["stderr_bytes"]) == (8, 0)
    assert base64.b64decode(second["stdout_b64"]) == b"1\n2\n3\n4\n"


def test_merged_output_is_clipped_and_capped_as_one_stream(trial: TrialFiles) -> None:
    script = "for i in $(seq 1 400); do echo out $i; echo err $i >&2; done"
    pinned = ("--max-call-tokens", "60", "--max-capture-bytes", "5000")
    # 100 rounds fit under the capture cap; 400 do not.
    done = trial.call("sh", "-c", script.replace("400", "100"), flags=("--merge-output", *pinned))
    record = trial.records()[0]
    assert record["status"] == "truncated" and record["delivered_emitted_tokens"] <= 60
    assert done.stdout.startswith(b"out 1\nerr 1\nout 2\n") and done.stdout.endswith(b"err 100\n")
    capped = trial.call("sh", "-c", script, flags=("--merge-output", *pinned))
    record = trial.records()[1]
    assert record["status"] == "output_limit" and capped.returncode == 124
    assert record["stdout_capture_truncated"] and not record["stderr_capture_truncated"]


def test_merged_output_still_tells_a_missing_command(trial: TrialFiles) -> None:
    # Sandboxed, bwrap says why a command never ran on the stream it was given: the one stream, here.
    done = trial.call("no-such-command-trialtool", flags=("--merge-output",))
    assert done.returncode == 127 and b"command not found" in done.stderr
    assert trial.records()[0]["status"] == "command_error"


def test_api_and_serve_merge_and_feed(trial: TrialFiles) -> None:
    code, responses, _ = session(
        trial,
        lines(
            {"id": 1, "method": "run", "params": {"command": INTERLEAVED, "merge_output": True}},
            {"id": 2, "method": "run", "params": {"command": "cat", "input": "typed"}},
            {"id": 3, "method": "run", "params": {"command": ["od", "-An", "-tx1"], "input_b64": "/wA="}},
            {"id": 4, "method": "run", "params": {"command": "cat", "input": "a", "input_b64": "YQ=="}},
            {"id": 5, "method": "run", "params": {"command": "cat", "input_b64": "not base64!"}},
            {"id": 6, "method": "run", "params": {"command": "cat", "merge_output": "yes"}},
        ),
        "--max-concurrent",
        "1",
    )
    answers = by_id(responses)
    assert code == 0
    assert answers[1]["result"]["stdout"] == "1\n2\n3\n4\n" and answers[1]["result"]["stderr"] == ""
    assert answers[2]["result"]["stdout"] == "typed"
    assert answers[3]["result"]["stdout"].split() == ["ff", "00"]
    for bad in (4, 5, 6):
        assert answers[bad]["error"]["code"] == -32602
    assert [record["sequence"] for record in trial.records()] == [1, 2, 3]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.text("abc", min_size=1, max_size=5)), min_size=1, max_size=12))
def test_merged_output_is_the_writes_in_order(tmp_path: Path, writes: list[tuple[bool, str]]) -> None:
    script = "; ".join(f"printf %s {word}" + (" >&2" if to_err else "") for to_err, word in writes)
    with Trial(tmp_path / "s.json", tmp_path / "l.jsonl", limits={"sandbox": "none", "max_calls": 1000}) as trial:
        result = trial.run(script, merge_output=True)
    assert (result.stdout, result.stderr) == ("".join(word for _, word in writes), "")


# -- --timeout, --json, --version ---------------------------------------------


def test_timeout_shortens_the_call_and_never_lengthens_it(trial: TrialFiles) -> None:
    done = trial.call("sleep", "30", flags=("--call-timeout", "0.6", "--timeout", "0.3"))
    assert done.returncode == 124
    done = trial.call("sleep", "30", flags=("--timeout", "100"))  # the pinned 0.6 s holds
    assert done.returncode == 124
    first, second = trial.records()
    assert (first["deadline_kind"], first["deadline_seconds"]) == ("request", 0.3)
    assert (second["deadline_kind"], second["deadline_seconds"]) == ("call", 0.6)
    before = trial.snapshot()
    done = trial.call("true", flags=("--timeout", "-1"))
    assert done.returncode == 125 and "timeout must be a positive number" in one_line(done.stderr)
    assert trial.snapshot() == before


def test_json_prints_the_result_as_serve_does(trial: TrialFiles) -> None:
    done = trial.call("sh", "-c", "echo out; echo err >&2; exit 3", flags=("--json", "--max-calls", "1"))
    assert (done.returncode, done.stderr) == (3, b"")
    result = json.loads(done.stdout)
    assert (result["stdout"], result["stderr"], result["exit_code"], result["status"]) == ("out\n", "err\n", 3, "error")
    assert result["budget"]["calls_left"] == 0 and result["sequence"] == 1
    _, responses, _ = session(trial, lines({"id": 1, "method": "budget"}))
    assert set(result) == {
        "sequence",
        "status",
        "exit_code",
        "stdout",
        "stderr",
        "delivered_tokens",
        "allowance",
        "output_truncated",
        "budget",
        "head",
    }
    assert result["head"] == json.loads(trial.state.read_text())["log"]["head"]
    assert set(result["budget"]) == set(responses[0]["result"])
    # A refusal: the error object on stdout, the one line on stderr, the usual exit code.
    refused = trial.call("true", flags=("--json", "--max-calls", "1"))
    assert refused.returncode == 123
    error = json.loads(refused.stdout)["error"]
    assert error["data"] == {"kind": "BudgetExhausted", "exit_code": 123, "status": "maximum_tool_calls"}
    one_line(refused.stderr)
    # So is a failure before the call reaches the trial.
    unread = trial.call("cat", flags=("--json", "--stdin", str(trial.root / "missing")))
    assert unread.returncode == 125 and json.loads(unread.stdout)["error"]["data"]["kind"] == "UsageError"


def test_version_on_every_command(trial: TrialFiles) -> None:
    from trialtool import __version__

    for command in ([], ["init"], ["status"], ["report"], ["export"], ["serve"], ["mcp"], ["shim"], ["server"]):
        done = trial.cli(*command, "--version")
        assert (done.returncode, done.stdout) == (0, f"trial-tool {__version__}\n".encode()), command
    assert not trial.state.exists()


def test_flags_reach_the_command_untouched_after_the_separator(trial: TrialFiles) -> None:
    # `--version` and `--json` after `--` are the command's, not trial-tool's.
    done = trial.call("sh", "-c", 'printf "%s," "$@"', "sh", "--version", "--json")
    assert (done.returncode, done.stdout) == (0, b"--version,--json,")
