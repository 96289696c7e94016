"""The log's lines: written in parts, they are byte for byte the canonical line, and chain as one."""

from __future__ import annotations

import base64
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from trialtool.ledger import audit


@settings(max_examples=30, deadline=None)
@given(
    out=st.integers(0, 3 << 20),
    err=st.integers(0, (1 << 20) + 10),
    extra=st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20)), max_size=4),
)
def test_a_line_in_parts_is_the_canonical_line(out: int, err: int, extra: dict[str, object]) -> None:
    record = {
        **extra,
        "stdout_b64": base64.b64encode(os.urandom(out)).decode(),
        "stderr_b64": base64.b64encode(os.urandom(err)).decode(),
    }
    parts = list(audit.encode_parts(record))
    assert b"".join(parts) == audit.encode(record)
    chain = audit.Chain(b"k" * 16)
    hasher = chain.hasher()
    for part in parts:
        hasher.update(part)
    assert hasher.hexdigest() == chain.digest(audit.encode(record))
