"""A network of the tests' own: a network and mount namespace holding made-up hosts, and servers on them.

The world is a process made with `unshare --net --mount` that sets its loopback
up, gives it the tests' addresses (documentation ranges, a private one, and
loopback), binds a hosts file of the tests' own over /etc/hosts inside its mount
namespace (the machine's own file is untouched), and then waits on its stdin:
closing that ends it. Nothing in it has a route anywhere else.

Servers listen in it from this process: a socket made while this thread is in
the world's namespace (setns) stays there, and is served from a thread here.
trial-tool runs in it through `nsenter`, so that its proxy resolves the names
by the world's hosts file and connects to the world's addresses.
"""

from __future__ import annotations

import ctypes
import http.server
import os
import shutil
import ssl
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: name -> address, in the world's hosts file.
HOSTS = {
    "web.test": "203.0.113.10",
    "pypi.test": "203.0.113.11",
    "git.test": "203.0.113.12",
    "other.test": "198.51.100.20",
    "inside.test": "10.77.0.5",
    "loop.test": "127.0.0.1",
    "allowed.test": "203.0.113.13",
    "www.allowed.test": "203.0.113.13",
    "xn--bcher-kva.allowed.test": "203.0.113.13",
    "evil.test": "203.0.113.7",
}
_CLONE_NEWNET = 0x40000000


def missing() -> str | None:
    """Why the world cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making a network namespace with addresses of its own needs root"
    for tool in ("unshare", "nsenter", "ip", "openssl", "curl"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


class World:
    """The tests' network: its holder process, its servers, and how to run a command in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        hosts = root / "hosts"
        hosts.write_text("".join(f"{address} {name}\n" for name, address in HOSTS.items()) + "127.0.0.1 localhost\n")
        addresses = sorted({address for address in HOSTS.values() if not address.startswith("127.")})
        setup = "ip link set lo up && " + " && ".join(f"ip addr add {a}/32 dev lo" for a in addresses)
        setup += f" && mount --bind {hosts} /etc/hosts && echo ready && read _"
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", setup],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the tests' network namespace could not be made")
        self.servers: list[http.server.HTTPServer] = []
        self.cert = root / "cert.pem"
        key = root / "key.pem"
        names = ",".join(f"DNS:{name}" for name in HOSTS)
        request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=web.test"]
        subprocess.run(
            ["openssl", *request, "-addext", f"subjectAltName={names}", "-keyout", str(key), "-out", str(self.cert)],
            check=True,
            capture_output=True,
        )
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(self.cert, key)

    def prefix(self) -> list[str]:
        """The command line prefix that runs a command in the world."""
        pid = self.holder.pid
        return ["nsenter", f"--net=/proc/{pid}/ns/net", f"--mount=/proc/{pid}/ns/mnt", "--"]

    @contextmanager
    def inside(self) -> Iterator[None]:
        """This thread in the world's network namespace (sockets made meanwhile stay there)."""
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        theirs = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(theirs, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the tests' network")
            try:
                yield
            finally:
                if libc.setns(own, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back")
        finally:
            os.close(own)
            os.close(theirs)

    def serve(self, directory: Path, address: str, port: int, *, tls: bool = False) -> list[str]:
        """Serve `directory`'s files at `address`:`port` in the world (HTTPS with the world's certificate).

        Returns the server's log: each request line it heard, in order.
        """
        heard: list[str] = []

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(directory), **kwargs)  # type: ignore[arg-type]

            def log_request(self, *args: object) -> None:
                heard.append(self.requestline)

            def log_message(self, *args: object) -> None:
                pass

        with self.inside():
            server = http.server.ThreadingHTTPServer((address, port), Quiet)
        if tls:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return heard

    def close(self) -> None:
        if self.holder.poll() is None:
            # The per-user server started for calls made in the world serves that world only: stopped from it.
            stop = [*self.prefix(), sys.executable, "-m", "trialtool", "server", "stop"]
            subprocess.run(stop, capture_output=True, timeout=120)
        for server in self.servers:
            server.shutdown()
            server.server_close()
        if self.holder.poll() is None:
            assert self.holder.stdin is not None
            self.holder.stdin.close()  # the holder's `read` ends, and with it the namespaces
            try:
                self.holder.wait(10)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()
        for stream in (self.holder.stdout, self.holder.stdin):
            if stream is not None and not stream.closed:
                stream.close()


def wheel(directory: Path, name: str = "trialtool_testpkg", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel, made by hand: one module that says it was installed."""
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "GREETING = 'installed through the allowlist'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{member},,\n" for member in files) + f"{info}/RECORD,,\n")
    return path


def package_index(root: Path) -> Path:
    """A simple (PEP 503) index served from a directory, holding one test wheel."""
    made = wheel(root)
    project = root / "simple" / "trialtool-testpkg"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<html><body><a href="../../{made.name}">{made.name}</a></body></html>\n')
    return root


def git_repository(root: Path, git: str) -> Path:
    """A bare repository served the dumb way (plain files), with one commit."""
    work, bare = root / "work", root / "repo.git"
    environ = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root)}
    run = lambda *argv: subprocess.run([git, *argv], check=True, capture_output=True, env=environ)  # noqa: E731
    run("init", "-q", str(work))
    (work / "README").write_text("cloned through the allowlist\n")
    run("-C", str(work), "add", "README")
    run("-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    run("clone", "-q", "--bare", str(work), str(bare))
    run("-C", str(bare), "update-server-info")
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    why = missing()
    if why is not None:
        pytest.skip(why)
    made = World(tmp_path_factory.mktemp("networld"))
    try:
        yield made
    finally:
        made.close()
