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
import re
import shutil
from pathlib import Path
from typing import Any, Literal, overload

from inspect_ai.log._samples import sample_active
from inspect_ai.solver._task_state import sample_state
from inspect_ai.util import ExecResult, SandboxEnvironment, SandboxEnvironmentConfigType, sandboxenv, subprocess
from inspect_ai.util._sandbox._cli import SANDBOX_CLI
from inspect_ai.util._sandbox.environment import RootAccess, SandboxUserUnsupportedError
from inspect_ai.util._sandbox.limits import verify_read_file_size
from pydantic import BaseModel, ConfigDict, Field

from .. import EXIT_INTERNAL, BudgetExhausted, Trial, TrialState, TrialToolError, UsageError, read_key_file, toolreply
from .inspectexecs import inspects_own, needs_tools_server, scoring

#: The key of the sample's metadata that holds the trial's account.
METADATA_KEY = "trialtool"


class TrialSandboxConfig(BaseModel):
    """The sandbox's settings, from the Task (`sandbox=("trialtool", config)`) or a YAML/JSON file."""

    # inspect keys its sandbox specs by their config: frozen, and hashed by value (`limits` is a dict).
    model_config = ConfigDict(frozen=True)

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    #: Where each sample's trial directory is made; default: beside the eval log.
    root: str | None = None
    #: Limits pinned in every sample's trial, as `Trial` takes them (max_calls, max_tokens,
    #: call_timeout, ...), and its sandbox settings (sandbox, network, writable).
    limits: dict[str, Any] = Field(default_factory=dict)
    #: Keep the sample's workspace after cleanup (its state and log are always kept).
    keep_workspace: bool = False
    #: One stream for stdout and stderr, in the order written (delivered as stdout).
    merge_output: bool = False
    #: A file holding the ledger key: every trial keyed (HMAC), the file hidden from sandboxed commands.
    key_file: str | None = None


@sandboxenv(name="trialtool")
class TrialSandboxEnvironment(SandboxEnvironment):
    """A sample's trial: its execs are budgeted calls, its files live in the trial's workspace."""

    def __init__(self, trial: Trial, workspace: Path, settings: TrialSandboxConfig, account: dict[str, Any]) -> None:
        super().__init__()
        self.trial = trial
        self.workspace = workspace
        self.settings = settings
        #: What the sample's metadata says of the trial (METADATA_KEY).
        self.account = account

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return TrialSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = _settings(config)
        state = sample_state()
        sample = "sample" if state is None else _safe(str(state.sample_id))
        epoch = 1 if state is None else state.epoch
        directory = _fresh(_root(settings, task_name) / f"{sample}-epoch{epoch}")
        workspace = directory / "workspace"
        labels = _labels(task_name, state)
        trial, created = await asyncio.to_thread(_create_trial, directory, workspace, settings, labels)
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
        for environment in environments.values():
            own = environment.as_type(TrialSandboxEnvironment)
            try:
                await own._account_from_state()
            except TrialToolError:
                pass  # the account keeps the budget of the last call
            await asyncio.to_thread(own.trial.close)
            if not own.settings.keep_workspace:
                await asyncio.to_thread(shutil.rmtree, own.workspace, True)

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
        if user is not None and not _is_current_user(user):
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

    async def _account_from_state(self) -> None:
        """The account's budget and head as the trial's state has them now; published."""
        now = await asyncio.to_thread(self.trial.budget)
        self.account["budget"] = now.as_json()
        self.account["head"] = now.head
        self._publish()

    async def write_file(self, file: str, contents: str | bytes) -> None:
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
        path = self._resolve(file)
        verify_read_file_size(str(path))
        if text:
            with open(path, newline="", encoding="utf-8") as source:
                return source.read()
        return path.read_bytes()

    def _resolve(self, file: str) -> Path:
        return Path(file) if os.path.isabs(file) else self.workspace / file

    def _publish(self) -> None:
        """Put the trial's account in the running sample's metadata (the state inspect logs)."""
        state = sample_state()
        if state is not None:
            state.metadata[METADATA_KEY] = dict(self.account)


def _settings(config: SandboxEnvironmentConfigType | None) -> TrialSandboxConfig:
    if config is None:
        return TrialSandboxConfig()
    if isinstance(config, TrialSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return TrialSandboxConfig(**config.model_dump())
    if isinstance(config, str):
        import yaml  # type: ignore[import-untyped]  # inspect's own dependency; reads JSON too

        with open(config, encoding="utf-8") as source:
            return TrialSandboxConfig(**(yaml.safe_load(source) or {}))
    msg = f"the trialtool sandbox's config must be a TrialSandboxConfig, a dict or a file, not {type(config).__name__}"
    raise UsageError(msg)


def _root(settings: TrialSandboxConfig, task_name: str) -> Path:
    """Where this eval's trials go: `<root>/<eval log's name>/`, by default beside the eval log."""
    active = sample_active()
    location = "" if active is None else active.log_location
    name = _safe(Path(location).stem) if location else _safe(task_name)
    if settings.root is not None:
        return Path(settings.root).absolute() / name
    if location and "://" not in location:
        return Path(location).absolute().parent / f"{name}.trials"
    return Path("trialtool-trials").absolute() / name


def _fresh(directory: Path) -> Path:
    """`directory`, or `directory-2`, `-3`...: a retried sample gets a new trial, the old one stays for the record."""
    candidate, attempt = directory, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            attempt += 1
            candidate = directory.with_name(f"{directory.name}-{attempt}")


def _labels(task_name: str, state: Any) -> dict[str, str]:
    """Who the sample's trial is: task, sample id, epoch, model, and the eval's run and eval ids.

    inspect's sample context says each; what it does not know here is left out.
    """
    labels = {"task": task_name}
    if state is not None:
        labels.update(sample=str(state.sample_id), epoch=str(state.epoch), model=str(state.model))
    active = sample_active()
    if active is not None:
        labels["model"] = str(active.model)
        for name, value in (("run", active.run_id), ("eval", active.eval_id), ("eval_set", active.eval_set_id)):
            if value:
                labels[name] = str(value)
    # A label is printable text of bounded length (ledger/_labels.py); a sample id may be neither.
    return {name: "".join(ch if ch.isprintable() else "?" for ch in value)[:1024] for name, value in labels.items()}


def _create_trial(
    directory: Path, workspace: Path, settings: TrialSandboxConfig, labels: dict[str, str]
) -> tuple[Trial, TrialState]:
    """The sample's trial, created with its limits and labels pinned, and its state as created."""
    workspace.mkdir()
    key = None if settings.key_file is None else read_key_file(settings.key_file, "key_file")
    trial = Trial(
        directory / "state.json",
        directory / "log.jsonl",
        limits={"workspace": str(workspace), **settings.limits},
        key=key,
        hidden_files=[settings.key_file] if settings.key_file else [],
        origin=workspace,
        labels=labels,
    )
    return trial, trial.init()


def _safe(name: str) -> str:
    """A sample id or a log's name as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "sample"


def _is_current_user(user: str) -> bool:
    import pwd

    try:
        uid = int(user) if user.isdecimal() else pwd.getpwnam(user).pw_uid
    except KeyError:
        return False
    return uid == os.geteuid()


__all__ = ["METADATA_KEY", "TrialSandboxConfig", "TrialSandboxEnvironment"]
