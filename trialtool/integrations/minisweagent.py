"""mini-swe-agent's environment, with every command a call of a trial.

    environment:
      environment_class: trialtool.integrations.minisweagent.TrialEnvironment
      state: runs/t1/state.json
      log: runs/t1/log.jsonl
      limits: {max_calls: 50, max_tokens: 100000}

mini runs `/bin/sh` by absolute path, so a shim on PATH would budget only
nested shells; this environment takes the command itself. It keeps mini's
observation shape (`output`, `returncode`, `exception_info`) and its
submission check, and adds the trial's own account of the call under
`extra.trial_tool`. stdout and stderr reach the model merged, in the order
written, as mini's local environment shows them. A call refused because a
budget is spent ends the run as mini's own limits do: `LimitsExceeded` (or
`TimeExceeded` for the trial's time), with `on_exhausted: observe` making it
an observation instead. docs/minisweagent.md has a runnable example.
"""

from __future__ import annotations

import os
import shlex
from typing import Any, Literal

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig
from minisweagent.exceptions import LimitsExceeded, Submitted, TimeExceeded
from pydantic import Field

from .. import BudgetExhausted, Trial, TrialToolError, read_key_file, read_signing_key, remove_container, toolreply


class TrialEnvironmentConfig(LocalEnvironmentConfig):
    """mini's local settings (`cwd`, `env`, `timeout`: per call, it can only shorten the trial's) and the trial's."""

    #: The trial's state and log; the trial is created on the first call if it does not exist.
    state: str
    log: str
    #: Limits pinned when the trial is created (names as in `Trial`/`Limits`: max_calls, max_tokens, ...).
    limits: dict[str, Any] = Field(default_factory=dict)
    #: "raise": a spent budget ends the run (LimitsExceeded); "observe": the model reads the refusal.
    on_exhausted: Literal["raise", "observe"] = "raise"
    #: One stream, as mini shows it; False delivers stdout then stderr after a `[stderr]` line.
    merge_output: bool = True
    #: A file holding the ledger key (a keyed trial), hidden from sandboxed commands.
    key_file: str | None = None
    #: A file holding the trial's Ed25519 signing key (a signed trial), hidden from sandboxed commands:
    #: the trial is signed as it goes, and its statement when the agent submits or the budget is spent.
    signing_key: str | None = None
    #: Who the trial is (task, sample, epoch, model, ...): pinned at creation; the run script
    #: that knows the instance sets them (mini's environment config does not know it).
    labels: dict[str, str] = Field(default_factory=dict)


class TrialEnvironment(LocalEnvironment):
    """`LocalEnvironment` with each `execute` run through a `Trial` (budgeted, contained, recorded)."""

    def __init__(self, *, config_class: type = TrialEnvironmentConfig, **kwargs: Any) -> None:
        super().__init__(config_class=config_class, **kwargs)
        key = None if self.config.key_file is None else read_key_file(self.config.key_file, "key_file")
        signing = self.config.signing_key
        self.trial = Trial(
            self.config.state,
            self.config.log,
            limits=self.config.limits,
            key=key,
            hidden_files=[path for path in (self.config.key_file, signing) if path],
            labels=dict(self.config.labels) or None,
            signing_key=None if signing is None else read_signing_key(signing, "signing_key"),
        )

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run the action's command as one call of the trial; mini's observation of it."""
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        run, options = self._call(command, cwd)
        options["timeout"] = float(timeout) if timeout else None
        try:
            # mini's submission is the harness's final act: a call like any other while the budget
            # lasts; once it is spent, run once a trial instead of refused (Ledger.reserve's `final`).
            result = self.trial.run(run, merge_output=self.config.merge_output, final=_submits(command), **options)
        except BudgetExhausted as exc:
            return self._spent(exc.status, exc)
        except TrialToolError as exc:
            return self._not_run(exc)
        try:
            observation = self._observed(result)  # mini's submission ends the run here (Submitted)
        except Submitted:
            if self.config.signing_key is not None:
                self.trial.attest("submitted")  # the trial's end: its statement, before mini saves the run
            raise
        if result.sequence == 0:
            # The final act ran and did not submit: what it printed is for graders (the log keeps
            # it), never more work for the agent, which is told the budget is spent.
            status = result.budget.refusal_status or "maximum_tool_calls"
            why = f"the budget is spent, and the submission did not submit (exit status {result.exit_code})"
            return self._spent(status, BudgetExhausted(why, status))
        return observation

    def _spent(self, status: str, exc: TrialToolError) -> dict[str, Any]:
        """A spent budget, as mini's own limits end a run (`on_exhausted: raise`), or as the model reads it."""
        if self.config.on_exhausted == "raise":
            kind = TimeExceeded if status == "task_timeout_seconds" else LimitsExceeded
            name = kind.__name__
            extra = {"exit_status": name, "submission": "", "trial_tool": {"refusal": status}}
            raise kind({"role": "exit", "content": name, "extra": extra}) from exc
        return self._not_run(exc)

    def _call(self, command: str, cwd: str) -> tuple[Any, dict[str, Any]]:
        """What the trial runs for mini's `command`, and its options: here, the command in `cwd` on this machine."""
        return command, {"cwd": cwd or self.config.cwd or os.getcwd(), "env": self.config.env}

    def _observed(self, result: Any) -> dict[str, Any]:
        """mini's observation of a call that ran (checked for mini's submission, which ends the run)."""
        observation = {
            "output": toolreply.joined(toolreply.output_blocks(result)),
            "returncode": result.exit_code,
            "exception_info": "" if result.status not in _STOPPED else toolreply.framing(result),
            "extra": {"trial_tool": _account(result.as_json())},
        }
        self._check_finished(observation)
        return observation

    def _not_run(self, exc: TrialToolError) -> dict[str, Any]:
        text = toolreply.refusal(exc)
        return {
            "output": "",
            "returncode": -1,
            "exception_info": text,
            "extra": {"trial_tool": {"status": exc.status, "error": exc.message}},
        }

    def serialize(self) -> dict[str, Any]:
        """mini's record of the environment, with where the trial's files are and what it used."""
        data = super().serialize()
        try:
            state, now = self.trial.status(), self.trial.budget()
            account: dict[str, Any] = {
                "trial_id": state.trial_id,
                "labels": state.labels,
                "budget": now.as_json(),
                # The log's chain head: `trial-tool verify --expect-head` checks the trial against it.
                "head": now.head,
            }
            if state.signer is not None:
                # A signed trial: its key, and its statement as last signed (None until it ends).
                account["signer"] = state.signer
                account["statement"] = (
                    None
                    if state.statement is None
                    else {
                        "path": self.trial.statement_path,
                        **state.statement,
                    }
                )
        except TrialToolError as exc:
            account = {"budget": {"error": exc.message}}
        data["info"]["trial_tool"] = {
            "state": os.path.abspath(self.config.state),
            "log": os.path.abspath(self.config.log),
            **account,
        }
        return data

    def close(self) -> None:
        """Stop the trial's fork server (it also stops when the process ends)."""
        self.trial.close()


class TrialDockerEnvironmentConfig(TrialEnvironmentConfig):
    """mini's docker settings (`image`, `cwd` in the container, `env`, `forward_env`, `interpreter`) and the trial's."""

    image: str
    #: Where commands start, in the container (the image's paths: /testbed, say).
    cwd: str = "/"
    forward_env: list[str] = Field(default_factory=list)
    interpreter: list[str] = Field(default_factory=lambda: ["bash", "-lc"])
    #: The host directory bound into the container at its own path (default: `workspace` beside the state).
    workspace: str | None = None


class TrialDockerEnvironment(TrialEnvironment):
    """mini's docker environment, each command a call of a trial run by trialtool's own docker backend.

    The trial's container is made from `image` on the first call and kept (docs/containers.md):
    a deadline stops and sweeps what the command started in it, which mini's own `docker exec`
    with a client-side timeout leaves running. `close()` removes it.
    """

    def __init__(self, *, config_class: type = TrialDockerEnvironmentConfig, **kwargs: Any) -> None:
        config = config_class(**kwargs)
        workspace = config.workspace or os.path.join(os.path.dirname(os.path.abspath(config.state)), "workspace")
        os.makedirs(workspace, exist_ok=True)
        limits = {**config.limits, "sandbox": "docker", "image": config.image, "workspace": workspace}
        super().__init__(config_class=config_class, **{**kwargs, "limits": limits})

    def _call(self, command: str, cwd: str) -> tuple[Any, dict[str, Any]]:
        """mini's interpreter over the command, after a `cd` to its directory in the container."""
        forwarded = {name: os.environ[name] for name in self.config.forward_env if name in os.environ}
        where = shlex.quote(cwd or self.config.cwd)
        return [*self.config.interpreter, f"cd {where} && {command}"], {"env": {**forwarded, **self.config.env}}

    def close(self) -> None:
        """Remove the trial's container, and stop the trial's fork server."""
        remove_container(self.trial)
        super().close()


#: Statuses where the command did not end on its own: mini shows these as an exception.
_STOPPED = frozenset(
    {"timeout", "output_limit", "memory_limit", "cpu_limit", "file_size_limit", "process_limit", "interrupted"}
)


#: The line mini's agent prints to submit (mini's LocalEnvironment checks output for it).
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _submits(command: object) -> bool:
    """Whether `command` is mini's submission: it begins by printing mini's submission line.

    What follows that `echo` (mini's prompts add `git diff` to show the work) runs too. Once
    the budget is spent it runs as the harness's final act, once a trial: uncharged, within
    the call timeout, its output the run's result and never the model's; a second is refused.
    """
    text = command if isinstance(command, str) else ""
    return text.lstrip().startswith((f"echo {SUBMIT}", f"echo '{SUBMIT}'", f'echo "{SUBMIT}"'))


def _account(result: dict[str, Any]) -> dict[str, Any]:
    """The call's result without the text (the observation has it)."""
    return {name: value for name, value in result.items() if name not in ("stdout", "stderr")}


__all__ = ["TrialDockerEnvironment", "TrialDockerEnvironmentConfig", "TrialEnvironment", "TrialEnvironmentConfig"]
