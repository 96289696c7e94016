"""Which of inspect's execs are what: its own plumbing, a call for its tools server, a scorer's.

Read from inspect itself (its command preambles, its tools' JSON-RPC methods,
its transcript's spans), never from a flag a task could set or forget; loaded
by inspectai.py only, with inspect installed.
"""

from __future__ import annotations

from inspect_ai.event._span import SpanBeginEvent
from inspect_ai.log._transcript import transcript
from inspect_ai.util._sandbox._privileged import IMAGE_PATH_VARIABLE, SHELL_PATH
from inspect_ai.util._span import SCORER_SPAN_TYPE, current_span_id


def scoring() -> bool:
    """Whether this exec is a scorer's: made inside the span inspect opens around each scorer.

    inspect runs each scorer of a sample (and `inspect score` each one after the fact)
    in a span of type "scorer", inside one named "scorers"; an exec made there is
    stamped with that span, or one under it. The phase is read from inspect's own
    transcript, never from a flag a task could set or forget. Where the transcript
    cannot say (its history given up), the exec is the agent's, as it was.
    """
    span = current_span_id()
    if span is None:
        return False
    try:
        events = transcript().events
    except Exception:
        return False
    parents: dict[str, tuple[str | None, str | None, str]] = {}
    for event in events:
        if isinstance(event, SpanBeginEvent):
            parents[event.id] = (event.parent_id, event.type, event.name)
    seen: set[str] = set()
    while span is not None and span in parents and span not in seen:
        seen.add(span)
        parent, kind, name = parents[span]
        if kind == SCORER_SPAN_TYPE or name == "scorers":
            return True
        span = parent
    return False


def framework_directory_script() -> str:
    """The script inspect wraps its framework directory's commands in (checked, created, extracted into)."""
    from inspect_ai.util._sandbox import _framework_directory

    return str(_framework_directory._SCRIPT)


#: How every command inspect issues on its own behalf begins (inspect_ai.util._sandbox._privileged).
_OWN_PREAMBLE = f"{IMAGE_PATH_VARIABLE}=${{PATH-}}"


#: inspect's modules that issue commands on its own behalf (its sample setup, its tools' installation,
#: its framework directory): their calls reach the sandbox through these, and a tool's never does.
_OWN_MODULES = frozenset(
    {
        "inspect_ai.util._sandbox._privileged",
        "inspect_ai.util._sandbox._framework_directory",
        "inspect_ai.util._sandbox.context",
    }
)
#: Frames looked through for one of them: inspect's own wrappers (its event-recording proxy) sit between.
_DEPTH = 32


def inspects_own(cmd: list[str]) -> bool:
    """Whether `cmd` is inspect's own plumbing rather than a tool's call: not charged, not recorded.

    Decided by who asked, never by what the command says: a tool that runs the agent's text as
    `/bin/sh -c TEXT` must not make it uncharged by starting TEXT as inspect's scripts start.
    The exec must come from one of inspect's own modules (found on the caller's frames, where
    `await` leaves them: the coroutine that awaits an exec is on the stack while it runs), and
    the command must be one of its preambles besides.
    """
    # Its privileged scripts all begin the same way; its framework directory's script is one text.
    shaped = (
        len(cmd) >= 3
        and cmd[0] == SHELL_PATH
        and cmd[1] == "-c"
        and (cmd[2].startswith(_OWN_PREAMBLE) or cmd[2] == framework_directory_script())
    )
    return shaped and _issued_by_inspect()


def _issued_by_inspect() -> bool:
    import sys
    from types import FrameType

    frame: FrameType | None = sys._getframe(1)
    for _ in range(_DEPTH):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") in _OWN_MODULES:
            return True
        frame = frame.f_back
    return False


#: The tools whose calls go to inspect's tools server (a shell kept between calls, remote processes).
_SERVER_METHODS = ("bash_session", "exec_remote", "mcp_")


def needs_tools_server(request: str | bytes | None) -> bool:
    """Whether a call of inspect's sandbox tools names a method its server would run."""
    import json

    try:
        method = json.loads(request or "{}").get("method", "")
    except (ValueError, AttributeError):
        return False
    return isinstance(method, str) and method.startswith(_SERVER_METHODS)


__all__ = ["framework_directory_script", "inspects_own", "needs_tools_server", "scoring"]
