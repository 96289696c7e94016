"""A call's orders to its supervisor: `Spec`, and its form on the control pipe.

The launcher (trial-tool's side) encodes a Spec; the supervisor decodes it.
Both go by `Spec`'s own fields, so a field added here travels without being
written out again on either side. The orders are one JSON line; the command's
stdin follows it raw (`stdin_bytes` long): no base64, no escaping of a megabyte.
Light at import: the launcher loads it before the rest of trialtool.
"""

from __future__ import annotations

from typing import Any, NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..limits import Limits


class Spec(NamedTuple):
    """Everything the supervisor needs to run one command."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    #: time.monotonic() values (the clock is system wide): when the call's clock started,
    #: and when the command is stopped. The command's `elapsed` counts from the first.
    started: float
    deadline: float
    #: The trial's pinned limits: the capture cap, the kill grace and the resource limits.
    limits: Limits
    #: The sandbox backend `argv` is a command line of (process/sandbox/): "none", or "bwrap", whose
    #: status descriptor is read, its exit code taken from it, and its own processes spared the stop's SIGTERM.
    backend: str = "none"
    #: The caller's umask and resource limits ((resource, soft, hard)), when the caller is
    #: not the process the supervisor was forked from (the per-user server's callers).
    umask: int | None = None
    caller_rlimits: tuple[tuple[int, int, int], ...] = ()
    #: The command's standard input, fed through a pipe (None: /dev/null).
    stdin: bytes | None = None
    #: One pipe for stdout and stderr, read in the order written (the stderr spool stays empty).
    merge: bool = False
    #: Pinned paths bwrap binds from a descriptor: (index in argv of its descriptor argument,
    #: path, device, inode). Opened and checked in the supervisor, just before bwrap starts (sandbox/pinned.py).
    binds: tuple[tuple[int, str, int, int], ...] = ()
    #: Backend docker: the trial's container, where a stop signals the command's processes (sandbox/_docker.py).
    container: str | None = None
    #: Network "allow": the trial's allowlist (egress.py), which the call's proxy enforces (_proxy.py).
    egress: tuple[str, ...] | None = None


def encode(spec: Spec) -> bytes:
    """The orders' line, then the input's bytes."""
    import json

    fields: dict[str, Any] = spec._asdict()
    fields["limits"] = spec.limits._asdict()
    stdin = fields.pop("stdin")
    fields["stdin_bytes"] = None if stdin is None else len(stdin)
    return json.dumps(fields).encode() + b"\n" + (stdin or b"")


def input_size(fields: dict[str, Any]) -> int:
    """How many bytes of input follow the orders' line."""
    size = fields.get("stdin_bytes")
    return size if isinstance(size, int) and size > 0 else 0


def decode(fields: dict[str, Any], stdin: bytes | None) -> Spec:
    """The Spec from the orders' line (parsed) and the input that followed it."""
    from ..limits import Limits

    given = {name: fields[name] for name in Spec._fields if name in fields}
    given["limits"] = Limits(**fields["limits"])
    given["caller_rlimits"] = tuple(tuple(row) for row in fields.get("caller_rlimits") or ())
    given["binds"] = tuple(tuple(row) for row in fields.get("binds") or ())
    given["egress"] = None if fields.get("egress") is None else tuple(fields["egress"])
    given["stdin"] = stdin if fields.get("stdin_bytes") is not None else None
    return Spec(**given)


__all__ = ["Spec", "decode", "encode", "input_size"]
