"""The trial's sandbox settings: what its commands may see, write and reach, pinned when the trial is created.

The settings travel with the limits: `sandbox` (none, bwrap, docker, auto), `network`
(none, host, allow: through trial-tool's proxy to what `allow` lists, sandbox/_egress.py), `workspace`
(the directory the command may write), `writable` (more paths), `home`, `image`
(docker's) and `run_as` (who the command is). `pin` resolves them once, at creation, into what the state keeps:

- "auto" becomes bwrap where a tiny sandboxed command runs on this machine, and
  none where it does not, with bwrap's own words for why (`fallback`);
- the bwrap executable, or docker's client, is pinned by absolute path and
  identity (`binary`), never looked up on PATH again; docker's image by its
  id (`image_id`), never resolved by its name again;
- the workspace and writable paths become canonical, and are pinned by
  identity (`pins`: device and inode), so that a path a command renamed or
  replaced by a symlink is refused rather than followed;
- `run_as` becomes the uid and gid the command runs as ("UID:GID"): an
  unprivileged one (`user`, 65534) when the caller is root, else the caller's.

`check_pinned` refuses a later use that asks for something else. What can run here,
and how a call is wrapped, are the seam's (sandbox/): `pin` is handed its answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..errors import LimitMismatch, SandboxError, UsageError
from ..osio import plain
from ..types import SANDBOX_SETTINGS
from . import _egress as egress
from ._egress import NETWORKS

MODES = ("none", "bwrap", "docker")
HOMES = ("host", "trial")
#: The override names that are sandbox settings rather than limits.
SETTINGS = (*SANDBOX_SETTINGS, "origin", "search_path", "home_path")
#: The flag of each setting, for messages.
FLAG_OF = {name: "--" + name.replace("_", "-") for name in SANDBOX_SETTINGS}
#: `--run-as user`: nobody, an id that owns nothing on a host and that no host trusts.
USER_ID = 65534
RUN_AS = {"root": "0:0", "user": f"{USER_ID}:{USER_ID}"}


class Pin(NamedTuple):
    """A path as it was when the trial was created: on each call it must still be this very file."""

    path: str
    device: int
    inode: int


class Binary(NamedTuple):
    """The sandbox's executable, pinned: a call runs it only while it is still this file, unchanged."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int


class Sandbox(NamedTuple):
    """A trial's pinned sandbox. Paths are canonical; `workspace` and `writable` mean nothing under mode none."""

    mode: str = "none"
    #: "host" under mode none: the command then reaches whatever the machine reaches.
    network: str = "host"
    workspace: str | None = None
    writable: tuple[str, ...] = ()
    #: The bwrap executable (mode bwrap).
    binary: Binary | None = None
    #: The workspace and writable paths by identity (mode bwrap).
    pins: tuple[Pin, ...] = ()
    #: Why "auto" resolved to none, in the sandbox's own words (None otherwise).
    fallback: str | None = None
    #: "trial": the command's $HOME is a layer of the trial's own over the host's (mode bwrap,
    #: sandbox/_home.py); "host": the host's, read-only like the rest of its root.
    home: str = "host"
    #: The host's home directory (canonical) the layer goes over, when `home` is "trial".
    home_path: str | None = None
    #: Mode docker: the image as named, and its id (what every container of the trial is made from).
    image: str | None = None
    image_id: str | None = None
    #: Network "allow": the allowlist, canonical (egress.canonical).
    allow: tuple[str, ...] = ()
    #: "UID:GID", who the command runs as (modes bwrap and docker); None in trials made before it was pinned.
    run_as: str | None = None

    def as_json(self) -> dict[str, Any]:
        images = ("image", "image_id") if self.mode != "docker" else ()  # a container's only
        unused = (*images, *(("allow",) if self.network != "allow" else ()))
        unused += ("run_as",) if self.mode == "none" else ()
        return {
            **{name: value for name, value in self._asdict().items() if name not in unused},
            "writable": list(self.writable),
            **({"allow": list(self.allow)} if self.network == "allow" else {}),
            "binary": None if self.binary is None else self.binary._asdict(),
            "pins": [pin._asdict() for pin in self.pins],
        }

    @property
    def roots(self) -> tuple[str, ...]:
        """Every path the command may write, shortest first."""
        return tuple(sorted({path for path in (self.workspace, *self.writable) if path is not None}, key=len))

    @property
    def ids(self) -> tuple[int, int]:
        """The uid and gid the command runs as: pinned, or (a trial made before) what `--run-as` defaults to now."""
        uid, _, gid = (self.run_as or default_run_as()).partition(":")
        return int(uid), int(gid)


def default_run_as() -> str:
    """`--run-as` when not given: `user` for a root caller, whose files a command would otherwise own as root."""
    return RUN_AS["user"] if os.geteuid() == 0 else f"{os.geteuid()}:{os.getegid()}"


def run_as(value: Any) -> str:
    """`--run-as` root, user or UID:GID as "UID:GID"; UsageError otherwise."""
    if isinstance(value, str) and value in RUN_AS:
        return RUN_AS[value]
    uid, colon, gid = value.partition(":") if isinstance(value, str) else ("", "", "")
    if colon and all(part.isascii() and part.isdigit() and int(part) < 2**32 - 1 for part in (uid, gid)):
        return f"{int(uid)}:{int(gid)}"
    raise UsageError(f"--run-as must be root, user or UID:GID, not {plain(value)}")


UNSANDBOXED = Sandbox()  # what a trial created before sandboxes existed holds: nothing

#: Given the paths a command could write and the PATH to search, the bwrap executable to pin, or why none.
Available = Callable[[tuple[str, ...], "str | None"], "tuple[Binary | None, str | None]"]
#: Given an image, the PATH to search and the writable paths: the container client and the image's id, or why none.
ContainerAvailable = Callable[[str, "str | None", tuple[str, ...]], "tuple[Binary | None, str | None, str | None]"]


def split(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the limits, the sandbox settings) of one overrides dict."""
    limits = {name: value for name, value in overrides.items() if name not in SETTINGS}
    settings = {name: value for name, value in overrides.items() if name in SETTINGS}
    return limits, settings


def checked(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with their values checked (UsageError naming the flag); paths not yet resolved."""
    checked = dict(settings)
    mode = settings.get("sandbox")
    if mode is not None and mode not in (*MODES, "auto"):
        msg = f"--sandbox must be one of none, bwrap, docker, auto, not {plain(mode)}"
        raise UsageError(msg)
    image = settings.get("image")
    if image is not None and (not isinstance(image, str) or not image or not image.isprintable()):
        raise UsageError(f"--image must name an image, not {plain(image)}")
    if image is not None and mode not in (None, "docker"):
        raise UsageError("--image goes with --sandbox docker")
    checked.update(egress.checked(settings))
    if settings.get("run_as") is not None:
        run_as(settings["run_as"])
    home = settings.get("home")
    if home is not None and home not in HOMES:
        msg = f"--home must be one of {', '.join(HOMES)}, not {plain(home)}"
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


def pin(settings: dict[str, Any], available: Available | None, containers: ContainerAvailable | None = None) -> Sandbox:
    """The sandbox a new trial pins: "auto" resolved on this machine, the executable and paths pinned.

    `available` (the seam's, sandbox/) says which bwrap to pin, or why none
    can run here; `containers`, which container client and image. SandboxError when
    bwrap is asked for (or network "none", which needs it) and cannot run here, or
    docker is and its image cannot.
    """
    settings = checked(settings)
    workspace, writable = _paths(settings)
    mode = settings.get("sandbox") or "auto"
    if mode == "docker" or settings.get("image") is not None:
        return _container(settings, workspace, writable, containers)
    binary: Binary | None = None
    fallback: str | None = None
    if mode != "none":
        roots = tuple(sorted({workspace, *writable}, key=len))
        # Runs a tiny sandbox: only now, when a trial is created.
        search = settings.get("search_path")
        binary, reason = (None, "no sandbox backend was given") if available is None else available(roots, search)
        if binary is not None:
            mode = "bwrap"
        elif mode == "bwrap" or settings.get("network") in ("none", "allow"):
            asked = "--sandbox bwrap" if mode == "bwrap" else f"--network {settings['network']}"
            raise SandboxError(f"{asked} needs the bwrap sandbox: {reason}")
        else:
            mode, fallback = "none", reason
    if mode == "none":
        if settings.get("network") in ("none", "allow"):
            raise UsageError(f"--network {settings['network']} needs a sandbox; it cannot hold with --sandbox none")
        if settings.get("home") == "trial" and settings.get("sandbox") == "none":
            raise UsageError("--home trial needs a sandbox; it cannot hold with --sandbox none")
        if settings.get("run_as") is not None:
            raise UsageError("--run-as needs a sandbox: with --sandbox none a command runs as its caller")
        return Sandbox("none", "host", workspace, writable, fallback=fallback)
    pins = tuple(identity(path) for path in (workspace, *writable))
    home, home_path = _home(settings, workspace, writable)
    network, allow = settings.get("network") or "none", settings.get("allow") or ()
    ids = _pinned_run_as(settings)
    return Sandbox(
        "bwrap", network, workspace, writable, binary, pins, home=home, home_path=home_path, allow=allow, run_as=ids
    )


def _pinned_run_as(settings: Mapping[str, Any]) -> str:
    return default_run_as() if settings.get("run_as") is None else run_as(settings["run_as"])


def _container(
    settings: dict[str, Any], workspace: str, writable: tuple[str, ...], containers: ContainerAvailable | None
) -> Sandbox:
    """A docker trial's sandbox: the client pinned, the image by its id; the home is the image's."""
    image = settings.get("image")
    if settings.get("sandbox") != "docker" or not isinstance(image, str):
        raise UsageError("--sandbox docker needs --image IMAGE, and --image goes with --sandbox docker only")
    if settings.get("home") is not None:
        raise UsageError("--home is bwrap's: a container's $HOME is its image's")
    roots = tuple(sorted({workspace, *writable}, key=len))
    binary, image_id, reason = (
        (None, None, "no container backend")
        if containers is None
        else containers(image, settings.get("search_path"), roots)
    )
    if binary is None or image_id is None:
        raise SandboxError(f"--sandbox docker: {reason}")
    pins = tuple(identity(path) for path in (workspace, *writable))
    network = settings.get("network") or "none"
    if network == "allow":
        raise UsageError("--network allow runs under --sandbox bwrap; a container has none or host (docs/sandbox.md)")
    ids = _pinned_run_as(settings)
    return Sandbox("docker", network, workspace, writable, binary, pins, image=image, image_id=image_id, run_as=ids)


def _home(settings: dict[str, Any], workspace: str, writable: tuple[str, ...]) -> tuple[str, str | None]:
    """The pinned home: "trial" by default, over the caller's $HOME (`home_path`); "host" when asked for.

    A home that is the workspace, or inside a writable path, is the command's already: "host". So is
    one that is no directory, unless "trial" was asked for (then it is an error).
    """
    wanted = settings.get("home") or "trial"
    # The caller's $HOME (the per-user server's callers send theirs), else this process's.
    given = settings.get("home_path") or os.environ.get("HOME")
    if wanted == "host":
        return "host", None
    path = os.path.realpath(given) if isinstance(given, str) and given.startswith("/") else None
    if path is None or path == "/" or not os.path.isdir(path):
        if settings.get("home") == "trial":
            raise UsageError(f"--home trial: $HOME {plain(given)} is not a directory to go over")
        return "host", None
    if any(path == root or path.startswith(root.rstrip("/") + "/") for root in (workspace, *writable)):
        return "host", None
    return "trial", path


def identity(path: str) -> Pin:
    """`path` (canonical) pinned by its device and inode."""
    info = os.stat(path)
    return Pin(path, info.st_dev, info.st_ino)


def check_pinned(pinned: Sandbox, settings: dict[str, Any]) -> None:
    """Refuse settings passed now that differ from the pinned ones ("auto" accepts whatever was pinned)."""
    if not settings:
        return
    settings = checked(settings)
    mode = settings.get("sandbox")
    if mode is not None and mode != "auto" and mode != pinned.mode:
        _mismatch("sandbox", mode, pinned.mode)
    for name in ("network", "allow", "home", "image"):
        value = settings.get(name)
        if value is not None and value != getattr(pinned, name):
            _mismatch(name, value, getattr(pinned, name))
    if settings.get("run_as") is not None and run_as(settings["run_as"]) != (pinned.run_as or default_run_as()):
        _mismatch("run_as", run_as(settings["run_as"]), pinned.run_as or default_run_as())
    if settings.get("workspace") is not None or settings.get("writable"):
        workspace, writable = _paths(settings)
        if settings.get("workspace") is not None and workspace != pinned.workspace:
            _mismatch("workspace", workspace, pinned.workspace)
        if settings.get("writable") and writable != pinned.writable:
            _mismatch("writable", list(writable), list(pinned.writable))


def _mismatch(name: str, wanted: Any, pinned: Any) -> None:
    wanted, pinned = (" ".join(v) if isinstance(v, tuple) else v for v in (wanted, pinned))
    msg = f"{FLAG_OF[name]} {plain(wanted)} differs from the value {plain(pinned)} pinned when this trial was created"
    raise LimitMismatch(msg)


#: The fields every stored sandbox has; the others came later and may be missing.
_FIRST_FIELDS = frozenset({"mode", "network", "workspace", "writable"})


def from_state(data: Any) -> Sandbox:
    """The pinned sandbox as stored in a state file; ValueError if it is malformed."""
    if data is None:
        return UNSANDBOXED
    if not isinstance(data, dict) or not _FIRST_FIELDS <= set(data) <= set(Sandbox._fields):
        raise ValueError("the sandbox is malformed")
    workspace, writable = data["workspace"], data["writable"]
    images = (data.get("image"), data.get("image_id")) if data["mode"] == "docker" else ()
    if (
        data["mode"] not in MODES
        or data["network"] not in NETWORKS
        or (data["mode"] == "bwrap" and not isinstance(workspace, str))
        or not isinstance(writable, list)
        or not all(isinstance(path, str) for path in writable)
        or not isinstance(data.get("fallback"), str | None)
        or data.get("home", "host") not in HOMES
        or not isinstance(data.get("home_path"), str | None)
        or (data.get("home") == "trial" and not isinstance(data.get("home_path"), str))
        or not all(isinstance(value, str) for value in images)
        or not egress.stored(data.get("allow", []))
        or (data.get("run_as") is not None and not _ids(data["run_as"]))
    ):
        raise ValueError("the sandbox is malformed")
    try:
        binary = None if data.get("binary") is None else Binary(**data["binary"])
        pins = tuple(Pin(**pin) for pin in data.get("pins") or ())
    except TypeError as exc:
        raise ValueError("the sandbox is malformed") from exc
    if (binary is not None and not _typed(binary, str, int)) or not all(_typed(pin, str, int) for pin in pins):
        raise ValueError("the sandbox is malformed")
    later = {name: data[name] for name in (*_LATER_FIELDS, "run_as") if name in data}
    later["allow"] = tuple(data.get("allow") or ())
    return Sandbox(data["mode"], data["network"], workspace, tuple(writable), binary, pins, **later)


_LATER_FIELDS = ("fallback", "home", "home_path", "image", "image_id")


def _ids(value: Any) -> bool:
    try:
        return isinstance(value, str) and run_as(value) == value
    except UsageError:
        return False


def _typed(row: tuple[Any, ...], first: type, rest: type) -> bool:
    return isinstance(row[0], first) and all(isinstance(v, rest) and not isinstance(v, bool) for v in row[1:])


__all__ = [
    "MODES",
    "NETWORKS",
    "SETTINGS",
    "UNSANDBOXED",
    "Available",
    "Binary",
    "ContainerAvailable",
    "Pin",
    "Sandbox",
    "check_pinned",
    "checked",
    "default_run_as",
    "from_state",
    "identity",
    "pin",
    "run_as",
    "split",
]
