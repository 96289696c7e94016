"""`trial-tool close` and `trial-tool gc`: what a trial's backend keeps between its calls, ended.

A container trial's container lives from its first call until `close` removes
it (its files stay, and a later call starts a new one). `gc` removes, among
what every backend keeps for trials on this machine (the containers trial-tool
made, by their label), what belongs to a trial that is over: its state file is
gone or holds another trial, or its budget is spent. A trial whose state cannot
be read as this user (a keyed trial, say) is left alone.
"""

from __future__ import annotations

import os

from .. import Trial
from ..errors import TrialToolError
from .options import Arguments


def remove_container(trial: Trial) -> bool:
    """Stop and remove `trial`'s container (a container backend's), if it has one; whether it had.

    The trial's files stay; a later call starts a new container, and its record says so.
    """
    from .. import sandbox

    state = trial.status()
    return sandbox.backend(state.sandbox.mode).close(state.sandbox, state.trial_id)


def sweep_command() -> list[str]:
    """A command that kills every process in a container but the container's own (its init's session).

    For a harness whose own sandbox runs a trial's commands in a container (`Trial.acall_elsewhere`):
    run it there after a call stopped at its deadline, with the trial's calls one at a time, and nothing
    the call started is left. It needs /bin/sh and /proc, nothing else. Never run it on a host.
    """
    from .. import sandbox

    return sandbox.sweep_argv("KILL")


def close(args: Arguments) -> int:
    from .fromflags import trial_of

    trial = trial_of(args)
    trial_id = trial.status().trial_id
    if remove_container(trial):
        print(f"removed the container of trial {trial_id}")
    else:
        print(f"trial {trial_id} has no container")
    if trial.ledger.signing_key is not None:
        made = trial.attest("close")
        print(f"signed {made.records} records of the log: {made.path} (statement sha256 {made.sha256})")
    return 0


def gc(args: Arguments) -> int:
    from .. import sandbox

    for row in sandbox.BACKENDS.values():
        for left in row.leftovers():
            why = _over(left.trial_id, left.state_path, left.log_path)
            if why is not None:
                left.remove()
                print(f"removed {left.name}: {why}")
    return 0


def _over(trial_id: str, state_path: str, log_path: str) -> str | None:
    """Why the trial of a container is over, or None while it may call again."""
    if not state_path or not os.path.exists(state_path):
        return "its trial's state file is gone"
    try:
        trial = Trial(state_path, log_path)
        state = trial.status()
        spent = trial.budget().exhausted
    except TrialToolError:
        return None  # unreadable here (keyed, or being repaired): not ours to judge
    if state.trial_id != trial_id:
        return "its state file holds another trial now"
    return "its trial's budget is spent" if spent else None


__all__ = ["close", "gc", "remove_container", "sweep_command"]
