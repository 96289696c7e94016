"""The container engine, as far as a trial needs it: one container's state, asked in about a millisecond.

A call asks whether its trial's container is running, and from which image.
The engine's own API answers over its unix socket in about a millisecond, where
starting the `docker` client takes tens; the client is asked where there is no
such socket (an engine at a tcp or ssh address, or podman without its service).
Everything that changes a container goes through the client: the trial's
pinned one (_docker.py), or for `close` and `gc` (`remove`, `listed`) the one
they were given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import SandboxError

#: Where docker's engine listens unless DOCKER_HOST says otherwise.
DEFAULT_SOCKET = "/var/run/docker.sock"
#: Labels on every container of trial-tool's: its trial, and the state file that owns it.
TRIAL_LABEL = "trialtool.trial"
STATE_LABEL = "trialtool.state"
LOG_LABEL = "trialtool.log"
#: How long a question to the engine may take before the client is asked instead.
_TIMEOUT = 10.0


class Seen(NamedTuple):
    """A container as the engine reports it."""

    id: str
    running: bool
    image: str
    labels: dict[str, str]
    #: The container's first process, as this machine's /proc numbers it (0: not running).
    pid: int = 0


def socket_path(client: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The engine's unix socket for `client` (docker's), or None: ask the client itself."""
    if os.path.basename(client) != "docker":
        return None  # podman's service socket is not always running: its client answers
    host = environ.get("DOCKER_HOST") or ""
    if host and not host.startswith("unix://"):
        return None
    if environ.get("DOCKER_CONTEXT"):
        return None  # a context of the user's choosing: the client knows where it points
    path = host[len("unix://") :] if host else DEFAULT_SOCKET
    return path if os.path.exists(path) else None


def container(client: str, name: str, environ: Mapping[str, str] = os.environ) -> Seen | None:
    """The container `name` as the engine sees it now, or None when there is none by that name.

    OSError when neither the engine nor its client answers.
    """
    path = socket_path(client, environ)
    if path is not None:
        try:
            return _by_socket(path, name)
        except (OSError, ValueError):
            pass  # the engine restarting, say: its client may know more
    return _by_client(client, name, environ)


def _by_socket(path: str, name: str) -> Seen | None:
    """One HTTP/1.0 request (the engine closes the connection after its answer): no client library to load."""
    import socket  # not at import: a call of another backend never loads it (the CLI counts its imports)

    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"not a container name: {name!r}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_TIMEOUT)
        sock.connect(path)
        sock.sendall(f"GET /containers/{name}/json HTTP/1.0\r\nHost: engine\r\n\r\n".encode())
        answer = bytearray()
        while chunk := sock.recv(1 << 16):
            answer += chunk
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status == 404:
        return None
    if status != 200:
        raise OSError(f"the container engine answered {status}: {body[:200]!r}")
    return _seen(json.loads(body))


def _by_client(client: str, name: str, environ: Mapping[str, str]) -> Seen | None:
    import subprocess

    done = subprocess.run(
        [client, "container", "inspect", "--format", "{{json .}}", name],
        capture_output=True,
        env=dict(environ),
        timeout=_TIMEOUT * 3,
        check=False,
    )
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()
        if "no such" in said.lower():
            return None
        raise OSError(said.splitlines()[-1] if said else f"{client} exited with {done.returncode}")
    return _seen(json.loads(done.stdout))


def _seen(data: Any) -> Seen:
    if isinstance(data, list):  # podman's inspect: a list of one
        data = data[0]
    state = data.get("State") or {}
    labels = (data.get("Config") or {}).get("Labels") or {}
    pid = state.get("Pid")
    pid = pid if type(pid) is int else 0
    return Seen(str(data["Id"]), bool(state.get("Running")), str(data.get("Image", "")), dict(labels), pid)


def remove(client: str, name: str) -> bool:
    """Stop and remove the container `name`; whether there was one. SandboxError if the engine cannot."""
    import subprocess

    try:
        done = subprocess.run([client, "rm", "--force", name], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"the container client did not answer: {exc}") from exc
    if done.returncode != 0 and "no such" not in done.stderr.decode(errors="replace").lower():
        raise SandboxError(f"the container {name} cannot be removed: {said(done.stderr)}")
    return done.returncode == 0 and bool(done.stdout.strip())


def listed(client: str) -> list[tuple[str, str, str, str]]:
    """Every container of trial-tool's on the engine: (name, trial id, state file, log).

    Their names from `ps`, then their labels from `inspect`, whose JSON docker and podman
    share (their `ps` templates differ on labels).
    """
    names = _client_output(client, "ps", "--all", "--filter", f"label={TRIAL_LABEL}", "--format", "{{.Names}}")
    found = [name for name in names.decode(errors="replace").split() if name]
    if not found:
        return []
    rows = []
    for data in json.loads(_client_output(client, "container", "inspect", *found)):
        seen, name = _seen(data), str(data.get("Name", "")).lstrip("/")
        labels = [seen.labels.get(label, "") for label in (TRIAL_LABEL, STATE_LABEL, LOG_LABEL)]
        rows.append((name, *labels))
    return [(name, trial_id, state, log) for name, trial_id, state, log in rows if name and trial_id]


def _client_output(client: str, *args: str) -> bytes:
    """What the client printed for `args`; SandboxError when it fails or does not answer."""
    import subprocess

    try:
        done = subprocess.run([client, *args], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"the container client did not answer: {exc}") from exc
    if done.returncode != 0:
        raise SandboxError(f"the container engine cannot list containers: {said(done.stderr)}")
    return done.stdout


def said(stderr: bytes) -> str:
    """The last line the client wrote on stderr: its reason."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else "no reason given"


__all__ = [
    "DEFAULT_SOCKET",
    "LOG_LABEL",
    "STATE_LABEL",
    "TRIAL_LABEL",
    "Seen",
    "container",
    "listed",
    "remove",
    "said",
    "socket_path",
]
