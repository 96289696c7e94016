"""The Trial and the CallRequest a call's flags name: one mapping, for the CLI and the per-user server alike.

The CLI calls these with its own process's environment and working directory;
the per-user server with its caller's (sent over the socket). Neither maps a
flag to a Trial or a request by itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypedDict

from ..ledger import key_from_environ, read_key_file
from ..types import CallRequest, Command
from .options import Arguments, overrides

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..process import ForkServer
    from ..signing import SigningKey
    from ..trial import Trial


#: signing.SIGNING_KEY_ENV, named here so that an unsigned call need not import the signing room to ask.
SIGNING_KEY_ENV = "TRIALTOOL_SIGNING_KEY"


def key_of(args: Arguments, environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The ledger key from --key-file, else the environment (`environ`, the caller's)."""
    if args.key_file is not None:
        return read_key_file(args.key_file)
    return key_from_environ(environ)


class TrialSettings(TypedDict):
    """What a Trial is made with, as the flags and the caller's environment give it."""

    state_path: str
    log_path: str
    limits: dict[str, object]
    lock_timeout: float
    rank_file: str | None
    key: bytes | None
    hidden_files: list[str]
    signing_key: SigningKey | None
    checkpoint_every: int | None


def trial_settings(args: Arguments, environ: Mapping[str, str] = os.environ) -> TrialSettings:
    """Trial's arguments for these flags, in the caller's `environ`: equal flags, equal settings."""
    from ..output import RANK_FILE_ENV

    hidden = [args.key_file] if args.key_file is not None else []
    signing_key = None
    named = getattr(args, "signing_key", None)
    # The signing room only for a signed trial: an unsigned call does not load it (1.5 ms in process).
    if named is not None or environ.get(SIGNING_KEY_ENV):
        from ..signing import read_signing_key, signing_key_path

        signing_path = signing_key_path(named, environ)
        assert signing_path is not None  # named, or in the environment
        signing_key = read_signing_key(signing_path)
        hidden.append(signing_path)
    return {
        "state_path": args.state,
        "log_path": args.log,
        "limits": overrides(args),
        "lock_timeout": args.lock_timeout,
        "rank_file": getattr(args, "o200k_file", None) or environ.get(RANK_FILE_ENV) or None,
        "key": key_of(args, environ),
        "hidden_files": hidden,
        "signing_key": signing_key,
        "checkpoint_every": getattr(args, "checkpoint_every", None),
    }


def trial_of(
    args: Arguments,
    environ: Mapping[str, str] = os.environ,
    *,
    origin: str | None = None,
    fork_server: ForkServer | None = None,
    settings: TrialSettings | None = None,
) -> Trial:
    """The Trial the flags name (`settings`: trial_settings's, when the caller has them already)."""
    from ..trial import Trial

    return Trial(**(settings or trial_settings(args, environ)), origin=origin, fork_server=fork_server)


def request_of(
    args: Arguments,
    command: Command,
    stdin: bytes | None,
    *,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    umask: int | None = None,
    rlimits: Sequence[Sequence[int]] | None = None,
    caller_imports: Sequence[str] = (),
    request_id: str | None = None,
) -> CallRequest:
    """The call the flags ask for, of `command` with `stdin`; the rest is the caller's, when it is not
    this process (the per-user server's callers): its working directory, environment, umask, limits
    and import path."""
    from ..process import environment

    return CallRequest.of(
        command,
        cwd=args.cwd or cwd,
        env=dict(environment.parse_assignment(item) for item in args.env),
        unset_env=tuple(args.unset_env),
        clean_env=args.clean_env,
        timeout=args.timeout,
        input=stdin,
        merge_output=args.merge_output,
        read_only=tuple(args.read_only),
        environ=environ,
        umask=umask,
        rlimits=rlimits,
        caller_imports=caller_imports,
        request_id=request_id,
    )


__all__ = ["TrialSettings", "key_of", "request_of", "trial_of", "trial_settings"]
