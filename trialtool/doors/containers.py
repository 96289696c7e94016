"""`trial-tool close` and `trial-tool gc`: the containers of `--sandbox docker` trials, ended.

A trial's container lives from its first call until `close` removes it (its
files stay, and a later call starts a new one). `gc` removes, among the
containers trial-tool made (by their label), those whose trial is over: its
state file is gone or holds another trial, or its budget is spent. A trial
whose state cannot be read as this user (a keyed trial, say) is left alone.
"""

from __future__ import annotations

import os

from .. import Trial
from ..errors import TrialToolError
from .options import Arguments


def remove_container(trial: Trial) -> bool:
    """Stop and remove `trial`'s container (--sandbox docker), if it has one; whether it had.

    The trial's files stay; a later call starts a new container, and its record says so.
    """
    from .. import sandbox

    state = trial.status()
    pinned = state.sandbox
    if pinned.mode != "docker" or pinned.binary is None:
        return False
    # The trial's own client, pinned: checked, never looked up again.
    sandbox.docker.check_binary(pinned.binary)
    return sandbox.docker.remove(pinned.binary.path, sandbox.docker.name_of(state.trial_id))


def sweep_command() -> list[str]:
    """A command that kills every process in a container but the container's own (its init's session).

    For a harness whose own sandbox runs a trial's commands in a container (`Trial.acall_elsewhere`):
    run it there after a call stopped at its deadline, with the trial's calls one at a time, and nothing
    the call started is left. It needs /bin/sh and /proc, nothing else. Never run it on a host.
    """
    from .. import sandbox

    return sandbox.docker.sweep_argv("KILL")


def close(args: Arguments) -> int:
    from .fromflags import trial_of

    trial = trial_of(args)
    trial_id = trial.status().trial_id
    if remove_container(trial):
        print(f"removed the container of trial {trial_id}")
    else:
        print(f"trial {trial_id} has no container")
    return 0


def gc(args: Arguments) -> int:
    from .. import sandbox

    client = sandbox.docker.client()
    for name, trial_id, state_path, log_path in sandbox.docker.listed(client):
        why = _over(trial_id, state_path, log_path)
        if why is not None:
            sandbox.docker.remove(client, name)
            print(f"removed {name}: {why}")
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
