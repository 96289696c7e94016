"""A home of the trial's own: the host's `$HOME` as the sandbox shows it under `--home trial` (the default).

The host's home appears read-only with a writable layer of the trial's on top,
in one directory beside the trial's state, `.STATE.sandbox-home-TRIALID`
(0700). Its kind is decided on the trial's first sandboxed call and kept (the
pinned bwrap cannot change under the trial):

- **overlay**, where bwrap has overlay mounts (0.9 and later) and the kernel
  lets a user namespace mount one: the host's home is the read-only lower
  layer, `upper/` holds what the trial's commands changed, `work/` is the
  overlay's own. A file reaches `upper/` only when a command changes it.
- **directory** elsewhere (bubblewrap 0.8, Debian 12's, has no overlays):
  `home/` is made on the first call from the host's home as it is then, and
  copies nothing. Its directories, shallowest first and within a budget, are
  directories of the layer's own, in which a command can make, replace and
  remove entries; every file, and every directory past the budget, is a
  symbolic link into `VIEW`, where the sandbox shows the host's home
  read-only (one mount a call, however large the home). So `git config
  --global` (a new file renamed over the link), caches, pip's `--user`
  installs and pyenv's `shims` work, while writing inside one of the host's
  files fails as it does with `--home host`. The links resolve only inside the
  sandbox: trial-tool never follows what a command could have changed.
- **empty**, when the home itself holds the trial's files (a state directly in
  `$HOME`): the sandbox shows none of the host's home (as with `--home host`,
  where it is an empty tmpfs), and `home/` starts empty.

Every kind persists across the trial's calls like its `/tmp`, is never shared
between trials, and is hidden like the trial's other files. The host's home
never changes. What the sandbox hides below the home (the trial's files, the
per-user servers' directories) is neither entered nor linked, and is hidden
again on top of the layer and in `VIEW`.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from . import _pinned as pinned
from ._executable import overlay_works
from ._layout import inside
from ._settings import Binary, Pin

#: Where the sandbox shows the host's home read-only, for the directory layer's links.
VIEW = "/run/trialtool/host-home"
#: Levels of directories a directory layer may enter below the home; deeper ones are linked whole.
DEPTH = 6
#: A directory with more entries than this is linked whole rather than entered.
ENTERED = 256
#: What one trial's directory layer makes at most, shallowest first: entries (directories, links, copies),
#: directories entered, and bytes copied. Beyond them, directories are linked whole and files linked.
#: Every trial pays them in disk beside its state (about 0.25 MB; links take no blocks): thousands of
#: trials, thousands of layers.
BUDGET_ENTRIES = 1024
BUDGET_DIRECTORIES = 32
BUDGET_BYTES = 128 << 10
#: A file larger is linked rather than copied.
FILE_BYTES = 64 << 10


class Home(NamedTuple):
    """A trial's home layer: where it goes (the host's home), its kind, the directories behind it, pinned."""

    path: str
    #: "overlay", "directory" or "empty" (see the module docstring).
    kind: str
    #: The layer (`home/`), or the overlay's upper directory.
    layer: Pin
    #: The overlay's work directory.
    work: Pin | None = None
    #: What the sandbox hides below the home, hidden again on top of the layer (and in VIEW).
    hidden: tuple[str, ...] = ()


def directory(state_path: str, trial_id: str) -> str:
    """The trial's home layer directory, beside its state."""
    parent, name = os.path.split(os.path.abspath(state_path))
    return os.path.join(os.path.realpath(parent), f".{name}.sandbox-home-{trial_id}")


def layer(
    state_path: str, trial_id: str, home: str, binary: Binary, kept: Iterable[str], hidden: Iterable[str]
) -> Home:
    """The trial's home layer over `home`: decided and made on first use, pinned on every call.

    `kept` are the paths below the home the sandbox mounts itself (the writable
    paths); `hidden` those it hides (the trial's files, the servers'
    directories), or the home itself or a directory above it, which makes the
    layer empty. Neither is entered or linked, and every directory above one of
    them is entered. OSError when the layer cannot be made.
    """
    top, _ = pinned.own_directory(directory(state_path, trial_id), "the trial's sandbox home")
    below: list[str] = []
    empty = False
    for path in sorted({os.path.realpath(path) for path in hidden}, key=len):
        if inside(home, path):
            empty = True  # the home itself is hidden: the layer goes on where the sandbox covered it
        elif inside(path, home) and not any(inside(path, outer) for outer in below):
            below.append(path)
    upper, work, made = (os.path.join(top.path, name) for name in ("upper", "work", "home"))
    if not os.path.lexists(made) and not empty:
        if not os.path.lexists(upper) and overlay_works(binary, home, top.path):
            os.mkdir(upper, 0o700)
            os.mkdir(work, 0o700)
        if os.path.lexists(upper):
            return Home(home, "overlay", _pin(upper), _pin(work), tuple(below))
    if not os.path.lexists(made):
        partial = made + ".partial"
        shutil.rmtree(partial, ignore_errors=True)  # a first call that did not finish
        os.mkdir(partial, 0o700)
        if not empty:
            _fill(home, partial, {os.path.realpath(path) for path in (*kept, *below)} | {top.path})
        os.rename(partial, made)
    return Home(home, "empty" if empty else "directory", _pin(made), None, tuple(below))


def _pin(path: str) -> Pin:
    return pinned.own_directory(path, "the trial's sandbox home")[0]


class _Budget:
    """What one trial's directory layer may still make."""

    def __init__(self) -> None:
        self.entries = BUDGET_ENTRIES
        self.directories = BUDGET_DIRECTORIES
        self.bytes = BUDGET_BYTES


def _fill(host: str, layer_path: str, kept: set[str]) -> None:
    """Make in `layer_path` what of `host` is worth making, breadth first; link the rest into VIEW."""
    budget = _Budget()
    queue: deque[tuple[str, int]] = deque([("", 0)])
    while queue:
        relative, depth = queue.popleft()
        try:
            entries = sorted(os.scandir(os.path.join(host, relative)), key=lambda entry: entry.name)
        except OSError:
            continue  # unreadable: as the host's own permissions would have it
        for entry in entries:
            name = os.path.join(relative, entry.name) if relative else entry.name
            real = os.path.realpath(entry.path)
            if any(inside(real, path) for path in kept):
                continue  # the trial's own, or a path the sandbox binds: hidden or mounted there
            try:
                if _place(entry, name, os.path.join(layer_path, name), depth, budget, kept):
                    queue.append((name, depth + 1))
            except OSError:
                continue


def _place(entry: os.DirEntry[str], name: str, target: str, depth: int, budget: _Budget, kept: set[str]) -> bool:
    """Make `target`, the layer's `name`: a copy, a directory (True: to be entered), or a link into VIEW."""
    budget.entries -= 1
    if entry.is_symlink():
        os.symlink(os.readlink(entry.path), target)  # as it is: resolved inside the sandbox
        return False
    info = entry.stat(follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        size = _entries(entry.path)
        # One above a path the sandbox binds is always entered: a link would lead that path through VIEW.
        holds = any(inside(path, os.path.realpath(entry.path)) for path in kept)
        if holds or (size is not None and depth + 1 < DEPTH and size <= budget.entries and budget.directories > 0):
            os.mkdir(target)
            shutil.copystat(entry.path, target, follow_symlinks=False)
            budget.directories -= 1
            budget.entries -= size or 0
            return True
    elif stat.S_ISREG(info.st_mode):
        # Copied when small and readable by anyone: a tool that locks or rewrites it beside itself (git
        # resolves a link first) then works. A file only its owner may read (a token, a key) is never copied.
        blocks = -(-info.st_size // 4096) * 4096  # what it takes on disk
        if info.st_mode & 0o044 == 0o044 and info.st_size <= FILE_BYTES and blocks <= budget.bytes:
            shutil.copy2(entry.path, target, follow_symlinks=False)
            budget.bytes -= blocks
            return False
    else:
        return False  # a socket, FIFO or device: not the home's to carry
    os.symlink(os.path.join(VIEW, name), target)
    return False


def _entries(path: str) -> int | None:
    """How many entries the directory at `path` holds (up to ENTERED), or None past it or unreadable."""
    count = 0
    try:
        with os.scandir(path) as listing:
            for _ in listing:
                count += 1
                if count > ENTERED:
                    return None
    except OSError:
        return None
    return count


__all__ = ["DEPTH", "VIEW", "Home", "directory", "layer"]
