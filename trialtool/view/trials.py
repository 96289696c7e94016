"""Finding trials on disk: a trial is a state file and its log, wherever a benchmark left them.

A state is a `.json` file that holds a trialtool state; its log is the
`.jsonl` file beside it with the same stem (`t1.json`, `t1.jsonl`), else the
one `.jsonl` file in its directory whose records carry its trial id, else
the only `.jsonl` file left in a directory that holds one state (the
headline `s.json` and `l.jsonl`). Hidden files (temporaries, the sandbox's
`/tmp`) are skipped. Directories are walked; a path with `*`, `?` or `[` is
a glob (`**` reaches any depth).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator

from ..errors import UsageError

#: Bytes read from the front of a file to tell a trialtool state or log from other JSON.
_PEEK = 4096


def find(paths: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(state, log) of every trial under `paths`, each once, in a stable order."""
    seen: set[str] = set()
    for path in paths:
        if any(ch in path for ch in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                msg = f"no file matches {path!r}"
                raise UsageError(msg)
            for match in matches:
                yield from _unseen(_under(match), seen)
        elif os.path.exists(path):
            yield from _unseen(_under(path), seen)
        else:
            msg = f"no such file or directory: {path}"
            raise UsageError(msg)


def _unseen(pairs: Iterator[tuple[str, str]], seen: set[str]) -> Iterator[tuple[str, str]]:
    for state, log in pairs:
        if state not in seen:
            seen.add(state)
            yield state, log


def _under(path: str) -> Iterator[tuple[str, str]]:
    if os.path.isdir(path):
        for directory, subdirectories, files in os.walk(path):
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
            yield from _pairs(directory, files)
    elif path.endswith(".jsonl"):
        return  # a log is found from its state
    else:
        directory = os.path.dirname(path) or "."
        for state, log in _pairs(directory, os.listdir(directory)):
            if os.path.samefile(state, path):
                yield state, log


def _pairs(directory: str, names: list[str]) -> Iterator[tuple[str, str]]:
    """The trials of one directory."""
    visible = sorted(name for name in names if not name.startswith("."))
    states = [name for name in visible if name.endswith(".json")]
    logs = {name[: -len(".jsonl")]: name for name in visible if name.endswith(".jsonl")}
    unpaired: list[str] = []
    paired: set[str] = set()
    for name in states:
        stem = name[: -len(".json")]
        if stem in logs:
            paired.add(logs[stem])
            yield os.path.join(directory, name), os.path.join(directory, logs[stem])
        elif _trial_id(os.path.join(directory, name), state=True) is not None:
            unpaired.append(name)
    if not unpaired:
        return
    left = {name: _trial_id(os.path.join(directory, name), state=False) for name in logs.values() if name not in paired}
    for name in unpaired:
        state = os.path.join(directory, name)
        trial_id = _trial_id(state, state=True)
        match = next((log for log, of in left.items() if of == trial_id), None)
        if match is None and len(unpaired) == 1 and len(left) == 1:
            match = next(iter(left))
        if match is not None:
            left.pop(match)
            yield state, os.path.join(directory, match)
        else:
            yield state, os.path.join(directory, name[: -len(".json")] + ".jsonl")


def _trial_id(path: str, *, state: bool) -> str | None:
    """The trial id a state holds, or the first record of a log names; None for any other file."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_PEEK if not state else -1)
    except OSError:
        return None
    if not state:
        head = head.split(b"\n", 1)[0]
    try:
        document = json.loads(head)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    if state and document.get("schema") != "trialtool.state":
        return None
    trial_id = document.get("trial_id")
    return trial_id if isinstance(trial_id, str) else None


__all__ = ["find"]
