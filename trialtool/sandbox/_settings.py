"""The trial's sandbox settings: what its commands may see, write and reach, pinned when the trial is created.

The settings travel with the limits: `sandbox` (a backend's name, or auto), `network`
(none, host, allow: through trial-tool's proxy to what `allow` lists, sandbox/_egress.py), `workspace`
(the directory the command may write), `writable` (more paths), `home`, `image`
and `run_as` (who the command is). The registry (_backends.py) resolves them once, at creation, and the
backend pins what it takes into what the state keeps (`Sandbox`):

- its executable by absolute path and identity (`binary`), never looked up on
  PATH again; a container's image by its id (`image_id`), never by its name again;
- the workspace and writable paths canonical, and pinned by identity (`pins`:
  device and inode), so that a path a command renamed or replaced by a symlink
  is refused rather than followed;
- `run_as` as the uid and gid the command runs as ("UID:GID"): an
  unprivileged one (`user`, 65534) when the caller is root, else the caller's.

This module holds what every backend shares: the pinned form, the checks of each
value, and `check_pinned`, which refuses a later use that asks for something else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple, TypedDict

from ..errors import LimitMismatch, UsageError
from ..osio import plain
from ..types import SANDBOX_SETTINGS
from . import _egress as egress
from ._egress import NETWORKS

HOMES = ("host", "trial")
#: The override names that are sandbox settings rather than limits.
SETTINGS = (*SANDBOX_SETTINGS, "origin", "search_path", "home_path")
#: The settings only some backends take (each names its own: Backend.TAKES).
OWNED_SETTINGS = ("run_as", "home", "image")
#: The flag of each setting, for messages.
FLAG_OF = {name: "--" + name.replace("_", "-") for name in SANDBOX_SETTINGS}
#: `--run-as user`: nobody, an id that owns nothing on a host and that no host trusts.
USER_ID = 65534
RUN_AS = {"root": "0:0", "user": f"{USER_ID}:{USER_ID}"}


class Settings(TypedDict, total=False):
    """A trial's sandbox settings as given, each value checked (`checked`); paths not yet resolved."""

    sandbox: str
    network: str
    allow: tuple[str, ...]
    workspace: str
    writable: tuple[str, ...]
    home: str
    image: str
    run_as: str
    #: Where relative paths are from (the caller's directory), the PATH executables are looked for on,
    #: and the caller's $HOME (the per-user server's callers send theirs).
    origin: str
    search_path: str
    home_path: str


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
    #: The backend's executable (a sandbox's, or a container engine's client).
    binary: Binary | None = None
    #: The workspace and writable paths by identity (every backend but none).
    pins: tuple[Pin, ...] = ()
    #: Why "auto" resolved to none, in the sandbox's own words (None otherwise).
    fallback: str | None = None
    #: "trial": the command's $HOME is a layer of the trial's own over the host's
    #: (sandbox/_home.py); "host": the host's, read-only like the rest of its root.
    home: str = "host"
    #: The host's home directory (canonical) the layer goes over, when `home` is "trial".
    home_path: str | None = None
    #: A container's image as named, and its id (what every container of the trial is made from).
    image: str | None = None
    image_id: str | None = None
    #: Network "allow": the allowlist, canonical (egress.canonical).
    allow: tuple[str, ...] = ()
    #: "UID:GID", who the command runs as (every backend but none); None in trials made before it was pinned.
    run_as: str | None = None
    #: A sandbox with a kernel of its own: its runtime and version ("runsc 20221219.0"), and the platform
    #: it intercepts the command's system calls with (gVisor's systrap, ptrace or kvm).
    runtime: str | None = None
    platform: str | None = None

    def as_json(self) -> dict[str, object]:
        # A backend's own fields only where it pinned them; the allowlist only with network "allow".
        unused = {name for name in _OPTIONAL_FIELDS if getattr(self, name) is None}
        unused |= {"allow"} if self.network != "allow" else set()
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


def run_as(value: object) -> str:
    """`--run-as` root, user or UID:GID as "UID:GID"; UsageError otherwise."""
    if isinstance(value, str) and value in RUN_AS:
        return RUN_AS[value]
    uid, colon, gid = value.partition(":") if isinstance(value, str) else ("", "", "")
    if colon and all(part.isascii() and part.isdigit() and int(part) < 2**32 - 1 for part in (uid, gid)):
        return f"{int(uid)}:{int(gid)}"
    raise UsageError(f"--run-as must be root, user or UID:GID, not {plain(value)}")


UNSANDBOXED = Sandbox()  # what a trial created before sandboxes existed holds: nothing


def split(overrides: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """(the limits, the sandbox settings) of one overrides dict."""
    limits = {name: value for name, value in overrides.items() if name not in SETTINGS}
    settings = {name: value for name, value in overrides.items() if name in SETTINGS}
    return limits, settings


def checked(settings: Mapping[str, object]) -> Settings:
    """`settings` with their values checked (UsageError naming the flag); paths not yet resolved.

    Which backend takes which is the registry's to check (_backends.checked)."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise UsageError(f"unknown sandbox settings: {', '.join(sorted(unknown))}")
    checked = Settings()
    mode = settings.get("sandbox")
    if mode is not None:
        if not isinstance(mode, str):
            raise UsageError(f"--sandbox must name a backend, not {plain(mode)}")
        checked["sandbox"] = mode
    image = settings.get("image")
    if image is not None:
        if not isinstance(image, str) or not image or not image.isprintable():
            raise UsageError(f"--image must name an image, not {plain(image)}")
        checked["image"] = image
    network, allow = egress.checked(settings)
    if network is not None:
        checked["network"] = network
    if allow is not None:
        checked["allow"] = allow
    if settings.get("run_as") is not None:
        checked["run_as"] = run_as(settings["run_as"])
    home = settings.get("home")
    if home is not None:
        if not isinstance(home, str) or home not in HOMES:
            raise UsageError(f"--home must be one of {', '.join(HOMES)}, not {plain(home)}")
        checked["home"] = home
    workspace = settings.get("workspace")
    if workspace is not None:
        if not isinstance(workspace, str) or not workspace:
            raise UsageError(f"--workspace must be a directory, not {plain(workspace)}")
        checked["workspace"] = workspace
    writable = settings.get("writable")
    if writable is not None:
        if not isinstance(writable, list | tuple) or not all(isinstance(path, str) and path for path in writable):
            raise UsageError(f"--writable takes one path per use, not {plain(writable)}")
        checked["writable"] = tuple(writable)
    for name in ("origin", "search_path", "home_path"):
        value = settings.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise UsageError(f"the sandbox's {name} must be a path, not {plain(value)}")
            checked[name] = value
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


def paths(settings: Settings) -> tuple[str, tuple[str, ...]]:
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


def pinned_run_as(settings: Settings) -> str:
    """The `run_as` a new trial pins: as given (checked), else `default_run_as`."""
    return settings.get("run_as") or default_run_as()


def identity(path: str) -> Pin:
    """`path` (canonical) pinned by its device and inode."""
    info = os.stat(path)
    return Pin(path, info.st_dev, info.st_ino)


def check_pinned(pinned: Sandbox, settings: Settings) -> None:
    """Refuse settings passed now (checked) that differ from the pinned ones ("auto" accepts whatever was pinned)."""
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
        workspace, writable = paths(settings)
        if settings.get("workspace") is not None and workspace != pinned.workspace:
            _mismatch("workspace", workspace, pinned.workspace)
        if settings.get("writable") and writable != pinned.writable:
            _mismatch("writable", list(writable), list(pinned.writable))


def _mismatch(name: str, wanted: object, pinned: object) -> None:
    wanted, pinned = (" ".join(v) if isinstance(v, tuple) else v for v in (wanted, pinned))
    msg = f"{FLAG_OF[name]} {plain(wanted)} differs from the value {plain(pinned)} pinned when this trial was created"
    raise LimitMismatch(msg)


#: The fields every stored sandbox has; the others came later and may be missing.
_FIRST_FIELDS = frozenset({"mode", "network", "workspace", "writable"})


def parsed(data: dict[str, object]) -> Sandbox:
    """A stored sandbox's shared fields checked, and the whole as pinned; ValueError if malformed.

    The registry has already asked its backend about the fields of its own (Backend.stored).
    """
    if not _FIRST_FIELDS <= set(data) <= set(Sandbox._fields):
        raise ValueError("the sandbox is malformed")
    workspace, writable = data["workspace"], data["writable"]
    binary_fields, pin_fields, allow = data.get("binary"), data.get("pins") or [], data.get("allow", [])
    if (
        not isinstance(data["mode"], str)
        or data["network"] not in NETWORKS
        or not isinstance(workspace, str | None)
        or not isinstance(writable, list)
        or not all(isinstance(path, str) for path in writable)
        or not all(isinstance(data.get(name), str | None) for name in ("fallback", "home_path", *_OPTIONAL_FIELDS))
        or data.get("home", "host") not in HOMES
        or (data.get("home") == "trial" and not isinstance(data.get("home_path"), str))
        or not egress.stored(allow)
        or not isinstance(allow, list)
        or (data.get("run_as") is not None and not _ids(data["run_as"]))
        or not (binary_fields is None or isinstance(binary_fields, dict))
        or not isinstance(pin_fields, list)
        or not all(isinstance(pin, dict) for pin in pin_fields)
    ):
        raise ValueError("the sandbox is malformed")
    try:
        binary = None if binary_fields is None else Binary(**binary_fields)
        pins = tuple(Pin(**pin) for pin in pin_fields)
    except TypeError as exc:
        raise ValueError("the sandbox is malformed") from exc
    if (binary is not None and not _typed(binary, str, int)) or not all(_typed(pin, str, int) for pin in pins):
        raise ValueError("the sandbox is malformed")
    checked = {name: data[name] for name in ("mode", "network", *_LATER_FIELDS) if name in data}
    checked.update(workspace=workspace, writable=tuple(writable), binary=binary, pins=pins, allow=tuple(allow))
    # Every value is checked above; _make takes them in the fields' order.
    return Sandbox._make(checked.get(name, default) for name, default in Sandbox()._asdict().items())


#: Fields a backend pins only when it takes them (a container's image): left out of the state when None.
_OPTIONAL_FIELDS = ("image", "image_id", "run_as", "runtime", "platform")
_LATER_FIELDS = ("fallback", "home", "home_path", *_OPTIONAL_FIELDS)


def _ids(value: object) -> bool:
    try:
        return isinstance(value, str) and run_as(value) == value
    except UsageError:
        return False


def _typed(row: tuple[object, ...], first: type, rest: type) -> bool:
    return isinstance(row[0], first) and all(isinstance(v, rest) and not isinstance(v, bool) for v in row[1:])


__all__ = [
    "FLAG_OF",
    "NETWORKS",
    "OWNED_SETTINGS",
    "SETTINGS",
    "UNSANDBOXED",
    "Binary",
    "Pin",
    "Sandbox",
    "Settings",
    "check_pinned",
    "checked",
    "default_run_as",
    "identity",
    "parsed",
    "paths",
    "pinned_run_as",
    "run_as",
    "split",
]
