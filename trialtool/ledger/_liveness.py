"""Is the process we recorded still alive, or has its pid been reused?"""

from __future__ import annotations


def token(pid: int) -> str | None:
    """Something that tells a live process from a later one reusing its pid; None if there is none.

    On Linux, the start time in clock ticks since boot (field 22 of /proc/PID/stat);
    elsewhere psutil's create time, imported only on that path.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        # Fields after the command name, which may itself hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] == b"Z":
            return None  # a zombie has finished; only its parent's wait is missing
        return fields[19].decode()
    except FileNotFoundError:
        return None
    except OSError:
        pass  # no procfs (macOS)
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{process.create_time():.3f}"
    except psutil.Error:
        return None


def alive(pid: int, recorded: str | None) -> bool:
    """True when `pid` is the very process whose token was `recorded`."""
    return recorded is not None and token(pid) == recorded


__all__ = ["alive", "token"]
