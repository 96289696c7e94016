"""The docker backend, for real: a real engine, an image built here offline, real execs, real deadlines.

Each trial's container is made on its first call and kept; these tests look into
it with the engine's own `exec` to see what runs there after a call. The image is
`docker import` of a root holding busybox-static, made by the test; every
container and image the tests made is removed at the end (by label and name).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TrialFiles
from tests.dockerengine import Engine, build
from trialtool.errors import EXIT_INTERNAL, EXIT_REFUSED, EXIT_TIMEOUT


@pytest.fixture
def boxed(tmp_path: Path, engine: Engine, cli_mode: str) -> TrialFiles:
    """A trial of the docker backend: its files in tmp_path, its workspace tmp_path/ws (bound in)."""
    trial = TrialFiles(tmp_path)
    (tmp_path / "ws").mkdir()
    return trial


def flags(engine: Engine, trial: TrialFiles, *more: str) -> tuple[str, ...]:
    workspace = str(trial.root / "ws")
    return ("--sandbox", engine.mode, "--image", engine.tag, "--workspace", workspace, *more)


def run(
    trial: TrialFiles, engine: Engine, *command: str, more: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    return trial.call(*command, flags=flags(engine, trial, *more), cwd=trial.root / "ws", timeout=120)


def test_a_call_runs_in_the_trials_container_and_its_record_says_which(boxed: TrialFiles, engine: Engine) -> None:
    done = run(boxed, engine, "sh", "-c", "cat /etc/image; pwd; echo out; echo err >&2; exit 3")
    assert done.returncode == 3, done.stderr
    assert done.stdout.decode().splitlines() == [engine.tag, str(boxed.root / "ws"), "out"]
    assert done.stderr.decode() == "err\n"
    again = run(boxed, engine, "sh", "-c", "echo again > made-here; cat made-here")
    assert again.stdout == b"again\n"
    assert (boxed.root / "ws" / "made-here").read_text() == "again\n"  # the workspace is bound in
    first, second = boxed.records()
    for record in (first, second):
        assert record["container"]["image"] == engine.tag
        assert record["container"]["image_id"] == engine.image_id
        assert record["container"]["name"] == engine.name_of(boxed)
    assert first["container"]["made"] == "the trial's first call"
    assert second["container"]["made"] is None and second["container"]["id"] == first["container"]["id"]
    pinned = boxed.state_json()["sandbox"]
    assert (pinned["mode"], pinned["image"], pinned["image_id"], pinned["network"]) == (
        engine.mode,
        engine.tag,
        engine.image_id,
        "none",
    )


def test_exact_budgets_and_refusals(boxed: TrialFiles, engine: Engine) -> None:
    more = ("--max-calls", "2", "--max-tokens", "1000", "--max-call-tokens", "5")
    outputs = [run(boxed, engine, "sh", "-c", "echo call >> calls; seq 1 200", more=more) for _ in range(3)]
    assert [done.returncode for done in outputs] == [0, 0, EXIT_REFUSED]
    assert (boxed.root / "ws" / "calls").read_text() == "call\ncall\n"  # the refused call never ran
    records = boxed.records()
    assert [record["delivered_emitted_tokens"] for record in records[:2]] == [5, 5]
    assert records[-1]["status"] == "maximum_tool_calls"
    assert boxed.state_json()["calls"] == 2


def test_a_deadline_leaves_nothing_running_in_the_container(boxed: TrialFiles, engine: Engine) -> None:
    script = "trap '' TERM; (setsid sleep 300 &); sleep 200 & echo started; sleep 100"
    done = run(boxed, engine, "sh", "-c", script, more=("--call-timeout", "2", "--kill-grace", "0.5"))
    assert done.returncode == EXIT_TIMEOUT, done.stderr
    assert done.stdout == b"started\n"
    (record,) = boxed.records()
    assert record["status"] == "timeout" and record["stop_signal"] == 9  # TERM was ignored: KILL after the grace
    assert record["elapsed_seconds"] < 30
    left = engine.processes(engine.name_of(boxed))
    assert len(left) == 2 and f"{engine.mode}-init" in left[0], left  # the container's own init and its waiting shell


def test_a_command_that_ends_leaves_nothing_behind(boxed: TrialFiles, engine: Engine) -> None:
    done = run(boxed, engine, "sh", "-c", "(setsid sleep 300 &); sleep 200 & echo quick")
    assert done.returncode == 0 and done.stdout == b"quick\n" and done.stderr == b""
    assert len(engine.processes(engine.name_of(boxed))) == 2


def test_a_fork_loop_held_by_the_process_cap_is_swept_and_the_sweep_says_nothing(
    boxed: TrialFiles, engine: Engine
) -> None:
    """Processes appear and vanish while the sweep reads /proc: none of its own words reach the agent."""
    loop = "trap '' TERM; while :; do (sleep 100 &) 2>/dev/null; sh -c 'while :; do sleep 1 & done' 2>/dev/null & done"
    done = run(
        boxed, engine, "sh", "-c", loop, more=("--max-procs", "40", "--call-timeout", "3", "--kill-grace", "0.3")
    )
    assert b"/proc/" not in done.stderr, done.stderr
    assert len(engine.processes(engine.name_of(boxed))) == 2


def test_calls_at_once_run_one_at_a_time_in_the_container(boxed: TrialFiles, engine: Engine) -> None:
    """What runs in the container besides its own is one call's: parallel calls of the trial wait their turn."""
    assert run(boxed, engine, "true").returncode == 0  # the container made first
    argv = [
        *boxed.argv(*flags(engine, boxed), "--cwd", str(boxed.root / "ws")),
        "--",
        "sh",
        "-c",
        "echo in >> turns; sleep 0.5; echo out >> turns",
    ]
    results = boxed.parallel(argv, 3, timeout=120)
    assert [code for code, _ in results] == [0, 0, 0]
    assert (boxed.root / "ws" / "turns").read_text() == "in\nout\n" * 3


def test_the_output_cap_stops_the_command_in_the_container(boxed: TrialFiles, engine: Engine) -> None:
    done = run(boxed, engine, "yes", more=("--max-capture-bytes", "10000"))
    assert done.returncode != 0
    (record,) = boxed.records()
    assert record["status"] == "output_limit" and record["stdout_capture_truncated"]
    assert len(engine.processes(engine.name_of(boxed))) == 2


def test_a_container_gone_between_calls_is_made_again_and_the_record_says_so(boxed: TrialFiles, engine: Engine) -> None:
    assert run(boxed, engine, "true").returncode == 0
    name = engine.name_of(boxed)
    subprocess.run([engine.docker, "kill", name], capture_output=True, check=True, timeout=60)
    assert run(boxed, engine, "echo", "back").stdout == b"back\n"
    subprocess.run([engine.docker, "rm", "--force", name], capture_output=True, check=True, timeout=60)
    assert run(boxed, engine, "echo", "again").stdout == b"again\n"
    made = [record["container"]["made"] for record in boxed.records()]
    assert made == ["the trial's first call", "the trial's container had stopped", "the trial's container was gone"]


def test_the_trials_files_are_not_in_the_container(boxed: TrialFiles, engine: Engine) -> None:
    done = run(boxed, engine, "sh", "-c", f"ls {boxed.root}; cat {boxed.state}")
    assert done.returncode != 0
    assert b"state.json" not in done.stdout
    assert b"trial_id" not in done.stdout


def test_a_state_inside_the_workspace_is_refused_before_anything_is_charged(tmp_path: Path, engine: Engine) -> None:
    inside = TrialFiles(tmp_path)
    done = inside.call("true", flags=("--sandbox", engine.mode, "--image", engine.tag), cwd=tmp_path, timeout=120)
    assert done.returncode == EXIT_INTERNAL, done.stderr
    assert b"keep the state, log and key files outside the workspace" in done.stderr
    assert not inside.state.exists()  # nothing made, nothing charged


def test_the_image_is_pinned_by_its_id(boxed: TrialFiles, engine: Engine, tmp_path: Path) -> None:
    """Retagging the image after the trial was made changes nothing for the trial: its id was pinned."""
    assert run(boxed, engine, "cat", "/etc/image").stdout.decode() == engine.tag + "\n"
    other = f"{engine.tag.split(':')[0]}-other:busybox"
    try:
        build(engine.docker, tmp_path / "other", other, extra="another image")
        subprocess.run([engine.docker, "tag", other, engine.tag], capture_output=True, check=True, timeout=60)
        name = engine.name_of(boxed)
        subprocess.run([engine.docker, "rm", "--force", name], capture_output=True, check=True, timeout=60)
        done = run(boxed, engine, "cat", "/etc/image")
        assert done.stdout.decode() == engine.tag + "\n", done.stderr  # the pinned image, not what the tag names now
    finally:
        subprocess.run([engine.docker, "tag", engine.image_id, engine.tag], capture_output=True, timeout=60)
        subprocess.run([engine.docker, "image", "rm", other], capture_output=True, timeout=60)


def test_a_runtime_failure_is_trial_tools_and_costs_nothing(boxed: TrialFiles, engine: Engine) -> None:
    missing = run(boxed, engine, "true", more=("--image", "trialtool-no-such-image:none"))
    assert missing.returncode == EXIT_INTERNAL
    assert b"no image" in missing.stderr
    assert not boxed.state.exists()  # the trial was never made


def test_close_and_gc(tmp_path: Path, engine: Engine) -> None:
    trials = []
    for name in ("kept", "closed", "orphaned", "spent"):
        (tmp_path / name / "ws").mkdir(parents=True)
        trials.append(TrialFiles(tmp_path / name))
    for trial in trials:
        more = ("--max-calls", "1") if trial.root.name == "spent" else ()
        assert run(trial, engine, "true", more=more).returncode == 0
    kept, closed, orphaned, _ = trials
    names = {trial.root.name: engine.name_of(trial) for trial in trials}
    done = closed.cli("close", "--state", str(closed.state), "--log", str(closed.log), timeout=120)
    assert done.returncode == 0 and b"removed the container" in done.stdout
    assert engine.state_of(names["closed"]) is None
    orphaned.state.unlink()
    done = kept.cli("gc", timeout=120)
    assert done.returncode == 0, done.stderr
    assert engine.state_of(names["orphaned"]) is None and engine.state_of(names["spent"]) is None
    assert engine.state_of(names["kept"]) == "running"
    assert b"state file is gone" in done.stdout and b"budget is spent" in done.stdout
    assert run(closed, engine, "echo", "later").stdout == b"later\n"  # closed, not ended: a new container
    assert closed.records()[-1]["container"]["made"] == "the trial's container was gone"


def test_report_is_clean_and_tells_images_apart(tmp_path: Path, engine: Engine) -> None:
    for name in ("a", "b"):
        (tmp_path / name / "ws").mkdir(parents=True)
        trial = TrialFiles(tmp_path / name)
        assert run(trial, engine, "echo", name).returncode == 0
    done = TrialFiles(tmp_path).cli("report", "--format", "json", "--strict", str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    overview = json.loads(done.stdout)["overview"]
    assert overview["trials"] == 2 and overview["integrity"] == {"clean": 2}, overview
    assert overview["fairness"]["same_rules"]
    assert overview["fairness"]["majority"]["sandbox"]["image_id"] == engine.image_id
    # A trial run on another image breaks the fairness check, by the image's id.
    other = f"{engine.tag.split(':')[0]}-report:busybox"
    try:
        other_id = build(engine.docker, tmp_path / "image", other, extra="another image")
        (tmp_path / "c" / "ws").mkdir(parents=True)
        odd = TrialFiles(tmp_path / "c")
        done = odd.call("true", flags=("--sandbox", engine.mode, "--image", other, "--workspace", str(odd.root / "ws")))
        assert done.returncode == 0, done.stderr
        subprocess.run([engine.docker, "rm", "--force", engine.name_of(odd)], capture_output=True, timeout=60)
    finally:
        subprocess.run([engine.docker, "image", "rm", "--force", other], capture_output=True, timeout=60)
    done = TrialFiles(tmp_path).cli("report", "--format", "json", str(tmp_path / "a"), str(odd.root), timeout=120)
    (differs,) = [group["differs"] for group in json.loads(done.stdout)["overview"]["fairness"]["others"]]
    assert differs["sandbox.image_id"] == [engine.image_id, other_id]
