"""The bwrap backend: find and pin bubblewrap, build a call's command line, read back how it ended.

The view the command gets (docs/sandbox.md):

- the host's root read-only; a private /dev; a fresh /proc of a new pid
  namespace (no trial-tool process in it); an empty /run (no sockets of the
  host's daemons); the trial's own /tmp (a directory beside the state, kept
  across the trial's calls); the workspace and the writable paths bound
  read-write, each by the descriptor that checked it against its pin
  (_pinned.py);
- the trial's files, the per-user servers' directories and trial-tool's own
  files kept from it as _layout.py says;
- new user, ipc, uts, cgroup, pid and network namespaces (the network one
  shared back with --network host); no capabilities even as root; no nested
  user namespaces; a new session; killed if its supervisor dies;
- the trial's `run_as` uid and gid inside its user namespace (the caller's
  own outside: the files it makes are the caller's), and the system-call
  filter of _seccomp.py, so that none of them is setuid, setgid or a device.

bwrap itself is found, pinned and probed by _executable.py.

bwrap reports on a status descriptor: a JSON document with `exit-code` once
the command has run and ended. Without it, bwrap exited 1 because it could not
set the sandbox up, or could not execute the command ("bwrap: execvp ...").
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..errors import SandboxError, UsageError
from ..osio import plain
from . import _home as home
from . import _pinned as pinned
from . import _seccomp as seccomp
from . import _view as view
from ._base import Asked, CallAt, TrialFiles, Unavailable, nothing_kept, nothing_left
from ._base import Wrapped as Orders
from ._executable import ISOLATION, STATUS_FD, available, check_binary, probe, start_probe
from ._layout import Layout, inside, layout
from ._settings import Pin, Sandbox, Settings, identity, pinned_run_as

if TYPE_CHECKING:
    from ..types import CallRequest, Limits

#: No network by default; the host's when asked; or only what the allowlist names, through trial-tool's proxy.
NETWORKS = ("none", "host", "allow")
#: Who the command is, and whether its $HOME is a layer of the trial's own.
TAKES = frozenset({"run_as", "home"})
#: The first of the descriptors bwrap binds from (`--bind-fd`): the pinned paths, opened by the supervisor.
FIRST_BIND_FD = 4
#: Processes of bwrap's own in the command's tree: its monitor, and the pid namespace's init.
OWN_PROCESSES = 2
#: bwrap changes to the call's directory inside (--chdir), and sets the open-files limit there
#: (it cannot set a sandbox up within a small one).
SETS_DIRECTORY = True
SETS_OPEN_FILES = True
#: The supervisor sets the command's other resource limits.
LIMITS_INSIDE = False


def own(top: int, children: Callable[[int], list[int]]) -> set[int]:
    """bwrap's monitor (`top`) and its direct children (the pid namespace's init)."""
    return {top, *children(top)}


def stops(client: str, place: str | None, env: Mapping[str, str] | None) -> None:
    """A stop signals the tree here (sparing bwrap's own processes): nothing of the command is elsewhere."""
    return None


def pin(asked: Asked) -> Sandbox:
    """bwrap pinned where a tiny sandbox runs (Unavailable otherwise); the paths by identity, the home and user."""
    settings = asked.settings
    # Runs a tiny sandbox: only now, when a trial is created.
    binary, reason = available(asked.roots, settings.get("search_path"))
    if binary is None:
        raise Unavailable(reason or "bubblewrap cannot run here")
    pins = tuple(identity(path) for path in (asked.workspace, *asked.writable))
    home_mode, home_path = _home(settings, asked.roots)
    network, allow = settings.get("network") or NETWORKS[0], settings.get("allow") or ()
    return Sandbox(
        "bwrap",
        network,
        asked.workspace,
        asked.writable,
        binary,
        pins,
        home=home_mode,
        home_path=home_path,
        allow=allow,
        run_as=pinned_run_as(settings),
    )


def _home(settings: Settings, roots: Sequence[str]) -> tuple[str, str | None]:
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
    if any(inside(path, root) for root in roots):
        return "host", None
    return "trial", path


def stored(data: Mapping[str, object]) -> bool:
    """A bwrap trial has its workspace."""
    return isinstance(data.get("workspace"), str)


def session(sandbox: Sandbox, files: TrialFiles) -> Plan:
    return Plan(sandbox, files.state_path, list(files.secret), files.rank_file)


def ahead(sandbox: Sandbox) -> None:
    """Start the pinned bwrap's probe, so that its few ms overlap the ledger's work."""
    if sandbox.binary is not None:
        start_probe(sandbox.binary)


# Nothing is kept between calls: the trial's /tmp and home stay with its files.
close = nothing_kept
leftovers = nothing_left


class Wrapped(NamedTuple):
    """A call's bwrap command line, and the pinned paths its supervisor opens for it."""

    argv: list[str]
    #: (index in argv of a --bind-fd's descriptor argument, the path pinned there).
    binds: list[tuple[int, Pin]]


#: At one depth, the home layer goes on before what it hides and the paths a command may write.
_RANK = {"home": 0, "cover": 1, "blank": 2, "root": 3, "held": 4, "protected": 5, "masked": 6, "overmounted": 7}


def arguments(
    binary: str, sandbox: Sandbox, hide: Layout, tmp: Pin, cwd: str, argv: list[str], open_files: int = 0
) -> Wrapped:
    """The command line that runs `argv` in `sandbox`, with things kept from it as `hide` says.

    Every pinned path (the roots, the trial's /tmp `tmp`, its home layer) is bound
    from a descriptor the supervisor opens and checks just before it starts bwrap:
    the argv holds a placeholder (`{fd}`) at each index that `binds` names.
    `open_files` (the trial's --max-open-files) is set by a shell inside the
    sandbox, just before it becomes the command: bwrap cannot set a sandbox up
    within a small limit.
    """
    wrapped = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
    binds: list[tuple[int, Pin]] = []
    layer: home.Home | None = hide.home
    if layer is not None and layer.work is not None:
        # An overlay takes its directories by path: /proc/self/fd/N of descriptors the supervisor opened
        # and checked. bwrap closes only --bind-fd's, so these two are closed before the command starts.
        binds += [(-1, layer.layer), (-1, layer.work)]
    shut = [FIRST_BIND_FD + index for index in range(len(binds))]

    def bind_pinned(pin: Pin, destination: str) -> None:
        binds.append((len(wrapped) + 1, pin))
        wrapped.extend(["--bind-fd", "{fd}", destination])

    if sandbox.network == "host":
        resolver = os.path.realpath("/etc/resolv.conf")
        if inside(resolver, "/run") and os.path.exists(resolver):
            wrapped += ["--ro-bind", resolver, resolver]  # name resolution through a daemon's file
    # The trial's /tmp first: a workspace or a trial file under the host's /tmp is then
    # mounted on top of it (bwrap makes the mount points), not hidden under it.
    bind_pinned(tmp, "/tmp")
    # Shallow first: a directory covered inside another covered one is made in the outer tmpfs.
    for directory in sorted(hide.covered, key=len):
        wrapped += ["--tmpfs", directory]
    held = set(hide.held)
    if any(inside(tmp.path, root) for root in sandbox.roots):
        held.add(tmp.path)  # beside a state in the workspace: not to be renamed or replaced by a link
    pins = {pin.path: pin for pin in sandbox.pins}
    # Every mount inside the writable paths in one order, parents before children: a later
    # bind of a parent would cover what was mounted below it.
    mounts = [(root, "root") for root in sandbox.roots]
    mounts += [(path, "held") for path in held] + [(path, "protected") for path in hide.protected]
    mounts += [(path, "masked") for path in hide.masked] + [(path, "overmounted") for path in hide.overmounted]
    if layer is not None:
        if any(inside(layer.layer.path, root) for root in sandbox.roots):
            mounts.append((os.path.dirname(layer.layer.path), "held"))
        # The home goes on at its depth, and what the sandbox hides below it is hidden again on top: an
        # overlay shows the host's files there, and a tmpfs gives the writable paths their mount points.
        mounts.append((layer.path, "home"))
        for path in layer.hidden:
            if any(inside(path, root) for root in sandbox.roots):
                continue  # what a writable path shows is its own, hidden there already
            if os.path.isdir(path):
                mounts.append((path, "cover"))
            elif layer.kind == "overlay" and os.path.lexists(path):
                mounts.append((path, "blank"))
        if layer.kind == "directory":
            _view(wrapped, layer)
    for path, kind in sorted(set(mounts), key=lambda mount: (len(mount[0]), _RANK[mount[1]], mount[0])):
        if kind == "home" and shut:
            wrapped += ["--overlay-src", path, "--overlay", *(f"/proc/self/fd/{fd}" for fd in shut), path]
        elif kind == "home":
            bind_pinned(layer.layer, path)  # type: ignore[union-attr]
        elif kind == "cover":
            wrapped += ["--tmpfs", path]
        elif kind == "root":
            bind_pinned(pins[path], path)
        elif kind == "held":
            wrapped += ["--bind", path, path]
        elif kind == "protected":
            wrapped += ["--ro-bind", path, path]
        elif kind == "masked":
            wrapped += ["--tmpfs", path, "--remount-ro", path]
        else:
            # "overmounted", "blank": a device node on a nodev mount, which can be neither opened nor replaced.
            wrapped += ["--ro-bind", "/dev/null", path]
    covers = {path for path, kind in mounts if kind == "cover"}
    for directory in sorted({*hide.covered, *covers}):
        if layer is None or directory != layer.path:  # a covered home has the layer on top: writable
            wrapped += ["--remount-ro", directory]
    uid, gid = sandbox.ids
    wrapped += ["--chdir", cwd, *ISOLATION, "--uid", str(uid), "--gid", str(gid)]
    # The filter comes on the descriptor after the pinned paths' (`descriptors` makes it).
    wrapped += ["--seccomp", str(FIRST_BIND_FD + len(binds))]
    if sandbox.network == "host":
        wrapped.append("--share-net")
    elif sandbox.network == "allow":
        # The sandbox's own network, as for none; bwrap waits on the descriptor after the filter's
        # before it runs the command, while the supervisor opens the proxy's listener in it (sandbox/network/_netns.py).
        wrapped += ["--block-fd", str(FIRST_BIND_FD + len(binds) + 1)]
    prelude = "".join(f"exec {fd}<&-; " for fd in shut)
    if open_files:
        prelude += f"ulimit -n {open_files} && "
    if prelude:
        argv = ["/bin/sh", "-c", prelude + 'exec "$@"', "sh", *argv]
    wrapped += ["--json-status-fd", str(STATUS_FD), "--", *argv]
    return Wrapped(wrapped, binds)


def _view(wrapped: list[str], layer: home.Home) -> None:
    """The host's home read-only at home.VIEW, for a directory layer's links, with what the sandbox hides
    below the home hidden there too."""
    wrapped += ["--ro-bind", layer.path, home.VIEW]
    for path in sorted(layer.hidden, key=len):
        seen = home.VIEW + path[len(layer.path) :]
        if os.path.isdir(path):
            wrapped += ["--tmpfs", seen, "--remount-ro", seen]
        elif os.path.lexists(path):
            wrapped += ["--ro-bind", "/dev/null", seen]


def exit_code(status: bytes, returncode: int | None) -> int | None:
    """The command's exit code from bwrap's status documents, or None when the command never ran."""
    decoder = json.JSONDecoder()
    text = status.decode("utf-8", "replace")
    index = 0
    found = None
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return found
        try:
            document, index = decoder.raw_decode(text, index)
        except ValueError:
            return found
        if isinstance(document, dict) and isinstance(document.get("exit-code"), int):
            found = document["exit-code"]


def failure(stderr: bytes, returncode: int | None) -> tuple[str, str] | None:
    """Why bwrap ran nothing, from what it wrote: ("not_found" | "not_executable" | "sandbox", the reason).

    None unless bwrap exited 1, its own failure: killed by something else (out of memory), it is as it is.
    """
    if returncode != 1:
        return None
    text = stderr.decode("utf-8", "replace").rstrip("\n")
    # The command's name may hold any character but NUL, line breaks too (str.splitlines's U+0085, "\n"):
    # bwrap's last message starts a line, and its reason follows the message's last ": ".
    start = text.rfind("bwrap: execvp ")
    if start >= 0 and (start == 0 or text[start - 1] == "\n"):
        reason = text.rpartition(": ")[2]
        return ("not_found" if reason == os.strerror(2) else "not_executable"), reason
    lines = text.split("\n")
    return "sandbox", lines[-1] or "bwrap exited without a word"


class Plan:
    """One trial's sandbox as its calls use it: what is kept from the command, its /tmp, bwrap itself."""

    def __init__(self, sandbox: Sandbox, state_path: str, files: list[str], rank_file: str | None = None) -> None:
        if sandbox.binary is None or len(sandbox.pins) != len(sandbox.roots):
            msg = (
                "this trial was created by an older trial-tool, without its sandbox pinned by identity; "
                "create a new trial"
            )
            raise SandboxError(msg)
        self.sandbox = sandbox
        self.binary = sandbox.binary
        self.state_path = state_path
        self.files = files
        self.rank_file = rank_file
        #: Where trial files are kept: fixed for the trial (`exposed` decides how its calls are scheduled).
        self.layout = layout(sandbox.roots, files)

    #: The log must exist before bwrap starts, to be hidden when it sits in a writable path.
    hides_files = True

    @property
    def one_at_a_time(self) -> bool:
        """With the trial's files inside a writable path, its calls run one at a time."""
        return self.layout.exposed

    def prepare(self, call: CallAt) -> _Call:
        """`check` for one call: its /tmp and layout, and how its command line is made."""
        request = call.request
        cwd = request.cwd or os.getcwd()
        tmp, hide = self.check(cwd, call.trial_id, request.environ, request.read_only, request.caller_imports)
        return _Call(self, tmp, hide)

    def check(
        self,
        cwd: str,
        trial_id: str,
        environ: Mapping[str, str] | None = None,
        read_only: Sequence[str] = (),
        caller: tuple[str, ...] = (),
    ) -> tuple[Pin, Layout]:
        """Before the call is charged: the trial's /tmp (made if need be), and the call's layout.

        SandboxError if the pinned bwrap changed or cannot run here, or a pinned path
        was moved or replaced; UsageError if `cwd` is hidden in the sandbox.
        """
        check_binary(self.binary)
        reason = probe(self.binary)
        if reason is not None:
            raise SandboxError(f"this trial runs its commands in the bwrap sandbox, which cannot run here: {reason}")
        pinned.check(self.sandbox.pins)
        roots = self.sandbox.roots
        hide = view.hidden(roots, self.files, self.rank_file, environ, read_only, caller)
        real = os.path.realpath(cwd)
        if any(inside(real, directory) for directory in hide.covered) and not any(inside(real, root) for root in roots):
            msg = f"the call's directory {plain(cwd)} is hidden in the sandbox (it holds the trial's files)"
            raise UsageError(msg)
        tmp = tmp_directory(self.state_path, trial_id)
        home_path = self.sandbox.home_path
        if self.sandbox.home == "trial" and isinstance(home_path, str):
            secret = (*hide.covered, *hide.masked, *hide.overmounted, *self.files)
            try:
                made = home.layer(self.state_path, trial_id, home_path, self.binary, roots, secret)
            except OSError as exc:
                msg = f"the trial's sandbox home cannot be made: {exc.strerror or exc}"
                raise SandboxError(msg) from exc
            hide = hide._replace(home=made)
        return tmp, hide

    def wrap(self, argv: list[str], cwd: str, tmp: Pin, hide: Layout, open_files: int = 0) -> Wrapped:
        """The bwrap command line that runs `argv` in `cwd`, with `tmp` and `hide` from `check`."""
        present = hide._replace(overmounted=tuple(name for name in hide.overmounted if os.path.lexists(name)))
        return arguments(self.binary.path, self.sandbox, present, tmp, cwd, argv, open_files)


class _Call:
    """One call, checked: its bwrap command line, and (network "allow") the proxy's orders."""

    def __init__(self, plan: Plan, tmp: Pin, hide: Layout) -> None:
        self.plan, self.tmp, self.hide = plan, tmp, hide

    def wrap(self, request: CallRequest, env: dict[str, str] | None, limits: Limits) -> Orders:
        sandbox = self.plan.sandbox
        cwd = request.cwd or os.getcwd()
        argv, pins = self.plan.wrap(list(request.argv), cwd, self.tmp, self.hide, limits.max_open_files)
        binds = tuple((index, *pin) for index, pin in pins)
        if sandbox.network != "allow":
            return Orders(argv, env, binds)
        from .network import environment  # the proxy's modules: only for a call that needs them

        return Orders(argv, {**(env or {}), **environment(sandbox.allow)}, binds, egress=sandbox.allow)

    def where(self) -> None:
        return None


def descriptors(argv: Sequence[str], binds: Sequence[tuple[int, str, int, int]]) -> tuple[list[str], list[int]]:
    """`argv` with each pinned bind's descriptor number in place, and those descriptors, in order,
    then the system-call filter's (a pipe holding the program) where bwrap's options ask for it.

    Opened in the supervisor, a moment before bwrap starts, and checked against the
    pins; bwrap binds the very directory checked, and closes the descriptor before
    the command runs.
    """
    argv = list(argv)
    fds: list[int] = []
    try:
        for index, path, device, inode in binds:
            fds.append(pinned.open_pinned(Pin(path, device, inode)))
            if index >= 0:  # else named as /proc/self/fd/N where bwrap takes a path (an overlay's)
                argv[index] = argv[index].replace("{fd}", str(FIRST_BIND_FD + len(fds) - 1))
        # Only bwrap's own options (a bwrap call always binds its /tmp): the command's words come after "--".
        if binds and "--seccomp" in argv[: argv.index("--") if "--" in argv else len(argv)]:
            fds.append(_filter())
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return argv, fds


def _filter() -> int:
    """A pipe's read end holding the filter's program, written whole (it is far smaller than a pipe holds)."""
    try:
        program = seccomp.program()
    except seccomp.Unsupported as exc:
        raise SandboxError(f"the sandbox cannot run here: {exc}") from exc
    read, write = os.pipe()
    try:
        os.write(write, program)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return read


def tmp_directory(state_path: str, trial_id: str) -> Pin:
    """The trial's own /tmp: a directory beside its state, made (0700) on first use, never a symlink; pinned.

    Checked before every call, and bound from the descriptor the check opened: in
    a trial whose state sits in its workspace the directory is reachable by the
    command (bound onto itself there, so that it cannot be renamed or replaced,
    but checked all the same).
    """
    directory, name = os.path.split(os.path.abspath(state_path))
    path = os.path.join(os.path.realpath(directory), f".{name}.sandbox-tmp-{trial_id}")
    return pinned.own_directory(path, "the trial's sandbox /tmp")[0]


__all__ = [
    "FIRST_BIND_FD",
    "LIMITS_INSIDE",
    "NETWORKS",
    "OWN_PROCESSES",
    "SETS_DIRECTORY",
    "SETS_OPEN_FILES",
    "STATUS_FD",
    "TAKES",
    "Plan",
    "Wrapped",
    "ahead",
    "arguments",
    "close",
    "descriptors",
    "exit_code",
    "failure",
    "leftovers",
    "own",
    "pin",
    "session",
    "stops",
    "stored",
    "tmp_directory",
]
