"""The trial's sandbox: what its commands may see, write and reach, pinned when the trial is created.

The settings travel with the limits (the same overrides from every door) under
four names: `sandbox` (none, bwrap, auto), `network` (none, host), `workspace`
(the directory the command may write) and `writable` (more paths it may
write). `pin` resolves them once, at creation: "auto" becomes bwrap where a
tiny sandboxed command runs on this machine and none where it does not, and
paths become canonical (symlinks resolved). The state keeps the result;
`check_pinned` refuses a later use that asks for something else. How one call
is then wrapped in bubblewrap is process/bwrap.py's.

Also here, because creating a trial needs it: whether bwrap can run on this
machine at all (`unavailable`). Nothing runs at import or when pinned settings
are checked; the CLI reads this module on every call.
"""

from __future__ import annotations

import os
import threading
from typing import Any, NamedTuple

from .errors import LimitMismatch, SandboxError, UsageError
from .limits import NOT_LIMITS
from .osio import plain

MODES = ("none", "bwrap")
NETWORKS = ("none", "host")
#: The override names that are sandbox settings rather than limits.
SETTINGS = NOT_LIMITS
#: The flag of each setting, for messages.
FLAG_OF = {"sandbox": "--sandbox", "network": "--network", "workspace": "--workspace", "writable": "--writable"}


class Sandbox(NamedTuple):
    """A trial's pinned sandbox. Paths are canonical; `workspace` and `writable` mean nothing under mode none."""

    mode: str = "none"
    #: "host" under mode none: the command then reaches whatever the machine reaches.
    network: str = "host"
    workspace: str | None = None
    writable: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "network": self.network,
            "workspace": self.workspace,
            "writable": list(self.writable),
        }


#: What a trial created before sandboxes existed holds: nothing.
UNSANDBOXED = Sandbox()


#: Namespaces, privileges and lifetime: the same for every call and for the probe.
ISOLATION = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
)
#: The answer of `unavailable`, once known; a probe started and not yet collected.
_UNAVAILABLE: list[str | None] = []
_PENDING: list[tuple[int, int, str]] = []
_GUARD = threading.Lock()


def program() -> str | None:
    """The bwrap executable: on trial-tool's PATH, else /usr/bin/bwrap; None if there is none."""
    for directory in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin"]:
        candidate = os.path.join(directory or ".", "bwrap")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def unavailable() -> str | None:
    """Why the bwrap sandbox cannot run here, or None when it can; checked once per process.

    The check runs `true` in a sandbox made as a call's is (5-10 ms): bwrap can be
    installed and still be refused the namespaces it needs (user namespaces
    disabled, a container without them). `start_probe` starts it ahead.
    """
    with _GUARD:
        if not _UNAVAILABLE:
            if not _PENDING:
                _start()
            _UNAVAILABLE.append(_collect())
        return _UNAVAILABLE[0]


def start_probe() -> None:
    """Start the check of `unavailable` now, in the background, so that its answer is ready when needed.

    A call starts it before it reserves: the probe's 5-10 ms then overlap the
    ledger's work instead of adding to it. A no-op once started, or without bwrap.
    """
    with _GUARD:
        if not _UNAVAILABLE and not _PENDING and program() is not None:
            _start()


def settle(*, block: bool) -> None:
    """Reap a probe started ahead and keep its answer: waiting for it if `block`, else only if it is done.

    For a process whose trial turned out unsandboxed, so that no probe is left a zombie.
    """
    with _GUARD:
        if not _PENDING:
            return
        pid = _PENDING[0][0]
        if not block and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return
        _UNAVAILABLE.append(_collect())


def _start() -> None:
    import sys

    if not sys.platform.startswith("linux"):
        _UNAVAILABLE.append("bubblewrap runs on Linux only")
        return
    path = program()
    if path is None:
        _UNAVAILABLE.append("bubblewrap is not installed (apt-get install bubblewrap, dnf install bubblewrap)")
        return
    argv = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *ISOLATION, "--", "true"]
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawn(
            path,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
        )
    except OSError as exc:
        os.close(err_r)
        _UNAVAILABLE.append(f"{path} cannot be executed: {exc.strerror}")
        return
    finally:
        os.close(err_w)
    _PENDING.append((pid, err_r, path))


def _collect() -> str | None:
    """The started probe's answer (or the reason it could not start)."""
    if _UNAVAILABLE:
        return _UNAVAILABLE.pop()
    pid, err_r, path = _PENDING.pop()
    with os.fdopen(err_r, "rb") as stream:
        said = stream.read(4096)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    lines = said.decode("utf-8", "replace").strip().splitlines()
    why = lines[-1] if lines else f"{path} exited with status {code}"
    return f"bubblewrap cannot make a sandbox here ({why}); are user namespaces disabled? see docs/sandbox.md"


def split(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the limits, the sandbox settings) of one overrides dict."""
    limits = {name: value for name, value in overrides.items() if name not in SETTINGS}
    settings = {name: value for name, value in overrides.items() if name in SETTINGS}
    return limits, settings


def _checked(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` with their values checked (UsageError naming the flag); paths not yet resolved."""
    checked = dict(settings)
    mode = settings.get("sandbox")
    if mode is not None and mode not in (*MODES, "auto"):
        msg = f"--sandbox must be one of none, bwrap, auto, not {plain(mode)}"
        raise UsageError(msg)
    network = settings.get("network")
    if network is not None and network not in NETWORKS:
        msg = f"--network must be one of {', '.join(NETWORKS)}, not {plain(network)}"
        raise UsageError(msg)
    workspace = settings.get("workspace")
    if workspace is not None and (not isinstance(workspace, str) or not workspace):
        msg = f"--workspace must be a directory, not {plain(workspace)}"
        raise UsageError(msg)
    writable = settings.get("writable")
    if writable is not None:
        if isinstance(writable, str) or not all(isinstance(path, str) and path for path in writable):
            msg = f"--writable takes one path per use, not {plain(writable)}"
            raise UsageError(msg)
        checked["writable"] = tuple(writable)
    return checked


def _canonical(path: str, flag: str, *, directory: bool) -> str:
    """`path` with every symlink resolved; UsageError if it does not exist (or is not a directory)."""
    resolved = os.path.realpath(path)
    if not os.path.exists(resolved):
        msg = f"{flag} {plain(path)}: no such file or directory"
        raise UsageError(msg)
    if directory and not os.path.isdir(resolved):
        msg = f"{flag} {plain(path)} is not a directory"
        raise UsageError(msg)
    if resolved == "/":
        msg = f"{flag} /: the whole filesystem cannot be writable in a sandbox; name a directory"
        raise UsageError(msg)
    return resolved


def _paths(settings: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The workspace and writable paths, canonical; relative ones and the default from `origin` (else here)."""
    origin = settings.get("origin") or os.getcwd()
    workspace = _canonical(os.path.join(origin, settings.get("workspace") or "."), "--workspace", directory=True)
    writable = tuple(
        sorted(
            {
                _canonical(os.path.join(origin, path), "--writable", directory=False)
                for path in settings.get("writable") or ()
            }
        )
    )
    return workspace, writable


def pin(settings: dict[str, Any]) -> Sandbox:
    """The sandbox a new trial pins: "auto" resolved on this machine, paths canonical.

    SandboxError when bwrap is asked for (or network "none", which needs it) and
    cannot run here.
    """
    settings = _checked(settings)
    workspace, writable = _paths(settings)
    mode = settings.get("sandbox") or "auto"
    if mode != "none":
        reason = unavailable()  # runs a tiny sandbox: only now, when a trial is created
        if reason is None:
            mode = "bwrap"
        elif mode == "bwrap" or settings.get("network") == "none":
            asked = "--sandbox bwrap" if mode == "bwrap" else "--network none"
            raise SandboxError(f"{asked} needs the bwrap sandbox: {reason}")
        else:
            mode = "none"
    if mode == "none":
        if settings.get("network") == "none":
            raise UsageError("--network none needs a sandbox; it cannot hold with --sandbox none")
        return Sandbox("none", "host", workspace, writable)
    return Sandbox("bwrap", settings.get("network") or "none", workspace, writable)


def check_pinned(pinned: Sandbox, settings: dict[str, Any]) -> None:
    """Refuse settings passed now that differ from the pinned ones ("auto" accepts whatever was pinned)."""
    if not settings:
        return
    settings = _checked(settings)
    mode = settings.get("sandbox")
    if mode is not None and mode != "auto" and mode != pinned.mode:
        _mismatch("sandbox", mode, pinned.mode)
    network = settings.get("network")
    if network is not None and network != pinned.network:
        _mismatch("network", network, pinned.network)
    if settings.get("workspace") is not None or settings.get("writable"):
        workspace, writable = _paths(settings)
        if settings.get("workspace") is not None and workspace != pinned.workspace:
            _mismatch("workspace", workspace, pinned.workspace)
        if settings.get("writable") and writable != pinned.writable:
            _mismatch("writable", list(writable), list(pinned.writable))


def _mismatch(name: str, wanted: Any, pinned: Any) -> None:
    msg = f"{FLAG_OF[name]} {plain(wanted)} differs from the value {plain(pinned)} pinned when this trial was created"
    raise LimitMismatch(msg)


def from_state(data: Any) -> Sandbox:
    """The pinned sandbox as stored in a state file; ValueError if it is malformed."""
    if data is None:
        return UNSANDBOXED
    if not isinstance(data, dict) or set(data) != set(Sandbox._fields):
        raise ValueError("the sandbox is malformed")
    writable = data["writable"]
    workspace = data["workspace"]
    if (
        data["mode"] not in MODES
        or data["network"] not in NETWORKS
        or (data["mode"] == "bwrap" and not isinstance(workspace, str))
        or not isinstance(writable, list)
        or not all(isinstance(path, str) for path in writable)
    ):
        raise ValueError("the sandbox is malformed")
    return Sandbox(data["mode"], data["network"], workspace, tuple(writable))


__all__ = [
    "ISOLATION",
    "MODES",
    "NETWORKS",
    "SETTINGS",
    "UNSANDBOXED",
    "Sandbox",
    "check_pinned",
    "from_state",
    "pin",
    "program",
    "split",
    "unavailable",
]
