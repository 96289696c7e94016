"""inspect-ai's sandbox `trialtool`: every exec of a sample runs as a call of that sample's own trial.

    Task(..., sandbox=("trialtool", TrialSandboxConfig(limits={"max_calls": 30})))

inspect finds it through its extension entry point (`pip install
'trialtool[inspect]'`). Each sample and epoch gets a trial of its own, made in
`sample_init`: a directory with the trial's state, log and workspace (the
sample's working directory, where its files are copied), under `root`, by
default beside the eval log (`<log>.trials/<sample>-epoch<N>/`). Every `exec`
(the bash and python tools, the agent's own, a scorer's) is one budgeted,
contained, recorded call: `input` reaches the command on its stdin, `timeout`
shortens the call's deadline. `read_file` and `write_file` are the harness's
own file access and are not charged, and so are the commands inspect runs on
its own behalf (a sample's setup, installing its sandbox tools), recognised
exactly. `text_editor` works, a call a use; tools that need inspect's tools
server (bash_session, exec_remote) are refused, since that server would run
commands outside every call.

What a tool sees of a refused call is a failed exec: return code 123 and
trial-tool's one-line refusal on stderr, which inspect's tools show the model.
A call stopped at its deadline is returned too (124, with the notice and the
output so far), not raised as TimeoutError: that output was charged, so the
model gets it, and no call is ever retried behind the budget's back.

The sample's metadata gets `trialtool`: the paths of the state, log and
workspace, the pinned limits, and the budget as of the last call, so that a
grader finds the trial from the eval log. The state and log are always kept;
the workspace is removed at cleanup unless `keep_workspace`. The wrapped
environment is the local machine (optionally bwrap, through the trial's own
`sandbox` setting); a container would be wrapped at the same seam, `exec`,
with the container's exec command as the call's argv.
docs/inspect.md has a runnable example.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any, Literal, overload

from inspect_ai.solver._task_state import sample_state
from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
    subprocess,
)
from inspect_ai.util._sandbox._cli import SANDBOX_CLI
from inspect_ai.util._sandbox.environment import RootAccess, SandboxUserUnsupportedError
from inspect_ai.util._sandbox.limits import verify_read_file_size
from pydantic import BaseModel

from .. import EXIT_INTERNAL, BudgetExhausted, Trial, TrialToolError, UsageError, toolreply
from .inspectexecs import inspects_own, needs_tools_server, scoring
from .inspectinner import inner_type, run_inside
from .inspecttrials import (
    TrialSandboxConfig,
    create_trial,
    fresh,
    is_current_user,
    labels_of,
    root_of,
    safe,
    settings_of,
    sweeps,
)

#: The key of the sample's metadata that holds the trial's account.
METADATA_KEY = "trialtool"


@sandboxenv(name="trialtool")
class TrialSandboxEnvironment(SandboxEnvironment):
    """A sample's trial: its execs are budgeted calls, its files live in the trial's workspace."""

    def __init__(
        self,
        trial: Trial,
        workspace: Path,
        settings: TrialSandboxConfig,
        account: dict[str, Any],
        inner: tuple[str, SandboxEnvironment] | None = None,
    ) -> None:
        super().__init__()
        self.trial = trial
        self.workspace = workspace
        self.settings = settings
        #: What the sample's metadata says of the trial (METADATA_KEY).
        self.account = account
        #: The inner sandbox's environment that runs this one's commands (its name there), if any.
        self.inner = inner

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        settings = settings_of(config)
        if settings.inner is not None:
            await inner_type(settings.inner).task_init(task_name, settings.inner_config)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        settings = settings_of(config)
        if settings.inner is not None:
            await inner_type(settings.inner).task_cleanup(task_name, settings.inner_config, cleanup)

    @classmethod
    async def task_init_environment(
        cls, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, str]:
        """The inner sandbox's: docker's reads a sample's metadata into its compose file (an image per sample)."""
        settings = settings_of(config)
        if settings.inner is None:
            return await super().task_init_environment(config, metadata)
        return await inner_type(settings.inner).task_init_environment(settings.inner_config, metadata)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return TrialSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = settings_of(config)
        state = sample_state()
        sample = "sample" if state is None else safe(str(state.sample_id))
        epoch = 1 if state is None else state.epoch
        directory = fresh(root_of(settings, task_name) / f"{sample}-epoch{epoch}")
        workspace = directory / "workspace"
        labels = labels_of(task_name, state)
        trial, created = await asyncio.to_thread(create_trial, directory, workspace, settings, labels)
        account = {
            "trial_id": created.trial_id,
            "labels": created.labels,
            "state": str(directory / "state.json"),
            "log": str(directory / "log.jsonl"),
            "workspace": str(workspace),
            "limits": created.limits._asdict(),
            "budget": (await asyncio.to_thread(trial.budget)).as_json(),
            # The log's chain head after the last call: `trial-tool verify --expect-head` checks against it.
            "head": created.log.head,
        }
        if settings.inner is not None:
            # The inner sandbox makes the sample's environments; all of them are calls of the one trial.
            inners = await inner_type(settings.inner).sample_init(task_name, settings.inner_config, metadata)
            made = {name: cls(trial, workspace, settings, account, (name, env)) for name, env in inners.items()}
            next(iter(made.values()))._publish()
            return dict(made)
        environment = cls(trial, workspace, settings, account)
        # inspect probes each sandbox for root at sample init with an exec, unless the sandbox
        # carries its verdict: here it would be a charged call the agent never made. The verdict is
        # known: commands run as the current user through the trial, which never switches users.
        environment._root_access = RootAccess("unusable", "the trialtool sandbox runs commands as the current user")
        environment._publish()
        return {"default": environment}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        inners: dict[str, SandboxEnvironment] = {}
        for environment in environments.values():
            own = environment.as_type(TrialSandboxEnvironment)
            if own.inner is not None:
                inners[own.inner[0]] = own.inner[1]
            try:
                await own._account_from_state()
            except TrialToolError:
                pass  # the account keeps the budget of the last call
            await asyncio.to_thread(own.trial.close)
            if own.trial.attestation is not None:
                # A signed trial's statement, signed by close(): a grader checks it with the public key alone.
                own.account["statement"] = own.trial.attestation.as_json()
                own._publish()
            if not own.settings.keep_workspace:
                await asyncio.to_thread(shutil.rmtree, own.workspace, True)
        settings = settings_of(config)
        if settings.inner is not None and inners:
            await inner_type(settings.inner).sample_cleanup(task_name, settings.inner_config, inners, interrupted)

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,  # inspect's name for it
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """One call of the sample's trial; a refusal is a failed exec whose stderr says why."""
        if self.inner is not None:
            return await self._exec_inside(self.inner, cmd, input, cwd, env, user, timeout)
        if user is not None and not is_current_user(user):
            msg = f"the trialtool sandbox runs commands as the current user only, not {user!r}"
            raise SandboxUserUnsupportedError(msg)
        directory = self.workspace if cwd is None else self.workspace / cwd
        if cmd[:1] == [SANDBOX_CLI] and cmd[1:] in (["start-server"], ["stop-server"]):
            # inspect's tools server would run tools' commands outside every call, unbudgeted and
            # uncontained: it is not started. Tools that run in their own call (text_editor) work.
            return ExecResult(True, 0, "", "")
        if cmd[:1] == [SANDBOX_CLI] and needs_tools_server(input):
            msg = "this tool needs inspect's tools server, which the trialtool sandbox does not run; nothing ran"
            return ExecResult(False, EXIT_INTERNAL, "", toolreply.refusal(UsageError(msg)))
        if inspects_own(cmd):
            # inspect's own command, on its own behalf (a sample's setup, installing its
            # sandbox tools): the harness's, like read_file and write_file.
            return await subprocess(cmd, input=input, cwd=directory, env=env, timeout=timeout)
        # inspect's own tools (text_editor) send a JSON-RPC request and parse the reply: the
        # text inside it is what the model reads, clipped there, the envelope kept (clipping.fit_reply).
        tool = cmd[:1] == [SANDBOX_CLI]
        try:
            result = await self.trial.arun(
                list(cmd),
                input=input,
                cwd=str(directory),
                env=env,
                timeout=timeout,
                merge_output=self.settings.merge_output and not tool,
                # A scorer's command grades the agent's work: never refused, never charged (inspectexecs.scoring).
                grading=scoring(),
                reply="json-rpc" if tool else "text",
            )
        except TrialToolError as exc:
            if isinstance(exc, BudgetExhausted):
                # The refusal is counted (and logged) in the trial: the account says so too.
                await self._account_from_state()
            return ExecResult(False, exc.exit_code, "", toolreply.refusal(exc))
        self.account["budget"] = result.budget.as_json()
        self.account["head"] = result.head
        self._publish()
        if tool and result.status == "timeout":
            # What inspect expects of a sandbox at a deadline: its tool tells the model, the eval goes on.
            # The call is recorded and charged as any call stopped at its deadline.
            raise TimeoutError(
                f"the tool's call was stopped at its deadline ({result.record.get('deadline_seconds')} s)"
            )
        return ExecResult(result.exit_code == 0, result.exit_code, result.stdout, result.stderr)

    async def _exec_inside(
        self,
        inner: tuple[str, SandboxEnvironment],
        cmd: list[str],
        input: str | bytes | None,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | None,
        timeout: int | None,
    ) -> ExecResult[str]:
        """An exec of the inner sandbox's environment, as one call of the trial (inspectinner.py)."""
        name, environment = inner
        if inspects_own(cmd):  # inspect's own plumbing: the harness's, uncharged
            return await environment.exec(cmd, input=input, cwd=cwd, env=env, user=user, timeout=timeout)
        tool = cmd[:1] == [SANDBOX_CLI]
        where = {"sandbox": self.settings.inner, "environment": name}
        try:
            result = await run_inside(
                self.trial,
                environment,
                where,
                cmd,
                input=input,
                cwd=cwd,
                env=env,
                user=user,
                timeout=timeout,
                grading=scoring(),
                merge_output=self.settings.merge_output and not tool,
                grace=float(self.account["limits"]["kill_grace"]),
                sweep=sweeps(self.settings),
            )
        except TrialToolError as exc:
            if isinstance(exc, BudgetExhausted):
                await self._account_from_state()
            return ExecResult(False, exc.exit_code, "", toolreply.refusal(exc))
        self.account["budget"], self.account["head"] = result.budget.as_json(), result.head
        self._publish()
        if tool and result.status == "timeout":
            raise TimeoutError(
                f"the tool's call was stopped at its deadline ({result.record.get('deadline_seconds')} s)"
            )
        return ExecResult(result.exit_code == 0, result.exit_code, result.stdout, result.stderr)

    async def _account_from_state(self) -> None:
        """The account's budget and head as the trial's state has them now; published."""
        now = await asyncio.to_thread(self.trial.budget)
        self.account["budget"] = now.as_json()
        self.account["head"] = now.head
        self._publish()

    async def write_file(self, file: str, contents: str | bytes) -> None:
        if self.inner is not None:
            return await self.inner[1].write_file(file, contents)
        path = self._resolve(file)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(contents, str):
            path.write_text(contents, encoding="utf-8")
        else:
            path.write_bytes(contents)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        if self.inner is not None:
            read: str | bytes = await self.inner[1].read_file(file, text)  # type: ignore[call-overload]
            return read
        path = self._resolve(file)
        verify_read_file_size(str(path))
        if text:
            with open(path, newline="", encoding="utf-8") as source:
                return source.read()
        return path.read_bytes()

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """The inner sandbox's way in, for a person (`docker exec -it ...`): outside the trial's budget."""
        if self.inner is not None:
            return await self.inner[1].connection(user=user)
        return await super().connection(user=user)

    def default_polling_interval(self) -> float:
        if self.inner is not None:
            return self.inner[1].default_polling_interval()
        return super().default_polling_interval()

    def _resolve(self, file: str) -> Path:
        return Path(file) if os.path.isabs(file) else self.workspace / file

    def _publish(self) -> None:
        """Put the trial's account in the running sample's metadata (the state inspect logs)."""
        state = sample_state()
        if state is not None:
            state.metadata[METADATA_KEY] = dict(self.account)


__all__ = ["METADATA_KEY", "TrialSandboxConfig", "TrialSandboxEnvironment"]
