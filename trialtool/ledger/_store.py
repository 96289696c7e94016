"""The state file and the audit log as one consistent pair: read checked, mended after a crash, written in step.

The ledger (_ledger.py) holds the lock around every use of a `Store`. Each
locked step appends at most one record and then replaces the state, so a crash
leaves the log at most one record ahead of the state, or with a torn last line:
`open` rolls that record forward, or cuts the torn line off and logs the
repair. Anything else that disagrees fails closed.

Durability: every record is fsynced before its state is replaced, and every
state's bytes are fsynced before the rename; the directory is fsynced only when
the trial is created or mended, not on each call. After a power loss, then, the
log holds every call whose output was delivered, and the state is its last
version or the one before; the next `open` rolls the log's last record forward.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from .. import sandbox
from ..errors import StateError, UsageError
from ..types import Limits
from ..types import limits as limit_rules
from . import _audit as audit
from . import _clock as clock
from . import _durable as durable
from . import _labels as labels
from . import _mending as mending
from . import _records as records
from ._settings import Settings
from ._state import TrialState, check_against_log, decode, encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .. import signing


class Store:
    """One trial's state file and log, as this process last saw them."""

    def __init__(
        self,
        state_path: str,
        log_path: str,
        chain: audit.Chain,
        pin_sandbox: sandbox.PinSandbox | None = None,
        signing_key: signing.SigningKey | None = None,
        checkpoint_every: int | None = None,
    ) -> None:
        self.state_path = state_path
        self.log_path = log_path
        self.chain = chain
        #: What pins a new trial's sandbox on this machine (the sandbox room's `pin`); None: none can run.
        self.pin_sandbox = pin_sandbox
        #: A signed trial's key: each record is followed by a checkpoint (_attest.py). None: a reader's
        #: store (or an unsigned trial's), which signs nothing.
        self.signing_key = signing_key
        #: The cadence a new trial pins (None: every record); for an existing one, what it must have pinned.
        self.checkpoint_every = checkpoint_every

    def load(self) -> TrialState | None:
        """The validated state, or None when the trial does not exist yet."""
        raw = durable.read_bytes(self.state_path)
        return None if raw is None else decode(raw, self.state_path, self.chain)

    def write(self, state: TrialState, *, sync_directory: bool = False) -> None:
        # The log as it is now, under the lock, after this step's append and its space taken or
        # given back: the next open that finds it so knows it is the log this state was written against.
        state.log_stamp = durable.stamp(self.log_path)
        # The directory is not fsynced after a call's writes (see "Durability" in the
        # module docstring): the log is, and a state one step behind it is mended.
        durable.atomic_write(self.state_path, encode(state, self.chain), sync_directory=sync_directory)

    def append(self, state: TrialState, record: records.Record, *, claim: bool = False) -> None:
        """Append `record`, bound to this trial and stating the totals of `state` (already updated for it)."""
        record["trial_id"] = state.trial_id
        record["record"] = state.log.records + 1
        if record.get("record_type") in (records.RECORD_TYPE, records.GRADING):
            record["sandbox"] = state.sandbox.mode  # type: ignore[typeddict-unknown-key]  # a call's, by its type
        record["ledger_after"] = state.totals().as_json()
        state.log = audit.append(self.log_path, record, state.log, self.chain, claim=claim)
        if self.signing_key is not None and state.signer == self.signing_key.fingerprint:
            from . import _attest as attest  # a signed trial's only: an unsigned call loads none of it

            attest.checkpoint(state, self.signing_key)

    def check_signer(self, state: TrialState) -> None:
        """A signed trial is written only with its own key, an unsigned one with none (UsageError)."""
        key = self.signing_key
        if state.signer is None and key is not None:
            msg = f"trial {state.trial_id} was made without a signing key, and a signing key was given"
            raise UsageError(msg)
        if state.signer is not None and key is None:
            from ..signing import SIGNING_KEY_ENV

            msg = (
                f"trial {state.trial_id} is signed (key {state.signer[:16]}...): "
                f"pass its key (--signing-key or ${SIGNING_KEY_ENV})"
            )
            raise UsageError(msg)
        if state.signer is not None and key is not None and key.fingerprint != state.signer:
            msg = f"trial {state.trial_id} is signed by key {state.signer[:16]}..., not by {key.fingerprint[:16]}..."
            raise UsageError(msg)
        if (
            self.checkpoint_every is not None
            and state.signer is not None
            and (state.checkpoint_every != self.checkpoint_every)
        ):
            msg = f"--checkpoint-every is {self.checkpoint_every}, but the trial pinned {state.checkpoint_every}"
            raise UsageError(msg)

    def claim(self, state: TrialState) -> None:
        """Bind the log to this trial with its first record, before the trial's first command runs.

        Written only if the log is still empty (audit.append's `claim`): of two trials
        given one log at once, the second is refused here, before anything ran, rather
        than after its command, when its record could no longer be kept.
        """
        pinned = state.sandbox.as_json()
        record = records.start(
            trial_id=state.trial_id,
            limits=state.limits._asdict(),
            # A container's image (by its id), a kernel's runtime and platform: the rules its calls run under.
            sandbox={
                name: pinned[name]
                for name in (
                    "mode",
                    "network",
                    "allow",
                    "workspace",
                    "writable",
                    "image",
                    "image_id",
                    "runtime",
                    "platform",
                )
                if name in pinned
            },
            labels=state.labels,
            at_utc=state.started_at_utc,
        )
        self.append(state, record, claim=True)

    def unchanged(self, state: TrialState) -> bool:
        """Whether the log is exactly as it was when `state` was written, and its last record states the
        state's totals: then there is nothing to walk and nothing to mend, in time that does not grow with the log.

        "Exactly": the same device, inode, size, mtime and ctime. Any write, cut,
        rename over or copy in changes one of them, and no unprivileged process can
        set a ctime back. The last record is read to hold the state to it, as a walk
        does (an edited or rolled-back state). What this cannot see is said in
        docs/integrity.md ("What each call checks").
        """
        head, stamp = state.log, state.log_stamp
        if stamp is None or stamp[2] != head.bytes:
            return False
        if head.records == 0:
            return durable.stamp(self.log_path) == stamp and state.totals() == records.Totals()
        found = durable.stamped_range(self.log_path, head.last_offset, head.bytes)
        if found is None or found[0] != stamp:
            return False
        return audit.states(found[1], state.trial_id, state.totals().as_json())

    def new_state(
        self, limits: Limits, pinned: sandbox.Sandbox = sandbox.UNSANDBOXED, given: dict[str, str] | None = None
    ) -> TrialState:
        """A new trial's state, refused over a log that already has records (or is not a plain file)."""
        durable.check_regular(self.log_path)
        if os.path.exists(self.log_path) and os.path.getsize(self.log_path) > 0:
            msg = (
                f"log {self.log_path} already has records but there is no state {self.state_path}: "
                "refusing to start a trial over another trial's log"
            )
            raise StateError(msg)
        key = self.signing_key
        return TrialState.new(
            limits,
            self.chain,
            pinned,
            given,
            os.path.abspath(self.log_path),
            signer=None if key is None else key.fingerprint,
            checkpoint_every=self.checkpoint_every or 1,
        )

    def open(self, settings: Settings | None, *, create: bool) -> TrialState:
        """The state, checked against its log (and mended after a crash), and against the `settings` a
        caller gave (None: none; a new trial pins them). Under the lock."""
        mending.sweep_temporaries(self.state_path)
        settings = settings or Settings.of()
        state = self.load()
        if state is None:
            if not create:
                msg = f"no trial at {self.state_path}: create it with `trial-tool init` or a first call"
                raise StateError(msg)
            given = None if settings.labels is None else dict(settings.labels)
            if self.pin_sandbox is None:
                pinned = sandbox.pin(settings.sandbox, here=False)
            else:
                pinned = self.pin_sandbox(settings.sandbox)
            return self.new_state(settings.limits, pinned, given)
        labels.check_pinned(state.labels, None if settings.labels is None else dict(settings.labels))
        limit_rules.check_given(state.limits, settings.limits, settings.given)
        sandbox.check_pinned(state.sandbox, settings.sandbox)
        if self.unchanged(state):
            return state  # otherwise the whole chain is walked, and the state held to its last record
        tail = audit.read_tail(self.log_path, state.log, self.chain)
        last: Mapping[str, object] | None = tail.last
        if tail.extra:
            last = self._mend(state, tail.extra) or last
        check_against_log(state, last, self.state_path)
        return state

    def _mend(self, state: TrialState, extra: bytes) -> Mapping[str, object] | None:
        """Bring state and log back into step after a crash; return the new last record, if any."""
        complete, _, torn = extra.rpartition(b"\n")
        if not complete and torn:
            # A torn append: the writer died mid-line. Cut it off and say so in the log.
            durable.truncate(self.log_path, state.log.bytes)
            repaired = records.repair(state.trial_id, torn, clock.utc(time.time()))
            self.append(state, repaired)
            self.write(state, sync_directory=True)
            return repaired
        lines = complete.split(b"\n") if complete else []
        if len(lines) == 1 and not torn:
            record = mending.roll_forward(state, lines[0], self.chain, self.log_path)
            self.write(state, sync_directory=True)
            return record
        msg = (
            f"log {self.log_path} has {len(lines)} records and {len(torn)} stray bytes the state does not know of: "
            "more than one crash can leave; run `trial-tool verify`"
        )
        raise StateError(msg)


__all__ = ["Store"]
