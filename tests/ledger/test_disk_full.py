"""A full disk at every write of a call, on a real 256 KiB tmpfs: tokens are charged only for text delivered.

Each case fills the file system to leave a little room (0 to 5 pages), then makes
a call whose record is larger or smaller than that room, so that the spool, the
reservation's state, the record or the commit's state is the write that fails.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TrialFiles, strict_records
from trialtool import Trial, TrialToolError
from trialtool.ledger._verify import verify

PAGE = 4096


@contextlib.contextmanager
def _tmpfs(size: str, prefix: str) -> Iterator[Path]:
    """A tmpfs of `size` of its own, so that filling it endangers nothing else; skipped where none can be mounted."""
    mount_point = Path(tempfile.mkdtemp(prefix=prefix))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", "tmpfs", str(mount_point)], capture_output=True
    )
    if done.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 256 KiB tmpfs."""
    with _tmpfs("256k", "trialtool-full-") as mount_point:
        yield mount_point


def fill(mount_point: Path, leave: int) -> Path:
    """A file taking all but `leave` bytes of the file system."""
    filler = mount_point / "filler"
    info = os.statvfs(mount_point)
    size = max(0, info.f_bavail * info.f_frsize - leave)
    with filler.open("wb") as handle, contextlib.suppress(OSError):
        handle.write(b"\0" * size)
    return filler


@pytest.mark.timeout(300)
def test_a_full_disk_at_each_write_charges_only_what_was_delivered(small_disk: Path) -> None:
    files = TrialFiles(small_disk)
    delivered: list[tuple[str, int]] = []
    failures: list[TrialToolError] = []
    # A capture cap this disk can hold: each call reserves room for its capture and record (_ledger.py).
    # The host's home, not a layer of the trial's beside the state: this disk is the ledger's to fill.
    limits = {"max_calls": 1000, "max_call_tokens": 3000, "max_capture_bytes": 8192, "home": "host"}
    with Trial(files.state, files.log, limits=limits) as api:
        api.run(["echo", "warm"])  # the trial exists and the encoder is built
        delivered.append(("warm\n", 2))
        for leave in range(0, 6 * PAGE, PAGE):
            for size in (0, 2000, 7000):
                filler = fill(small_disk, leave)
                try:
                    result = api.run(["head", "-c", str(size), "/etc/services"])
                except TrialToolError as exc:
                    failures.append(exc)
                else:
                    delivered.append((result.stdout, result.delivered_tokens))
                finally:
                    filler.unlink()
                # Room again: the next call mends whatever the failure left.
                result = api.run(["echo", "after"])
                delivered.append((result.stdout, result.delivered_tokens))
    assert failures, "the disk never ran full: the test tested nothing"
    assert all("\n" not in exc.message and exc.exit_code == 125 for exc in failures)
    report = verify(files.state, files.log)
    assert report.ok, report.problems
    records = strict_records(files.log)
    calls = [row for row in records if row.get("charged")]
    # Every delivered text has its record; no record charges tokens for text that was not delivered.
    assert sum(row["delivered_emitted_tokens"] for row in calls) == sum(tokens for _, tokens in delivered)
    assert sorted(row["delivered_stdout_tokens"] for row in calls if row["delivered_emitted_tokens"]) == sorted(
        tokens for _, tokens in delivered if tokens
    )
    assert all(
        row["delivered_emitted_tokens"] == 0 for row in calls if row["status"] in ("abandoned", "trial_tool_error")
    )
    assert files.state_json()["in_flight"] == {}


@pytest.mark.timeout(120)
def test_the_cli_on_a_full_disk_says_one_line_and_changes_nothing(small_disk: Path) -> None:
    files = TrialFiles(small_disk)
    assert files.call("echo", "first", flags=("--max-capture-bytes", "8192", "--home", "host")).returncode == 0
    before = files.snapshot()
    filler = fill(small_disk, 0)
    try:
        done = files.call("echo", "second")
    finally:
        filler.unlink()
    assert done.returncode == 125 and done.stderr.startswith(b"trial-tool: ") and done.stderr.count(b"\n") == 1
    assert done.stdout == b""
    after = files.snapshot()
    after.pop("filler", None)
    assert after == before  # nothing was charged: the reservation's own write is what failed


@pytest.fixture
def one_mib_disk() -> Iterator[Path]:
    """A 1 MiB tmpfs, for a trial and its workspace together."""
    with _tmpfs("1m", "trialtool-fill-") as mount_point:
        yield mount_point


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_command_that_fills_the_disk_still_gets_its_call_recorded(one_mib_disk: Path, sandbox: str) -> None:
    from trialtool import sandbox as seam

    if sandbox == "bwrap" and seam.unavailable() is not None:
        pytest.skip(f"the bwrap sandbox cannot run here: {seam.unavailable()}")
    workspace = one_mib_disk / "ws"
    workspace.mkdir()
    files = TrialFiles(one_mib_disk)
    limits = {"sandbox": sandbox, "workspace": str(workspace), "max_capture_bytes": 16384}
    # The workspace and (sandboxed) the trial's own /tmp share the disk with the state and log;
    # unsandboxed, /tmp is the machine's, which no test fills.
    tmp_fill = "cat /dev/zero > /tmp/fill; " if sandbox == "bwrap" else ""
    fill = f"cat /dev/zero > ws-fill; {tmp_fill}cat /dev/zero > ws-fill-2; echo filled"
    with Trial(files.state, files.log, limits=limits) as api:
        result = api.run(["sh", "-c", fill], cwd=workspace)
        assert result.status == "ok" and result.stdout.endswith("filled\n"), result
        assert "No space left on device" in result.stderr  # the disk really was full
        records = strict_records(files.log)
        assert [record["status"] for record in records] == ["ok"]
        assert records[0]["stdout_b64"]
        # Room again: the next call mends the state, and the trial is whole.
        for name in ("ws-fill", "ws-fill-2"):
            (workspace / name).unlink()
        for leftover in one_mib_disk.glob(".state.json.sandbox-tmp-*/fill"):
            leftover.unlink()
        assert api.run(["true"], cwd=workspace).status == "ok"
    assert verify(str(files.state), str(files.log)).ok


def test_the_room_reserved_for_a_record_is_given_back_when_no_call_needs_it(tmp_path: Path) -> None:
    """Each call reserves room for its record (a few MB at the default capture cap); once no call is in
    flight the log holds only its own bytes: ten thousand trials must not keep ten thousand reservations."""
    files = TrialFiles(tmp_path)
    with Trial(files.state, files.log, limits={"sandbox": "none"}) as api:
        for _ in range(3):
            assert api.run(["echo", "hi"]).status == "ok"
            allocated = os.stat(files.log).st_blocks * 512
            assert allocated < os.path.getsize(files.log) + 64 * 1024, allocated


@pytest.mark.timeout(120)
def test_a_small_disk_says_in_one_line_what_a_call_needs_and_charges_nothing(cli_mode: str) -> None:
    with _tmpfs("4m", "trialtool-small-") as disk:
        files = TrialFiles(disk)
        assert files.cli("init", "--state", str(files.state), "--log", str(files.log)).returncode == 0
        before = files.snapshot()
        # The default capture cap (1 MiB a stream) needs about 4.8 MB: two spools and the record's room.
        done = files.call("echo", "hello")
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 125, done.stderr
        assert len(lines) == 1, lines
        assert "needs" in lines[0] and "bytes free in" in lines[0] and "--max-capture-bytes" in lines[0], lines[0]
        assert "nothing is charged" in lines[0]
        assert files.snapshot() == before
        # The small-disk setting: a smaller cap needs a fraction of the room.
        small = TrialFiles(disk / "small")
        small.root.mkdir()
        done = small.call("echo", "hello", flags=("--max-capture-bytes", "262144"))
        assert (done.returncode, done.stdout) == (0, b"hello\n"), done.stderr


@pytest.mark.timeout(120)
def test_a_merged_call_reserves_room_for_one_stream_only(cli_mode: str) -> None:
    with _tmpfs("4m", "trialtool-merged-") as disk:
        files = TrialFiles(disk)
        # 1 MiB a stream: two streams need about 4.8 MB, one about 2.4 MB, which this disk has.
        done = files.call("sh", "-c", "echo out; echo err >&2", flags=("--merge-output",))
        assert (done.returncode, done.stdout) == (0, b"out\nerr\n"), done.stderr
        assert files.records()[-1]["status"] == "ok"
