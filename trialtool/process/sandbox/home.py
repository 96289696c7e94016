"""A home of the trial's own: the host's `$HOME` as the sandbox shows it under `--home trial` (asked for).

bubblewrap 0.8 (Debian 12's) has no overlay mounts, so the writable layer on
top of the host's home is a directory of the trial's, `.STATE.sandbox-home-
TRIALID` beside its state, bound at `$HOME` and kept across the trial's calls
(like its `/tmp`). It is made on the trial's first sandboxed call from the
host's home as it is then:

- files and directories small enough are copied, so that tools that write
  there (a shell profile, `git config --global`, pyenv's `shims`, pip's and
  npm's caches) write their own copies;
- a directory too large to copy is entered, up to `DEPTH` levels, and what
  is still too large below it is bound read-only from the host, at its place;
- links are made again as they are; sockets, FIFOs and devices are left out.

The host's home never changes. The layer (0700) holds copies of the home's
small files, within a budget a trial (a few MB at most), so it is as private as
the home itself and goes where the trial's files go: that, and its disk, are
why a trial has it only when asked (docs/sandbox.md). What is bound read-only is listed in a file
beside the state, which the sandbox hides like the state itself: the command
cannot name what trial-tool binds. The trial's own files, wherever they are in
the home, are neither copied nor bound (the sandbox hides them at their paths).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from typing import NamedTuple

from ...errors import SandboxError
from ...osio import plain
from ...sandbox import Pin
from . import pinned

#: Directories entered below the home when too large to copy whole; deeper ones are bound read-only.
DEPTH = 3
#: A file larger is bound read-only rather than copied.
FILE_BYTES = 256 << 10
#: A directory with more entries (all levels) or bytes is entered rather than copied.
TREE_ENTRIES = 64
TREE_BYTES = 1 << 20
#: What one trial's layer copies at most, over the whole home: beyond it, everything is bound read-only.
#: Every trial pays it in disk, beside its state: thousands of trials, thousands of layers.
BUDGET_ENTRIES = 512
BUDGET_BYTES = 2 << 20


class Home(NamedTuple):
    """A trial's home layer: where it is mounted, the directory behind it (pinned), and what is bound read-only."""

    path: str
    layer: Pin
    #: Paths relative to `path`, bound read-only from the host's home at their place in the layer.
    read_only: tuple[str, ...]


def listing(state_path: str) -> str:
    """The list of the home layer's read-only binds: beside the state, hidden like it (one a state path:
    a new trial there makes a new layer, and writes the list again)."""
    directory, name = os.path.split(os.path.abspath(state_path))
    return os.path.join(os.path.realpath(directory), f".{name}.sandbox-home-binds")


def names(state_path: str, trial_id: str) -> tuple[str, str]:
    """(the layer directory, the list of its read-only binds), beside the state."""
    directory, name = os.path.split(os.path.abspath(state_path))
    return os.path.join(os.path.realpath(directory), f".{name}.sandbox-home-{trial_id}"), listing(state_path)


def layer(state_path: str, trial_id: str, home: str, excluded: list[str]) -> Home:
    """The trial's home layer over `home`: made and filled on first use, checked (and pinned) on every call.

    `excluded` are paths never to copy or bind: the trial's own files and directories.
    """
    path, listing = names(state_path, trial_id)
    pin, made = pinned.own_directory(path, "the trial's sandbox home")
    if made or not os.path.lexists(listing):
        read_only = _fill(home, path, {os.path.realpath(p) for p in excluded} | {path, listing})
        temporary = listing + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(read_only, handle)
        os.replace(temporary, listing)
    try:
        with open(listing, encoding="utf-8") as handle:
            read_only = json.load(handle)
    except (OSError, ValueError) as exc:
        msg = f"the trial's sandbox home list {plain(listing)} cannot be read: {exc}"
        raise SandboxError(msg) from exc
    if not isinstance(read_only, list) or not all(_relative(item) for item in read_only):
        msg = f"the trial's sandbox home list {plain(listing)} is not trial-tool's (edited?)"
        raise SandboxError(msg)
    return Home(home, pin, tuple(read_only))


def _relative(item: object) -> bool:
    return isinstance(item, str) and bool(item) and not item.startswith("/") and ".." not in item.split("/")


class _Budget:
    def __init__(self) -> None:
        self.entries = BUDGET_ENTRIES
        self.bytes = BUDGET_BYTES


def _fill(host: str, layer_path: str, excluded: set[str]) -> list[str]:
    """Copy into `layer_path` what of `host` is small enough; the relative paths to bind read-only instead."""
    read_only: list[str] = []
    budget = _Budget()

    def visit(relative: str, depth: int) -> None:
        source = os.path.join(host, relative) if relative else host
        try:
            entries = sorted(os.scandir(source), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            name = os.path.join(relative, entry.name) if relative else entry.name
            target = os.path.join(layer_path, name)
            real = os.path.realpath(entry.path)
            if any(real == path or real.startswith(path.rstrip("/") + "/") for path in excluded):
                continue  # the trial's own: hidden at its path, never copied
            try:
                _place(entry, name, target, depth, budget, read_only, visit)
            except OSError:
                continue  # unreadable: left out, as the host's own permissions would have it

    visit("", 0)
    return read_only


def _place(
    entry: os.DirEntry[str],
    name: str,
    target: str,
    depth: int,
    budget: _Budget,
    read_only: list[str],
    visit: Callable[[str, int], None],
) -> None:
    if entry.is_symlink():
        os.symlink(os.readlink(entry.path), target)
        return
    info = entry.stat(follow_symlinks=False)
    if stat.S_ISREG(info.st_mode):
        if info.st_size <= FILE_BYTES and budget.entries > 0 and budget.bytes >= info.st_size:
            shutil.copy2(entry.path, target, follow_symlinks=False)
            budget.entries -= 1
            budget.bytes -= info.st_size
        else:
            open(target, "x").close()  # the mount point of its read-only bind
            read_only.append(name)
        return
    if not stat.S_ISDIR(info.st_mode):
        return  # a socket, FIFO or device: not the home's to carry
    size = _tree_size(entry.path)
    if size is not None and size[0] <= budget.entries and size[1] <= budget.bytes:
        shutil.copytree(entry.path, target, symlinks=True, ignore=_specials)
        budget.entries -= size[0]
        budget.bytes -= size[1]
        return
    os.mkdir(target)
    shutil.copystat(entry.path, target, follow_symlinks=False)
    if depth + 1 < DEPTH:
        visit(name, depth + 1)
    else:
        read_only.append(name)


def _tree_size(path: str) -> tuple[int, int] | None:
    """(entries, bytes) of the tree at `path`, or None once past TREE_ENTRIES or TREE_BYTES (or unreadable)."""
    entries = total = 0
    for directory, subdirectories, files in os.walk(path):
        entries += len(subdirectories) + len(files)
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                return None
        if entries > TREE_ENTRIES or total > TREE_BYTES:
            return None
    return entries, total


def _specials(directory: str, names_here: list[str]) -> list[str]:
    """What `copytree` leaves out: sockets, FIFOs and devices."""
    left = []
    for name in names_here:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except OSError:
            left.append(name)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            left.append(name)
    return left


__all__ = ["DEPTH", "Home", "layer", "listing", "names"]
