"""What a shim script runs: one budgeted call of the real shell, as `trial-tool ... -- SHELL ARGS` would.

`python -m trialtool.doors.shimcall --real-shell P --shim-dir D -- FLAGS -- SHELL_ARGS...`;
the shim scripts that shim.py writes are one `exec` of this.
"""

from __future__ import annotations

import os
import sys

from . import cli
from .shim import path_without, runs_something


def main(argv: list[str] | None = None) -> int:
    """`python -m trialtool.doors.shimcall --real-shell P --shim-dir D -- FLAGS -- SHELL_ARGS...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        real, directory = args[1], args[3]
        if args[0] != "--real-shell" or args[2] != "--shim-dir" or args[4] != "--":
            raise IndexError
        rest = args[5:]
        cut = rest.index("--")
    except (IndexError, ValueError):
        print("trial-tool shim: malformed shim script; make it again with `trial-tool shim`", file=sys.stderr)
        return 125
    flags, shell_args = rest[:cut], rest[cut + 1 :]
    if not runs_something(shell_args):
        print(
            f"trial-tool shim: `{os.path.basename(real)}` with nothing to run (it would read commands from stdin); "
            "the shim budgets `sh -c CMD` and `sh SCRIPT` only",
            file=sys.stderr,
        )
        return 125
    path = path_without(directory)
    # The shims are trial-tool's own: a command must not rewrite what the harness runs next.
    return cli.main([*flags, "--env", f"PATH={path}", "--read-only", directory, "--", real, *shell_args])


if __name__ == "__main__":
    cli.exit_after(main)


__all__ = ["main"]
