"""o200k_base, exactly and offline: find the rank file, check its hash, build the real encoder.

tiktoken's `get_encoding("o200k_base")` downloads the rank file on first use; a
graded trial runs offline, so we build the same `tiktoken.Encoding` from a local
copy of the official file, checked against the SHA-256 tiktoken itself expects
(`tiktoken_ext/openai_public.py`). Where the file comes from, first found wins:

1. an explicit override: the `rank_file` argument (CLI `--o200k-file`) or the
   environment variable TRIALTOOL_O200K_FILE;
2. the copy shipped as package data (`trialtool/data/o200k_base.tiktoken`);
3. tiktoken's own cache (TIKTOKEN_CACHE_DIR, DATA_GYM_CACHE_DIR, or
   <tmp>/data-gym-cache, under the SHA-1 of the download URL, as tiktoken names it).

A chosen file with the wrong hash is an error, never skipped: a tampered or
truncated vocabulary would silently change every count. tiktoken is imported
only when an encoder is built: its import is slow (docs/performance.md).
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import TYPE_CHECKING

from ..errors import EncoderError, StorageError
from ..ledger import durable

if TYPE_CHECKING:
    import tiktoken

ENCODING_NAME = "o200k_base"
EXPECTED_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
RANK_FILE_ENV = "TRIALTOOL_O200K_FILE"
_DOWNLOAD_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_BUNDLED = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "o200k_base.tiktoken")

# The o200k_base split pattern and special tokens, as tiktoken_ext/openai_public.py
# defines them. tiktoken offers no way to get them without loading (and so
# downloading) the ranks; tests/test_tokens.py checks these against tiktoken's own
# constructor so that a drift cannot pass unnoticed.
_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}

_FIX = (
    f"point --o200k-file or {RANK_FILE_ENV} at the official o200k_base.tiktoken "
    f"(sha256 {EXPECTED_SHA256}), or reinstall trialtool to restore its bundled copy"
)


def tiktoken_cache_path() -> str:
    """Where tiktoken would cache the o200k_base file on this machine."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if not cache_dir:
        import tempfile  # only on this fallback path: a slow import

        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.join(cache_dir, hashlib.sha1(_DOWNLOAD_URL.encode()).hexdigest())


def seed_tiktoken_cache(directory: str | os.PathLike[str] | None = None) -> str:
    """Put the bundled o200k_base file where tiktoken looks for it; its path there.

    For other code in the same process or machine that calls
    `tiktoken.get_encoding("o200k_base")` (inspect-ai's mock model does), which
    would otherwise download it. `directory` is the cache to fill (default:
    TIKTOKEN_CACHE_DIR, else tiktoken's own); a file already there with the
    right hash is kept. The copy is written to a temporary name and renamed.
    """
    if directory is None:
        target = tiktoken_cache_path()
    else:
        target = os.path.join(os.fspath(directory), os.path.basename(tiktoken_cache_path()))
    try:
        with open(target, "rb") as existing:
            if hashlib.sha256(existing.read()).hexdigest() == EXPECTED_SHA256:
                return target
    except OSError:
        pass
    source = locate()
    data = durable.read_input(source)
    if hashlib.sha256(data).hexdigest() != EXPECTED_SHA256:
        msg = f"o200k_base rank file {source} does not have the official hash; {_FIX}"
        raise EncoderError(msg)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    temporary = f"{target}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        out.write(data)
    os.replace(temporary, target)
    return target


def locate(rank_file: str | os.PathLike[str] | None = None) -> str:
    """The rank file to use, by the order in the module docstring; EncoderError if none."""
    explicit = rank_file if rank_file is not None else os.environ.get(RANK_FILE_ENV)
    if explicit:
        path = os.fspath(explicit)
        if not os.path.isfile(path):
            msg = f"o200k_base rank file {path} does not exist; {_FIX}"
            raise EncoderError(msg)
        return path
    if os.path.isfile(_BUNDLED):
        return os.fspath(_BUNDLED)
    cached = tiktoken_cache_path()
    if os.path.isfile(cached):
        return cached
    msg = f"no o200k_base rank file: the bundled copy {_BUNDLED} is missing and tiktoken's cache {cached} is empty"
    msg += f"; {_FIX}"
    raise EncoderError(msg)


def stamp(path: str) -> list[int]:
    """What changes whenever the file's bytes do (durable.stamp); EncoderError if the file is gone.

    ctime cannot be set back by an unprivileged process, so a file verified once
    and showing the same stamp later has the same bytes; trial/_trial.py keeps the stamp
    in the state to skip re-hashing the file on every call.
    """
    found = durable.stamp(path)
    if found is None:
        msg = f"cannot stat o200k_base rank file {path}; {_FIX}"
        raise EncoderError(msg)
    return found


class RankFile:
    """The verified bytes of an o200k_base rank file; `encoder()` builds and memoises the encoder."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._data = durable.read_input(path)
        except StorageError as exc:
            msg = f"cannot read o200k_base rank file: {exc.message}; {_FIX}"
            raise EncoderError(msg) from exc
        digest = hashlib.sha256(self._data).hexdigest()
        if digest != EXPECTED_SHA256:
            msg = f"o200k_base rank file {path} has sha256 {digest}, expected {EXPECTED_SHA256}; {_FIX}"
            raise EncoderError(msg)
        self._encoder: tiktoken.Encoding | None = None
        # Two threads must not both build it: it is the slowest step of a call (docs/performance.md).
        self._building = threading.Lock()

    def encoder(self) -> tiktoken.Encoding:
        """The real tiktoken Encoding for o200k_base, built on first use."""
        if self._encoder is not None:
            return self._encoder
        with self._building:
            return self._build()

    def _build(self) -> tiktoken.Encoding:
        if self._encoder is None:
            import binascii

            import tiktoken

            fields = self._data.split()
            # Each line is "<base64 token> <rank>". The file passed the hash check, so it is
            # the official one, whose ranks are 0, 1, 2, ... in order (tests/test_tokens.py
            # checks this): counting them saves parsing 200k integers.
            tokens = fields[0::2]
            ranks = dict(zip(map(binascii.a2b_base64, tokens), range(len(tokens)), strict=True))
            self._encoder = tiktoken.Encoding(
                name=ENCODING_NAME,
                pat_str=_PAT_STR,
                mergeable_ranks=ranks,
                special_tokens=_SPECIAL_TOKENS,
            )
            self._data = b""  # the ranks now live in the encoder
        return self._encoder


_VERIFIED: dict[str, RankFile] = {}
_VERIFIED_LOCK = threading.Lock()


def verified(path: str, *, recheck: bool = False) -> RankFile:
    """The process's one RankFile for `path`, so that its encoder is built once per process.

    `recheck` reads and hashes the file again (the reservation's preflight does,
    when the file's stamp changed); a file that fails keeps nothing cached.
    """
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(path)
        if known is None or recheck:
            _VERIFIED.pop(path, None)
            fresh = RankFile(path)
            if known is not None and known._encoder is not None:
                fresh._encoder, fresh._data = known._encoder, b""  # same bytes, same encoder
            known = _VERIFIED[path] = fresh
        return known


__all__ = [
    "ENCODING_NAME",
    "EXPECTED_SHA256",
    "RANK_FILE_ENV",
    "RankFile",
    "locate",
    "seed_tiktoken_cache",
    "stamp",
    "tiktoken_cache_path",
    "verified",
]
