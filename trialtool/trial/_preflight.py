"""What a call checks under the ledger's lock before it is charged; a check that fails charges nothing.

Its input within the trial's `max_stdin_bytes`; the o200k_base file there, with
the right hash; room on disk for its output's capture; and, for a sandboxed
trial, bwrap and every pinned path as pinned, the call's directory visible,
the trial's /tmp and home made, or its container running. The ledger runs these (`Ledger.reserve`'s
`preflight`) once it has read the trial's state, so that they see its pinned
limits and sandbox.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any

from .. import sandbox as seam
from ..errors import StorageError, UsageError
from ..ledger import TrialState, durable
from ..osio import reserve
from ..output import tokens
from ..process import Launcher, Spec
from ..sandbox import Pin, Sandbox
from ..types import CallRequest, Limits


class Preflight:
    """One trial's checks before a call: the sandbox plans it made, the rank file it located."""

    def __init__(
        self, state_path: str, log_path: str, hidden_files: Sequence[str], rank_file: str | os.PathLike[str] | None
    ) -> None:
        self.state_path = state_path
        self.log_path = log_path
        #: Files a sandboxed command must not reach besides the state, log and lock (a key file).
        self.hidden_files = list(hidden_files)
        self.rank_file = rank_file
        #: The rank file as the last check located it (tokens.locate).
        self.rank_path: str | None = None
        self._plans: dict[Sandbox, seam.Plan] = {}
        self._containers: dict[Sandbox, seam.Container] = {}

    def plan(self, sandbox: Sandbox) -> seam.Plan:
        """The trial's sandbox plan (where its files are hidden), made once per pinned sandbox."""
        plan = self._plans.get(sandbox)
        if plan is None:
            path = self.state_path
            files = [path, self.log_path, path + ".lock", *self.hidden_files]
            # The rank file as the call's check located it (check_rank_file, which runs first).
            plan = self._plans[sandbox] = seam.Plan(sandbox, path, files, self.rank_path)
        return plan

    def container(self, sandbox: Sandbox) -> seam.Container:
        """The trial's container as its calls use it (mode docker), made once per pinned sandbox."""
        container = self._containers.get(sandbox)
        if container is None:
            files = [self.state_path, self.log_path, self.state_path + ".lock", *self.hidden_files]
            container = self._containers[sandbox] = seam.Container(sandbox, self.state_path, self.log_path, files)
        return container

    def one_at_a_time(self, state: TrialState) -> bool:
        """Whether the trial's calls must run one at a time: in its container (what runs there besides
        the container's own is the call's), or with its files inside a writable path."""
        mode = state.sandbox.mode
        return mode == "docker" or (mode == "bwrap" and self.plan(state.sandbox).layout.exposed)

    def check_rank_file(self, state: TrialState) -> None:
        """The rank file is there and has the right hash, or nothing is charged.

        A file verified before is recognised by its stamp (tokens.stamp), kept in
        the state, rather than hashed on every call; a changed file is hashed again.
        """
        path = self.rank_path = tokens.locate(self.rank_file)
        seen = {"path": str(path), "stamp": tokens.stamp(path)}
        if state.rank_file != seen:
            tokens.verified(path, recheck=True)
            state.rank_file = seen

    def for_call(self, request: CallRequest, launcher: Launcher | None) -> Checks:
        """The checks of one call, run by the ledger with the trial's state."""
        return Checks(self, request, launcher)


class Checks:
    """One call's checks; after them, `sandboxed` holds its sandbox plan, /tmp and layout, if sandboxed."""

    def __init__(self, preflight: Preflight, request: CallRequest, launcher: Launcher | None) -> None:
        self.preflight = preflight
        self.request = request
        self.launcher = launcher
        self.sandboxed: tuple[seam.Plan, Pin, seam.Layout] | None = None
        #: Mode docker: the trial's container, running, and how a call runs in it.
        self.contained: tuple[seam.Container, seam.Started] | None = None

    def spec(self, env: dict[str, str], started: float, deadline: float, limits: Limits) -> Spec:
        """The supervisor's orders for the checked call: its command as its backend runs it."""
        request = self.request
        argv = list(request.argv)
        run_argv, binds, container, backend, egress = argv, [], None, "none", None
        cwd = request.cwd or os.getcwd()
        if self.contained is not None:
            # The command runs in the trial's container; the client runs here, with this process's environment.
            inside, started_in = self.contained
            run_argv = inside.argv(started_in, argv, cwd, request.env, request.unset_env, request.stdin is not None)
            env, container, backend = dict(os.environ), started_in.name, "docker"
        elif self.sandboxed is not None:
            plan, tmp, hide = self.sandboxed
            run_argv, pinned = plan.wrap(argv, cwd, tmp, hide, limits.max_open_files)
            binds, backend = [(index, *pin) for index, pin in pinned], plan.sandbox.mode
            if plan.sandbox.network == "allow":
                from ..sandbox.network import environment

                egress = plan.sandbox.allow
                env = {**env, **environment(egress)}
        return Spec(
            run_argv,
            request.cwd,
            env,
            started,
            deadline,
            limits,
            backend=backend,
            umask=request.umask,
            caller_rlimits=request.rlimits or (),
            stdin=request.stdin,
            merge=request.merge_output,
            binds=tuple(binds),
            container=container,
            egress=egress,
        )

    def container_record(self) -> dict[str, Any] | None:
        """What the call's record says of the container that ran it (mode docker), else None."""
        if self.contained is None:
            return None
        sandbox, started = self.contained[0].sandbox, self.contained[1]
        return {
            "container": {
                "name": started.name,
                "id": started.id,
                "image": sandbox.image,
                "image_id": sandbox.image_id,
                # Why a container was made for this call (the trial's first, the last one gone); None: it ran.
                "made": started.made,
            }
        }

    def __call__(self, state: TrialState) -> None:
        limits = state.limits
        stdin = self.request.stdin
        if stdin is not None and len(stdin) > limits.max_stdin_bytes:
            msg = (
                f"the input is {len(stdin)} bytes, over the trial's --max-stdin-bytes "
                f"{limits.max_stdin_bytes}; nothing ran and nothing is charged"
            )
            raise UsageError(msg)
        self.preflight.check_rank_file(state)
        _reserve_spools(self.launcher, limits.max_capture_bytes, self.request.merge_output)
        self.sandboxed = self.contained = None
        if state.sandbox.mode == "none":
            seam.settle()
            return
        if state.sandbox.mode == "docker":
            container = self.preflight.container(state.sandbox)
            self.contained = (container, container.ready(state.trial_id, limits, state.calls))
            return
        request = self.request
        plan = self.preflight.plan(state.sandbox)
        cwd = request.cwd or os.getcwd()
        tmp, hide = plan.check(cwd, state.trial_id, request.environ, request.read_only, request.caller_imports)
        # The log must exist before the sandbox starts, to be hidden when it sits in a writable path.
        durable.touch(self.preflight.log_path)
        self.sandboxed = (plan, tmp, hide)


def _reserve_spools(launcher: Launcher | None, capture_bytes: int, merged: bool) -> None:
    """Room for each stream's capture, taken before the call is charged: a command that
    fills the disk its spools are on cannot then cut its own capture short. A merged
    call's stderr spool stays empty: it needs none."""
    spools = () if launcher is None else launcher.spools or ()
    for fd in spools[:1] if merged else spools:
        try:
            reserve(fd, 0, capture_bytes)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                msg = f"cannot reserve {capture_bytes} bytes for the call's output beside the state: {exc.strerror}"
                raise StorageError(msg) from exc
            assert launcher is not None
            what = f"the call's output ({capture_bytes} bytes for each of {1 if merged else 2} streams)"
            needed = capture_bytes * (1 if merged else 2)
            raise StorageError.no_room(what, needed, launcher.spool_dir, capture_bytes) from None


__all__ = ["Checks", "Preflight"]
