"""DSSE envelopes (Dead Simple Signing Envelope, v1.0.2): a payload signed over its type, and checked.

What is signed is the pre-authentication encoding of the payload and its type,

    "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

(LEN the ASCII decimal length in bytes), never the JSON around it, so an
envelope's own formatting cannot change what it says. The envelope is the
JSON object {"payload", "payloadType", "signatures": [{"keyid", "sig"}]},
payload and sig in standard base64 (URL-safe is read too, as DSSE allows); each signature's `keyid` is its key's
fingerprint (_keys.py).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import NamedTuple

from ._keys import PublicKey, SigningKey


def pae(payload_type: str, payload: bytes) -> bytes:
    """The bytes DSSE signs for `payload` of `payload_type`."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def seal(payload: bytes, payload_type: str, key: SigningKey) -> dict[str, object]:
    """`payload` in an envelope signed by `key`."""
    signature = key.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [{"keyid": key.fingerprint, "sig": base64.b64encode(signature).decode()}],
    }


class Opened(NamedTuple):
    """An envelope that holds: its payload, and the fingerprint of the trusted key that signed it."""

    payload: bytes
    signer: str


class BadEnvelope(Exception):
    """An envelope that does not hold, and why (one line)."""


def _b64(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise BadEnvelope(f"the envelope's {what} is not a base64 string")
    try:
        # DSSE allows standard or URL-safe base64 (trialtool writes standard); padding is required.
        return base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise BadEnvelope(f"the envelope's {what} is not valid base64") from None


def open_envelope(envelope: object, payload_type: str, trusted: Mapping[str, PublicKey]) -> Opened:
    """The payload of `envelope` (a parsed JSON value), if a key of `trusted` signed it; else BadEnvelope.

    The payload type must be `payload_type`: a checkpoint is never taken for a statement, nor the reverse.
    """
    if not isinstance(envelope, dict):
        raise BadEnvelope("not a DSSE envelope (a JSON object)")
    if envelope.get("payloadType") != payload_type:
        found = json.dumps(envelope.get("payloadType"))
        raise BadEnvelope(f"the envelope's payloadType is {found}, not {json.dumps(payload_type)}")
    payload = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise BadEnvelope("the envelope has no signatures")
    signed = pae(payload_type, payload)
    named = []
    for signature in signatures:
        if not isinstance(signature, dict):
            raise BadEnvelope("a signature of the envelope is not an object")
        keyid = signature.get("keyid")
        named.append(str(keyid))
        key = trusted.get(keyid) if isinstance(keyid, str) else None
        if key is not None and key.verify(_b64(signature.get("sig"), "signature"), signed):
            return Opened(payload, key.fingerprint)
    for key in trusted.values():  # a keyid is a hint only: a signature may name its key otherwise
        for signature in signatures:
            raw = signature.get("sig")
            if isinstance(raw, str) and key.verify(_b64(raw, "signature"), signed):
                return Opened(payload, key.fingerprint)
    if not any(name in trusted for name in named):
        raise BadEnvelope(f"signed by {', '.join(named)}: no key trusted here (--public-key)")
    raise BadEnvelope("its signature does not verify: the envelope was changed, or signed by another key")


__all__ = ["BadEnvelope", "Opened", "open_envelope", "pae", "seal"]
