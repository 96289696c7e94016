"""The command's environment: inherited or clean, with changes, never with trial-tool's own variables."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from ..errors import UsageError

#: What `--clean-env` keeps from trial-tool's environment: enough to find programs,
#: a home, a locale and a terminal type, and nothing that carries credentials.
CLEAN_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL")
#: Variables of trial-tool itself (a ledger key, the rank file): never passed on.
OWN_PREFIX = "TRIALTOOL_"


def parse_assignment(text: str) -> tuple[str, str]:
    """`KEY=VALUE` from `--env`; UsageError for anything else."""
    key, sep, value = text.partition("=")
    if not sep or not key or "\0" in text:
        msg = f"--env wants KEY=VALUE, not {text!r}"
        raise UsageError(msg)
    return key, value


def build(
    *,
    base: Mapping[str, str] | None = None,
    clean: bool = False,
    set_vars: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
) -> dict[str, str]:
    """The environment for the command."""
    source = os.environ if base is None else base
    env = {key: source[key] for key in CLEAN_KEEP if key in source} if clean else dict(source)
    for key in unset:
        env.pop(key, None)
    for key, value in (set_vars or {}).items():
        if key.startswith(OWN_PREFIX):
            msg = f"--env cannot pass trial-tool's own variable {key}"
            raise UsageError(msg)
        env[key] = value
    return {key: value for key, value in env.items() if not key.startswith(OWN_PREFIX)}


__all__ = ["CLEAN_KEEP", "OWN_PREFIX", "build", "parse_assignment"]
