"""A call's orders to its supervisor (`Spec`) and the supervisor's answer (`Report`), and their forms on the pipes.

The launcher (trial-tool's side) encodes a Spec; the supervisor decodes it,
and answers with a Report the same way. Both go by their own fields, so a field added here travels without being
written out again on either side. The orders are one JSON line; the command's
stdin follows it raw (`stdin_bytes` long): no base64, no escaping of a megabyte.
Light at import: the launcher loads it before the rest of trialtool.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._capture import EMPTY_SHA256

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..types import Limits


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
    #: The sandbox backend `argv` is a command line of, by its registry name (sandbox/): it says which
    #: descriptor reports the exit status, which processes are its own, and where a stop signals the command.
    backend: str = "none"
    #: The caller's umask and resource limits ((resource, soft, hard)), when the caller is
    #: not the process the supervisor was forked from (the per-user server's callers).
    umask: int | None = None
    caller_rlimits: tuple[tuple[int, int, int], ...] = ()
    #: The command's standard input, fed through a pipe (None: /dev/null).
    stdin: bytes | None = None
    #: One pipe for stdout and stderr, read in the order written (the stderr spool stays empty).
    merge: bool = False
    #: Pinned paths the backend binds from a descriptor: (index in argv of its descriptor argument,
    #: path, device, inode). Opened and checked in the supervisor, just before the backend starts (its `descriptors`).
    binds: tuple[tuple[int, str, int, int], ...] = ()
    #: Where the command runs when not in the tree here (a container's name): where a stop signals it.
    place: str | None = None
    #: Network "allow": the trial's allowlist (sandbox/_egress.py), which the call's proxy enforces (_proxy.py).
    egress: tuple[str, ...] | None = None
    #: Where the proxy listens when not in the sandbox's network namespace: a unix socket's host path.
    egress_socket: str | None = None


def encode(spec: Spec) -> bytes:
    """The orders' line, then the input's bytes."""
    import json

    fields: dict[str, Any] = spec._asdict()
    fields["limits"] = spec.limits._asdict()
    stdin = fields.pop("stdin")
    fields["stdin_bytes"] = None if stdin is None else len(stdin)
    return json.dumps(fields).encode() + b"\n" + (stdin or b"")


def input_size(fields: Mapping[str, object]) -> int:
    """How many bytes of input follow the orders' line."""
    size = fields.get("stdin_bytes")
    return size if isinstance(size, int) and size > 0 else 0


def decode(fields: dict[str, Any], stdin: bytes | None) -> Spec:
    """The Spec from the orders' line (parsed) and the input that followed it."""
    from ..types import Limits

    given = {name: fields[name] for name in Spec._fields if name in fields}
    given["limits"] = Limits(**fields["limits"])
    given["caller_rlimits"] = tuple(tuple(row) for row in fields.get("caller_rlimits") or ())
    given["binds"] = tuple(tuple(row) for row in fields.get("binds") or ())
    given["egress"] = None if fields.get("egress") is None else tuple(fields["egress"])
    given["stdin"] = stdin if fields.get("stdin_bytes") is not None else None
    return Spec(**given)


class Report(NamedTuple):
    """What the supervisor saw of one command, sent back on the result pipe; `fatal` alone when it ran none."""

    #: exited, deadline, output_limit, interrupted, process_limit, not_found, not_executable.
    ended: str = "exited"
    #: The command's exit status, or minus the signal that ended it; None when it is not known
    #: (a command a harness ran elsewhere, that did not exit by itself).
    returncode: int | None = 0
    #: Seconds on the monotonic clock from the call's start to the command's end.
    elapsed: float = 0.0
    #: Why the command could not start (not_found, not_executable).
    error: str | None = None
    #: The last signal sent to stop the tree, if any.
    stop_signal: int | None = None
    deadline_overshoot: float | None = None
    exited_after_deadline: float | None = None
    #: Processes still alive after the command ended, and killed then; any that could not be.
    killed: int = 0
    survivors: tuple[int, ...] = ()
    oom_kills: int = 0
    process_cap_hit: bool = False
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_rss: int = 0
    peak_rss_scope: str = "largest_process"
    #: Each stream's bytes written and their SHA-256 (stdout, stderr).
    streams: tuple[tuple[int, str], tuple[int, str]] = ((0, EMPTY_SHA256), (0, EMPTY_SHA256))
    #: Which mechanism enforced what (cgroup2, cgroup1, sweep, rlimit_as, subreaper).
    containment: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    #: Network "allow": the connections the call's proxy allowed and denied.
    network: dict[str, Any] | None = None
    #: Why the supervisor could not run the command at all: trial-tool's failure, never the command's.
    fatal: str | None = None


def encode_report(report: Report) -> bytes:
    """The report's one line."""
    import json

    return json.dumps(report._asdict()).encode() + b"\n"


def decode_report(fields: dict[str, Any]) -> Report:
    """The Report from its line (parsed); unknown fields are an older or newer supervisor's, and ignored."""
    given = {name: fields[name] for name in Report._fields if name in fields}
    if "survivors" in given:
        given["survivors"] = tuple(given["survivors"])
    if "streams" in given:
        (out_bytes, out_sha), (err_bytes, err_sha) = given["streams"]
        given["streams"] = ((int(out_bytes), str(out_sha)), (int(err_bytes), str(err_sha)))
    return Report(**given)


__all__ = ["Report", "Spec", "decode", "decode_report", "encode", "encode_report", "input_size"]
