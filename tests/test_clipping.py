"""Properties of clipping, with the real o200k_base encoder, over hostile Unicode."""

from __future__ import annotations

import os
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trialtool.output import clipping

EXAMPLES = int(os.environ.get("TRIALTOOL_HYPOTHESIS_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOTICE = re.compile(r"\n\[\.\.\. trial-tool clipped (\d+) of (\d+) tokens here \.\.\.\]\n")

PIECES = [
    "👨\u200d👩\u200d👧\u200d👦",  # a ZWJ family
    "🏳️\u200d🌈",
    "e\u0301\u0323",  # combining marks
    "日本語のテキストと中文文本",
    "<|endoftext|>",
    "<|endofprompt|>",
    "\n",
    "\r\n",
    "   ",
    "x" * 200,  # a long line with no newline
    "😀" * 7,
    "\ufffd",
    "0123456789" * 3,
]
chunk = st.one_of(
    st.text(max_size=60),
    st.sampled_from(PIECES),
    # invalid UTF-8 decoded as the tool does it: replacement characters the command "printed"
    st.binary(max_size=40).map(lambda data: data.decode("utf-8", "replace")),
)
outputs = st.lists(chunk, max_size=25).map("".join)
allowances = st.integers(min_value=1, max_value=400)
modes = st.sampled_from(["headtail", "head"])


def count(encoder: Any, text: str) -> int:
    return len(encoder.encode_ordinary(text))


def made_of_original(delivered: str, original: str, suffix: str = "") -> bool:
    """Delivered is a prefix, or a prefix + notice + suffix, of the original (then our suffix)."""
    if suffix and delivered.endswith(suffix):
        delivered = delivered[: len(delivered) - len(suffix)]
    if original.startswith(delivered):
        return True
    for match in NOTICE.finditer(delivered):
        head, tail = delivered[: match.start()], delivered[match.end() :]
        if original.startswith(head) and original.endswith(tail) and len(head) + len(tail) <= len(original):
            return True
    return False


@SETTINGS
@given(stdout=outputs, stderr=outputs, allowance=allowances, mode=modes)
def test_delivery_is_exact_and_within_allowance(
    encoder: Any, stdout: str, stderr: str, allowance: int, mode: str
) -> None:
    out, err = clipping.fit(encoder, stdout, stderr, allowance, mode)
    assert out.tokens == count(encoder, out.text)
    assert err.tokens == count(encoder, err.text)
    assert out.tokens + err.tokens <= allowance
    assert out.observed_tokens == count(encoder, stdout)
    assert err.observed_tokens == count(encoder, stderr)
    assert made_of_original(out.text, stdout)
    assert made_of_original(err.text, stderr)


@SETTINGS
@given(stdout=outputs, stderr=outputs, allowance=allowances, mode=modes)
def test_output_within_allowance_passes_unchanged(
    encoder: Any, stdout: str, stderr: str, allowance: int, mode: str
) -> None:
    allowance += count(encoder, stdout) + count(encoder, stderr)
    out, err = clipping.fit(encoder, stdout, stderr, allowance, mode)
    assert (out.text, err.text) == (stdout, stderr)
    assert not out.clipped and not err.clipped


@SETTINGS
@given(stdout=outputs, stderr=outputs, allowance=allowances)
def test_head_mode_delivers_prefixes(encoder: Any, stdout: str, stderr: str, allowance: int) -> None:
    out, err = clipping.fit(encoder, stdout, stderr, allowance, "head")
    assert stdout.startswith(out.text) and stderr.startswith(err.text)


@SETTINGS
@given(stdout=outputs, stderr=outputs, allowance=allowances, mode=modes)
def test_stderr_gets_a_fair_share(encoder: Any, stdout: str, stderr: str, allowance: int, mode: str) -> None:
    _, err = clipping.fit(encoder, stdout, stderr, allowance, mode)
    # stderr is never left with less than it needs when it needs at most half.
    if count(encoder, stderr) <= allowance // 2:
        assert err.text == stderr


@SETTINGS
@given(stdout=outputs, stderr=outputs, allowance=allowances, mode=modes)
def test_trial_tool_notice_is_counted(encoder: Any, stdout: str, stderr: str, allowance: int, mode: str) -> None:
    suffix = "\n[trial-tool: stopped at the 2 s call deadline (--call-timeout)]\n"
    out, err = clipping.fit(encoder, stdout, stderr, allowance, mode, suffix)
    assert out.tokens + err.tokens <= allowance
    assert err.tokens == count(encoder, err.text)
    assert made_of_original(err.text, stderr, suffix)


def test_headtail_keeps_both_ends_and_says_how_much_was_cut(encoder: Any) -> None:
    text = "".join(f"line {n}\n" for n in range(2000))
    out, _ = clipping.fit(encoder, text, "", 200, "headtail")
    assert out.clipped and out.tokens <= 200
    assert out.text.startswith("line 0\n") and out.text.endswith("line 1999\n")
    match = NOTICE.search(out.text)
    assert match is not None and int(match.group(2)) == count(encoder, text)


def test_cut_never_splits_a_character(encoder: Any) -> None:
    # A cut at a token boundary can fall inside a multi-byte character and deliver U+FFFD.
    text = "😀🎉日本語👨\u200d👩\u200d👧" * 40
    for allowance in range(1, 60):
        for mode in ("head", "headtail"):
            out, _ = clipping.fit(encoder, text, "", allowance, mode)
            assert "\ufffd" not in out.text
            assert made_of_original(out.text, text)


def test_special_token_text_is_ordinary_text(encoder: Any) -> None:
    out, _ = clipping.fit(encoder, "<|endoftext|>", "", 100)
    assert out.text == "<|endoftext|>"
    assert out.tokens == len(encoder.encode_ordinary("<|endoftext|>")) > 1


LETTERED = st.lists(st.one_of(chunk, st.sampled_from(["\nabc", "\nZ", ".\nx", "  \nq", "\n\nw"])), max_size=40).map(
    "".join
)


@SETTINGS
@given(text=LETTERED, window=st.integers(min_value=1, max_value=64))
def test_windows_tokenize_as_the_whole(encoder: Any, text: str, window: int) -> None:
    windows = list(clipping.pieces(text, window))
    assert "".join(windows) == text
    assert [t for w in windows for t in encoder.encode_ordinary(w)] == encoder.encode_ordinary(text)


@SETTINGS
@given(
    data=st.lists(st.one_of(LETTERED.map(str.encode), st.binary(max_size=30)), max_size=8).map(b"".join),
    cut=st.booleans(),
    window=st.integers(min_value=1, max_value=64),
)
def test_windows_of_captured_bytes_decode_as_the_whole(data: bytes, cut: bool, window: int) -> None:
    import codecs

    whole = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=not cut)
    assert "".join(clipping.pieces(clipping.Captured(data, cut), window)) == whole


@SETTINGS
@given(stdout=LETTERED, stderr=LETTERED, allowance=allowances, mode=modes, window=st.integers(1, 48))
def test_windowed_delivery_is_the_whole_texts_delivery(
    encoder: Any, stdout: str, stderr: str, allowance: int, mode: str, window: int
) -> None:
    whole = clipping.fit(encoder, stdout, stderr, allowance, mode, "[trial-tool: x]\n")
    saved = clipping.CHUNK
    clipping.CHUNK = window  # module state: restored below, and Hypothesis runs examples one at a time
    try:
        windowed = clipping.fit(encoder, stdout, stderr, allowance, mode, "[trial-tool: x]\n")
        captured = clipping.fit(
            encoder,
            clipping.Captured(stdout.encode()),
            clipping.Captured(stderr.encode()),
            allowance,
            mode,
            "[trial-tool: x]\n",
        )
    finally:
        clipping.CHUNK = saved
    assert windowed == whole == captured
