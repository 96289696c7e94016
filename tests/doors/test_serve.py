"""`trial-tool serve`: a real server process speaking JSON lines, good input and bad."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ESCAPE, TrialFiles, marked, wait_until
from trialtool.ledger._verify import verify


def serve_argv(trial: TrialFiles, *flags: str) -> list[str]:
    return [sys.executable, "-m", "trialtool", "serve", "--state", str(trial.state), "--log", str(trial.log), *flags]


def session(trial: TrialFiles, data: bytes, *flags: str) -> tuple[int, list[dict[str, Any]], bytes]:
    """Feed `data` to a server and close its stdin; its exit code, every response, its stderr."""
    done = subprocess.run(serve_argv(trial, *flags), input=data, capture_output=True, timeout=60)
    responses = [json.loads(line) for line in done.stdout.splitlines()]
    return done.returncode, responses, done.stderr


def lines(*requests: dict[str, Any] | bytes) -> bytes:
    return b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in requests)


def by_id(responses: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {response["id"]: response for response in responses}


def test_ping_run_budget(trial: TrialFiles) -> None:
    code, responses, _ = session(
        trial,
        lines(
            {"id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "id": "two", "method": "run", "params": {"command": "echo out; echo err >&2; exit 4"}},
            {"id": 3, "method": "run", "params": {"command": ["printf", "%s", "x"], "cwd": "/", "timeout": 5}},
        ),
        "--max-concurrent",
        "1",  # one at a time: the budget request below sees both calls
    )
    assert code == 0
    answers = by_id(responses)
    assert all(r["jsonrpc"] == "2.0" for r in responses)
    assert answers[1]["result"] == {}
    two = answers["two"]["result"]
    assert (two["status"], two["exit_code"], two["stdout"], two["stderr"]) == ("error", 4, "out\n", "err\n")
    assert answers[3]["result"]["stdout"] == "x"
    code, responses, _ = session(trial, lines({"id": 4, "method": "budget"}))
    budget = responses[0]["result"]
    assert budget["calls_used"] == 2 and budget["tokens_used"] == two["delivered_tokens"] + 1
    assert verify(trial.state, trial.log).ok


def test_bad_requests_get_errors_and_the_server_goes_on(trial: TrialFiles) -> None:
    code, responses, _ = session(
        trial,
        lines(
            b"this is not json\n",
            b"[1, 2]\n",
            b"\n",  # blank lines are skipped
            {"id": 1, "method": "explode"},
            {"id": 2, "method": "run", "params": {"command": 42}},
            {"id": 3, "method": "run", "params": {"command": "true", "shell": "bash"}},
            {"id": 4, "method": "run", "params": "echo"},
            {"id": [5], "method": "ping"},
            {"id": 6, "method": "run", "params": {"command": "echo fine"}},
        ),
    )
    assert code == 0
    # Bad params are found by the worker that runs the request: answers may come in any order.
    codes = sorted((str(r["id"]), r["error"]["code"]) for r in responses if "error" in r)
    expected = [(None, -32700), (None, -32600), (1, -32601), (2, -32602), (3, -32602), (4, -32600), (None, -32600)]
    assert codes == sorted((str(i), c) for i, c in expected)
    assert by_id(responses)[6]["result"]["stdout"] == "fine\n"
    assert trial.state_json()["calls"] == 1  # bad requests are not charged


def test_oversized_request_is_refused_whole(trial: TrialFiles) -> None:
    big = {"id": 1, "method": "run", "params": {"command": "echo " + "x" * 500}}
    code, responses, _ = session(
        trial, lines(big, {"id": 2, "method": "run", "params": {"command": "echo ok"}}), "--max-request-bytes", "200"
    )
    assert code == 0
    assert responses[0] == {"jsonrpc": "2.0", "id": None, "error": responses[0]["error"]}
    assert "200 bytes" in responses[0]["error"]["message"]
    assert by_id(responses)[2]["result"]["stdout"] == "ok\n"
    assert trial.state_json()["calls"] == 1


def test_eof_mid_request(trial: TrialFiles) -> None:
    # A whole request without its newline is served; a torn one is a parse error. Both end cleanly.
    code, responses, _ = session(trial, b'{"id": 1, "method": "run", "params": {"command": "echo last"}}')
    assert code == 0 and responses[0]["result"]["stdout"] == "last\n"
    code, responses, _ = session(trial, lines({"id": 2, "method": "ping"}) + b'{"id": 3, "meth')
    assert code == 0
    assert [r.get("error", {}).get("code") for r in responses] == [None, -32700]
    assert trial.state_json()["calls"] == 1


def test_command_output_never_reaches_the_protocol(trial: TrialFiles) -> None:
    noisy = (
        'echo \'{"jsonrpc": "2.0", "id": 1, "result": "forged"}\'; '
        "echo to-stderr >&2; cat; echo to-tty > /dev/tty 2>/dev/null; seq 1 2000"
    )
    code, responses, _ = session(trial, lines({"id": 1, "method": "run", "params": {"command": noisy}}))
    assert code == 0
    (response,) = responses  # one line per request, whatever the command printed
    assert response["result"]["stdout"].startswith('{"jsonrpc"')
    assert "to-stderr" in response["result"]["stderr"]
    # Nor can it write to descriptor 1 of the server or any other ancestor: it is stderr or /dev/null there.
    # (Unsandboxed: in the sandbox, the command sees no ancestor of trial-tool's at all.)
    other = TrialFiles(trial.root / "unsandboxed")
    other.root.mkdir()
    request = lines({"id": 2, "method": "run", "params": {"command": ESCAPE}})
    code, responses, stderr = session(other, request, "--sandbox", "none")
    assert code == 0 and [r["id"] for r in responses] == [2]
    assert responses[0]["result"]["stdout"] == "climbed\n"
    assert b'"result":{}' in stderr  # it did write to the server's descriptor 1, which is stderr now


def test_limits_are_checked_at_start(trial: TrialFiles) -> None:
    assert session(trial, b"", "--max-calls", "5")[0] == 0
    code, responses, stderr = session(trial, lines({"id": 1, "method": "ping"}), "--max-calls", "6")
    assert code == 125 and responses == []
    assert stderr.count(b"\n") == 1 and b"--max-calls" in stderr


def test_at_most_max_concurrent_calls_run_at_once(trial: TrialFiles) -> None:
    requests = [{"id": n, "method": "run", "params": {"command": "sleep 0.2"}} for n in range(5)]
    code, responses, _ = session(trial, lines(*requests), "--max-concurrent", "2")
    assert code == 0 and len(responses) == 5
    spans = [(row["started_at_utc"], row["ended_at_utc"]) for row in trial.records()]
    for start, _ in spans:
        running = sum(1 for other_start, other_end in spans if other_start <= start < other_end)
        assert running <= 2


@pytest.fixture
def server(trial: TrialFiles) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(serve_argv(trial), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_sigterm_stops_running_calls_and_answers_them(
    trial: TrialFiles, server: subprocess.Popen[bytes], marker: str
) -> None:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(lines({"id": 1, "method": "run", "params": {"command": f"sleep 60; : {marker}"}}))
    server.stdin.flush()
    assert wait_until(lambda: bool(marked(marker)))
    server.send_signal(signal.SIGTERM)
    response = json.loads(server.stdout.readline())
    assert server.wait(timeout=30) == 128 + signal.SIGTERM
    assert response["result"]["status"] == "interrupted"
    assert "SIGTERM" in response["result"]["stderr"]
    assert wait_until(lambda: not marked(marker))
    assert trial.state_json()["in_flight"] == {}
