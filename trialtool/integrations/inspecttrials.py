"""Each inspect sample's trial: the sandbox's settings, where the trial lives, and who it is.

Loaded by inspectai.py only, with inspect installed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from inspect_ai.log._samples import sample_active
from inspect_ai.util import SandboxEnvironmentConfigType
from pydantic import BaseModel, ConfigDict, Field

from .. import Trial, TrialState, UsageError, read_key_file, read_signing_key


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
    #: A file holding an Ed25519 signing key: every trial signed (checkpoints as it goes, its statement at
    #: sample cleanup, whose digest the sample's metadata carries), the file hidden from sandboxed commands.
    signing_key: str | None = None
    #: Another inspect sandbox that runs the commands (docker, k8s, local, any registered one), with
    #: its own config: trialtool then budgets, clips and records each exec on this side (inspectinner.py).
    inner: str | None = None
    inner_config: Any = None
    #: After a call stopped at its deadline, kill what is left in the inner sandbox's container
    #: (`sweep_command`), the sample's calls then running one at a time. None: for docker and k8s.
    inner_sweep: bool | None = None


def settings_of(config: SandboxEnvironmentConfigType | None) -> TrialSandboxConfig:
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


def root_of(settings: TrialSandboxConfig, task_name: str) -> Path:
    """Where this eval's trials go: `<root>/<eval log's name>/`, by default beside the eval log."""
    active = sample_active()
    location = "" if active is None else active.log_location
    name = safe(Path(location).stem) if location else safe(task_name)
    if settings.root is not None:
        return Path(settings.root).absolute() / name
    if location and "://" not in location:
        return Path(location).absolute().parent / f"{name}.trials"
    return Path("trialtool-trials").absolute() / name


def fresh(directory: Path) -> Path:
    """`directory`, or `directory-2`, `-3`...: a retried sample gets a new trial, the old one stays for the record."""
    candidate, attempt = directory, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            attempt += 1
            candidate = directory.with_name(f"{directory.name}-{attempt}")


def labels_of(task_name: str, state: Any) -> dict[str, str]:
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


def create_trial(
    directory: Path, workspace: Path, settings: TrialSandboxConfig, labels: dict[str, str]
) -> tuple[Trial, TrialState]:
    """The sample's trial, created with its limits and labels pinned, and its state as created."""
    workspace.mkdir()
    key = None if settings.key_file is None else read_key_file(settings.key_file, "key_file")
    signing = settings.signing_key
    trial = Trial(
        directory / "state.json",
        directory / "log.jsonl",
        limits={"workspace": str(workspace), **settings.limits},
        key=key,
        hidden_files=[path for path in (settings.key_file, signing) if path],
        origin=workspace,
        labels=labels,
        signing_key=None if signing is None else read_signing_key(signing, "signing_key"),
    )
    return trial, trial.init()


def safe(name: str) -> str:
    """A sample id or a log's name as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "sample"


def is_current_user(user: str) -> bool:
    import pwd

    try:
        uid = int(user) if user.isdecimal() else pwd.getpwnam(user).pw_uid
    except KeyError:
        return False
    return uid == os.geteuid()


#: The inner sandboxes that run each sample in a container of its own: swept after a deadline.
CONTAINERS = ("docker", "k8s")


def sweeps(settings: TrialSandboxConfig) -> bool:
    """Whether the sample's container is swept after a call stopped at its deadline."""
    if settings.inner_sweep is not None:
        return settings.inner_sweep
    return settings.inner in CONTAINERS


__all__ = [
    "CONTAINERS",
    "TrialSandboxConfig",
    "create_trial",
    "fresh",
    "is_current_user",
    "labels_of",
    "root_of",
    "safe",
    "settings_of",
    "sweeps",
]
