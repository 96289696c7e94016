"""`python -m trialtool`: the same as the `trial-tool` command."""

from __future__ import annotations

from .doors.cli import entry

if __name__ == "__main__":
    entry()
