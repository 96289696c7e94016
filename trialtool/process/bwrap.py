"""Wrap one command in bubblewrap: the argv that builds the sandbox, and reading back how it ended.

The view the command gets (docs/sandbox.md):

- the host's root read-only; a private /dev; a fresh /proc of a new pid
  namespace (no trial-tool process in it); an empty /run (no sockets of the
  host's daemons); the trial's own /tmp (a directory beside the state, kept
  across the trial's calls); the workspace and the writable paths bound
  read-write;
- the trial's files (state, log, lock, key file) hidden. A directory holding
  one that no writable path reaches is covered by an empty read-only tmpfs
  (writable paths inside it are bound back). A file inside a writable path is
  overmounted by an unusable node, and every directory between the writable
  root and it is bound onto itself, so that nothing can rename or delete the
  way to it. Such a trial's calls then run one at a time (`exposed`): trial-tool
  replaces the state by rename, and a rename on the host lifts the overmount
  in every sandbox that has it;
- new user, ipc, uts, cgroup, pid and network namespaces (the network one
  shared back with --network host); no capabilities even as root; no nested
  user namespaces; a new session; killed if its supervisor dies.

bwrap reports on a status descriptor: a JSON document with `exit-code` once
the command has run and ended. Without it, bwrap exited 1 because it could not
set the sandbox up, or could not execute the command ("bwrap: execvp ...").
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from ..errors import UsageError
from ..osio import plain
from ..sandbox import ISOLATION, Sandbox, program, unavailable

#: The descriptor bwrap writes its JSON status to, in bwrap's own process.
STATUS_FD = 3
#: Processes of bwrap's own in the command's tree: its monitor, and the pid namespace's init.
OWN_PROCESSES = 2


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Layout(NamedTuple):
    """How the trial's files are kept from the command (see the module docstring)."""

    #: Directories covered by an empty read-only tmpfs.
    covered: tuple[str, ...]
    #: Files inside a writable path, overmounted.
    overmounted: tuple[str, ...]
    #: Directories between a writable root and an overmounted file, bound onto themselves.
    held: tuple[str, ...]

    @property
    def exposed(self) -> bool:
        """True when a trial file sits inside a writable path: its calls must run one at a time."""
        return bool(self.overmounted)


def layout(sandbox: Sandbox, files: list[str]) -> Layout:
    """Where each of the trial's `files` is hidden; UsageError for a file directly under /."""
    roots = [path for path in (sandbox.workspace, *sandbox.writable) if path is not None]
    covered: set[str] = set()
    overmounted: set[str] = set()
    held: set[str] = set()
    for name in files:
        for path in {
            os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(name))), os.path.basename(name)),
            os.path.realpath(name),
        }:
            directory = os.path.dirname(path)
            root = next((root for root in roots if _inside(path, root)), None)
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
            while _inside(directory, root) and directory != root:
                held.add(directory)
                directory = os.path.dirname(directory)
    return Layout(tuple(sorted(covered)), tuple(sorted(overmounted)), tuple(sorted(held)))


def arguments(
    path: str, sandbox: Sandbox, hide: Layout, tmp_dir: str, cwd: str, argv: list[str], open_files: int = 0
) -> list[str]:
    """The argv that runs `argv` in `sandbox` with the trial's files hidden as `hide` says.

    `open_files` (the trial's --max-open-files) is set by a shell inside the sandbox, just
    before it becomes the command: bwrap cannot set a sandbox up within a small limit.
    """
    wrapped = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
    if sandbox.network == "host":
        resolver = os.path.realpath("/etc/resolv.conf")
        if _inside(resolver, "/run") and os.path.exists(resolver):
            wrapped += ["--ro-bind", resolver, resolver]  # name resolution through a daemon's file
    # The trial's /tmp first: a workspace or a trial file under the host's /tmp is then
    # mounted on top of it (bwrap makes the mount points), not hidden under it.
    wrapped += ["--bind", tmp_dir, "/tmp"]
    # Shallow first: a directory covered inside another covered one is made in the outer tmpfs.
    for directory in sorted(hide.covered, key=len):
        wrapped += ["--tmpfs", directory]
    roots = sorted({path for path in (sandbox.workspace, *sandbox.writable) if path is not None}, key=len)
    for root in roots:
        wrapped += ["--bind", root, root]
    held = set(hide.held)
    if any(_inside(tmp_dir, root) for root in roots):
        held.add(tmp_dir)  # beside a state in the workspace: not to be renamed or replaced by a link
    for directory in sorted(held, key=len):
        wrapped += ["--bind", directory, directory]
    for name in hide.overmounted:
        # A device node on a nodev mount: it can be neither opened nor replaced.
        wrapped += ["--ro-bind", "/dev/null", name]
    for directory in hide.covered:
        wrapped += ["--remount-ro", directory]
    wrapped += ["--chdir", cwd, *ISOLATION]
    if sandbox.network == "host":
        wrapped.append("--share-net")
    if open_files:
        argv = ["/bin/sh", "-c", f'ulimit -n {open_files} && exec "$@"', "sh", *argv]
    wrapped += ["--json-status-fd", str(STATUS_FD), "--", *argv]
    return wrapped


def exit_code(status: bytes) -> int | None:
    """The command's exit code from bwrap's status documents, or None when the command never ran."""
    decoder = json.JSONDecoder()
    text = status.decode("utf-8", "replace")
    index = 0
    found = None
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return found
        try:
            document, index = decoder.raw_decode(text, index)
        except ValueError:
            return found
        if isinstance(document, dict) and isinstance(document.get("exit-code"), int):
            found = document["exit-code"]


def failure(stderr: bytes) -> tuple[str, str]:
    """Why bwrap ran nothing, from what it wrote: ("not_found" | "not_executable" | "sandbox", the reason)."""
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    last = lines[-1] if lines else "bwrap exited without a word"
    if last.startswith("bwrap: execvp "):
        reason = last.rpartition(": ")[2]
        return ("not_found" if reason == os.strerror(2) else "not_executable"), reason
    return "sandbox", last


class Plan:
    """One trial's sandbox as its calls use it: where its files are hidden, its /tmp, bwrap itself."""

    def __init__(self, sandbox: Sandbox, state_path: str, files: list[str]) -> None:
        self.sandbox = sandbox
        self.state_path = state_path
        self.layout = layout(sandbox, files)

    def check(self, cwd: str, trial_id: str) -> str:
        """Before the call is charged: the trial's /tmp, made if need be.

        SandboxError if bwrap cannot run here or a writable path is gone, UsageError
        if `cwd` is hidden in the sandbox.
        """
        from ..errors import SandboxError

        reason = unavailable()
        if reason is not None:
            raise SandboxError(f"this trial runs its commands in the bwrap sandbox, which cannot run here: {reason}")
        roots = [path for path in (self.sandbox.workspace, *self.sandbox.writable) if path is not None]
        for root in roots:
            if not os.path.exists(root):
                raise SandboxError(f"the trial's writable path {plain(root)} no longer exists")
        real = os.path.realpath(cwd)
        if any(_inside(real, directory) for directory in self.layout.covered) and not any(
            _inside(real, root) for root in roots
        ):
            msg = f"the call's directory {plain(cwd)} is hidden in the sandbox (it holds the trial's files)"
            raise UsageError(msg)
        return tmp_directory(self.state_path, trial_id)

    def wrap(self, argv: list[str], cwd: str, tmp_dir: str, open_files: int = 0) -> list[str]:
        """The bwrap command line that runs `argv` in `cwd`, with `tmp_dir` (from `check`) as its /tmp."""
        path = program()
        if path is None:
            from ..errors import SandboxError

            raise SandboxError("bubblewrap is no longer installed here")
        present = self.layout._replace(
            overmounted=tuple(name for name in self.layout.overmounted if os.path.lexists(name))
        )
        return arguments(path, self.sandbox, present, tmp_dir, cwd, argv, open_files)


def tmp_directory(state_path: str, trial_id: str) -> str:
    """The trial's own /tmp: a directory beside its state, made (0700) on first use, never a symlink.

    Checked before every call: bwrap follows a link, and in a trial whose state sits in
    its workspace the directory is reachable by the command (bound onto itself there,
    so that it cannot be renamed or replaced, but checked all the same).
    """
    import stat

    directory, name = os.path.split(os.path.abspath(state_path))
    path = os.path.join(directory, f".{name}.sandbox-tmp-{trial_id}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        from ..errors import SandboxError

        msg = f"the trial's sandbox /tmp {plain(path)} is not a directory of this user's (replaced?)"
        raise SandboxError(msg)
    return path


__all__ = [
    "OWN_PROCESSES",
    "STATUS_FD",
    "Layout",
    "Plan",
    "arguments",
    "exit_code",
    "failure",
    "layout",
    "program",
    "tmp_directory",
    "unavailable",
]
