"""A signed trial's key, out of reach of the command in every sandbox: it cannot read it, find it, or
sign for the trial; the trial verifies with its public key after each attempt.

The key sits in the caller's home (`--home trial` gives the command a layer of its own over it), and the
command looks for it by its path, by listing, and through the home; it also writes a statement of its own
where it can. bwrap and gVisor run here when they can; docker and podman over the engine fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import gvisor_unavailable
from tests.dockerengine import Engine
from trialtool import sandbox

PY = sys.executable
ATTEMPTS = (
    "cat {key}; ls -a {keys} ~/.keys; cat ~/.keys/trial.key; "
    # Where the key really is (the test's directory) and what the command's home shows: a walk of the whole
    # root would take minutes on gVisor's ptrace platform, and finds nothing more.
    "find {root} ~ -name trial.key 2>/dev/null; echo forged > l.jsonl.intoto.json; cat {state} {log}; true"
)


class Setup(NamedTuple):
    """A signed trial's key (in the caller's home), its public key, its files' flags, and how to call it."""

    key: Path
    public: Path
    files: list[str]
    argv: list[str]
    env: dict[str, str]
    workspace: Path
    script: str


def _setup(tmp_path: Path) -> Setup:
    home = tmp_path / "home"
    keys = home / ".keys"
    keys.mkdir(parents=True)
    key = keys / "trial.key"
    made = subprocess.run([PY, "-m", "trialtool", "keygen", "-o", str(key)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    public = tmp_path / "trial.pub"
    public.write_text(made.stdout)
    key.chmod(0o644)  # readable by anyone on the host: only the sandbox keeps the command from it
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "trial").mkdir()
    state, log = tmp_path / "trial" / "s.json", tmp_path / "trial" / "l.jsonl"
    files = ["--state", str(state), "--log", str(log)]
    script = ATTEMPTS.format(key=key, keys=keys, state=state, log=log, root=tmp_path)
    argv = [PY, "-m", "trialtool", *files, "--signing-key", str(key)]
    return Setup(key, public, files, argv, {**os.environ, "HOME": str(home)}, workspace, script)


def _attempt(setup: Setup, pinned: list[str]) -> subprocess.CompletedProcess[str]:
    argv = [*setup.argv, *pinned, "--workspace", str(setup.workspace), "--", "sh", "-c", setup.script]
    # Below the test's own timeout, so that a slow call still lets the test's cleanup run.
    return subprocess.run(argv, capture_output=True, text=True, env=setup.env, cwd=setup.workspace, timeout=100)


def _closed(setup: Setup) -> None:
    """The trial's sandbox (gVisor's) or container ended, whatever became of the call."""
    argv = [PY, "-m", "trialtool", "close", *setup.files, "--signing-key", str(setup.key)]
    subprocess.run(argv, capture_output=True, timeout=100)


def _unreached(done: subprocess.CompletedProcess[str], setup: Setup) -> None:
    key, public, files = setup.key, setup.public, setup.files
    assert done.returncode == 0, done.stderr
    secret = key.read_text()
    body = secret.splitlines()[1]  # the base64 line of the PEM
    seen = done.stdout + done.stderr
    assert body not in seen and "PRIVATE KEY" not in seen and "trial.key" not in done.stdout
    assert "trial_id" not in seen  # nor the trial's files
    checked = subprocess.run(
        [PY, "-m", "trialtool", "verify", *files, "--public-key", str(public), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(checked.stdout)
    assert checked.returncode == 0 and report["verdict"] == "clean", report
    assert report["signature"]["status"] == "checkpoint" and report["signature"]["signed_records"] == 2


@pytest.mark.skipif(sandbox.unavailable() is not None, reason=f"bwrap cannot run here: {sandbox.unavailable()}")
@pytest.mark.parametrize("home", ["trial", "host"])
def test_bwrap_keeps_the_signing_key_from_the_command(tmp_path: Path, home: str) -> None:
    setup = _setup(tmp_path)
    _unreached(_attempt(setup, ["--sandbox", "bwrap", "--home", home]), setup)


@pytest.mark.skipif(gvisor_unavailable() is not None, reason=f"gVisor cannot run here: {gvisor_unavailable()}")
def test_gvisor_keeps_the_signing_key_from_the_command(tmp_path: Path) -> None:
    setup = _setup(tmp_path)
    try:
        _unreached(_attempt(setup, ["--sandbox", "gvisor"]), setup)
    finally:
        _closed(setup)


def test_a_container_keeps_the_signing_key_from_the_command(tmp_path: Path, engine: Engine) -> None:
    setup = _setup(tmp_path)
    try:
        _unreached(_attempt(setup, ["--sandbox", engine.mode, "--image", engine.tag]), setup)
    finally:
        _closed(setup)
