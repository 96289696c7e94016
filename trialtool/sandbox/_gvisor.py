"""The `gvisor` backend: the command on a kernel of its own, gVisor's, kept warm for the trial's calls.

bwrap and the containers leave the command on the host's kernel, where one bug
in a reachable system call is a way out. Under gVisor the command's system
calls are answered by gVisor's own kernel (the sentry, a process of its own on
the host, itself held to a few host calls); its files reach the host through
gVisor's gofer. The view is bwrap's (docs/sandbox.md): the host's root
read-only, a fresh /proc (gVisor's: only the sandbox's processes), /dev and
/run of its own, the trial's /tmp (beside its state), the workspace and the
writable paths read-write, and what _view.py says hidden, every capability
dropped, the trial's `run_as` as its user, no network unless the trial pinned
`host`.

One sandbox per trial (_runsc.py keeps it), made on the trial's first call
and kept: its first process only waits, and a call is `runsc exec` of a small
Python loader (`LOADER`, run by this very interpreter from the host's read-only
root, never from a file a command could write) that sets the trial's
per-process limits and the system-call filter of _seccomp.py, then becomes
the container backend's script (_container.SCRIPT): the command in its
directory, and when it ends, whatever it left killed. A stop signals inside
the sandbox with that script, as in a container. runsc applies an OCI spec's
filter to the sandbox's first process only, not to what `exec` starts: hence
the loader. A sandbox whose view a call would change (a server directory
made since, another caller's import path) is made again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from ..errors import SandboxError, UsageError
from ..osio import alive, plain, process_token
from . import _gvisorspec as gvspec
from . import _pinned as pinned
from . import _runsc as runsc
from . import _seccomp as seccomp
from . import _view as view
from ._base import Asked, CallAt, Leftover, TrialFiles, Unavailable, Wrapped, nothing_ahead, nothing_bound
from ._container import SCRIPT, Stops, name_of
from ._executable import check_binary, find
from ._handover import hand_over
from ._layout import inside, refuse_writable
from ._settings import Binary, Sandbox, identity

if TYPE_CHECKING:
    from ..types import CallRequest, Limits

#: No network; the host's, through gVisor's own network stack; or only what the allowlist names, through
#: trial-tool's proxy, which the sandbox reaches by a unix socket bound in (_gvisorspec.FORWARDER).
NETWORKS = ("none", "host", "allow")
#: Who the command is.
TAKES = frozenset({"run_as"})
#: runsc's exec is all there is of the command on this side: a stop signals inside the sandbox.
OWN_PROCESSES = 0
#: runsc's exec states the command's pid in the sandbox once it started, on this descriptor (its
#: `--internal-pid-file`): its exit status is the command's only then.
STATUS_FD = 3
#: The script changes to the call's directory inside; the loader sets the per-process limits there.
SETS_DIRECTORY = True
SETS_OPEN_FILES = True
LIMITS_INSIDE = True


#: What a runsc that ran a tiny sandbox in this process says of itself, and the platform chosen, by its
#: identity (path, inode, size, mtime: an upgrade is asked again). Only a "yes" is kept, as for bwrap.
_WORKS: dict[Binary, tuple[runsc.Facts, str]] = {}


def own(top: int, children: Callable[[int], list[int]]) -> set[int]:
    """runsc's exec is all there is of the command on this side."""
    return {top}


def stops(client: str, place: str | None, env: Mapping[str, str] | None) -> Stops | None:
    """A call's stops, signalled inside its sandbox by the container backend's script."""
    return None if place is None else Stops([client, "--root", runsc.ROOT, "exec", place], env)


def exit_code(status: bytes, returncode: int | None) -> int | None:
    """runsc's exit status is the command's once runsc stated the command's pid in the sandbox (on
    `STATUS_FD`): without it, the command never started, whatever the status (runsc's own is 128)."""
    return returncode if status.strip().isdigit() else None


def failure(stderr: bytes, returncode: int | None) -> tuple[str, str]:
    """Why runsc started nothing: its own failure (the sandbox gone, the loader refused), in its words."""
    return "sandbox", runsc.said(stderr)


def pin(asked: Asked) -> Sandbox:
    """runsc pinned, its version and the platform chosen here, after a tiny sandbox ran; Unavailable otherwise."""
    settings = asked.settings
    network = settings.get("network") or NETWORKS[0]
    if network not in NETWORKS:
        msg = f"--network {network} cannot hold under gVisor: it has {' or '.join(NETWORKS)} (docs/sandbox.md)"
        raise UsageError(msg)
    if not sys.platform.startswith("linux"):
        raise Unavailable("gVisor runs on Linux only")
    if os.geteuid() != 0:
        raise Unavailable("trial-tool runs gVisor's sandboxes as root only (runsc's rootless mode is not offered)")
    binary, reason = find(asked.roots, settings.get("search_path"), ("runsc",), "gVisor is not installed (runsc)")
    if binary is None:
        raise Unavailable(reason or "gVisor is not installed")
    known = _WORKS.get(binary)
    if known is None:
        try:
            facts = runsc.facts(binary)
            chosen = runsc.platform(facts.platforms)
            if chosen is None:
                raise Unavailable(f"runsc {facts.version} has none of the platforms {', '.join(runsc.PLATFORMS)}")
            why = probe(binary, chosen)
        except SandboxError as exc:
            raise Unavailable(exc.message) from None
        if why is not None:
            raise Unavailable(why)
        known = _WORKS[binary] = (facts, chosen)
    facts, chosen = known
    pins = tuple(identity(path) for path in (asked.workspace, *asked.writable))
    return Sandbox(
        "gvisor",
        network,
        asked.workspace,
        asked.writable,
        binary,
        pins,
        # The caller's own ids by default: over the host's root, the directories above the workspace
        # are the host's, and another uid (65534) could not reach a workspace under /root.
        run_as=settings.get("run_as") or f"{os.geteuid()}:{os.getegid()}",
        allow=settings.get("allow") or (),
        runtime=f"runsc {facts.version}",
        platform=chosen,
    )


def _flags(platform: str | None, network: str) -> list[str]:
    flags = [f"--platform={platform or 'ptrace'}", f"--network={'host' if network == 'host' else 'none'}"]
    # "allow": the forwarder inside connects to the proxy's socket on the host, through the gofer.
    return [*flags, "--host-uds=open"] if network == "allow" else flags


def probe(binary: Binary, platform: str) -> str | None:
    """Why gVisor cannot run a sandbox here, in runsc's words; None when a tiny one ran `/bin/true`."""
    container = f"trialtool-probe-{os.getpid()}"
    spec = gvspec.spec(["/bin/true"], (0, 0), [], {})
    runsc.state_directory()
    try:
        why = runsc.start(binary, container, spec, _flags(platform, "none"), detach=False)
    finally:
        runsc.delete(binary, container)
    return None if why is None else f"gVisor cannot run a sandbox here: {why}"


def stored(data: Mapping[str, object]) -> bool:
    """A gVisor trial has its workspace, its runtime and its platform."""
    return all(isinstance(data.get(name), str) for name in ("workspace", "runtime", "platform"))


def session(sandbox: Sandbox, files: TrialFiles) -> Kernel:
    return Kernel(sandbox, files)


# Nothing to start ahead: the sandbox is asked about under the lock, by its process's token.
ahead = nothing_ahead
# Nothing is bound by descriptor: the paths go to runsc by name, checked before the sandbox starts.
descriptors = nothing_bound


def close(sandbox: Sandbox, trial_id: str) -> bool:
    """End the trial's sandbox, through its own pinned runsc."""
    if sandbox.binary is None:
        return False
    check_binary(sandbox.binary)
    return runsc.delete(sandbox.binary, name_of(trial_id))


def leftovers() -> list[Leftover]:
    """The sandboxes trial-tool made, through the runsc on PATH ([] where there is none)."""
    import functools

    binary, _ = find((), None, ("runsc",))
    if binary is None:
        return []
    found = []
    for container in runsc.listed(binary):
        spec = runsc.made_from(container) or {}
        notes = spec.get("annotations")
        notes = notes if isinstance(notes, dict) else {}
        trial_id = notes.get("trialtool.trial")
        if isinstance(trial_id, str) and container == name_of(trial_id):
            state, log = str(notes.get("trialtool.state", "")), str(notes.get("trialtool.log", ""))
            found.append(Leftover(container, trial_id, state, log, functools.partial(runsc.delete, binary, container)))
    return found


class _Running(NamedTuple):
    """The trial's sandbox as last found running: the spec it was made from, and its process on the host."""

    spec: dict[str, object]
    pid: int
    token: str


class Kernel:
    """One trial's gVisor sandbox as its calls use it: made when missing or when the call's view differs."""

    #: What runs in the sandbox besides its keeper must be the call's.
    one_at_a_time = True
    #: The trial's files are refused inside what is writable, and their directories covered.
    hides_files = False

    def __init__(self, sandbox: Sandbox, files: TrialFiles) -> None:
        if sandbox.binary is None or sandbox.workspace is None or len(sandbox.pins) != len(sandbox.roots):
            raise SandboxError("this trial's gVisor settings are incomplete; create a new trial")
        refuse_writable(files.secret, sandbox.roots, "its gVisor sandbox")
        if any(inside(runsc.ROOT, root) or inside(root, runsc.ROOT) for root in sandbox.roots):
            raise UsageError(f"gVisor's state directory {runsc.ROOT} cannot be in or around a writable path")
        self.sandbox, self.binary, self.files = sandbox, sandbox.binary, files
        self._running: _Running | None = None

    def prepare(self, call: CallAt) -> _Call:
        """The trial's sandbox, running with the view this call needs."""
        check_binary(self.binary)
        uid, gid = self.sandbox.ids
        if uid != 0:
            try:
                hand_over(self.sandbox.pins, uid, gid)  # a root harness's files, for the command to write
            except OSError as exc:
                raise SandboxError(f"the workspace cannot be handed to uid {uid}: {exc.strerror or exc}") from exc
        pinned.check(self.sandbox.pins)
        request = call.request
        hide = view.hidden(
            self.sandbox.roots,
            list(self.files.secret),
            self.files.rank_file,
            request.environ,
            request.read_only,
            request.caller_imports,
        )
        real = os.path.realpath(request.cwd or os.getcwd())
        if any(inside(real, d) for d in hide.covered) and not any(inside(real, r) for r in self.sandbox.roots):
            raise UsageError(
                f"the call's directory {plain(real)} is hidden in the sandbox (it holds the trial's files)"
            )
        notes = {
            "trialtool.trial": call.trial_id,
            "trialtool.state": os.path.abspath(self.files.state_path),
            "trialtool.log": os.path.abspath(self.files.log_path),
        }
        mounts = gvspec.mounts(self.sandbox, hide)
        keeper = gvspec.KEEPER
        if self.sandbox.network == "allow":
            from .network import ADDRESS, PORT

            net = _net_directory(call.trial_id)
            mounts.append({"destination": gvspec.NET, "type": "bind", "source": net, "options": ["rbind", "ro"]})
            forwarder = [gvspec.FORWARDER, f"{gvspec.NET}/proxy.sock", ADDRESS, str(PORT)]
            keeper = [gvspec.interpreter(uid), "-I", "-S", "-B", "-c", *forwarder]
        spec = gvspec.spec(keeper, (uid, gid), mounts, notes, self.sandbox.network)
        if call.limits.max_memory:
            spec["linux"] = {**spec["linux"], "resources": {"memory": {"limit": call.limits.max_memory}}}  # type: ignore[dict-item]
        return _Call(self, call.trial_id, self._ready(call.trial_id, spec, call.calls))

    def _ready(self, trial_id: str, spec: dict[str, object], calls: int) -> str | None:
        """The sandbox running from `spec`: None when it was, else why it was made now."""
        container = name_of(trial_id)
        running = self._running
        if running is not None and running.spec == spec and alive(running.pid, running.token):
            return None
        self._running = None
        word, pid = runsc.status(self.binary, container)
        if pid is not None and runsc.made_from(container) == spec:
            self._remember(spec, pid)
            return None
        if pid is not None:
            made = "the call's view differs from the sandbox's"
        elif word is not None:
            made = "the trial's sandbox had stopped"
        else:
            made = "the trial's first call" if calls == 0 else "the trial's sandbox was gone"
        runsc.delete(self.binary, container)
        if self.sandbox.network == "allow":
            _net_directory(trial_id)  # made again: the delete took the last sandbox's
        why = runsc.start(self.binary, container, spec, _flags(self.sandbox.platform, self.sandbox.network))
        if why is not None:
            raise SandboxError(f"the trial's gVisor sandbox cannot be started: {why}")
        _, pid = runsc.status(self.binary, container)
        if pid is None:
            raise SandboxError("the trial's gVisor sandbox stopped as soon as it started")
        self._remember(spec, pid)
        return made

    def _remember(self, spec: dict[str, object], pid: int) -> None:
        token = process_token(pid)
        if token is not None:
            self._running = _Running(spec, pid, token)


def _net_directory(trial_id: str) -> str:
    """The host directory of the trial's proxy socket, beside its bundle (0755: the sandbox's user reaches it there)."""
    runsc.state_directory()
    path = os.path.join(runsc.ROOT, "net", name_of(trial_id))
    pinned.own_directory(os.path.join(runsc.ROOT, "net"), "gVisor's network directory")
    pinned.own_directory(path, "the trial's proxy directory")
    os.chmod(path, 0o755)
    return path


class _Call:
    """One call in the trial's sandbox: `runsc exec` of the loader, and what its record says of the sandbox."""

    def __init__(self, kernel: Kernel, trial_id: str, made: str | None) -> None:
        self.kernel, self.container, self.made = kernel, name_of(trial_id), made

    def wrap(self, request: CallRequest, env: dict[str, str] | None, limits: Limits) -> Wrapped:
        sandbox = self.kernel.sandbox
        cwd = request.cwd or os.getcwd()
        cwd = cwd if any(inside(os.path.realpath(cwd), root) for root in sandbox.roots) else os.path.realpath(cwd)
        variables = dict(os.environ if env is None else env)
        socket_path = None
        if sandbox.network == "allow":
            from .network import environment  # the proxy's modules: only for a call that needs them

            variables.update(environment(sandbox.allow))
            # Made by the call's check (and again with each new sandbox): here only named.
            socket_path = os.path.join(runsc.ROOT, "net", self.container, "proxy.sock")
        argv = [self.kernel.binary.path, "--root", runsc.ROOT, "exec", "--user", "{}:{}".format(*sandbox.ids)]
        argv += ["--internal-pid-file", f"/dev/fd/{STATUS_FD}"]
        for name, value in variables.items():
            argv += ["--env", f"{name}={value}"]
        try:
            program = seccomp.program().hex()
        except seccomp.Unsupported as exc:
            raise SandboxError(f"the gVisor sandbox cannot run here: {exc}") from exc
        loader = [gvspec.LOADER, program, gvspec.limits_of(limits)]
        argv += [self.container, gvspec.interpreter(sandbox.ids[0]), "-I", "-S", "-B", "-c", *loader]
        argv += ["/bin/sh", "-c", SCRIPT, "sh", "run", cwd, " ".join(request.unset_env), *request.argv]
        egress = sandbox.allow if socket_path is not None else None
        return Wrapped(argv, dict(runsc.ENV), place=self.container, egress=egress, egress_socket=socket_path)

    def where(self) -> dict[str, object]:
        sandbox = self.kernel.sandbox
        return {
            "name": self.container,
            "runtime": sandbox.runtime,
            "platform": sandbox.platform,
            # Why the sandbox was made for this call (the trial's first, the last one gone); None: it ran.
            "made": self.made,
        }


__all__ = [
    "LIMITS_INSIDE",
    "NETWORKS",
    "OWN_PROCESSES",
    "SETS_DIRECTORY",
    "SETS_OPEN_FILES",
    "STATUS_FD",
    "TAKES",
    "Kernel",
    "ahead",
    "close",
    "descriptors",
    "exit_code",
    "failure",
    "leftovers",
    "own",
    "pin",
    "probe",
    "session",
    "stops",
    "stored",
]
