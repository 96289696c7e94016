"""`Settings`: a trial's limits, sandbox settings and labels as its caller gives them, split and checked once.

Made where they enter (a `Trial`, from the API's dict or the CLI's flags), so
that a bad value is refused before any file is touched; the ledger then pins
them in a new trial, or compares them with what an existing trial pinned,
without reading them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from .. import sandbox
from ..types import Limits
from ..types import limits as limit_rules
from . import _labels as labels


class Settings(NamedTuple):
    """What a caller asked a trial to be: typed and checked; `given` says which limits it named."""

    #: The limits, defaults where not given, each validated.
    limits: Limits
    #: The names of the limits the caller gave: only these must match a trial's pinned ones.
    given: tuple[str, ...]
    #: The sandbox's settings given (sandbox.SETTINGS), checked; paths are resolved when pinned.
    sandbox: Mapping[str, object]
    #: The labels given, checked, or None.
    labels: Mapping[str, str] | None

    @classmethod
    def of(cls, overrides: Mapping[str, object] | None = None) -> Settings:
        """Settings from a `limits` dict as `Trial` takes it (with `labels`); UsageError naming a bad one."""
        given_labels, rest = labels.split(dict(overrides or {}))
        limits, settings = sandbox.settings.split(rest)
        return cls(
            limit_rules.from_overrides(limits),
            tuple(limits),
            MappingProxyType(sandbox.checked(settings)),
            None if given_labels is None else MappingProxyType(given_labels),
        )

    def for_caller(self, environ: Mapping[str, str]) -> Settings:
        """These settings for a call made on behalf of another process (the per-user server's callers):
        its PATH, where a trial created now finds its sandbox, and its $HOME."""
        caller = {"search_path": environ.get("PATH", ""), "home_path": environ.get("HOME", "")}
        return self._replace(sandbox=MappingProxyType({**self.sandbox, **caller}))


__all__ = ["Settings"]
