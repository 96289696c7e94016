"""No way up: whatever a sandboxed command does, it leaves the host no file that grants more than its caller has.

Each test attacks from inside a real call (real bwrap, a real container) with the
moves that make a privileged file: chmod 4755 and 2755, an owner set to root
first, install -m 4755, a mode given to open, setcap, mknod of a character and a
block device, a setgid directory; in the workspace, the trial's /tmp and its
home. Then, on the host, each program it left is run as the user nobody, which
must stay nobody; `find -perm /6000` finds nothing, and no device node or file
capability is there. A control made setuid by the test itself shows that the
host honours the bit where the test looks (else the test is skipped, saying so).
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import COMMAND_PY
from tests.dockerengine import Engine
from tests.process.test_descriptors import _nobody_python
from trialtool import sandbox

NOBODY = 65534
#: The probe: a program that prints its effective uid (`id -u`), copied into the workspace.
PROBE = shutil.which("id") or "/usr/bin/id"
#: What the command tries; every step may fail, and the last line says it ran to the end.
ATTACK = """
cp ./probe ./u; chmod 4755 ./u
cp ./probe ./g; chmod 2755 ./g
cp ./probe ./o; chown 0:0 ./o; chmod u+s ./o
cp ./probe ./c; setcap cap_setuid+ep ./c
install -m 4755 ./probe ./i
mknod ./null c 1 3; mknod ./disk b 7 0
mkdir -m 2775 ./d; chmod g+s ./d
for where in /tmp "$HOME"; do cp ./probe "$where/u-$$" && chmod 4755 "$where/u-$$"; done
echo attacked
"""
#: Programs the attack made in the workspace, each to be run on the host as nobody.
MADE = ("u", "g", "o", "c", "i")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the caller here is not root: the tests attack a root caller")
needs_bwrap = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"the bwrap sandbox cannot run here: {sandbox.unavailable()}"
)


def euid_as_nobody(path: Path) -> str:
    """The effective uid that the program at `path` has when the user nobody runs it.

    Run through a hard link (the very file, its mode and owner) in a directory of the test's own that
    nobody can search: the directories above `path` need not be.
    """
    reachable = Path(tempfile.mkdtemp(prefix="trialtool-up-run-"))
    try:
        reachable.chmod(0o711)
        # Readable and runnable by all (what a command may well make it): chmod as root keeps any setuid bit.
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | 0o555)
        try:
            os.link(path, reachable / "program")
        except OSError as exc:
            pytest.skip(f"no hard link from {tempfile.gettempdir()} to {path} ({exc.strerror}): nobody cannot run it")
        done = subprocess.run(
            [str(reachable / "program"), "-u"],
            cwd="/",
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(reachable)
    return done.stdout.strip() or done.stderr.strip()


def privileged(*roots: Path) -> list[str]:
    """Every setuid or setgid file, device node and file with capabilities under `roots`."""
    found = []
    for root in roots:
        for directory, names, files in os.walk(root):
            for name in (*names, *files):
                path = os.path.join(directory, name)
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    continue
                if info.st_mode & 0o6000 or stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
                    found.append(f"{path} {stat.filemode(info.st_mode)}")
                try:
                    os.getxattr(path, "security.capability", follow_symlinks=False)
                    found.append(f"{path} has file capabilities")
                except OSError:
                    pass
    return found


def assert_nothing_privileged(root: Path) -> None:
    """The attack's outcome, judged on the host: no program grants nobody more, nothing privileged is left."""
    control = root / "control" / "id"
    control.parent.mkdir(exist_ok=True)
    shutil.copy(PROBE, control)
    control.chmod(0o4755)  # made by the test, as root: the host honours it where the workspace lies
    if euid_as_nobody(control) != "0":
        pytest.skip(f"setuid bits do nothing on the filesystem of {root}: nothing to prove there")
    workspace = root / "ws"
    for name in MADE:
        if (workspace / name).exists():
            assert euid_as_nobody(workspace / name) == str(NOBODY), name
    found = subprocess.run(
        ["find", str(workspace), str(root / "t"), "-perm", "/6000"], capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0 and found.stdout == "", found.stdout + found.stderr
    assert privileged(workspace, root / "t") == []


@pytest.fixture
def laid_out(tmp_path: Path) -> Path:
    """tmp_path/ws, the workspace holding the probe; tmp_path/t, the trial's files."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "t").mkdir()
    shutil.copy(PROBE, tmp_path / "ws" / "probe")
    return tmp_path


def call(
    root: Path, script: str, *flags: str, python: tuple[str, ...] = (sys.executable,)
) -> subprocess.CompletedProcess[str]:
    """`script` run by sh as one call of the trial under `root`, with `flags`, by trial-tool run as `python`."""
    argv = [*python, "-m", "trialtool", "--state", str(root / "t" / "s.json"), "--log", str(root / "t" / "l.jsonl")]
    argv += ["--workspace", str(root / "ws"), *flags, "--", "sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=root / "ws")


@needs_root
@needs_bwrap
@pytest.mark.parametrize("run_as", [None, "root", "user", "4321:4321"])
def test_under_bwrap_a_command_leaves_nothing_privileged(laid_out: Path, run_as: str | None) -> None:
    flags = ("--sandbox", "bwrap", *(("--run-as", run_as) if run_as else ()))
    script = ATTACK + f"{COMMAND_PY} -c \"import os; os.close(os.open('p', os.O_CREAT | os.O_WRONLY, 0o4755))\"\n"
    done = call(laid_out, script + "id -u\n", *flags)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "attacked", done.stderr
    inside = {None: str(NOBODY), "user": str(NOBODY), "root": "0", "4321:4321": "4321"}[run_as]
    assert done.stdout.splitlines()[-1] == inside
    assert (laid_out / "ws" / "u").stat().st_uid == 0  # the caller's own, outside its namespace
    assert_nothing_privileged(laid_out)
    # The same refusals from every moving part: chmod, install and open say "not permitted".
    assert done.stderr.count("Operation not permitted") >= 5, done.stderr
    pinned = {None: "65534:65534", "user": "65534:65534", "root": "0:0", "4321:4321": "4321:4321"}[run_as]
    assert json.loads((laid_out / "t" / "s.json").read_text())["sandbox"]["run_as"] == pinned


@needs_root
@pytest.mark.parametrize("run_as", [None, "root"])
def test_under_docker_a_command_leaves_nothing_privileged(laid_out: Path, engine: Engine, run_as: str | None) -> None:
    flags = ("--sandbox", engine.mode, "--image", engine.tag, *(("--run-as", run_as) if run_as else ()))
    done = call(laid_out, ATTACK + "id -u\n", *flags)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "attacked", done.stderr
    assert done.stdout.splitlines()[-1] == ("0" if run_as else str(NOBODY))
    assert_nothing_privileged(laid_out)


@needs_root
def test_a_root_harness_files_are_handed_to_the_containers_user(laid_out: Path, engine: Engine) -> None:
    workspace = laid_out / "ws"
    (workspace / "sub").mkdir()
    (workspace / "sub" / "given").write_text("by the harness\n")
    (workspace / "outside").symlink_to("/etc/hostname")  # a link is changed itself, never what it names
    before = os.stat("/etc/hostname")
    flags = ("--sandbox", engine.mode, "--image", engine.tag)
    done = call(laid_out, "echo more >> sub/given && rm sub/given && mkdir -p a/b && echo x > a/b/f && id -u", *flags)
    assert done.returncode == 0 and done.stdout == f"{NOBODY}\n", done.stderr
    (workspace / "later").write_text("written between calls\n")
    assert call(laid_out, "echo more >> later && cat later", *flags).stdout.endswith("more\n")
    after = os.stat("/etc/hostname")
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert {(path.lstat().st_uid, path.lstat().st_gid) for path in workspace.rglob("*")} == {(NOBODY, NOBODY)}


def _wheel(directory: Path) -> Path:
    """A wheel of one module, made here (no index is reachable)."""
    path = directory / "hello_up-1.0-py3-none-any.whl"
    info = "hello_up-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("hello_up.py", "GREETING = 'hello from the user site'\n")
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: hello-up\nVersion: 1.0\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: a test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


@needs_root
@needs_bwrap
def test_the_tools_agents_use_work_as_the_unprivileged_user(laid_out: Path) -> None:
    workspace = laid_out / "ws"
    flags = ("--sandbox", "bwrap")
    files = "echo one > f && mkdir -p a/b && echo two > a/b/g && rm f && rm -r a && echo kept > kept && id -un"
    done = call(laid_out, files, *flags)
    assert done.returncode == 0 and done.stdout == "nobody\n", done.stderr
    (workspace / "Makefile").write_text("out:\n\techo made > out\n")
    assert call(laid_out, "make -s && cat out", *flags).stdout == "made\n"
    if shutil.which("git") is not None:
        git = "git init -q . && git add kept && git -c user.name=a -c user.email=a@b commit -qm one"
        git += " && git log --format=%s"
        done = call(laid_out, git, *flags)
        assert done.returncode == 0 and done.stdout == "one\n", done.stderr
    (workspace / "test_it.py").write_text("def test_it():\n    assert 6 * 7 == 42\n")
    has_pytest = subprocess.run([COMMAND_PY, "-c", "import pytest"], capture_output=True, timeout=60).returncode == 0
    if has_pytest:
        done = call(laid_out, f"{COMMAND_PY} -m pytest -q -p no:cacheprovider test_it.py", *flags)
        assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    # pip --user wants an interpreter outside a virtualenv: the system's, where it has pip.
    python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode == 0:
        wheel = _wheel(workspace)
        pip = f"{python} -m pip install -q --user --break-system-packages --no-index --no-deps {wheel.name}"
        done = call(laid_out, f"{pip} && {python} -c 'import hello_up; print(hello_up.GREETING)'", *flags)
        assert done.returncode == 0 and done.stdout.endswith("hello from the user site\n"), done.stderr
    owners = {path.lstat().st_uid for path in workspace.rglob("*")}
    assert owners == {0}  # the caller's: nothing the harness cannot change or remove
    if not has_pytest:
        pytest.skip(f"{COMMAND_PY} has no pytest: the rest ran, pytest inside a call did not")


def _as_nobody(root: Path, groups: tuple[int, ...] = ()) -> list[str]:
    """trial-tool as the user nobody, and a layout under `root` that nobody owns."""
    python = _nobody_python(root / "lib", groups)
    for name in ("ws", "t"):
        (root / name).mkdir()
        os.chown(root / name, NOBODY, NOBODY)
    shutil.copy(PROBE, root / "ws" / "probe")
    os.chown(root / "ws" / "probe", NOBODY, NOBODY)
    return python


def _removable_by_nobody(workspace: Path, drop: list[str]) -> None:
    """Everything the command left, removed by nobody (a directory it made unreadable, opened again first)."""
    clear = f"chmod -R u+rwX {workspace} && rm -rf {workspace}/* && ls -A {workspace}"
    done = subprocess.run([*drop, "sh", "-c", clear], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "", done.stderr


@pytest.fixture
def nobody_root() -> Iterator[Path]:
    """A directory of the test's own in the host's temporary directory, that nobody can reach."""
    work = Path(tempfile.mkdtemp(prefix="trialtool-up-"))
    try:
        work.chmod(0o755)
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@needs_root
@needs_bwrap
def test_a_plain_user_can_remove_all_its_bwrap_command_left(nobody_root: Path) -> None:
    python = _as_nobody(nobody_root)
    script = ATTACK + "mkdir -p deep/er && echo x > deep/er/f && chmod 0 deep/er && id -u\n"
    done = call(nobody_root, script, "--sandbox", "bwrap", python=tuple(python))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == str(NOBODY), done.stderr
    assert {path.lstat().st_uid for path in (nobody_root / "ws").rglob("*")} == {NOBODY}
    assert privileged(nobody_root / "ws", nobody_root / "t") == []
    _removable_by_nobody(nobody_root / "ws", python[: python.index("env")])


@needs_root
@pytest.mark.parametrize("engine", ["docker"], indirect=True)  # a plain user reaches docker's daemon by its group
def test_a_plain_user_can_remove_all_its_container_command_left(nobody_root: Path, engine: Engine) -> None:
    try:
        docker_group = grp.getgrnam("docker").gr_gid
    except KeyError:
        pytest.skip("no docker group here: a plain user cannot reach the engine")
    python = _as_nobody(nobody_root, (docker_group,))
    script = ATTACK + "mkdir -p deep/er && echo x > deep/er/f && id -u\n"
    done = call(nobody_root, script, "--sandbox", "docker", "--image", engine.tag, python=tuple(python))
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == str(NOBODY), done.stderr
    assert {path.lstat().st_uid for path in (nobody_root / "ws").rglob("*")} == {NOBODY}
    assert privileged(nobody_root / "ws", nobody_root / "t") == []
    _removable_by_nobody(nobody_root / "ws", python[: python.index("env")])
