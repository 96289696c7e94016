"""The `podman` backend: the container backend of _docker.py, over podman's own client.

Podman needs no daemon: its client makes and runs the container itself, as
this user (rootless: the container's root is the user; as root: the host's root
with every capability dropped, as docker's is). Its init is catatonit. The
container's life, the script a call runs and the stops are the container
backend's; all this row says is which client is pinned.
"""

from __future__ import annotations

from ._docker import Engine

#: Podman, as root, raises a container's open-files and process limits to its own maximum, which a
#: host that does not let it raise a hard limit refuses: its containers get the caller's.
PODMAN = Engine("podman", ("podman",), caller_limits=True)

__all__ = ["PODMAN"]
