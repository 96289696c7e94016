"""The command cannot reach into trial-tool: it starts with exactly 0, 1, 2, and finds nothing of ours in /proc."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import COMMAND_PY, TrialFiles, strict_records
from trialtool import Trial

PY = sys.executable
#: Prints the descriptors open in the process, without opening one to find out.
LISTER = """
import os
fds = []
for fd in range(4096):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
print(fds)
"""
STDIO = b"[0, 1, 2]\n"


def test_cli_command_gets_exactly_stdio_even_with_the_callers_strays(trial: TrialFiles) -> None:
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    try:
        done = subprocess.run(
            trial.argv("--", COMMAND_PY, "-c", LISTER), capture_output=True, timeout=60, pass_fds=(read_end,)
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (done.returncode, done.stdout) == (0, STDIO)


def test_api_command_gets_exactly_stdio(trial: TrialFiles) -> None:
    with Trial(trial.state, trial.log) as api:
        assert api.run([COMMAND_PY, "-c", LISTER]).stdout == STDIO.decode()


#: LISTER, then whether stdin is a pipe and whether stdout and stderr are the same pipe.
PIPES = (
    LISTER
    + """
import stat, sys
same = os.fstat(1).st_ino == os.fstat(2).st_ino
print(stat.S_ISFIFO(os.fstat(0).st_mode), same, sys.stdin.read())
"""
)


def test_input_and_merged_output_add_no_descriptor(trial: TrialFiles, tmp_path: Path) -> None:
    source = tmp_path / "input"
    source.write_bytes(b"fed")
    done = trial.call(COMMAND_PY, "-c", PIPES, flags=("--stdin", str(source)))
    assert (done.returncode, done.stdout) == (0, STDIO + b"True False fed\n")
    done = trial.call(COMMAND_PY, "-c", PIPES, flags=("--stdin", str(source), "--merge-output"))
    assert (done.returncode, done.stdout) == (0, STDIO + b"True True fed\n")


def test_serve_command_gets_exactly_stdio(trial: TrialFiles) -> None:
    request = json.dumps({"id": 1, "method": "run", "params": {"command": [COMMAND_PY, "-c", LISTER]}}).encode() + b"\n"
    argv = [PY, "-m", "trialtool", "serve", "--state", str(trial.state), "--log", str(trial.log)]
    done = subprocess.run(argv, input=request, capture_output=True, timeout=60)
    assert json.loads(done.stdout)["result"]["stdout"] == STDIO.decode()


def test_shim_command_gets_exactly_stdio(trial: TrialFiles, tmp_path: Path) -> None:
    shims = tmp_path / "shims"
    assert trial.cli("shim", str(shims), "--state", str(trial.state), "--log", str(trial.log)).returncode == 0
    done = subprocess.run(
        [str(shims / "sh"), "-c", f"exec {COMMAND_PY} -c {shlex.quote(LISTER)}"], capture_output=True, timeout=60
    )
    assert done.stdout == STDIO


def test_mcp_command_gets_exactly_stdio(trial: TrialFiles) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    args = ["-m", "trialtool", "mcp", "--state", str(trial.state), "--log", str(trial.log)]
    seen: list[str] = []

    async def main() -> None:
        async with Client(StdioServerParameters(command=PY, args=args)) as client:
            result = await client.call_tool("run_shell", {"command": f"exec {COMMAND_PY} -c {shlex.quote(LISTER)}"})
            seen.append(result.structured_content["stdout"])

    anyio.run(main)
    assert seen == [STDIO.decode()]


#: Tries every descriptor a command might have been handed: read (a stop request), write (a
#: forged result), close; then sleeps past the deadline.
GRABBER = (
    "for fd in 3 4 5 6 7 8 9 10 11 12 13 14 15; do "
    "(cat <&$fd >/dev/null &) 2>/dev/null; (echo junk >&$fd) 2>/dev/null; done; exec sleep 30"
)


@pytest.mark.timeout(120)
def test_a_command_cannot_swallow_the_stop_or_forge_a_result(trial: TrialFiles, marker: str) -> None:
    # Once 1 run in 6 let the command eat the deadline's stop request: run it many times.
    with Trial(trial.state, trial.log, limits={"call_timeout": 0.3, "kill_grace": 0.1, "max_calls": 50}) as api:
        for _ in range(12):
            result = api.run(["sh", "-c", GRABBER, marker])
            assert result.status == "timeout" and result.exit_code == 124
    assert [row["status"] for row in strict_records(trial.log)] == ["timeout"] * 12


def test_an_asyncio_call_cancelled_is_charged_but_delivers_nothing(trial: TrialFiles, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    os.mkfifo(ready)

    async def main() -> None:
        with Trial(trial.state, trial.log) as api:
            task = asyncio.ensure_future(api.arun(["sh", "-c", f"echo printed so far; echo > {ready}; exec sleep 30"]))
            # The event: the command has printed and says so through the FIFO.
            await asyncio.to_thread(ready.read_bytes)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await api.abudget()).tokens_used == 0

    asyncio.run(main())
    [record] = strict_records(trial.log)
    assert record["status"] == "interrupted" and record["withheld"] is True
    assert record["delivered_emitted_tokens"] == 0 and record["observed_emitted_tokens"] > 0
    assert record["complete_delivery"] is False


@pytest.mark.timeout(60)
def test_a_cli_call_stopped_by_sigterm_still_delivers_what_it_charges(trial: TrialFiles, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    cli = subprocess.Popen(
        trial.argv("--", "sh", "-c", f"echo printed; echo > {ready}; exec sleep 30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ready.read_bytes()
        cli.send_signal(signal.SIGTERM)
        out, _ = cli.communicate(timeout=30)
    finally:
        cli.kill()
        cli.wait()
    assert cli.returncode == 143 and out == b"printed\n"
    [record] = strict_records(trial.log)
    assert record["status"] == "interrupted" and record["delivered_stdout_tokens"] > 0 and "withheld" not in record


def _nobody_python(copy_to: Path, groups: tuple[int, ...] = ()) -> list[str]:
    """A Python the user nobody can run, with a world-readable copy of trialtool, tiktoken and psutil; else skip.

    The checkout and its virtualenv may sit under a directory only root can read
    (CI clones into one), so what nobody imports is copied into `copy_to`.
    """
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run trial-tool as the user nobody")
    import psutil
    import tiktoken
    import tiktoken_ext  # a namespace package: tiktoken's registry imports it

    import trialtool

    sources = [Path(module.__file__ or "").parent for module in (trialtool, tiktoken, psutil)]
    for source in [*sources, *map(Path, tiktoken_ext.__path__)]:
        shutil.copytree(source, copy_to / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [copy_to, *copy_to.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644 | (path.stat().st_mode & 0o111))
    drop = ["setpriv", "--reuid=65534", "--regid=65534"]
    drop.append(f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups")
    # The system's Python of the same minor version: the test's own may live where nobody cannot read.
    for python in (f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}", sys.executable):
        # In process: a server run as nobody would need a directory of nobody's (tested as root).
        command = [*drop, "env", f"PYTHONPATH={copy_to}", "TRIALTOOL_SERVER=off", python]
        probe = subprocess.run([*command, "-c", "import trialtool, tiktoken, psutil"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return command
    pytest.skip(f"no Python the user nobody can run here ({probe.stderr.decode().strip()[-200:]})")


#: Run as nobody, like trial-tool: try the supervisor's and trial-tool's own descriptors through /proc.
PROBE = (
    'sup=$PPID; cli=$(cut -d" " -f4 /proc/$sup/stat); '
    "for pid in $sup $cli; do "
    'if ls /proc/$pid/fd >/dev/null 2>&1; then echo "listed $pid"; else echo "denied $pid"; fi; '
    '(echo forged > /proc/$pid/fd/1) 2>/dev/null && echo "wrote $pid"; '
    '(head -c1 /proc/$pid/fd/0 >/dev/null) 2>/dev/null && echo "read $pid"; '
    "done; true"
)


@pytest.mark.timeout(120)
def test_as_the_same_non_root_user_the_command_reaches_nothing_of_trial_tools() -> None:
    work = Path(tempfile.mkdtemp(prefix="trialtool-nobody-"))
    try:
        work.chmod(0o755)
        python = _nobody_python(work / "lib")
        os.chown(work, 65534, 65534)
        argv = [*python, "-m", "trialtool", "--state", str(work / "s.json"), "--log", str(work / "l.jsonl")]
        # Unsandboxed: what holds without namespaces (in the sandbox no trial-tool process is visible at all).
        argv += ["--sandbox", "none"]
        done = subprocess.run([*argv, "--", "sh", "-c", PROBE], capture_output=True, timeout=60, cwd=work, input=b"x")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode().splitlines()
        assert len(lines) == 2 and all(line.startswith("denied ") for line in lines), done.stdout
        assert b"forged" not in done.stdout and b"forged" not in done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
