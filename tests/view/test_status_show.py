"""`trial-tool status` and `show`: what a person reads, what a machine reads, and that they only read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import TrialFiles
from tests.view.conftest import make_trial
from trialtool.view.summary import summarize


@pytest.fixture
def files(tmp_path: Path) -> TrialFiles:
    return TrialFiles(tmp_path)


def test_status_says_what_is_used_and_left(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi", "false", "echo x", "echo y"], {"max_calls": 3})
    done = files.cli("status", "--state", str(files.state), "--log", str(files.log))
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "3 of 3 used, 0 left" in text
    assert "refused   1 (ended by calls)" in text
    assert "integrity clean" in text
    head = json.loads(files.state.read_text())["log"]["head"]
    assert f"head      {head}" in text
    assert len(text.splitlines()) <= 12


def test_status_json_has_the_documented_shape(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi", "false"], {"max_calls": 5, "max_tokens": 1000})
    done = files.cli("status", "--json", "--state", str(files.state), "--log", str(files.log))
    shown = json.loads(done.stdout)
    assert set(shown) == {
        "trial_id", "labels", "state", "log", "limits", "sandbox", "used", "left", "in_flight", "refused_calls",
        "ended_by", "statuses", "grading_commands", "records", "chain", "head", "integrity", "signature",
    }  # fmt: skip
    assert shown["used"]["calls"] == 2 and shown["left"]["calls"] == 3
    assert shown["left"]["tokens"] == 1000 - shown["used"]["tokens"]
    assert shown["statuses"] == {"ok": 1, "error": 1} and shown["chain"] == "sha256"
    assert shown["integrity"] == {"verdict": "clean"} and shown["ended_by"] is None
    assert shown["signature"] == {"status": "not_checked", "signer": None}  # unsigned, and no --public-key


def test_a_tampered_log_is_named_with_its_first_bad_call(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo one", "echo two", "echo three"])
    lines = files.log.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"status":"ok"', b'"status":"error"')  # call 2 (line 1 is the trial's)
    files.log.write_bytes(b"".join(lines))
    done = files.cli("status", "--json", "--state", str(files.state), "--log", str(files.log))
    assert done.returncode == 1
    integrity = json.loads(done.stdout)["integrity"]
    assert integrity["verdict"] == "failed" and integrity["first_bad_sequence"] == 3  # the chain breaks after line 3
    assert integrity["first_bad_record"] == 4
    assert "chain broken" in integrity["why"]


READERS = [
    ("status",),
    ("status", "--json"),
    ("show",),
    ("show", "--call", "1"),
    ("verify",),
]


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_readers_create_lock_and_change_nothing(files: TrialFiles, command: tuple[str, ...]) -> None:
    make_trial(files.state, files.log, ["echo hi"])
    for lock in files.root.glob("*.lock"):
        lock.unlink()
    before = {path.name: path.read_bytes() for path in files.root.iterdir()}
    done = files.cli(*command, "--state", str(files.state), "--log", str(files.log))
    assert done.returncode == 0, done.stderr
    assert {path.name: path.read_bytes() for path in files.root.iterdir()} == before


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_readers_never_wait_for_the_lock(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi"])
    argv = [sys.executable, "-c", HOLD_LOCK, str(files.state) + ".lock"]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
            for command in ("status", "show", "verify"):
                # The lock timeout is 10 s by default: a reader that waited would take that long.
                done = files.cli(command, "--state", str(files.state), "--log", str(files.log), timeout=8)
                assert done.returncode == 0, (command, done.stderr)
        finally:
            holder.kill()


def test_show_lists_every_call(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi", "exit 3", "echo done", "echo refused"], {"max_calls": 3})
    done = files.cli("show", "--state", str(files.state), "--log", str(files.log), env=None)
    lines = done.stdout.decode().splitlines()
    assert lines[0].split() == ["rec", "seq", "start", "secs", "status", "exit", "tokens", "clip", "command"]
    assert [line.split()[4] for line in lines[1:]] == ["ok", "error", "ok", "maximum_tool_calls"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "3", "4", "5"]  # the record's number: its line
    assert lines[2].split()[5] == "3" and "'exit" in lines[2]


def test_show_call_gives_what_the_agent_read(files: TrialFiles) -> None:
    """Clipped output: the text show reproduces from the record is, byte for byte, what the agent was given."""
    script = "seq 1 3000; echo oops >&2"
    [result] = make_trial(files.state, files.log, [script], {"max_call_tokens": 60})
    assert result.output_truncated
    done = files.cli("show", "--json", "--call", "1", "--state", str(files.state), "--log", str(files.log))
    shown = json.loads(done.stdout)
    assert shown["delivered"] == {"stdout": result.stdout, "stderr": result.stderr, "matches": True}
    text = files.cli("show", "--call", "1", "--state", str(files.state), "--log", str(files.log)).stdout.decode()
    assert "(matches the record)" in text and result.stdout in text


def test_show_of_a_call_that_is_not_there(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi"])
    done = files.cli("show", "--call", "7", "--state", str(files.state), "--log", str(files.log))
    assert done.returncode == 125 and done.stderr.decode().count("\n") == 1
    assert "no call 7 in this trial (it has calls 1..1)" in done.stderr.decode()


WRITER = """
import sys
from trialtool import Trial
with Trial(sys.argv[1], sys.argv[2], limits={"sandbox": "none", "max_calls": 1000}) as trial:
    for number in range(int(sys.argv[3])):
        trial.run(["echo", str(number)])
"""


@pytest.mark.timeout(120)
def test_a_trial_being_written_is_read_at_one_moment(files: TrialFiles) -> None:
    """Read while another process commits calls: never a failed verdict, never fewer calls than before."""
    make_trial(files.state, files.log, ["echo first"], {"max_calls": 1000})
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(files.state), str(files.log), "60"])
    seen: list[tuple[str, int]] = []
    try:
        while writer.poll() is None:
            summary = summarize(str(files.state), str(files.log))
            seen.append((summary["integrity"]["verdict"], summary["used"]["calls"]))
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
    verdicts = {verdict for verdict, _ in seen}
    assert verdicts <= {"clean", "in_flight"}, verdicts
    counts = [calls for _, calls in seen]
    assert counts == sorted(counts) and len(seen) > 5
    final = summarize(str(files.state), str(files.log))
    assert final["integrity"] == {"verdict": "clean"} and final["used"]["calls"] == 61


def test_summaries_of_one_moment_in_threads(files: TrialFiles) -> None:
    """summarize is safe from several threads at once (the API embeds it)."""
    make_trial(files.state, files.log, ["echo a", "echo b"])
    found: list[dict[str, object]] = []
    threads = [
        threading.Thread(target=lambda: found.append(summarize(str(files.state), str(files.log)))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 8 and all(summary == found[0] for summary in found)


def test_a_commit_between_the_reads_is_not_taken_for_damage(files: TrialFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call committed just after the log was read: the snapshot reads again rather than pair old log, new state."""
    from trialtool import Trial
    from trialtool.ledger import durable, snapshot
    from trialtool.ledger._verify import check

    make_trial(files.state, files.log, ["echo one"])
    real_read = durable.read_bytes
    fired: list[bool] = []

    def read_then_commit(path: str, **options: bool) -> bytes | None:
        data = real_read(path, **options)
        if path == str(files.log) and not fired:
            fired.append(True)
            with Trial(files.state, files.log) as trial:  # another writer, right between two reads
                trial.run(["echo", "two"])
        return data

    monkeypatch.setattr(durable, "read_bytes", read_then_commit)
    taken = snapshot.read(files.state, files.log)
    monkeypatch.undo()
    assert fired
    report = check(taken, str(files.state))
    assert report.ok and not report.recoverable and report.records == 3


def test_what_a_command_wrote_or_named_cannot_drive_the_graders_terminal(files: TrialFiles) -> None:
    # A command line with a newline, a title-setting sequence and a bidi override; output that clears the screen.
    evil = ["sh", "-c", "printf '\\033[2J\\033]0;pwned\\007fine\\n'", "x\n1  +0.0s  0.00  ok  0  1/1    forged\u202e"]
    make_trial(files.state, files.log, [evil])
    flags = ["--state", str(files.state), "--log", str(files.log)]
    shown = files.cli("show", *flags, env={**os.environ, "COLUMNS": "400"})  # the command column uncut
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout.decode()
    assert "\x1b" not in table and "\u202e" not in table and "\x07" not in table
    assert len(table.splitlines()) == 2  # the header and the one call: no forged row
    assert "\\n1" in table and "\\u202e" in table
    one = files.cli("show", *flags, "--call", "1").stdout.decode()
    assert "\x1b" not in one and "\\x1b[2J\\x1b]0;pwned\\x07fine" in one
    status = files.cli("status", *flags).stdout.decode()
    assert "\x1b" not in status


def test_show_gives_the_exit_code_the_agent_got(files: TrialFiles) -> None:
    make_trial(files.state, files.log, [["sleep", "30"], ["sh", "-c", "exit 3"]], {"call_timeout": 0.5})
    table = files.cli("show", "--state", str(files.state), "--log", str(files.log)).stdout.decode()
    deadline, plain = table.splitlines()[1:3]
    assert " 124 (143) " in deadline or " 124 (sig15) " in deadline, deadline
    assert " 3 " in plain and "(" not in plain.split()[4], plain


def test_a_csv_cell_that_starts_like_a_formula_is_text(files: TrialFiles, tmp_path: Path) -> None:
    make_trial(files.state, files.log, [["sh", "-c", 'echo \'=HYPERLINK("http://x","y")\''], ["printf", "+1"]])
    done = files.cli("export", str(files.state), "--format", "csv", "--text")
    assert done.returncode == 0, done.stderr
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(done.stdout.decode())))
    texts = [row[name] for row in rows for name in row if name and "stdout" in name and row[name]]
    assert any(text.startswith("'=HYPERLINK(") for text in texts), texts
    assert not any(text.startswith(("=", "+")) for text in texts)


def test_status_without_a_state_file_says_so_in_one_line(files: TrialFiles) -> None:
    make_trial(files.state, files.log, ["echo hi"], {"max_calls": 3})
    files.state.unlink()
    before = files.snapshot()
    done = files.cli("status", "--state", str(files.state), "--log", str(files.log))
    assert (done.returncode, done.stdout) == (125, b""), done.stdout
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith(f"trial-tool: no such state file: {files.state}"), line
    assert files.snapshot() == before
