"""What a trial's signature is: its Ed25519 keys, DSSE envelopes, and the in-toto statement a trial ends in.

A signed trial is checked with a public key alone: no shared secret travels.
`_keys.py` reads, makes and names keys (a key's name is its fingerprint, the
SHA-256 of its raw public key); `_dsse.py` seals a payload in a DSSE envelope
and opens one against the keys a grader trusts; `_statement.py` is the
statement's and the checkpoint's format. The `cryptography` package does the
arithmetic, imported only when a key is used: a trial without a signing key,
and every call of one, never loads it (docs/attestations.md says what it costs).

Nothing here reads a trial's files: the ledger signs and checks them.
"""

from __future__ import annotations

from . import _dsse as dsse
from . import _statement as statement
from ._keys import (
    SIGNING_KEY_ENV,
    PublicKey,
    SigningKey,
    fingerprint_of,
    generate,
    read_public_keys,
    read_signing_key,
    signing_key_path,
)

__all__ = [
    "SIGNING_KEY_ENV",
    "PublicKey",
    "SigningKey",
    "dsse",
    "fingerprint_of",
    "generate",
    "read_public_keys",
    "read_signing_key",
    "signing_key_path",
    "statement",
]
