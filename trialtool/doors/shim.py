"""The drop-in shell shim: `sh -c CMD` from a harness becomes one budgeted call of a trial.

This module writes the shims; what they run is shimcall.py.

`trial-tool shim DIR --state S --log L [flags]` writes `DIR/sh` and `DIR/bash`,
two small scripts with the trial baked in. A harness that runs its tool calls
as `sh -c CMD` or `bash -lc CMD` (by name, through PATH) gets them budgeted once
DIR is first on its PATH; one that takes a shell path (`SHELL`, or
`subprocess.run(cmd, shell=True, executable=...)`) is pointed at `DIR/sh`.

Each invocation runs `REAL_SHELL ARGS...` through trial-tool exactly as
`trial-tool --state S --log L [flags] -- REAL_SHELL ARGS...` would: the shim
prints the delivered stdout and stderr and exits with the call's code (123 once
a budget is spent). The command's PATH has DIR removed, so shells the command
itself starts (`make`, `git` hooks, scripts) are the real ones and not extra
calls. A shell with nothing to run (no `-c` and no script: it would read
commands from stdin, an interactive or piped session) is refused with exit
125, not run unbudgeted: a persistent shell cannot be split into calls here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from ..errors import UsageError

#: The shells a shim directory provides.
SHELLS = ("sh", "bash")

_TEMPLATE = """#!/bin/sh
# trial-tool shell shim: every invocation is one budgeted call of the trial below.
# Made by `trial-tool shim`; remove DIR from PATH to stop budgeting.
exec {python} -P -m trialtool.doors.shimcall --real-shell {real} --shim-dir {directory} -- {flags} -- "$@"
"""


def _real_shell(name: str, directory: str) -> str:
    """The first `name` on PATH that is not in the shim directory (else /bin/NAME)."""
    search = path_without(directory)
    found = shutil.which(name, path=search)
    if found is None and os.path.exists(f"/bin/{name}"):
        found = f"/bin/{name}"
    if found is None:
        msg = f"no real {name} found on PATH"
        raise UsageError(msg)
    # Not resolved further: bash run as `sh` behaves as sh, and must stay so.
    return os.path.abspath(found)


def path_without(directory: str) -> str:
    """This process's PATH with the shim directory taken out."""
    entries = os.environ.get("PATH", os.defpath).split(os.pathsep)
    return os.pathsep.join(entry for entry in entries if not _same_dir(entry, directory))


def _same_dir(entry: str, directory: str) -> bool:
    try:
        return os.path.samefile(entry or ".", directory)
    except OSError:
        return False


def install(directory: str, flags: list[str]) -> list[str]:
    """Write the shims into `directory` (created if needed); return their paths."""
    os.makedirs(directory, exist_ok=True)
    directory = os.path.realpath(directory)
    written = []
    for name in SHELLS:
        try:
            real = _real_shell(name, directory)
        except UsageError:
            continue  # no bash on this machine: only sh
        path = os.path.join(directory, name)
        text = _TEMPLATE.format(
            python=shlex.quote(sys.executable),
            real=shlex.quote(real),
            directory=shlex.quote(directory),
            flags=shlex.join(flags),
        )
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o755)
        os.replace(temporary, path)
        written.append(path)
    return written


def runs_something(shell_args: list[str]) -> bool:
    """Would `sh ARGS` run a command string or a script, rather than read commands from stdin?"""
    args = iter(shell_args)
    for arg in args:
        if arg in _TAKES_VALUE:
            next(args, None)  # -o pipefail, -O extglob, --rcfile FILE
        elif arg == "--" or arg.startswith("--"):
            continue  # bash's long options (--login, --norc, ...)
        elif arg.startswith(("-", "+")) and len(arg) > 1:
            if arg[0] == "-" and "c" in arg[1:]:
                return True  # -c, -lc, -ec ...
            if "s" in arg[1:]:
                return False  # explicitly: read commands from stdin
        else:
            return True  # the first operand is a script to run
    return False


#: Shell options whose value is the next argument.
_TAKES_VALUE = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})


__all__ = ["SHELLS", "install", "path_without", "runs_something"]
