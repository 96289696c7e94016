"""The per-user server that runs a user's CLI calls warm: its client, its wire, its world, its directory.

The first `trial-tool` call of a user starts it (`python -I -m
trialtool.server._server SOCKET`, _server.py); later calls hand it their call
over a unix socket (_client.py, _wire.py) instead of loading trialtool again.
Where its socket lives (_directory.py) is the one rule the client and every
sandbox apply: a sandboxed command never reaches a server's socket.
"""

from __future__ import annotations

from . import _client as client
from . import _directory as directory
from . import _wire as wire
from . import _world as world

__all__ = ["client", "directory", "wire", "world"]
