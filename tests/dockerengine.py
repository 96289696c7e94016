"""The container engines for the tests: an image built here offline, and every container and image made removed.

The fixture `engine` is each container backend in turn, docker's and podman's:
the same tests run through both. The image is `import` of a root holding
busybox-static (no registry is reachable); the fixture skips, saying why, where
an engine does not answer or busybox-static is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tests.conftest import TrialFiles

BUSYBOX = "/usr/bin/busybox"
#: The applets the image links; busybox's sh runs the rest of its applets itself.
APPLETS = (
    "sh",
    "ls",
    "cat",
    "echo",
    "sleep",
    "kill",
    "ps",
    "true",
    "id",
    "env",
    "wc",
    "head",
    "yes",
    "setsid",
    "pwd",
    "timeout",
    "cp",
    "chmod",
    "chown",
    "mknod",
    "mkdir",
    "install",
    "rm",
    "touch",
    "tee",
    "base64",
)
#: Where inspect's docker sandbox looks for what it runs by absolute path.
USR_BIN = ("timeout", "env")


#: Each container backend, and the question that tells whether its engine answers.
ENGINES = {"docker": ("info", "--format", "{{.ServerVersion}}"), "podman": ("info", "--format", "{{.Version.Version}}")}


def _client(mode: str) -> str | None:
    path = shutil.which(mode)
    if path is None:
        return None
    done = subprocess.run([path, *ENGINES[mode]], capture_output=True, timeout=60)
    return path if done.returncode == 0 else None


#: Every image these tests built, by id: removed at the end, whatever became of their tags.
BUILT: list[tuple[str, str]] = []


def build(docker: str, root: Path, tag: str, extra: str = "", scripts: dict[str, str] | None = None) -> str:
    """The test image: busybox and its applets, `/etc/image` naming it, and `scripts` (path: text) made executable."""
    for name in ("bin", "tmp", "proc", "dev", "etc", "sys"):
        (root / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    for applet in USR_BIN:
        (root / "usr" / "bin" / applet).symlink_to("/bin/busybox")
    (root / "etc" / "image").write_text((extra or tag) + "\n")
    for path, text in (scripts or {}).items():
        (root / path).write_text(text)
        (root / path).chmod(0o755)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True, timeout=60)
    subprocess.run([docker, "import", "-", tag], input=tar.stdout, capture_output=True, check=True, timeout=120)
    image_id = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True, check=True
    ).stdout.strip()
    BUILT.append((docker, image_id))
    return image_id


class Engine:
    """The engine as these tests use it: their image, their containers, and a look inside."""

    def __init__(self, mode: str, docker: str, tag: str, image_id: str, root: Path) -> None:
        #: The backend's name (`--sandbox`), and its engine's client.
        self.mode, self.docker, self.tag, self.image_id, self.root = mode, docker, tag, image_id, root

    def name_of(self, trial: TrialFiles) -> str:
        return f"trialtool-{trial.state_json()['trial_id']}"

    def processes(self, name: str) -> list[str]:
        """Every process in the container but the `ps` that lists them: pid and command."""
        done = subprocess.run(
            [self.docker, "exec", name, "ps", "-o", "pid,args"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [line.strip() for line in done.stdout.splitlines()[1:] if "ps -o pid,args" not in line]

    def state_of(self, name: str) -> str | None:
        done = subprocess.run(
            [self.docker, "inspect", "--format", "{{.State.Status}}", name], capture_output=True, text=True
        )
        return done.stdout.strip() if done.returncode == 0 else None

    def containers(self) -> list[str]:
        """The names of the containers whose trial lives under this test run's root."""
        done = subprocess.run(
            [self.docker, "ps", "--all", "--filter", "label=trialtool.trial", "--format", "{{.Names}}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        names = done.stdout.split()
        if not names:
            return []
        # Labels from `inspect`, whose JSON both engines share (their `ps` templates differ).
        found = subprocess.run([self.docker, "container", "inspect", *names], capture_output=True, check=True)
        return [
            data["Name"].lstrip("/")
            for data in json.loads(found.stdout)
            if (data["Config"].get("Labels") or {}).get("trialtool.state", "").startswith(str(self.root))
        ]


@pytest.fixture(scope="session", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    mode: str = request.param
    docker = _client(mode)
    if docker is None:
        install = "docker.io, and start dockerd" if mode == "docker" else "podman and catatonit"
        pytest.skip(f"no {mode} engine answers here (install {install}; .ci/run does)")
    if not os.path.exists(BUSYBOX):
        pytest.skip("the test image is built from busybox-static (apt-get install busybox-static; .ci/run does)")
    # Every trial of this run (this worker's) lives under its base temporary directory.
    root = tmp_path_factory.getbasetemp()
    tag = f"trialtool-test-{uuid.uuid4().hex[:12]}:busybox"
    found = Engine(mode, docker, tag, build(docker, tmp_path_factory.mktemp(mode), tag), root)
    try:
        yield found
    finally:
        for name in found.containers():
            subprocess.run([docker, "rm", "--force", name], capture_output=True, timeout=120)
        for image_id in [image for client, image in BUILT if client == docker]:
            subprocess.run([docker, "image", "rm", "--force", image_id], capture_output=True, timeout=120)
