"""Ed25519 keys: a trial's signing key read from its file, made by `keygen`, and the public keys a grader trusts.

A signing key file holds the key as PEM (PKCS#8, unencrypted: what `keygen`
writes and `openssl genpkey -algorithm ed25519` makes) or raw (its 32-byte
seed, or those bytes as 64 hex digits). A file of public keys holds one or
more PEM public keys (SubjectPublicKeyInfo), or lines of 64 hex digits (a raw
public key), with `#` comments. A key is named by its fingerprint: the SHA-256
of its raw 32-byte public key, in hex, which is also the DSSE `keyid`.
"""

from __future__ import annotations

import binascii
import errno
import hashlib
import os
import re
import stat
from collections.abc import Mapping

from ..errors import UsageError
from ..osio import plain, write_all

#: The signing key's file, when no --signing-key is given (an absolute path). Never passed to the command.
SIGNING_KEY_ENV = "TRIALTOOL_SIGNING_KEY"
#: The most a key file may hold: a PEM key is about 120 bytes, a file of trusted keys a few per key.
_MAX_FILE_BYTES = 1 << 20
#: Signing keys read, by path: (the file's stamp when read, the key). Bounded: cleared at 64.
_LOADED: dict[str, tuple[tuple[int, ...], SigningKey]] = {}
_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----\s+(.+?)-----END \1-----", re.DOTALL)


def fingerprint_of(public: bytes) -> str:
    """A key's name: the SHA-256 of its raw 32-byte public key, in hex."""
    return hashlib.sha256(public).hexdigest()


class PublicKey:
    """A public key a grader trusts; `verify` checks one signature."""

    __slots__ = ("_key", "fingerprint", "raw")

    def __init__(self, raw: bytes) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        self.raw = raw
        self.fingerprint = fingerprint_of(raw)
        self._key = Ed25519PublicKey.from_public_bytes(raw)

    def verify(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def pem(self) -> str:
        from cryptography.hazmat.primitives import serialization

        encoded = self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        return encoded.decode()


class SigningKey:
    """A trial's signing key: `sign` makes a 64-byte Ed25519 signature; `public` is its public key."""

    __slots__ = ("_key", "public")

    def __init__(self, seed: bytes) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = PublicKey(self._key.public_key().public_bytes_raw())

    @property
    def fingerprint(self) -> str:
        return self.public.fingerprint

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _read(path: str, what: str) -> tuple[bytes, tuple[int, ...]]:
    """The file's bytes, and its stamp (device, inode, size, mtime, ctime): the same stamp, the same bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        msg = f"cannot read {what} {plain(path)}: {exc.strerror}"
        raise UsageError(msg) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            msg = f"{what} {plain(path)} is not a regular file"
            raise UsageError(msg)
        stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        data = b"" if _LOADED.get(path, (None,))[0] == stamp else os.read(fd, _MAX_FILE_BYTES + 1)
    except OSError as exc:
        msg = f"cannot read {what} {plain(path)}: {exc.strerror}"
        raise UsageError(msg) from exc
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE_BYTES:
        msg = f"{what} {plain(path)} is larger than any key file ({_MAX_FILE_BYTES} bytes)"
        raise UsageError(msg)
    return data, stamp


def _hex32(text: bytes) -> bytes | None:
    try:
        raw = binascii.unhexlify(text)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


def read_signing_key(path: str, setting: str = "--signing-key") -> SigningKey:
    """The Ed25519 signing key in the file at `path` (PEM, or its raw 32-byte seed, or that in hex).

    A file read before and not changed since (its stamp) is not parsed again: the per-user
    server reads its callers' key files on every call.
    """
    data, stamp = _read(path, setting)
    known = _LOADED.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    key = _parse_signing_key(data, f"{setting} {plain(path)}")
    if len(_LOADED) >= 64:
        _LOADED.clear()
    _LOADED[path] = (stamp, key)
    return key


def _parse_signing_key(data: bytes, what: str) -> SigningKey:
    if b"-----BEGIN" in data:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            msg = f"{what} is not an unencrypted PEM private key: {exc}"
            raise UsageError(msg) from None
        if not isinstance(key, Ed25519PrivateKey):
            msg = f"{what} holds a {type(key).__name__.removesuffix('PrivateKey').removeprefix('_')} key, not Ed25519"
            raise UsageError(msg)
        return SigningKey(key.private_bytes_raw())
    seed = data if len(data) == 32 else _hex32(data.strip())
    if seed is None:
        msg = f"{what} holds no Ed25519 key: expected PEM (PKCS#8), 32 raw bytes, or 64 hex digits"
        raise UsageError(msg)
    return SigningKey(seed)


def signing_key_path(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """The signing key's file: --signing-key, else $TRIALTOOL_SIGNING_KEY (which must be absolute:
    the per-user server reads it from another directory than its caller's)."""
    if flag is not None:
        return flag
    value = environ.get(SIGNING_KEY_ENV)
    if not value:
        return None
    if not os.path.isabs(value):
        msg = f"${SIGNING_KEY_ENV} must be an absolute path, not {plain(value)}"
        raise UsageError(msg)
    return value


def read_public_keys(path: str, setting: str = "--public-key") -> dict[str, PublicKey]:
    """The trusted keys in the file at `path`, by fingerprint: PEM public keys, or lines of 64 hex digits."""
    data, _ = _read(path, setting)
    what = f"{setting} {plain(path)}"
    keys: dict[str, PublicKey] = {}
    if b"-----BEGIN" in data:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        for match in _PEM.finditer(data):
            if match.group(1) != b"PUBLIC KEY":
                msg = f"{what} holds a {match.group(1).decode().lower()}, not only public keys"
                raise UsageError(msg)
            try:
                key = serialization.load_pem_public_key(match.group(0))
            except ValueError as exc:
                msg = f"{what} holds a PEM block that is not a public key: {exc}"
                raise UsageError(msg) from None
            if not isinstance(key, Ed25519PublicKey):
                msg = f"{what} holds a public key that is not Ed25519"
                raise UsageError(msg)
            public = PublicKey(key.public_bytes_raw())
            keys[public.fingerprint] = public
    else:
        for number, line in enumerate(data.splitlines(), 1):
            line = line.split(b"#", 1)[0].strip()
            if not line:
                continue
            raw = _hex32(line)
            if raw is None:
                msg = f"{what} line {number}: not a raw Ed25519 public key (64 hex digits) or PEM"
                raise UsageError(msg)
            public = PublicKey(raw)
            keys[public.fingerprint] = public
    if not keys:
        msg = f"{what} holds no public key"
        raise UsageError(msg)
    return keys


def generate(path: str) -> SigningKey:
    """A new signing key, written to a new file at `path` (mode 0600; an existing file is never replaced)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = SigningKey(Ed25519PrivateKey.generate().private_bytes_raw())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        msg = f"cannot create the key file {plain(path)}: {exc.strerror}"
        if exc.errno == errno.EEXIST:
            msg += " (an existing key is never replaced)"
        raise UsageError(msg) from exc
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        write_all(fd, key.pem())
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        msg = f"cannot write the key file {plain(path)}: {exc.strerror}"
        raise UsageError(msg) from exc
    os.close(fd)
    return key


__all__ = [
    "SIGNING_KEY_ENV",
    "PublicKey",
    "SigningKey",
    "fingerprint_of",
    "generate",
    "read_public_keys",
    "read_signing_key",
    "signing_key_path",
]
