"""Shared fixtures: trial paths, the real CLI as a subprocess, the real encoder, and a process reaper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.dockerengine import engine
from trialtool.output import tokens

__all__ = ["engine"]  # the container engine's fixture, for the docker backend's tests and mini's over it


def gvisor_unavailable() -> str | None:
    """Why gVisor cannot run a sandbox here (runsc's words), or None when it can: asked once a test run."""
    if not _GVISOR:
        from trialtool.sandbox._base import Asked, Unavailable
        from trialtool.sandbox._gvisor import pin

        try:
            pin(Asked("gvisor", {}, os.getcwd(), ()))
            _GVISOR.append(None)
        except Unavailable as exc:
            _GVISOR.append(exc.reason)
    return _GVISOR[0]


_GVISOR: list[str | None] = []


def _command_python() -> str:
    """A Python that a command in the sandbox can run.

    The sandbox shows its own /tmp, not the host's: a virtualenv under the host's /tmp (a
    checkout in a temporary directory, as CI makes) is not there, so commands then run the
    interpreter it was made from. Commands use the standard library only.
    """
    tmp = os.path.realpath(tempfile.gettempdir()) + os.sep
    if not os.path.abspath(sys.executable).startswith(tmp):
        return sys.executable
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


#: The Python for commands (see _command_python); the tests themselves run trial-tool with sys.executable.
COMMAND_PY = _command_python()

#: A command that writes a forged protocol message to descriptor 1 of its supervisor, the fork
#: server and the server above them (three levels up; no further, not into the test runner).
ESCAPE = (
    "pid=$PPID; for level in 1 2 3; do "
    'printf \'{"jsonrpc":"2.0","id":1,"result":{}}\\n\' > /proc/$pid/fd/1 2>/dev/null; '
    "pid=$(awk '{print $4}' /proc/$pid/stat); done; echo climbed"
)


@pytest.fixture(scope="session")
def encoder() -> Any:
    """The real o200k_base encoder, built once from the bundled rank file."""
    return tokens.RankFile(tokens.locate()).encoder()


class TrialFiles:
    """A trial's state and log paths, and helpers to run trial-tool against them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state.json"
        self.log = root / "log.jsonl"

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess[bytes]:
        """Run `python -m trialtool` for real: flags first, then whatever follows."""
        argv = [sys.executable, "-m", "trialtool", *args]
        return subprocess.run(argv, capture_output=True, timeout=timeout, env=env, **kwargs)

    def argv(self, *rest: str) -> list[str]:
        """The command line of `python -m trialtool` on this trial, then `rest`."""
        return [sys.executable, "-m", "trialtool", "--state", str(self.state), "--log", str(self.log), *rest]

    def parallel(self, argv: list[str], count: int, timeout: float = 100) -> list[tuple[int, bytes]]:
        """Run `count` copies of `argv` at once; their exit codes and stdout. All are reaped."""
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for _ in range(count)]
        try:
            outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]

    def call(self, *command: str, flags: tuple[str, ...] = (), **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return self.cli("--state", str(self.state), "--log", str(self.log), *flags, "--", *command, **kwargs)

    def state_json(self) -> dict[str, Any]:
        return json.loads(self.state.read_text())

    def records(self) -> list[dict[str, Any]]:
        """The log's records after the trial's first (which every log starts with: see calls_of)."""
        if not self.log.exists():
            return []
        return calls_of([json.loads(line) for line in self.log.read_text().splitlines()])

    def snapshot(self) -> dict[str, bytes | None]:
        """Every file of the trial, byte for byte (the lock file aside: it is scratch)."""
        return {
            path.name: path.read_bytes()
            for path in sorted(self.root.iterdir())
            if path.is_file() and not path.name.endswith(".lock")
        }


@pytest.fixture(params=["server", "in-process"])
def cli_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every CLI test runs twice: through the per-user server, and in the CLI's own process."""
    monkeypatch.setenv("TRIALTOOL_SERVER", "on" if request.param == "server" else "off")
    return str(request.param)


def minimal_env(**variables: str) -> dict[str, str]:
    """A bare environment for a trial-tool process, still pointed at this run's server directory."""
    env = {"PATH": "/usr/bin:/bin", **variables}
    for name in ("TRIALTOOL_SERVER_DIR", "TRIALTOOL_SERVER"):
        if name in os.environ and name not in env:
            env[name] = os.environ[name]
    return env


def stop_servers(directory: Path) -> None:
    """Stop every per-user server whose socket is in `directory` (each finishes its calls), and wait for them."""
    import socket as socketlib
    import struct

    from trialtool.server._wire import Frames, frame, reach

    for path in sorted(directory.glob("server-*.sock")) if directory.is_dir() else []:
        with socketlib.socket(socketlib.AF_UNIX) as sock:
            try:
                reach(sock, str(path))
            except OSError:
                continue
            server = struct.unpack("3i", sock.getsockopt(socketlib.SOL_SOCKET, socketlib.SO_PEERCRED, 12))[0]
            sock.sendall(frame({"control": "stop"}))
            frames = Frames(sock)
            answer = frames.pop()
            while answer is None and frames.feed():
                answer = frames.pop()
        if answer is None:
            continue
        try:
            process = psutil.Process(server)
            if "pid" not in answer:
                # A server of another world (one a test started with fewer privileges) takes no
                # word from this one: it is ended by signal, as its idle timeout would end it.
                process.terminate()
            process.wait(timeout=60)
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="session", autouse=True)
def _servers_of_this_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # The run's own per-user servers, in a directory of its own (never a real user's
    # server, nor one of another checkout's code), all stopped at the end.
    directory = tmp_path_factory.mktemp("servers")
    directory.chmod(0o700)
    os.environ["TRIALTOOL_SERVER_DIR"] = str(directory)
    # Started now (the call that starts it runs in process), so that a test's first call goes through it.
    warm = tmp_path_factory.mktemp("warm-up")
    files = ["--state", str(warm / "s.json"), "--log", str(warm / "l.jsonl"), "--sandbox", "none"]
    subprocess.run([sys.executable, "-m", "trialtool", *files, "--", "true"], check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "trialtool", "server", "status"], check=True, capture_output=True, timeout=60)
    try:
        yield
    finally:
        stop_servers(directory)
        del os.environ["TRIALTOOL_SERVER_DIR"]


@pytest.fixture
def trial(tmp_path: Path, cli_mode: str) -> TrialFiles:
    return TrialFiles(tmp_path)


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique word to put in a test's commands; every process carrying it is killed afterwards.

    The reaper follows psutil's tests: SIGCONT before SIGKILL so a stopped process
    dies too, then wait on each, on the monotonic clock.
    """
    word = f"trialtool-marker-{uuid.uuid4().hex}"
    yield word
    leftovers = marked(word)
    for proc in leftovers:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
    psutil.wait_procs(leftovers, timeout=5)
    assert not leftovers, f"processes outlived the test: {[p.pid for p in leftovers]}"


def strict_records(path: Path) -> list[dict[str, Any]]:
    """The log as the strictest JSON reader takes it: UTF-8 lines, JSON objects, no lone surrogate anywhere."""

    def check(value: Any) -> None:
        if isinstance(value, str):
            value.encode("utf-8")  # a lone surrogate (\\udcff in the JSON) fails here
        elif isinstance(value, dict):
            for key, item in value.items():
                check(key)
                check(item)
        elif isinstance(value, list):
            for item in value:
                check(item)

    rows = []
    for raw in path.read_bytes().splitlines() if path.exists() else []:
        row = json.loads(raw.decode("utf-8"))
        assert isinstance(row, dict)
        check(row)
        rows.append(row)
    return calls_of(rows)


def calls_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records but the trial's first line (`trial_tool_trial`, which binds the log to its trial),
    checked to be there, first, whenever the log has any: the calls, refusals and repairs."""
    if records:
        assert records[0]["record_type"] == "trial_tool_trial", records[0]
        assert all(record["record_type"] != "trial_tool_trial" for record in records[1:])
    return records[1:]


def marked(word: str) -> list[psutil.Process]:
    """Live processes whose command line or environment carries `word`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(word in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    """Poll `predicate` on the monotonic clock: for conditions no event announces (a process gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


@pytest.fixture(autouse=True)
def _no_network_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make sure no test quietly relies on a tiktoken cache on this machine.
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    monkeypatch.delenv(tokens.RANK_FILE_ENV, raising=False)


@pytest.fixture(autouse=True)
def _run_from_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sandboxed command writes only in its workspace, by default the directory the trial
    # was created from: each test runs from its own tmp_path, where its commands write.
    monkeypatch.chdir(tmp_path)
