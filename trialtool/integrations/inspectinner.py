"""trialtool over another inspect sandbox: `TrialSandboxConfig(inner="docker", inner_config=...)`.

The inner sandbox (docker, k8s, local, any registered one) makes and cleans up
the sample's environments and runs each command; the trial stays on the
harness's side. Each exec is reserved in the sample's trial, run through the
inner sandbox's `exec` within the call's deadline, then clipped and committed
here (`Trial.acall_elsewhere`). The deadline stops the command's process
group inside: the command is run under `timeout -k GRACE SECONDS` (coreutils'
or busybox's, from the inner sandbox's image), which signals the group, and
the inner exec is given a timeout past it as a backstop. Where the inner
sandbox runs each sample in a container of its own (docker, k8s), a call
stopped at its deadline is followed by a sweep of that container
(`sweep_command`): what escaped the group (`setsid`) is killed too, the
sample's calls then running one at a time. `read_file` and
`write_file` pass through uncharged, as inspect's own plumbing does.
Loaded by inspectai.py only, with inspect installed.
"""

from __future__ import annotations

import math
import time
from typing import Any

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironment
from inspect_ai.util._sandbox._cli import SANDBOX_CLI
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

from .. import CallRequest, Ran, Trial, sweep_command

#: How long past the deadline and its grace the inner exec's own timeout waits for `timeout` to act.
_BACKSTOP = 10.0


def inner_type(name: str) -> type[SandboxEnvironment]:
    """The registered inspect sandbox `name`."""
    return registry_find_sandboxenv(name)


def deadline_wrapped(cmd: list[str], seconds: float, grace: float) -> list[str]:
    """`cmd` under `timeout`: SIGTERM to its process group at `seconds`, SIGKILL `grace` later."""
    if not math.isfinite(seconds):
        return list(cmd)
    return ["timeout", "-k", f"{max(grace, 0.1):.3f}", f"{max(seconds, 0.001):.3f}", *cmd]


async def run_inside(
    trial: Trial,
    inner: SandboxEnvironment,
    where: dict[str, Any],
    cmd: list[str],
    *,
    input: str | bytes | None,
    cwd: str | None,
    env: dict[str, str] | None,
    user: str | None,
    timeout: int | None,
    grading: bool,
    merge_output: bool,
    grace: float,
    sweep: bool,
) -> Any:
    """One exec as a call of `trial`, run by `inner`: the call's result (a `CallResult`).

    A tool's reply (inspect's own tools: JSON-RPC) is clipped inside its envelope, as in the local case.
    """
    data = input.encode() if isinstance(input, str) else input
    reply = "json-rpc" if cmd[:1] == [SANDBOX_CLI] else "text"
    request = CallRequest.of(
        list(cmd), input=data, timeout=timeout, grading=grading, merge_output=merge_output, reply=reply
    )

    async def run(seconds: float, cap: int) -> Ran:
        started = time.monotonic()
        wrapped = deadline_wrapped(cmd, seconds, grace)
        backstop = None if not math.isfinite(seconds) else math.ceil(seconds + grace + _BACKSTOP)
        command = ["sh", "-c", '"$@" 2>&1', "sh", *wrapped] if merge_output else wrapped
        try:
            done: ExecResult[str] = await inner.exec(
                command, input=input, cwd=cwd, env=env, user=user, timeout=backstop
            )
        except OutputLimitExceededError as exc:
            kept = (exc.truncated_output or "").encode()
            return Ran(1, kept, b"", "output_limit", where)
        except TimeoutError:
            await _swept(inner, sweep)
            return Ran(124, b"", b"", "deadline", where)
        elapsed = time.monotonic() - started
        # Past the deadline and failed: `timeout` stopped it (coreutils' says 124 or 137; busybox's, the signal's).
        stopped = elapsed >= seconds and done.returncode != 0
        if stopped:
            await _swept(inner, sweep)
        ended = "deadline" if stopped else "exited"
        return Ran(done.returncode, done.stdout.encode(), done.stderr.encode(), ended, where)

    return await trial.acall_elsewhere(request, run, one_at_a_time=sweep)


async def _swept(inner: SandboxEnvironment, sweep: bool) -> None:
    """What a stopped call left in the sample's container, killed (the sample's calls run one at a time)."""
    if not sweep:
        return
    try:
        await inner.exec(sweep_command(), timeout=30)
    except Exception:
        pass


__all__ = ["deadline_wrapped", "inner_type", "run_inside"]
