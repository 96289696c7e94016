"""Any single change to a trial's files is never `clean`: an edit, deletion, insertion or truncation of
the log, or a state rolled back, with the key or without it; and, given the head the harness was handed,
a correctly linked line appended after it fails."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trialtool import BudgetExhausted, Trial
from trialtool.ledger import audit
from trialtool.ledger._verify import verify

EXAMPLES = int(os.environ.get("TRIALTOOL_HYPOTHESIS_EXAMPLES", "150"))
KEY = b"k" * 32


class Made(NamedTuple):
    """A finished trial's files, and the state as it was after each of its calls (for rollbacks)."""

    state: bytes
    log: bytes
    earlier_states: list[bytes]
    head: str
    key: bytes | None


@pytest.fixture(scope="module", params=[None, KEY], ids=["unkeyed", "keyed"])
def made(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("made")
    state, log = root / "s.json", root / "l.jsonl"
    earlier = []
    head = audit.GENESIS
    commands = [["echo", "one"], ["sh", "-c", "seq 1 400"], ["false"], ["echo", "four"], ["echo", "refused"]]
    with Trial(state, log, limits={"sandbox": "none", "max_calls": 4, "max_call_tokens": 40}, key=request.param) as t:
        for command in commands:
            try:
                head = t.run(command).head
            except BudgetExhausted:
                head = json.loads(state.read_bytes())["log"]["head"]
            earlier.append(state.read_bytes())
    assert verify(state, log, request.param).verdict == "clean"
    return Made(state.read_bytes(), log.read_bytes(), earlier[:-1], head, request.param)


def _lines(log: bytes) -> list[bytes]:
    return log.splitlines(keepends=True)


@st.composite
def changes(draw: st.DrawFn, made: Made) -> tuple[str, bytes, bytes]:
    """(what was done, the state, the log) after one change."""
    lines = _lines(made.log)
    kind = draw(st.sampled_from(["edit", "delete", "insert", "truncate", "rollback"]))
    if kind == "rollback":
        state = draw(st.sampled_from(made.earlier_states))
        return kind, state, made.log
    at = draw(st.integers(0, len(lines) - 1))
    if kind == "edit":
        line = lines[at]
        offset = draw(st.integers(0, len(line) - 2))  # any byte but the newline
        byte = draw(st.integers(0x20, 0x7E).filter(lambda b: b != line[offset]))
        lines[at] = line[:offset] + bytes([byte]) + line[offset + 1 :]
        return f"{kind} line {at + 1} byte {offset}", made.state, b"".join(lines)
    if kind == "delete":
        del lines[at]
        return f"{kind} line {at + 1}", made.state, b"".join(lines)
    if kind == "insert":
        # A copy of another line (a replayed record), or a fresh well-formed record of the trial.
        copied = lines[draw(st.integers(0, len(lines) - 1))]
        record = json.loads(lines[-1])
        fresh = audit.encode({**record, "status": draw(st.sampled_from(["ok", "error"]))}) + b"\n"
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from([copied, fresh])))
        return f"{kind} at {at + 1}", made.state, b"".join(lines)
    cut = draw(st.integers(0, len(made.log) - 1))
    return f"truncate at {cut}", made.state, made.log[:cut]


def _verdict(state: bytes, log: bytes, key: bytes | None, expect_head: str | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="trialtool-tampered-") as directory:
        paths = Path(directory) / "s.json", Path(directory) / "l.jsonl"
        paths[0].write_bytes(state)
        paths[1].write_bytes(log)
        return verify(*paths, key, expect_head).verdict


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_change_is_never_clean(made: Made, data: st.DataObject) -> None:
    what, state, log = data.draw(changes(made))
    if (state, log) == (made.state, made.log):
        return  # an edit that changed nothing (an inserted copy of the same bytes cannot: lines differ)
    assert _verdict(state, log, made.key) != "clean", what
    if made.key is not None:
        assert _verdict(state, log, None) != "clean", what  # the keyed trial, read without its key


def test_a_linked_line_appended_fails_against_the_head(made: Made) -> None:
    """Linked and adding up: the files alone say `unconfirmed`; the head the harness was given says `failed`."""
    last_line = _lines(made.log)[-1]
    last = json.loads(last_line)
    assert last["status"] == "maximum_tool_calls"  # another refusal, its totals one refusal on
    after = {**last["ledger_after"], "refused_calls": last["ledger_after"]["refused_calls"] + 1}
    link = audit.Chain(made.key).digest(last_line[:-1])
    forged = {**last, "record": last["record"] + 1, "prev_hash": link, "ledger_after": after}
    log = made.log + audit.encode(forged) + b"\n"
    assert _verdict(made.state, log, made.key) == "unconfirmed"
    assert _verdict(made.state, log, made.key, made.head) == "failed"
    assert _verdict(made.state, made.log, made.key, made.head) == "clean"
