"""Where the per-user server's socket lives, by the rule every process applies the same way.

The CLI finds its server there (doors/userclient.py), and every sandbox hides
it (sandbox/), whatever TMPDIR, XDG_RUNTIME_DIR or
TRIALTOOL_SERVER_DIR say. Imports nothing: the client reads it on every call.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Where the socket lives, instead of $XDG_RUNTIME_DIR/trialtool or $TMPDIR/trialtool-UID.
SERVER_DIR_ENV = "TRIALTOOL_SERVER_DIR"


def directory(environ: Mapping[str, str] = os.environ) -> str:
    """The socket's directory: TRIALTOOL_SERVER_DIR, else $XDG_RUNTIME_DIR/trialtool, else TMPDIR/trialtool-UID."""
    chosen = environ.get(SERVER_DIR_ENV)
    if chosen:
        return os.path.abspath(str(chosen))
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "trialtool")
    return os.path.join(_temp_directory(environ), f"trialtool-{os.getuid()}")


def _temp_directory(environ: Mapping[str, str]) -> str:
    """$TMPDIR (or $TEMP, $TMP) when it names a directory, else /tmp.

    Not tempfile.gettempdir(): importing tempfile costs a warm call ~8 ms here
    (it pulls in shutil, random and the compression modules), more than the rest
    of the client together.
    """
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = environ.get(name)
        if value and os.path.isdir(value):
            return os.path.abspath(str(value))
    return "/tmp"


__all__ = ["SERVER_DIR_ENV", "directory"]
