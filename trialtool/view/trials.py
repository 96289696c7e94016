"""Finding trials on disk: a trial is a state file and its log, wherever a benchmark left them.

A state is a `.json` file that holds a trialtool state. Its log is found by
identity, never by name alone: the log whose first record carries the state's
trial id, looked for first at the path the state stores (`log_path`), then
beside it with the same stem (`t1.json`, `t1.jsonl`), then among the `.jsonl`
files of its directory. A log with no record yet (a trial created, never
called) pairs by the stored path, the stem, or as the one log left beside the
one state left. Hidden files (temporaries, the sandbox's `/tmp`) are skipped.
Directories are walked; a path with `*`, `?` or `[` is a glob (`**` reaches any
depth).

What a sandboxed command could write is not evidence: a state found inside
the workspace or a writable path of another trial that ran in a sandbox
(bwrap or a container, where those paths are the only ones it could write) is skipped and
counted, so that a trial the agent fabricated is never graded. A trial's own
files inside its own workspace are its own (the sandbox keeps its command off
them). Without a sandbox a command can write anywhere its user can; no path
tells its files apart (docs/graders.md).
"""

from __future__ import annotations

import functools
import glob
import json
import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from ..errors import UsageError
from ..signing import statement as statements

#: The longest first line read for its trial id (a call's record holds its output, a few MB).
_FIRST_LINE = 64 << 20


class Found(NamedTuple):
    """The trials found, each (state, log) once in a stable order; and the states skipped."""

    pairs: list[tuple[str, str]]
    #: States found inside another sandboxed trial's workspace or writable paths.
    ignored: list[str]

    def note(self) -> str | None:
        """The line a grader is told about what was skipped, if anything was."""
        if not self.ignored:
            return None
        count = len(self.ignored)
        return f"{count} file{'s' if count != 1 else ''} inside trials' workspaces ignored (a command could write them)"


class _State(NamedTuple):
    path: str
    trial_id: str
    log_path: str | None
    #: Where its command could write (real paths), when it ran in the bwrap sandbox.
    roots: tuple[str, ...]


def find(paths: Iterable[str]) -> Found:
    """Every trial under `paths`."""
    states: dict[str, tuple[_State, list[str]]] = {}
    for path in paths:
        if any(ch in path for ch in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                msg = f"no file matches {path!r}"
                raise UsageError(msg)
            for match in matches:
                _collect(match, states)
        elif os.path.exists(path):
            _collect(path, states)
        else:
            msg = f"no such file or directory: {path}"
            raise UsageError(msg)
    roots = [(found.path, root) for found, _ in states.values() for root in found.roots]
    pairs: list[tuple[str, str]] = []
    ignored: list[str] = []
    taken: set[str] = set()
    for real, (found, logs) in states.items():
        if any(_inside(real, root) for owner, root in roots if owner != found.path):
            ignored.append(found.path)
            continue
        log = _log_of(found, logs, taken)
        taken.add(_real(log))
        pairs.append((found.path, log))
    return Found(pairs, ignored)


@functools.lru_cache(maxsize=4096)
def _real_directory(directory: str) -> str:
    return os.path.realpath(directory)


def _real(path: str) -> str:
    """`path` with its directory's links resolved (once a directory: a benchmark has thousands of files)."""
    directory, name = os.path.split(path)
    return os.path.join(_real_directory(directory or "."), name)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _collect(path: str, states: dict[str, tuple[_State, list[str]]]) -> None:
    """Add the states under `path`, each with the `.jsonl` files of its directory."""
    if os.path.isdir(path):
        for directory, subdirectories, files in os.walk(path):
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
            _directory(directory, files, states)
    elif path.endswith(".json"):
        directory = os.path.dirname(path) or "."
        _directory(directory, os.listdir(directory), states, only=_real(path))


def _directory(
    directory: str, names: list[str], states: dict[str, tuple[_State, list[str]]], only: str | None = None
) -> None:
    visible = sorted(name for name in names if not name.startswith("."))
    logs = [os.path.join(directory, name) for name in visible if name.endswith(".jsonl")]
    for name in visible:
        if not name.endswith(".json") or name.endswith(statements.SUFFIX):
            continue  # a signed trial's statement is not a state: not even read
        path = os.path.join(directory, name)
        real = _real(path)
        if real in states or (only is not None and real != only):
            continue
        found = _read_state(path)
        if found is not None:
            states[real] = (found, logs)


def _read_state(path: str) -> _State | None:
    """The state at `path`, or None for any other file."""
    try:
        with open(path, "rb") as handle:
            document: object = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("schema") != "trialtool.state":
        return None
    trial_id = document.get("trial_id")
    if not isinstance(trial_id, str):
        return None
    log_path = document.get("log_path")
    sandbox = document.get("sandbox")
    roots: tuple[str, ...] = ()
    # The paths a backend pinned by identity are the only ones its commands could write (none pins none).
    if isinstance(sandbox, dict) and sandbox.get("pins"):
        named = [sandbox.get("workspace"), *(sandbox.get("writable") or [])]
        roots = tuple(os.path.realpath(root) for root in named if isinstance(root, str) and root)
    return _State(path, trial_id, log_path if isinstance(log_path, str) else None, roots)


def _first_id(path: str) -> str | None:
    """The trial id the log's first record names; "" for an empty log; None for no log of ours."""
    try:
        with open(path, "rb") as handle:
            # A whole line: an older log's first record is a call, its output ahead of `trial_id`.
            head = handle.readline(_FIRST_LINE)
    except OSError:
        return None
    if not head:
        return ""
    try:
        document = json.loads(head)
    except ValueError:
        return None
    trial_id = document.get("trial_id") if isinstance(document, dict) else None
    return trial_id if isinstance(trial_id, str) else None


def _log_of(found: _State, logs: list[str], taken: set[str]) -> str:
    """The log whose first record is this trial's; an empty one where none has a record yet."""
    stem = found.path[: -len(".json")] + ".jsonl"
    stored: list[str] = []
    if found.log_path:
        # Its name beside the state first: a trial copied elsewhere whole still pairs with its own copy.
        stored = [os.path.join(os.path.dirname(found.path), os.path.basename(found.log_path)), found.log_path]
    named_paths = (*stored, stem)
    empty = None
    for candidate in _unique([*named_paths, *logs]):
        if _real(candidate) in taken:
            continue
        named = _first_id(candidate)
        if named == found.trial_id:
            return candidate
        if named == "" and empty is None and candidate in named_paths:
            empty = candidate
    if empty is not None:
        return empty
    # No log names this trial: the one empty log beside it, or the stem (verify then says what is wrong).
    spare = [log for log in logs if _real(log) not in taken and _first_id(log) == ""]
    return spare[0] if len(spare) == 1 else stem


def _unique(items: Iterable[str]) -> Iterator[str]:
    seen: set[str] = set()
    for item in items:
        if item not in seen:
            seen.add(item)
            yield item


__all__ = ["Found", "find"]
