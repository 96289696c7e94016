"""Where, in a trial's sandbox, each thing the command must not reach or change is kept from it.

- The trial's files (state, log, lock, key file): a directory holding one that
  no writable path reaches is covered by an empty read-only tmpfs (writable
  paths inside it are bound back). A file inside a writable path is
  overmounted by an unusable node; such a trial's calls then run one at a time
  (`exposed`): trial-tool replaces the state by rename, and a rename on the
  host lifts the overmount in every sandbox that has it.
- The per-user servers' directories (server/_directory.py): covered by an empty tmpfs,
  wherever they are.
- trial-tool's own files (_ownfiles.py) inside a writable path: bound read-only
  on top.
- Writable paths nested in one another: the inner one is bound after the outer.

Whatever is hidden, protected or nested inside a writable path has every
directory between that path and it bound onto itself, so that the command
cannot rename or delete the way to it (a mount point cannot be renamed): what
trial-tool names by path stays what it was.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..errors import UsageError
from ..osio import plain


def inside(path: str, root: str) -> bool:
    """`path` is `root` or below it (both canonical)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


class Layout(NamedTuple):
    """How the sandbox keeps things from the command (see the module docstring)."""

    #: Directories covered by an empty read-only tmpfs.
    covered: tuple[str, ...]
    #: Files inside a writable path, overmounted.
    overmounted: tuple[str, ...]
    #: Directories between a writable path and something kept inside it, bound onto themselves.
    held: tuple[str, ...]
    #: trial-tool's own files and directories inside a writable path, bound read-only.
    protected: tuple[str, ...] = ()
    #: Directories inside a writable path covered by an empty tmpfs (a server's directory).
    masked: tuple[str, ...] = ()
    #: The trial's home layer (_home.py), when its sandbox has one.
    home: Any = None

    @property
    def exposed(self) -> bool:
        """True when a trial file sits inside a writable path: its calls must run one at a time."""
        return bool(self.overmounted)


def _innermost(path: str, roots: tuple[str, ...]) -> str | None:
    """The longest root holding `path`, if any."""
    holding = [root for root in roots if inside(path, root)]
    return max(holding, key=len) if holding else None


def _hold(path: str, roots: tuple[str, ...], held: set[str]) -> None:
    """Hold every directory between `path` and the writable roots above it, up to the outermost."""
    directory = os.path.dirname(path)
    while directory != "/" and any(inside(directory, root) for root in roots):
        if directory not in roots:
            held.add(directory)
        directory = os.path.dirname(directory)


def layout(
    roots: tuple[str, ...],
    files: list[str],
    *,
    directories: Sequence[str] = (),
    own: Sequence[str] = (),
) -> Layout:
    """Where each of the trial's `files`, the hidden `directories` and trial-tool's `own` paths are kept.

    `roots` are the writable paths (canonical). UsageError for a trial file
    directly under /, or one that is itself writable.
    """
    covered: set[str] = set()
    overmounted: set[str] = set()
    held: set[str] = set()
    for name in files:
        for path in {
            os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(name))), os.path.basename(name)),
            os.path.realpath(name),
        }:
            directory = os.path.dirname(path)
            root = _innermost(path, roots)
            if root is None:
                if directory == "/":
                    msg = f"{plain(path)} sits directly under /, which a sandbox cannot hide; move it into a directory"
                    raise UsageError(msg)
                covered.add(directory)
                continue
            if path == root:
                msg = f"{plain(path)} is itself writable in the sandbox ({plain(root)}); it cannot be hidden"
                raise UsageError(msg)
            overmounted.add(path)
            _hold(path, roots, held)
    masked: set[str] = set()
    for directory in directories:
        if _innermost(directory, roots) is None:
            covered.add(directory)
        elif directory not in roots:
            masked.add(directory)
            _hold(directory, roots, held)
    protected: set[str] = set()
    for path in sorted(own, key=len):
        if _innermost(path, roots) is None or path in roots or any(inside(path, done) for done in protected):
            continue  # read-only already, or (a writable path itself) refused by ownfiles.refuse_writable
        protected.add(path)
        _hold(path, roots, held)
    for root in roots:
        if any(inside(root, outer) and root != outer for outer in roots):
            _hold(root, roots, held)  # a nested writable path: the way to it stays
    return Layout(
        tuple(sorted(covered)),
        tuple(sorted(overmounted)),
        tuple(sorted(held - protected)),
        tuple(sorted(protected)),
        tuple(sorted(masked)),
    )


def refuse_writable(files: Sequence[str], roots: Sequence[str], where: str) -> None:
    """UsageError when one of the trial's `files` lies in a writable path: a backend that binds those paths by
    name (`where` says into what) hides nothing inside them."""
    for path in files:
        real = os.path.realpath(path)
        if any(inside(real, root) for root in roots):
            msg = (
                f"the trial's file {plain(path)} lies in a path writable in {where}; "
                "keep the state, log and key files outside the workspace and writable paths"
            )
            raise UsageError(msg)


__all__ = ["Layout", "inside", "layout", "refuse_writable"]
