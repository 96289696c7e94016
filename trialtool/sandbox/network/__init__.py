"""The sandbox's network part for `--network allow`: the command's own namespace, and the proxy that is its one way out.

A call's proxy listens inside the sandbox's network namespace (_netns.py) and
checks every attempt against the trial's allowlist (the rules are the
sandbox room's `egress`) before it connects, recording each (_proxy.py).
Imported only by a call that needs it: the two modules are some 9 ms of
imports (socket, threading, ipaddress) that no other call pays.
"""

from __future__ import annotations

from ._netns import ADDRESS, PORT, CallNetwork, environment, listener_in
from ._proxy import MAX_OPEN, Proxy

__all__ = ["ADDRESS", "MAX_OPEN", "PORT", "CallNetwork", "Proxy", "environment", "listener_in"]
