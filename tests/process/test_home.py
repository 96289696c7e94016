"""A home of the trial's own (`--home trial`): tools that write under $HOME work,
the host's home never changes, and the layer is the trial's alone. Each test's home is its own directory,
given as the caller's $HOME: the machine's home is never the one written."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from trialtool.process import sandbox

PY = sys.executable

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {sandbox.unavailable()}"
)


class Homed:
    """A bwrap trial (its files in `trial/`, its workspace `ws/`) called with $HOME set to `home/`."""

    def __init__(self, root: Path, name: str = "trial", home: str | None = "trial") -> None:
        self.root = root
        self.home = root / "home"
        self.workspace = root / "ws"
        for directory in (self.home, self.workspace, root / name):
            directory.mkdir(parents=True, exist_ok=True)
        self.files = ["--state", str(root / name / "s.json"), "--log", str(root / name / "l.jsonl")]
        self.pinned = ["--sandbox", "bwrap", "--workspace", str(self.workspace)]
        if home is not None:
            self.pinned += ["--home", home]

    def sh(self, script: str, *flags: str) -> subprocess.CompletedProcess[str]:
        argv = [PY, "-m", "trialtool", *self.files, *self.pinned, *flags, "--", "sh", "-c", script]
        env = {**os.environ, "HOME": str(self.home)}
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.workspace, env=env)

    def snapshot(self) -> dict[str, Any]:
        """Every path under the host's home, with its bytes (files) or its kind."""
        found: dict[str, Any] = {}
        for path in sorted(self.home.rglob("*")):
            found[str(path)] = path.read_bytes() if path.is_file() and not path.is_symlink() else path.is_dir()
        return found


@pytest.fixture
def homed(tmp_path: Path) -> Homed:
    made = Homed(tmp_path)
    (made.home / ".profile").write_text(
        # A profile that writes under $HOME, as pyenv's `rehash` does: it warns where it cannot.
        'mkdir -p "$HOME/.pyenv/shims" 2>/dev/null && touch "$HOME/.pyenv/shims/.rehash" 2>/dev/null '
        '|| echo "pyenv: cannot rehash: $HOME/.pyenv/shims is not writable" >&2\n'
    )
    (made.home / ".pyenv" / "shims").mkdir(parents=True)
    (made.home / ".cache").mkdir()
    return made


def test_tools_that_write_under_home_work_and_the_hosts_home_never_changes(homed: Homed) -> None:
    before = homed.snapshot()
    done = homed.sh(
        "mkdir -p ~/.cache/tool && echo cached > ~/.cache/tool/entry && "
        "git config --global user.name 'The Agent' && git config --global user.name && "
        "echo appended >> ~/.profile && touch ~/.pyenv/shims/python"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The Agent\n"
    assert homed.snapshot() == before  # the host's home: untouched
    # The layer is kept across the trial's calls, like its /tmp.
    again = homed.sh("cat ~/.cache/tool/entry && git config --global user.name && tail -1 ~/.profile")
    assert again.returncode == 0 and again.stdout == "cached\nThe Agent\nappended\n", again.stderr


def test_a_login_shell_whose_profile_writes_under_home_says_nothing(homed: Homed) -> None:
    done = homed.sh("bash --login -c 'echo hi'")
    assert done.returncode == 0 and done.stdout == "hi\n" and done.stderr == "", done.stderr
    ran = homed.sh("test -f ~/.pyenv/shims/.rehash")  # the profile ran, and wrote where it meant to
    assert ran.returncode == 0, ran.stderr
    assert not (homed.home / ".pyenv" / "shims" / ".rehash").exists()


def test_pip_install_user_of_a_local_wheel(homed: Homed) -> None:
    base = Path(sys.base_prefix) / "bin" / "python3"
    if subprocess.run([base, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip(f"{base} has no pip")
    wheel = homed.workspace / "tthello-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("tthello.py", "WORD = 'hello from the wheel'\n")
        archive.writestr("tthello-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tthello\nVersion: 1.0\n")
        archive.writestr(
            "tthello-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr("tthello-1.0.dist-info/RECORD", "")
    before = homed.snapshot()
    install = f"{base} -m pip install --user --no-index --no-deps --break-system-packages --quiet {wheel.name}"
    done = homed.sh(install)
    assert done.returncode == 0, done.stderr
    used = homed.sh(f"{base} -c 'import tthello; print(tthello.WORD)'")
    assert used.returncode == 0 and used.stdout == "hello from the wheel\n", used.stderr
    assert homed.snapshot() == before


def test_home_host_keeps_the_hosts_home_read_only(tmp_path: Path) -> None:
    host = Homed(tmp_path, home="host")
    done = host.sh("mkdir ~/.cache")
    # Read-only (or, the test's home being under the host's /tmp, not even there: the sandbox has its own).
    assert done.returncode != 0 and ("Read-only file system" in done.stderr or "No such file" in done.stderr)
    assert not (host.home / ".cache").exists()
    changed = host.sh("true", "--home", "trial")
    assert changed.returncode == 125 and "--home" in changed.stderr  # pinned


def test_the_layer_is_the_trials_alone_and_keeps_its_files_out(tmp_path: Path) -> None:
    """Two trials over one home: neither sees what the other wrote. A key file in the home (the trial's
    own, hidden) is neither copied into the layer nor readable through it."""
    key = tmp_path / "home" / "ledger.key"
    one = Homed(tmp_path, "one")
    key.write_text("k3y-0f-the-ledger-" + "x" * 20)
    two = Homed(tmp_path, "two")
    assert one.sh("echo one > ~/mine", "--key-file", str(key)).returncode == 0
    seen = two.sh("cat ~/mine", "--key-file", str(key))
    assert seen.returncode != 0 and "No such file" in seen.stderr
    read = one.sh(f"cat {key} || echo unreadable", "--key-file", str(key))
    assert "k3y" not in read.stdout and "k3y" not in read.stderr
    layers = sorted(tmp_path.glob("one/.s.json.sandbox-home-*"))
    assert layers and not any("ledger.key" in str(path) for layer in layers for path in layer.rglob("*"))
