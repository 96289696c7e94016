"""What a call checks under the ledger's lock before it is charged; a check that fails charges nothing.

Its input within the trial's `max_stdin_bytes`; the o200k_base file there, with
the right hash; room on disk for its output's capture; and what the trial's
sandbox backend checks (sandbox/: for bwrap, bwrap and every pinned path as
pinned, the call's directory visible, the trial's /tmp and home made; for a
container, the trial's container running). The ledger runs these (`Ledger.reserve`'s
`preflight`) once it has read the trial's state, so that they see its pinned
limits and sandbox.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import NamedTuple

from .. import sandbox
from ..errors import StorageError, UsageError
from ..ledger import TrialState, durable
from ..osio import reserve
from ..output import tokens
from ..process import Launcher, Spec
from ..sandbox import UNSANDBOXED, Sandbox
from ..types import CallRequest, Limits


class Placed(NamedTuple):
    """Where a call ran: whether in a sandbox (its "not found" is then explained), and what its record says of it."""

    sandboxed: bool
    #: The record's `container`: the container that ran it (a container backend's word, Checked.where).
    container: dict[str, object] | None = None
    #: The record's `elsewhere`: where a harness ran it, as the harness said (Trial.acall_elsewhere).
    elsewhere: dict[str, object] | None = None


class Preflight:
    """One trial's checks before a call: its backend's session, the rank file it located."""

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
        self._sessions: dict[Sandbox, sandbox.Session] = {}
        #: The sandbox the last call's state pinned: what a warm call starts ahead.
        self.last: Sandbox | None = None

    def session(self, pinned: Sandbox) -> sandbox.Session:
        """The trial's sandbox as its calls use it, made by its backend once per pinned sandbox."""
        session = self._sessions.get(pinned)
        if session is None:
            path = self.state_path
            secret = (path, self.log_path, path + ".lock", *self.hidden_files)
            # The rank file as the call's check located it (check_rank_file, which runs first).
            files = sandbox.TrialFiles(path, self.log_path, secret, self.rank_path)
            session = self._sessions[pinned] = sandbox.backend(pinned.mode).session(pinned, files)
        return session

    def one_at_a_time(self, state: TrialState) -> bool:
        """Whether the trial's calls must run one at a time, as its backend says."""
        return self.session(state.sandbox).one_at_a_time

    def ahead(self) -> None:
        """Start what the call's check will wait on (a probe), before the lock: from the last call's
        pinned sandbox, or, on a process's first call, from the state read without the lock."""
        if self.last is None:
            sandbox.probe_ahead(self.state_path)
        else:
            sandbox.backend(self.last.mode).ahead(self.last)

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
    """One call's checks; after them, `checked` is its backend's word on how the command runs."""

    def __init__(self, preflight: Preflight, request: CallRequest, launcher: Launcher | None) -> None:
        self.preflight = preflight
        self.request = request
        self.launcher = launcher
        self.mode = UNSANDBOXED.mode
        self.checked: sandbox.Checked | None = None

    def spec(self, env: dict[str, str], started: float, deadline: float, limits: Limits) -> Spec:
        """The supervisor's orders for the checked call: its command as its backend runs it."""
        request = self.request
        assert self.checked is not None, "the call's checks ran"
        wrapped = self.checked.wrap(request, env, limits)
        return Spec(
            wrapped.argv,
            request.cwd,
            wrapped.env,
            started,
            deadline,
            limits,
            backend=self.mode,
            umask=request.umask,
            caller_rlimits=request.rlimits or (),
            stdin=request.stdin,
            merge=request.merge_output,
            binds=wrapped.binds,
            place=wrapped.place,
            egress=wrapped.egress,
            egress_socket=wrapped.egress_socket,
        )

    def placed(self) -> Placed:
        """Where the checked call ran, for its delivery and its record."""
        container = None if self.checked is None else self.checked.where()
        return Placed(self.mode != UNSANDBOXED.mode, container)

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
        self.checked = None
        self.mode = state.sandbox.mode
        self.preflight.last = state.sandbox
        session = self.preflight.session(state.sandbox)
        self.checked = session.prepare(sandbox.CallAt(state.trial_id, limits, state.calls, self.request))
        if session.hides_files:
            # The log must exist before the sandbox starts, to be hidden when it sits in a writable path.
            durable.touch(self.preflight.log_path)


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


__all__ = ["Checks", "Placed", "Preflight"]
