"""gVisor's runsc, as far as a trial needs it: its version and platforms, and one sandbox's life.

Every sandbox of trial-tool's lives under one runsc state directory of its own
(`ROOT`, 0700, in /run, which no sandbox sees: each has an empty /run), with
its OCI bundle beside its state there: nothing a command can reach is ever
read back as a sandbox's configuration. A sandbox is made with `run
--detach`, asked about with `state`, and ended with `delete --force`; a call
is `exec` into it (_gvisor.py). Every runsc run here is the trial's pinned one.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, NamedTuple

from ..errors import SandboxError
from ..osio import plain
from . import _pinned as pinned
from ._settings import Binary

if TYPE_CHECKING:
    import subprocess

#: Where runsc keeps the state of trial-tool's sandboxes, and their bundles (`bundles/<id>`).
ROOT = "/run/trialtool-gvisor"
#: The platforms trial-tool picks from, best first: kvm only when asked, since a /dev/kvm that is
#: there but cannot run a guest (nested virtualisation turned off) hangs runsc rather than failing.
PLATFORMS = ("systrap", "ptrace")
#: The environment every runsc of trial-tool's runs with: none of the caller's. runsc makes the sandbox's
#: chroot under TMPDIR, which a caller's TMPDIR in a workspace (or a directory its user cannot reach) breaks.
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
#: How long runsc may take to make a sandbox, or answer about one.
_TIMEOUT = 60.0


class Facts(NamedTuple):
    """What a runsc binary says of itself."""

    version: str
    platforms: tuple[str, ...]


def run(binary: Binary, *args: str, timeout: float = _TIMEOUT) -> subprocess.CompletedProcess[bytes]:
    """The pinned runsc run on `args` (with the state directory first); SandboxError if it does not answer."""
    import subprocess  # not at import: a call of another backend never loads it (the CLI counts its imports)

    try:
        return subprocess.run(
            [binary.path, "--root", ROOT, *args],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
            env=ENV,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"gVisor's runsc {binary.path} did not answer: {exc}") from exc


def said(stderr: bytes) -> str:
    """runsc's reason: the last line it wrote, without its log prefix."""
    lines = [line for line in stderr.decode(errors="replace").strip().splitlines() if line.strip()]
    if not lines:
        return "no reason given"
    last = lines[-1]
    # "W1207 11:39:22.291949    8475 util.go:64] FATAL ERROR: ..." -> "FATAL ERROR: ..."
    return (last.split("] ", 1)[1] if "] " in last and last[:1] in "IWEF" else last)[:300]


def facts(binary: Binary) -> Facts:
    """Its version (`runsc --version`'s first line) and the platforms it names; SandboxError if it cannot say."""
    version = run(binary, "--version", timeout=20)
    listed = run(binary, "help", "platforms", timeout=20)
    if version.returncode != 0:
        raise SandboxError(f"runsc cannot say its version: {said(version.stderr)}")
    first = version.stdout.decode(errors="replace").strip().splitlines()
    words = first[0].split() if first else []
    platforms = tuple(line.strip() for line in listed.stdout.decode(errors="replace").splitlines() if line.strip())
    return Facts(words[-1] if words else "unknown", platforms)


def platform(known: tuple[str, ...]) -> str | None:
    """The platform a new trial's sandbox runs on: the best of `PLATFORMS` this runsc has."""
    return next((name for name in PLATFORMS if name in known), None)


def state_directory() -> str:
    """`ROOT`, made if missing: SandboxError when it is not a directory of this user's."""
    pinned.own_directory(ROOT, "gVisor's state directory")
    pinned.own_directory(os.path.join(ROOT, "bundles"), "gVisor's bundles directory")
    return ROOT


def bundle(container: str) -> str:
    """The bundle directory of the sandbox `container`."""
    return os.path.join(ROOT, "bundles", container)


def start(binary: Binary, container: str, spec: dict[str, object], flags: list[str], detach: bool = True) -> str | None:
    """Make and start the sandbox `container` from `spec`; None, or why it could not be (runsc's words).

    `detach=False`: run it to its end (a probe), and say why not unless its first process exited 0.
    """
    state_directory()
    directory = bundle(container)
    shutil.rmtree(directory, ignore_errors=True)
    os.mkdir(directory, 0o700)
    path = os.path.join(directory, "config.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(spec, handle)
    # The sandbox keeps whatever descriptors its start had: runsc's words go to a file, never a pipe
    # whose end would then not come.
    said_path = os.path.join(directory, "start.log")
    out = os.open(said_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    argv = [binary.path, "--root", ROOT, *flags, "run", "--bundle", directory, *(["--detach"] if detach else [])]
    import subprocess

    try:
        done = subprocess.run(
            [*argv, container],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            timeout=_TIMEOUT,
            check=False,
            env=ENV,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        delete(binary, container)
        raise SandboxError(f"gVisor's runsc {binary.path} did not start the sandbox: {exc}") from exc
    finally:
        os.close(out)
    if done.returncode == 0:
        return None
    with open(said_path, "rb") as handle:
        words = handle.read()[-4096:]
    delete(binary, container)
    if words.strip():
        return said(words)
    if done.returncode == 128 + 9:
        return "runsc was killed starting the sandbox (out of memory? the memory limit holds gVisor's own kernel too)"
    return f"runsc exited with status {done.returncode} and no word of why"


def status(binary: Binary, container: str) -> tuple[str | None, int | None]:
    """runsc's word for the sandbox `container` ("running", "stopped"; None: there is none), and, while it
    runs, the host pid of its own process."""
    done = run(binary, "state", container, timeout=20)
    if done.returncode != 0:
        return None, None
    try:
        data = json.loads(done.stdout)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    pid, word = data.get("pid"), data.get("status")
    running = word == "running" and type(pid) is int and pid > 0
    return (str(word) if word is not None else None), (pid if running else None)


def made_from(container: str) -> dict[str, object] | None:
    """The spec the sandbox `container` was made from, as its bundle keeps it; None if there is none."""
    try:
        fd = os.open(os.path.join(bundle(container), "config.json"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def delete(binary: Binary, container: str) -> bool:
    """End the sandbox `container` and remove its bundle; whether there was one."""
    done = run(binary, "delete", "--force", container)
    existed = os.path.isdir(bundle(container))
    shutil.rmtree(bundle(container), ignore_errors=True)
    shutil.rmtree(os.path.join(ROOT, "net", container), ignore_errors=True)  # network "allow": the proxy's socket
    if done.returncode != 0 and "does not exist" not in said(done.stderr) and "not found" not in said(done.stderr):
        raise SandboxError(f"gVisor's sandbox {plain(container)} cannot be ended: {said(done.stderr)}")
    return existed or done.returncode == 0


def listed(binary: Binary) -> list[str]:
    """Every sandbox under `ROOT`, by id."""
    if not os.path.isdir(ROOT):
        return []
    done = run(binary, "list", "--quiet", timeout=20)
    if done.returncode != 0:
        raise SandboxError(f"gVisor cannot list its sandboxes: {said(done.stderr)}")
    return [line.strip() for line in done.stdout.decode(errors="replace").splitlines() if line.strip()]


__all__ = [
    "ENV",
    "PLATFORMS",
    "ROOT",
    "Facts",
    "bundle",
    "delete",
    "facts",
    "listed",
    "made_from",
    "platform",
    "run",
    "said",
    "start",
    "state_directory",
    "status",
]
