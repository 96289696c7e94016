"""A home of the trial's own (`--home trial`, the default): tools that write under $HOME work,
the host's home never changes, and the layer is the trial's alone. Each test's home is its own directory,
given as the caller's $HOME: the machine's home is never the one written.

Both kinds of layer are tested: "directory" with a bwrap without overlays (Debian 12's 0.8), "overlay"
with one that has them, found in $TRIALTOOL_TEST_OVERLAY_BWRAP (a directory holding bwrap) or where
scripts/build-bwrap puts it (.ci/cache/bwrap/bin)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from trialtool import sandbox

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def _has_overlays(directory: str) -> bool:
    binary = os.path.join(directory, "bwrap")
    if not os.access(binary, os.X_OK):
        return False
    said = subprocess.run([binary, "--help"], capture_output=True, timeout=30, check=False).stdout
    return b"--overlay-src" in said


def _bwrap_directories() -> dict[str, str | None]:
    """Where the bwrap for each kind of layer is (prepended to PATH), or None where there is none."""
    system = shutil.which("bwrap")
    found: dict[str, str | None] = {"directory": None, "overlay": None}
    if system is not None:
        found["overlay" if _has_overlays(os.path.dirname(system)) else "directory"] = ""
    for candidate in (os.environ.get("TRIALTOOL_TEST_OVERLAY_BWRAP"), str(REPO / ".ci" / "cache" / "bwrap" / "bin")):
        if found["overlay"] is None and candidate and _has_overlays(candidate):
            found["overlay"] = candidate
    return found


BWRAPS = _bwrap_directories()

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {sandbox.unavailable()}"
)


class Homed:
    """A bwrap trial (its files in `trial/`, its workspace `ws/`) called with $HOME set to `home/`."""

    def __init__(self, root: Path, name: str = "trial", home: str | None = "trial", bwrap: str = "") -> None:
        self.root = root
        self.bwrap = bwrap
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
        if self.bwrap:
            env["PATH"] = f"{self.bwrap}:{env['PATH']}"
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.workspace, env=env)

    def snapshot(self) -> dict[str, Any]:
        """Every path under the host's home, with its bytes (files) or its kind."""
        found: dict[str, Any] = {}
        for path in sorted(self.home.rglob("*")):
            found[str(path)] = path.read_bytes() if path.is_file() and not path.is_symlink() else path.is_dir()
        return found


@pytest.fixture(params=["directory", "overlay"])
def kind(request: pytest.FixtureRequest) -> str:
    if BWRAPS[request.param] is None:
        why = {
            "directory": "the bwrap on PATH has overlays (the directory layer is for one without)",
            "overlay": "no bwrap with overlays here (0.9 or later; scripts/build-bwrap builds one)",
        }
        pytest.skip(why[request.param])
    return str(request.param)


@pytest.fixture
def homed(tmp_path: Path, kind: str) -> Homed:
    made = Homed(tmp_path, home=None, bwrap=BWRAPS[kind] or "")
    (made.home / ".profile").write_text(
        # A profile that writes under $HOME, as pyenv's `rehash` does: it warns where it cannot.
        'mkdir -p "$HOME/.pyenv/shims" 2>/dev/null && touch "$HOME/.pyenv/shims/.rehash" 2>/dev/null '
        '|| echo "pyenv: cannot rehash: $HOME/.pyenv/shims is not writable" >&2\n'
    )
    (made.home / ".pyenv" / "shims").mkdir(parents=True)
    (made.home / ".cache").mkdir()
    return made


def test_tools_that_write_under_home_work_and_the_hosts_home_never_changes(homed: Homed, kind: str) -> None:
    # The default under a sandbox: a home of the trial's own, of the kind its bwrap allows.
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
    state = json.loads((homed.root / "trial" / "s.json").read_text())
    assert state["sandbox"]["home"] == "trial"
    (layer,) = (homed.root / "trial").glob(".s.json.sandbox-home-*")
    assert sorted(path.name for path in layer.iterdir()) == (["upper", "work"] if kind == "overlay" else ["home"])
    assert stat.S_IMODE(layer.stat().st_mode) == 0o700


def test_the_command_gets_no_descriptor_of_the_layer(homed: Homed) -> None:
    done = homed.sh("ls /proc/self/fd")
    assert done.returncode == 0, done.stderr
    # Its own three, and the one ls reads the directory through.
    assert done.stdout.split() == ["0", "1", "2", "3"]


def test_a_login_shell_whose_profile_writes_under_home_says_nothing(homed: Homed) -> None:
    done = homed.sh("bash --login -c 'echo hi'")
    assert done.returncode == 0 and done.stdout == "hi\n" and done.stderr == "", done.stderr
    ran = homed.sh("test -f ~/.pyenv/shims/.rehash")  # the profile ran, and wrote where it meant to
    assert ran.returncode == 0, ran.stderr
    assert not (homed.home / ".pyenv" / "shims" / ".rehash").exists()


def test_a_directory_layer_copies_only_small_files_anyone_may_read(tmp_path: Path) -> None:
    if BWRAPS["directory"] is None:
        pytest.skip("the bwrap on PATH has overlays (the directory layer is for one without)")
    homed = Homed(tmp_path)
    (homed.home / ".gitconfig").write_text("[user]\n\tname = Host\n")
    (homed.home / ".gitconfig").chmod(0o644)
    (homed.home / "token").write_text("s3cret-token")
    (homed.home / "token").chmod(0o600)
    (homed.home / "big").write_bytes(b"x" * (1 << 20))
    (homed.home / "big").chmod(0o644)
    done = homed.sh("cat ~/token && wc -c < ~/big && git config --global user.name")
    assert done.stdout == "s3cret-token" + "1048576\nHost\n", done.stderr
    (layer,) = (homed.root / "trial").glob(".s.json.sandbox-home-*/home")
    assert (layer / ".gitconfig").is_file() and not (layer / ".gitconfig").is_symlink()
    # The private file and the large one are links to the sandbox's read-only view: nothing of theirs is copied.
    assert os.readlink(layer / "token") == "/run/trialtool/host-home/token"
    assert os.readlink(layer / "big") == "/run/trialtool/host-home/big"
    total = sum(path.lstat().st_blocks * 512 for path in layer.rglob("*"))
    assert total < 1 << 20


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


def test_the_layer_is_the_trials_alone_and_keeps_its_files_out(tmp_path: Path, kind: str) -> None:
    """Two trials over one home: neither sees what the other wrote. A key file below the home (the
    trial's own, hidden) is neither copied into the layer nor readable through it."""
    (tmp_path / "home" / "keys").mkdir(parents=True)
    key = tmp_path / "home" / "keys" / "ledger.key"
    one = Homed(tmp_path, "one", bwrap=BWRAPS[kind] or "")
    key.write_text("k3y-0f-the-ledger-" + "x" * 20)
    key.chmod(0o644)
    two = Homed(tmp_path, "two", bwrap=BWRAPS[kind] or "")
    assert one.sh("echo one > ~/mine", "--key-file", str(key)).returncode == 0
    seen = two.sh("cat ~/mine", "--key-file", str(key))
    assert seen.returncode != 0 and "No such file" in seen.stderr
    attempts = f"cat {key} /run/trialtool/host-home/keys/ledger.key; ls -a ~/keys /run/trialtool/host-home/keys"
    read = one.sh(attempts, "--key-file", str(key))
    assert "k3y" not in read.stdout and "k3y" not in read.stderr and "ledger.key" not in read.stdout
    layers = sorted(tmp_path.glob("one/.s.json.sandbox-home-*"))
    assert layers and not any("ledger.key" in str(path) for layer in layers for path in layer.rglob("*"))


def test_a_state_directly_in_the_home_gives_an_empty_layer(tmp_path: Path) -> None:
    """The home holds the trial's files, so the sandbox hides it whole: the layer starts empty, writable."""
    homed = Homed(tmp_path, home=None)
    homed.files = ["--state", str(homed.home / "s.json"), "--log", str(homed.home / "l.jsonl")]
    (homed.home / "notes").write_text("the host's\n")
    done = homed.sh("ls -A ~; echo mine > ~/mine && cat ~/mine")
    assert done.returncode == 0 and done.stdout == "mine\n", done.stderr
    again = homed.sh("cat ~/mine")
    assert again.stdout == "mine\n", again.stderr
    assert not (homed.home / "mine").exists()


def test_a_workspace_inside_the_home_is_the_hosts_and_the_rest_the_layers(tmp_path: Path, kind: str) -> None:
    """The usual layout, a repository under $HOME: the workspace is bound over the layer, writable and
    the host's; the rest of the home is the layer's."""
    homed = Homed(tmp_path, home=None, bwrap=BWRAPS[kind] or "")
    homed.workspace = homed.home / "src" / "repo"
    homed.workspace.mkdir(parents=True)
    homed.pinned = ["--sandbox", "bwrap", "--workspace", str(homed.workspace)]
    (homed.home / "src" / "other").write_text("beside\n")
    done = homed.sh("echo made > made && echo cached > ~/.cached && cat ~/src/other && echo x > ~/src/new")
    assert done.returncode == 0 and done.stdout == "beside\n", done.stderr
    assert (homed.workspace / "made").read_text() == "made\n"
    assert not (homed.home / ".cached").exists() and not (homed.home / "src" / "new").exists()
    again = homed.sh("cat made ~/.cached ~/src/new")
    assert again.stdout == "made\ncached\nx\n", again.stderr
