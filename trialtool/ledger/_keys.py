"""The ledger key (HMAC): read from a key file or the caller's environment, at least 16 bytes."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import StorageError, UsageError

#: The ledger key, when no key file is given. Never passed to the command.
KEY_ENV = "TRIALTOOL_LEDGER_KEY"
#: The shortest key taken.
MIN_KEY_BYTES = 16


def read_key_file(path: str, setting: str = "--key-file") -> bytes:
    """The ledger key held in the file at `path` (a trailing newline dropped); at least 16 bytes.

    `setting` names where the path came from, for the message.
    """
    from ._durable import read_input

    try:
        key = read_input(path).rstrip(b"\r\n")
    except StorageError as exc:
        msg = f"cannot read {setting}: {exc.message}"
        raise UsageError(msg) from exc
    return checked_key(key)


def key_from_environ(environ: Mapping[str, str]) -> bytes | None:
    """The ledger key in `environ` (the caller's), or None."""
    value = environ.get(KEY_ENV)
    return checked_key(value.encode()) if value else None


def checked_key(key: bytes) -> bytes:
    """`key`, if it is long enough to be one."""
    if len(key) < MIN_KEY_BYTES:
        msg = f"the ledger key must be at least {MIN_KEY_BYTES} bytes"
        raise UsageError(msg)
    return key


__all__ = ["KEY_ENV", "MIN_KEY_BYTES", "checked_key", "key_from_environ", "read_key_file"]
