"""`python -m trialtool`: the same as the `trial-tool` command."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # `python -m` puts the working directory first on the import path, and a call's
    # working directory is often a workspace its commands may write: nothing more is
    # imported from there (`python -P -m trialtool` does not put it there at all).
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    from trialtool.doors.cli import entry

    entry()
