"""One trial's container: made from its pinned image on its first call, kept for its calls, one exec a call.

The container is made from the image pinned by its id when the trial was
created, on the trial's first call, and kept for its calls: the workspace and
writable paths bound in at their own paths, a /tmp of its own, no network
unless the trial pinned `host`, every capability dropped, no new privileges,
the trial's `run_as` id as its user, the system-call filter of _seccomp.py in
place of the engine's default one, and the trial's process, memory and per-process limits set on it. Its first
process is the engine's init (it reaps orphans) over a shell that only waits,
so that the container lives between calls.

A call is `exec` of this module's shell script, which runs the command
in the call's directory and, when it ends, kills whatever it left running in
the container. At a deadline or a stop the supervisor runs the script again to
signal the command's processes (TERM, then KILL after the grace), and once
more, when the call is over, to kill what is left. The calls of a trial in a
container run one at a time (its session's `one_at_a_time`), so that what
runs in the container besides its own two processes is the call's.

The script needs /bin/sh and /proc in the image, and nothing else: it reads
/proc with the shell's own `read`, and signals with its own `kill`. Every
engine's client takes the same commands here (docker's, podman's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..errors import SandboxError
from ..osio import alive, process_token
from ..types import Limits
from . import _engine as engine
from . import _seccomp as seccomp
from ._base import CallAt, Wrapped
from ._engine import LOG_LABEL, STATE_LABEL, TRIAL_LABEL, remove, said
from ._executable import check_binary
from ._handover import hand_over
from ._layout import inside, refuse_writable
from ._settings import Binary, Sandbox

if TYPE_CHECKING:
    import subprocess

    from ..types import CallRequest

#: How long the last sweep of a stopped call may take.
_SWEEP_TIMEOUT = 30.0

#: Run in the container, by /bin/sh. `run DIR UNSET CMD...`: the command, in DIR (empty: the image's
#: working directory), without the variables named in UNSET; then every process it left is killed.
#: `stop SIGNAL [spare]`: signal every process of the container but its init and keeper (session 1) and
#: this script itself; with `spare`, the calls' own shells too (started by the engine: parent 0), so
#: that a call's shell outlives its command's TERM.
SCRIPT = (
    # One line, so that the shell's own words for a command it cannot run are what `sh -c` would say.
    r"""if [ "$1" = run ]; then [ -z "$2" ] || cd -- "$2" 2>/dev/null || { """
    r"""echo "trial-tool: the call's directory $2 is not in the container" >&2; exit 126; }; """
    r"""for v in $3; do unset "$v"; done; shift 3; "$@"; s=$?; set -- run KILL all; fi
end() {
  r=0
  while [ "$r" -lt 10 ]; do
    n=0
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$p" = 1 ] || [ "$p" = "$$" ] && continue
      read -r l 2>/dev/null < "/proc/$p/stat" || continue
      set -- "$1" "$2" ${l##*) }
      [ "$3" = Z ] || [ "$6" = 1 ] && continue
      [ "$2" = spare ] && [ "$4" = 0 ] && continue
      kill -"$1" "$p" 2>/dev/null && n=$((n + 1))
    done
    [ "$1" = TERM ] || [ "$n" = 0 ] && break
    r=$((r + 1))
  done
}
end "$2" "$3"
exit "${s:-0}"
"""
)


class Started(NamedTuple):
    """The trial's container as a call found it: its name and id, and why it was made now (None: it was running)."""

    name: str
    #: The engine's whole id for it: a call's exec and stops name it by this, never by its name again.
    id: str
    made: str | None


class _Running(NamedTuple):
    """The trial's container as the engine last found it running and the trial's, and its first process then."""

    trial_id: str
    started: Started
    pid: int
    #: The first process's start-time token (osio.process_token): while that very process lives, so does
    #: the container it started.
    token: str


def _first_process(seen: engine.Seen) -> tuple[int, str] | None:
    """The container's first process as this machine numbers it, with its token: None unless /proc shows
    a process whose cgroup names the container (an engine in another pid namespace numbers its own)."""
    if seen.pid <= 0 or len(seen.id) < 64:
        return None
    token = process_token(seen.pid)
    try:
        with open(f"/proc/{seen.pid}/cgroup", "rb") as handle:
            named = seen.id.encode() in handle.read()
    except OSError:
        return None
    # The same token after the read: the cgroup read was that very process's.
    return (seen.pid, token) if named and token is not None and process_token(seen.pid) == token else None


def name_of(trial_id: str) -> str:
    """The name of a trial's container."""
    return f"trialtool-{trial_id}"


def client_run(
    binary: Binary, *args: str, timeout: float = 120.0, passed: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    """The pinned client run on `args`; SandboxError when it cannot be run or does not answer in time."""
    import subprocess

    try:
        return subprocess.run([binary.path, *args], capture_output=True, timeout=timeout, check=False, pass_fds=passed)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"the container client {binary.path} did not answer: {exc}") from exc


def _run(binary: Binary, options: list[str]) -> subprocess.CompletedProcess[bytes]:
    """`run` with the filter's profile, read by the client from a pipe of ours: no file anyone could replace."""
    import json

    try:
        profile = json.dumps(seccomp.profile()).encode()
    except seccomp.Unsupported as exc:
        raise SandboxError(f"the container cannot be started here: {exc}") from exc
    read, write = os.pipe()
    try:
        os.write(write, profile)  # a few KiB: far less than a pipe holds
        os.close(write)
        write = -1
        return client_run(binary, "run", "--security-opt", f"seccomp=/dev/fd/{read}", *options, passed=(read,))
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


class Container:
    """One trial's container as its calls use it: made when missing, checked in a millisecond when not."""

    def __init__(
        self, sandbox: Sandbox, state_path: str, log_path: str, files: Sequence[str], caller_limits: bool = False
    ) -> None:
        if sandbox.binary is None or sandbox.image_id is None or sandbox.workspace is None:
            raise SandboxError("this trial's container settings are incomplete; create a new trial")
        refuse_writable(files, sandbox.roots, "its container")
        self.sandbox = sandbox
        self.binary = sandbox.binary
        self.image_id = sandbox.image_id
        self.state_path = os.path.abspath(state_path)
        self.log_path = os.path.abspath(log_path)
        #: The container gets the caller's own open-files and process limits where the trial sets none.
        self.caller_limits = caller_limits
        self._running: _Running | None = None

    #: What runs in the container besides its own two processes must be the call's.
    one_at_a_time = True
    #: The trial's files are refused inside what is bound in: nothing of them is there to hide.
    hides_files = False

    def prepare(self, call: CallAt) -> _Call:
        """The trial's container, running, for the call."""
        return _Call(self, self.ready(call.trial_id, call.limits, call.calls))

    def ready(self, trial_id: str, limits: Limits, calls: int) -> Started:
        """The trial's container, running: the one there, or a new one (and why). SandboxError if none can be."""
        check_binary(self.binary)
        uid, gid = self.sandbox.ids
        if os.geteuid() == 0 and uid != 0:
            try:
                hand_over(self.sandbox.pins, uid, gid)  # a root harness's files, for the command to write
            except OSError as exc:
                raise SandboxError(f"the workspace cannot be handed to uid {uid}: {exc.strerror or exc}") from exc
        running = self._running
        if running is not None and running.trial_id == trial_id and alive(running.pid, running.token):
            # Its first process is the one the engine named: a container's image, labels and mounts
            # do not change while it runs, so the engine is not asked again (docs/containers.md).
            return running.started
        self._running = None
        name = name_of(trial_id)
        try:
            seen = engine.container(self.binary.path, name)
        except OSError as exc:
            raise SandboxError(f"the container engine cannot be reached: {exc}") from exc
        ours = seen is not None and seen.image == self.image_id and seen.labels.get(TRIAL_LABEL) == trial_id
        if seen is not None and seen.running and ours:
            started = Started(name, seen.id, None)
            first = _first_process(seen)
            if first is not None:
                self._running = _Running(trial_id, started, *first)
            return started
        if seen is None:
            made = "the trial's first call" if calls == 0 else "the trial's container was gone"
        else:
            made = "the trial's container had stopped" if ours else "the container by its name was not the trial's"
            remove(self.binary.path, name)  # stopped, or not the trial's: a new one in its place
        done = _run(self.binary, [*self.options(trial_id, limits), self.image_id])
        if done.returncode != 0:
            try:
                remove(self.binary.path, name)  # made but not started: nothing of it is left behind
            except SandboxError:
                pass  # the reason it did not start is the one to give
            msg = f"the trial's container cannot be started from image {self.sandbox.image}: {said(done.stderr)}"
            raise SandboxError(msg)
        return Started(name, done.stdout.decode().strip(), made)

    def options(self, trial_id: str, limits: Limits) -> list[str]:
        """`run`'s options for the trial's container."""
        sandbox = self.sandbox
        options = ["--detach", "--interactive", "--init", "--name", name_of(trial_id)]
        options += ["--label", f"{TRIAL_LABEL}={trial_id}", "--label", f"{STATE_LABEL}={self.state_path}"]
        options += ["--label", f"{LOG_LABEL}={self.log_path}"]
        options += ["--network", "none" if sandbox.network == "none" else "host"]
        options += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--tmpfs", "/tmp"]
        options += ["--user", "{}:{}".format(*sandbox.ids)]
        if limits.max_procs:
            options += ["--pids-limit", str(limits.max_procs + 2)]  # the init and its waiting shell
        if limits.max_memory:
            options += ["--memory", str(limits.max_memory), "--memory-swap", str(limits.max_memory)]
        if limits.max_cpu_seconds:
            soft = max(1, int(limits.max_cpu_seconds + 0.999))
            options += ["--ulimit", f"cpu={soft}:{soft + 1}"]
        if limits.max_file_size:
            options += ["--ulimit", f"fsize={limits.max_file_size}"]
        if limits.max_open_files:
            options += ["--ulimit", f"nofile={limits.max_open_files}:{limits.max_open_files}"]
        if self.caller_limits:
            options += _callers_limits(with_open_files=not limits.max_open_files)
        for path in sandbox.roots:
            options += ["--mount", f"type=bind,source={path},target={path}"]
        return [*options, "--entrypoint", "/bin/sh"]

    def argv(
        self,
        started: Started,
        command: Sequence[str],
        cwd: str,
        env: Mapping[str, str] | None,
        unset: Sequence[str],
        stdin: bool,
    ) -> list[str]:
        """The client's command line that runs `command` in the container, in `cwd`.

        The call's directory is the same path inside when it lies in the workspace or a writable path
        (bound at their own paths); anywhere else on the host means nothing in the image: the command
        then starts in the image's working directory.
        """
        cwd = cwd if any(inside(os.path.realpath(cwd), root) for root in self.sandbox.roots) else ""
        argv = [self.binary.path, "exec"]
        if stdin:
            argv.append("--interactive")
        for name, value in (env or {}).items():
            argv += ["--env", f"{name}={value}"]
        # By its id: what the engine found the trial's, not whatever holds its name by now.
        return [*argv, started.id, "/bin/sh", "-c", SCRIPT, "sh", "run", cwd, " ".join(unset), *command]


def _callers_limits(with_open_files: bool) -> list[str]:
    """`--ulimit`s of this process's own open-files and process limits (the latter no more than the pids there are).

    An engine that would otherwise raise them past what this process holds (podman raises both, as
    root) cannot start a container where raising a hard limit is not allowed; these are what a
    command gets under the other backends.
    """
    import resource

    try:
        with open("/proc/sys/kernel/pid_max", "rb") as handle:
            pids: int | None = int(handle.read())
    except (OSError, ValueError):
        pids = None
    wanted = [("nproc", resource.RLIMIT_NPROC, pids)]
    wanted += [("nofile", resource.RLIMIT_NOFILE, None)] if with_open_files else []
    options = []
    for name, which, ceiling in wanted:
        # RLIM_INFINITY is -1 here: unlimited is None, so that min() means what it says.
        soft, hard = (None if value == resource.RLIM_INFINITY else value for value in resource.getrlimit(which))
        hard = min((value for value in (hard, ceiling) if value is not None), default=None)
        if hard is not None:
            options += ["--ulimit", f"{name}={hard if soft is None else min(soft, hard)}:{hard}"]
    return options


class _Call:
    """One call in the trial's container: `exec` of the script there, and the container its record names."""

    def __init__(self, container: Container, started: Started) -> None:
        self.container, self.started = container, started

    def wrap(self, request: CallRequest, env: dict[str, str] | None, limits: Limits) -> Wrapped:
        # The command runs in the container, with `env`; the client runs here, with this process's environment.
        cwd = request.cwd or os.getcwd()
        argv = self.container.argv(
            self.started, list(request.argv), cwd, request.env, request.unset_env, request.stdin is not None
        )
        return Wrapped(argv, dict(os.environ), place=self.started.id)

    def where(self) -> dict[str, object]:
        sandbox, started = self.container.sandbox, self.started
        return {
            "name": started.name,
            "id": started.id[:12],
            "image": sandbox.image,
            "image_id": sandbox.image_id,
            # Why a container was made for this call (the trial's first, the last one gone); None: it ran.
            "made": started.made,
        }


def sweep_argv(signal_name: str = "KILL", spare_calls: bool = False) -> list[str]:
    """The command that, run in a container, signals every process there but the container's own."""
    return ["/bin/sh", "-c", SCRIPT, "sh", "stop", signal_name, "spare" if spare_calls else "all"]


def stop_argv(prefix: Sequence[str], signal_name: str, spare_calls: bool) -> list[str]:
    """The command line that signals the call's processes where `prefix` (the client's exec into one place) runs."""
    return [*prefix, *sweep_argv(signal_name, spare_calls)]


def signal_inside(prefix: Sequence[str], signal_name: str, env: Mapping[str, str] | None) -> int:
    """Start signalling the call's processes in the container; the pid of the client doing it (reap it)."""
    argv = stop_argv(prefix, signal_name, spare_calls=signal_name == "TERM")
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
        return os.posix_spawn(argv[0], argv, dict(env or os.environ), file_actions=actions, setsid=True)
    finally:
        os.close(devnull)


def sweep(prefix: Sequence[str], env: Mapping[str, str] | None) -> None:
    """Kill every process a stopped call left in the container, and wait until it is done."""
    import subprocess

    try:
        subprocess.run(
            stop_argv(prefix, "KILL", spare_calls=False),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(env or os.environ),
            timeout=_SWEEP_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        pass  # the engine is gone or wedged: the container's own limits still hold what is left


def stops(client: str, place: str | None, env: Mapping[str, str] | None) -> Stops | None:
    """A call's stops in its container (`client` is the pinned client its command line runs)."""
    return None if place is None else Stops([client, "exec", place], env)


class Stops:
    """A call's stops, carried out in its container: the supervisor's side of a deadline or a stop."""

    def __init__(self, prefix: Sequence[str], env: Mapping[str, str] | None) -> None:
        #: The client's command line that runs a command in the call's place (`exec` into its container).
        self.prefix, self.env = list(prefix), env
        self.pids: list[int] = []

    def signal(self, signal_name: str) -> None:
        """Signal the call's processes in the container (TERM spares the call's own shell); returns at once."""
        try:
            self.pids.append(signal_inside(self.prefix, signal_name, self.env))
        except OSError:
            pass  # the client is gone: the container's limits still hold, and `finish` tries again

    def finish(self) -> None:
        """After a stop: every process the call left in the container killed, and the signalling clients reaped."""
        if not self.pids:
            return  # the command ended by itself: its shell killed what it left
        sweep(self.prefix, self.env)
        for pid in self.pids:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            except ProcessLookupError:
                os.waitpid(pid, 0)


__all__ = [
    "SCRIPT",
    "Container",
    "Started",
    "Stops",
    "client_run",
    "name_of",
    "signal_inside",
    "stops",
    "sweep",
    "sweep_argv",
]
