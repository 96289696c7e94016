"""The bwrap executable: found once when a trial is created, pinned by identity, probed where it runs.

bwrap is looked for among the absolute entries of the caller's PATH, then
/usr/bin and /bin, and pinned (sandbox.Binary): it must lie outside every
writable path, belong to root or this user, and be writable by no one else,
nor may any directory above it. A call runs it only while it is still that
file, and never looks for it again. Whether it can make a sandbox on this
machine is asked by running a tiny one (`probe`); only a "yes" is kept.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Sequence

from ..errors import SandboxError
from ..osio import plain
from ._layout import inside
from ._settings import Binary

#: The descriptor bwrap writes its JSON status to, in bwrap's own process.
STATUS_FD = 3
#: Namespaces, privileges and lifetime: the same for every call and for the probe.
ISOLATION = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
)
#: What to install when bwrap is not there.
_MISSING = "bubblewrap is not installed (apt-get install bubblewrap, dnf install bubblewrap)"
#: Where bwrap is looked for after PATH's absolute entries.
_FALLBACK_DIRECTORIES = ("/usr/bin", "/bin")
#: Executables that ran a sandbox in this process. Only "yes" is kept: a "no" is asked again
#: on the next call, so that installing bwrap, or allowing user namespaces, is seen at once.
_WORKS: set[Binary] = set()
#: Probes started ahead (start_probe), not yet collected: (pid, stderr's read end).
_PENDING: dict[Binary, tuple[int, int]] = {}
#: Whether an executable has overlay options (by its --help), asked once a process.
_OVERLAYS: dict[Binary, bool] = {}
_GUARD = threading.Lock()


def _unsafe(path: str, roots: Sequence[str]) -> str | None:
    """Why `path` (canonical) is no executable to trust for the sandbox, or None.

    A command runs as this user: anything it may write, or that others may, could
    be replaced between calls by a program that runs on the host.
    """
    if any(inside(path, root) for root in roots):
        return f"{plain(path)} lies in a path the trial's commands may write"
    owners = {0, os.geteuid()}
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        name = "/".join(parts[:depth]) or "/"
        try:
            info = os.lstat(name)
        except OSError as exc:
            return f"{plain(name)}: {exc.strerror}"
        if stat.S_ISLNK(info.st_mode):
            return f"{plain(name)} is a symlink"
        if info.st_uid not in owners:
            return f"{plain(name)} belongs to uid {info.st_uid}, neither root nor this user"
        # A sticky directory (/tmp) lets no one else rename or remove what is ours in it.
        sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and depth < len(parts)
        if info.st_mode & 0o022 and not sticky:
            return f"{plain(name)} may be written by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def find(
    roots: Sequence[str], search_path: str | None, names: Sequence[str], missing: str | None = None
) -> tuple[Binary | None, str | None]:
    """The executable to pin: the first safe one of `names` on PATH's absolute entries, then /usr/bin, /bin.

    `search_path` is the caller's PATH (None: this process's). Each name is looked
    for in turn; `missing` says what to install when none is there.
    """
    import sys

    if not sys.platform.startswith("linux"):
        return None, f"trial-tool runs {names[0]} as a sandbox on Linux only"
    refused = []
    seen = set()
    if search_path is None:
        search_path = os.environ.get("PATH", "")
    places = [*search_path.split(os.pathsep), *_FALLBACK_DIRECTORIES]
    for name, directory in ((name, directory) for name in names for directory in places):
        if not os.path.isabs(directory):
            continue  # "." or "": wherever the caller happens to be, perhaps a workspace
        candidate = os.path.join(directory, name)
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        path = os.path.realpath(candidate)
        if path in seen:
            continue
        seen.add(path)
        why = _unsafe(path, roots)
        if why is not None:
            refused.append(why)
            continue
        info = os.stat(path)
        return Binary(path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns), None
    if refused:
        return None, f"no {' or '.join(names)} executable that can be trusted: " + "; ".join(refused)
    return None, missing or f"{' or '.join(names)} is not installed"


def check_binary(binary: Binary) -> None:
    """SandboxError unless the pinned executable is still there, unchanged, and safe."""
    why = _unsafe(binary.path, ())
    if why is None:
        info = os.stat(binary.path)
        if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != binary[1:]:
            why = f"{plain(binary.path)} is no longer the file pinned when the trial was created (upgraded?)"
    if why is not None:
        msg = f"this trial's sandbox executable cannot be used: {why}; refusing to run a call (create a new trial)"
        raise SandboxError(msg)


def probe(binary: Binary) -> str | None:
    """Why `binary` cannot make a sandbox here, or None when it can: a tiny one, made as a call's is (5-10 ms).

    bwrap can be installed and still be refused the namespaces it needs (user
    namespaces disabled, AppArmor's restriction, a container without them). A
    probe started ahead (`start_probe`) is collected rather than run again.
    """
    with _GUARD:
        if binary in _WORKS:
            return None
        started = _PENDING.pop(binary, None)
    pid, err_r = started if started is not None else _spawn(binary)
    if pid < 0:
        return f"{binary.path} cannot be executed: {os.strerror(err_r)}"
    with os.fdopen(err_r, "rb") as stream:
        said = stream.read(4096)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code == 0:
        with _GUARD:
            _WORKS.add(binary)
        return None
    lines = said.decode("utf-8", "replace").strip().splitlines()
    why = lines[-1] if lines else f"{binary.path} exited with status {code}"
    return f"bubblewrap cannot make a sandbox here ({why}); see docs/sandbox.md for the usual causes"


def start_probe(binary: Binary) -> None:
    """Start `probe(binary)` now, so that its 5-10 ms overlap the ledger's work; for a cold call.

    Only for an executable that passes `check_binary` (the caller read it from the
    trial's state, which no command can reach); a no-op once it is known to work.
    """
    with _GUARD:
        if binary in _WORKS or binary in _PENDING:
            return
    try:
        check_binary(binary)
    except SandboxError:
        return  # the reservation's own check says why
    started = _spawn(binary)
    if started[0] >= 0:
        with _GUARD:
            _PENDING[binary] = started


def settle() -> None:
    """Reap every probe started ahead and not collected (the call turned out not to need it)."""
    with _GUARD:
        pending = list(_PENDING.values())
        _PENDING.clear()
    for pid, err_r in pending:
        os.close(err_r)
        os.waitpid(pid, 0)


def _spawn(binary: Binary) -> tuple[int, int]:
    """Start the probe: (its pid, the read end of its stderr), or (-1, errno) if it cannot be executed."""
    import fcntl

    opened = os.open("/", os.O_PATH | os.O_CLOEXEC)
    # Above the descriptor it becomes: one dup'd onto itself would keep close-on-exec.
    root = fcntl.fcntl(opened, fcntl.F_DUPFD_CLOEXEC, STATUS_FD + 1)
    os.close(opened)
    argv = [binary.path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--ro-bind-fd", str(STATUS_FD), "/tmp", *ISOLATION, "--", "true"]
    try:
        return _start(binary, argv, 2, [(os.POSIX_SPAWN_DUP2, root, STATUS_FD)])
    finally:
        os.close(root)


def _start(binary: Binary, argv: list[str], captured: int, more: list[tuple[int, ...]]) -> tuple[int, int]:
    """Start `binary` with descriptor `captured` (1 or 2) a pipe, the other two /dev/null, and `more` done:
    (its pid, the pipe's read end), or (-1, errno) if it cannot be executed."""
    read, write = os.pipe()
    nulls = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY if fd else os.O_RDONLY, 0) for fd in (0, 1, 2)]
    actions = [action for action in nulls if action[1] != captured]
    try:
        pid = os.posix_spawn(
            binary.path,
            argv,
            {"PATH": "/usr/bin:/bin"},
            file_actions=[*actions, (os.POSIX_SPAWN_DUP2, write, captured), *more],
        )
    except OSError as exc:
        os.close(read)
        return -1, exc.errno or 0
    finally:
        os.close(write)
    return pid, read


def overlay_works(binary: Binary, lower: str, scratch: str) -> bool:
    """Whether `binary` can mount an overlay of `lower` here, its writable layer in `scratch` (made by the caller).

    bwrap has overlays from 0.9; the kernel must also let a user namespace mount
    one (Linux 5.11 and later, upper directory on a filesystem that supports it).
    Asked once per trial, when its home layer is made (about 5 ms); the answer is
    kept in the layer's shape, so that a trial's home never changes kind.
    """
    with _GUARD:
        known = _OVERLAYS.get(binary)
    if known is None:
        code, said = _output(binary, [binary.path, "--help"])
        known = code == 0 and b"--overlay-src" in said
        with _GUARD:
            _OVERLAYS[binary] = known
    if not known:
        return False
    trying = os.path.join(scratch, f"overlay-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(trying, 0o700)
        upper, work = os.path.join(trying, "upper"), os.path.join(trying, "work")
        os.mkdir(upper)
        os.mkdir(work)
        argv = [binary.path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/run"]
        argv += ["--overlay-src", lower, "--overlay", upper, work, "/run/home", *ISOLATION, "--", "true"]
        return _output(binary, argv)[0] == 0
    except OSError:
        return False
    finally:
        _remove_tree(trying)


def _output(binary: Binary, argv: list[str]) -> tuple[int, bytes]:
    """Run `binary` to its end: (its exit status, its first 64 KiB of stdout); (-1, b"") if it cannot run."""
    pid, out_r = _start(binary, argv, 1, [])
    if pid < 0:
        return -1, b""
    said = b""
    with os.fdopen(out_r, "rb") as stream:
        while chunk := stream.read(1 << 16):
            if len(said) < 1 << 16:
                said += chunk
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), said[: 1 << 16]


def _remove_tree(path: str) -> None:
    """Remove a probe's directory: the overlay leaves a work directory of mode 000 in it."""
    import shutil

    for parent, subdirectories, _ in os.walk(path):
        for name in subdirectories:
            try:
                os.chmod(os.path.join(parent, name), 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


def available(roots: tuple[str, ...], search_path: str | None = None) -> tuple[Binary | None, str | None]:
    """The bwrap to pin for a trial whose commands may write `roots`, or why the sandbox cannot run here."""
    binary, reason = find(roots, search_path, ("bwrap",), _MISSING)
    if binary is None:
        return None, reason
    reason = probe(binary)
    return (binary, None) if reason is None else (None, reason)


def unavailable() -> str | None:
    """Why the bwrap sandbox cannot run on this machine, or None (for tests and the bench)."""
    return available(())[1]


__all__ = [
    "ISOLATION",
    "STATUS_FD",
    "available",
    "check_binary",
    "find",
    "overlay_works",
    "probe",
    "settle",
    "start_probe",
    "unavailable",
]
