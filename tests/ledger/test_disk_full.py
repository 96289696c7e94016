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
from trialtool.ledger.verify import verify

PAGE = 4096


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 256 KiB tmpfs of its own, so that filling it endangers nothing else."""
    mount_point = Path(tempfile.mkdtemp(prefix="trialtool-full-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=700", "tmpfs", str(mount_point)], capture_output=True
    )
    if done.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
        mount_point.rmdir()


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
    with Trial(files.state, files.log, limits={"max_calls": 1000, "max_call_tokens": 3000}) as api:
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
    assert files.call("echo", "first").returncode == 0
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
