"""The per-user server killed at random points of calls: what each CLI wrote and the records always agree.

A call either ran and is recorded (delivered as delivered to its CLI: nothing, if its CLI
got nothing), or it did not run and is not charged; and what the CLI says is what the
records say. Each call's command appends its number to a marker file, so what ran is known
apart from the log.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.conftest import TrialFiles
from tests.doors.test_userserver import server_pids
from trialtool.ledger._verify import verify

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-user server is Linux only")

CALLS = 200
AT_ONCE = 4


def kill_servers(directory: Path) -> None:
    for pid in server_pids(directory):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(600)
def test_killing_the_server_at_random_points_never_makes_words_and_records_disagree(
    tmp_path: Path, servers: Path
) -> None:
    trial = TrialFiles(tmp_path)
    markers = tmp_path / "ran"
    flags = ("--max-calls", str(CALLS + 10), "--max-call-tokens", "50", "--sandbox", "none")
    assert trial.call("true", flags=flags).returncode == 0  # starts the first server
    chance = random.Random(36)
    said: dict[int, tuple[int, bytes, bytes]] = {}
    for batch in range(0, CALLS, AT_ONCE):
        clis = {}
        for number in range(batch, batch + AT_ONCE):
            # Output past the call's allowance on some calls: clipped, and still delivered as recorded.
            text = f"out-{number}" + (" word" * 80 if number % 3 == 0 else "")
            script = f"echo {number} >> {markers}; echo {text}"
            argv = trial.argv(*flags, "--", "sh", "-c", script)
            clis[number] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            if chance.random() < 0.6:
                # Anywhere in a call: before its reservation, while it runs, between commit and delivery.
                time.sleep(chance.uniform(0, 0.06))  # a random kill point, not a wait for anything
                kill_servers(servers)
            for number, cli in clis.items():
                out, err = cli.communicate(timeout=120)
                said[number] = (cli.returncode, out, err)
        finally:
            for cli in clis.values():
                cli.kill()
                cli.wait()
    ran = Counter(int(line) for line in markers.read_text().split())
    records: dict[int, list[dict[str, object]]] = {}
    for record in trial.records():
        command = record.get("command")
        if isinstance(command, list) and command[:2] == ["sh", "-c"]:
            records.setdefault(int(str(command[2]).split()[1]), []).append(record)
    outcomes = Counter()
    for number, (code, out, err) in said.items():
        mine = records.get(number, [])
        assert ran[number] <= 1, number
        if code == 0:
            [record] = mine
            assert record["status"] in ("ok", "truncated") and not record.get("withheld"), record
            assert record["delivered_stdout_bytes"] == len(out) and out.startswith(f"out-{number}".encode())
            assert ran[number] == 1
            outcomes["delivered"] += 1
        elif b"before it was charged" in err:
            assert code == 125 and out == b"" and mine == [] and ran[number] == 0, (number, err, mine)
            outcomes["not charged"] += 1
        elif b"recorded abandoned" in err:
            [record] = mine
            assert code == 125 and out == b"" and record["status"] == "abandoned", (number, err, mine)
            outcomes["abandoned"] += 1
        else:
            pytest.fail(f"call {number}: exit {code}, stdout {out!r}, stderr {err!r}, records {mine}")
        assert err.count(b"\n") <= 1, err
    # Nothing ran that the records do not account for.
    assert all(number in records for number in ran), sorted(set(ran) - set(records))
    assert verify(trial.state, trial.log).ok
    assert trial.state_json()["in_flight"] == {}
    assert outcomes["delivered"] > 0 and outcomes["abandoned"] + outcomes["not charged"] > 0, outcomes
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(markers) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
