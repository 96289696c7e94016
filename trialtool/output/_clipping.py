"""Clip a call's output to its token allowance, exactly, at character boundaries.

Pure functions over an encoder with tiktoken's `encode_ordinary` and
`decode_bytes`. The invariants, checked by tests/test_clipping.py:

* delivered text is made only of characters the command printed, in order
  (plus our own notices); a cut never falls inside a UTF-8 sequence;
* the token count recorded for a stream is a recount of exactly the text
  delivered for it, and the two streams together never exceed the allowance;
* output within the allowance passes through unchanged.

Each stream is tokenized once in full, window by window (`pieces`), keeping
only the tokens of its two ends. Cutting at a token boundary and backing
off to a character boundary can change how the cut text tokenizes (BPE is not
prefix-stable at the edges), so every candidate is recounted, and shrunk until
the recount fits; candidates are bounded by the allowance, not by the output.

A reply a program parses is not text an agent reads (`fit_reply`). A harness's
own tools speak JSON-RPC through a call (inspect's `text_editor` execs its
sandbox tools with a request on stdin and parses the response on stdout).
Clipping that stdout as text would cut the JSON, and the tool would fail on its
own reply. What the model reads is the text inside: the response's string
`result`, or its error's `message`. That text is clipped to the allowance (the
clip notice inside it) and the envelope written again around it, so the reply
stays valid JSON and the tokens charged are those of the text the model reads.
Anything else on stdout is delivered as text, as for any call.
"""

from __future__ import annotations

import codecs
import json
import re
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Protocol

    class Encoder(Protocol):
        """The part of `tiktoken.Encoding` that clipping uses.

        Defined for the type checker only: creating a Protocol class at run time
        is slow, and would be paid on every call's path (docs/performance.md).
        """

        def encode_ordinary(self, text: str) -> list[int]: ...

        def decode_bytes(self, tokens: Sequence[int]) -> bytes: ...


class StreamDelivery(NamedTuple):
    """What one stream delivers to the agent."""

    text: str
    #: Recount of `text`.
    tokens: int
    #: Tokens in the captured stream before clipping.
    observed_tokens: int
    #: True when `text` is not the whole captured stream.
    clipped: bool


class Captured(NamedTuple):
    """A stream as captured: its raw bytes, decoded with replacement (U+FFFD) where they are not UTF-8.

    `cut_at_cap`: the capture cap cut the stream, so a character it cut in half is
    dropped rather than replaced: it is not a character the command printed.
    """

    data: bytes
    cut_at_cap: bool = False


#: Text is tokenized in windows of about this many characters or bytes, so that a
#: large output never exists as one token list (docs/performance.md).
CHUNK = 1 << 20
_CUT_TEXT = re.compile(r"\n(?=[A-Za-z])")
_CUT_DATA = re.compile(rb"\n(?=[A-Za-z])")


def pieces(source: str | Captured, chunk: int | None = None) -> Iterator[str]:
    """The text of `source` in windows whose tokens, concatenated, are the tokens of the whole.

    A window ends after a newline that an ASCII letter follows: o200k_base's
    pre-tokenizer always splits there (no pattern takes a newline and then a
    letter), so no token spans the cut. Where no such point comes for a long
    stretch the window simply grows. tests/test_clipping.py checks windows against
    the whole on generated text.
    """
    chunk = CHUNK if chunk is None else chunk
    if isinstance(source, str):
        data: str | bytes = source
        cut: re.Pattern[Any] = _CUT_TEXT
    else:
        data, cut = source.data, _CUT_DATA
    decoder = None if isinstance(source, str) else codecs.getincrementaldecoder("utf-8")("replace")
    start = 0
    while start < len(data) or (start == 0 and not data):
        found = cut.search(data, start + chunk) if len(data) - start > chunk else None
        end = found.start() + 1 if found else len(data)
        window = data[start:end]
        last = end >= len(data)
        if decoder is None:
            yield str(window)
        else:
            assert isinstance(source, Captured) and isinstance(window, bytes)
            yield decoder.decode(window, final=last and not source.cut_at_cap)
        start = end
        if last:
            return


class _Stream:
    """A stream's token count, and the text and tokens of its head and tail: all that clipping reads.

    Only the first and the last `keep` tokens (and one window) are held, however
    long the stream; the whole text only when it is short enough to be delivered.
    """

    def __init__(self, encoder: Encoder, source: str | Captured, keep: int) -> None:
        self.source = source
        self.observed = 0
        head: list[str] = []
        head_tokens: list[int] = []
        tail: deque[tuple[str, list[int]]] = deque()
        tail_count = 0
        self.complete = True
        for window in pieces(source):
            tokens = encoder.encode_ordinary(window) if window else []
            self.observed += len(tokens)
            if len(head_tokens) <= keep:
                head.append(window)
                head_tokens.extend(tokens)
            else:
                self.complete = False
            tail.append((window, tokens))
            tail_count += len(tokens)
            while len(tail) > 1 and tail_count - len(tail[0][1]) >= keep:
                tail_count -= len(tail.popleft()[1])
        self._head_text = "".join(head)
        self._head_data = self._head_text.encode("utf-8")
        self._head_tokens = head_tokens
        self._tail_data = "".join(window for window, _ in tail).encode("utf-8")
        self._tail_tokens = [token for _, tokens in tail for token in tokens]
        self._last = tail[-1] if tail else ("", [])

    def text(self) -> str:
        """The whole text (decoded once more if only its ends were kept: the rare case of a seam)."""
        return self._head_text if self.complete else "".join(pieces(self.source))

    def count_with(self, encoder: Encoder, suffix: str) -> int:
        """Tokens of the whole text followed by `suffix` (only the last window is counted again)."""
        if not suffix:
            return self.observed
        window, tokens = self._last
        return self.observed - len(tokens) + _count(encoder, window + suffix)

    def head(self, encoder: Encoder, count: int) -> str:
        """The text of the first `count` tokens, cut back to a character boundary."""
        if count <= 0:
            return ""
        data = self._head_data
        end = len(encoder.decode_bytes(self._head_tokens[:count]))
        while 0 < end < len(data) and data[end] & 0xC0 == 0x80:
            end -= 1  # inside a multi-byte character: cut before it
        return data[:end].decode("utf-8")

    def tail(self, encoder: Encoder, count: int) -> str:
        """The text of the last `count` tokens, cut forward to a character boundary."""
        if count <= 0:
            return ""
        data = self._tail_data
        start = len(data) - len(encoder.decode_bytes(self._tail_tokens[-count:]))
        while start < len(data) and data[start] & 0xC0 == 0x80:
            start += 1
        return data[start:].decode("utf-8")


def notice(omitted: int, total: int) -> str:
    """The one line that stands where head-and-tail clipping left tokens out."""
    return f"\n[... trial-tool clipped {omitted} of {total} tokens here ...]\n"


def _count(encoder: Encoder, text: str) -> int:
    return len(encoder.encode_ordinary(text)) if text else 0


def _clip_head(encoder: Encoder, stream: _Stream, budget: int, suffix: str) -> tuple[str, int]:
    if _count(encoder, suffix) > budget:
        suffix = ""
    keep = budget
    while True:
        text = stream.head(encoder, keep) + suffix
        used = _count(encoder, text)
        if used <= budget or keep == 0:
            return text, used
        keep = max(0, keep - (used - budget))


def _clip_headtail(encoder: Encoder, stream: _Stream, budget: int, suffix: str) -> tuple[str, int]:
    total = stream.observed
    fixed = _count(encoder, notice(total, total) + suffix)
    if budget - fixed < 2:
        # Too small for a head, a tail and the notice: the head alone says more.
        return _clip_head(encoder, stream, budget, suffix)
    head = (budget - fixed + 1) // 2
    tail = (budget - fixed) // 2
    while True:
        text = stream.head(encoder, head) + notice(total - head - tail, total) + stream.tail(encoder, tail) + suffix
        used = _count(encoder, text)
        if used <= budget:
            return text, used
        if head == 0 and tail == 0:
            return _clip_head(encoder, stream, budget, suffix)
        # Shrink both ends by the excess; an end already empty passes its share on.
        cut = used - budget
        from_head = (cut + 1) // 2 if tail else cut
        from_tail = cut - from_head if head > from_head else cut - head
        head = max(0, head - from_head)
        tail = max(0, tail - from_tail)


def _deliver_one(encoder: Encoder, stream: _Stream, budget: int, mode: str, suffix: str) -> StreamDelivery:
    observed = stream.observed
    whole_tokens = stream.count_with(encoder, suffix)
    if whole_tokens <= budget:
        return StreamDelivery(stream.text() + suffix, whole_tokens, observed, False)
    clip = _clip_headtail if mode == "headtail" else _clip_head
    text, used = clip(encoder, stream, budget, suffix)
    return StreamDelivery(text, used, observed, True)


def fit(
    encoder: Encoder,
    stdout: str | Captured,
    stderr: str | Captured,
    allowance: int,
    mode: str = "headtail",
    stderr_suffix: str = "",
) -> tuple[StreamDelivery, StreamDelivery]:
    """Fit stdout and stderr (with `stderr_suffix`, trial-tool's own notice) into `allowance`.

    When both do not fit, each stream is guaranteed half the allowance and a
    stream that needs less than half leaves the rest to the other, so stderr is
    never starved by a verbose stdout. A stream may be given as text or as the
    bytes captured; either way only its ends are held in tokens (`_Stream`).
    """
    out = _Stream(encoder, stdout, allowance)
    err = _Stream(encoder, stderr, allowance)
    out_need = out.observed
    err_need = err.count_with(encoder, stderr_suffix)
    if out_need + err_need <= allowance:
        return (
            StreamDelivery(out.text(), out_need, out_need, False),
            StreamDelivery(err.text() + stderr_suffix, err_need, err.observed, False),
        )
    half = allowance // 2
    if err_need <= half:
        out_budget = allowance - err_need
    elif out_need <= allowance - half:
        out_budget = out_need
    else:
        out_budget = allowance - half
    delivered_out = _deliver_one(encoder, out, out_budget, mode, "")
    delivered_err = _deliver_one(encoder, err, allowance - delivered_out.tokens, mode, stderr_suffix)
    return delivered_out, delivered_err


def fit_reply(
    encoder: Encoder,
    stdout: str | Captured,
    stderr: str | Captured,
    allowance: int,
    mode: str,
    stderr_suffix: str,
    reply: str,
) -> tuple[StreamDelivery, StreamDelivery]:
    """`fit`, for a call whose reply is `reply` (call.REPLIES): "json-rpc" is clipped inside its envelope
    when stdout is one whole JSON-RPC response of text, else delivered as text."""
    if reply == "json-rpc" and isinstance(stdout, Captured) and not stdout.cut_at_cap:
        fitted = _fit_json_rpc(encoder, stdout, stderr, allowance, mode, stderr_suffix)
        if fitted is not None:
            return fitted
    return fit(encoder, stdout, stderr, allowance, mode, stderr_suffix)


def _fit_json_rpc(
    encoder: Encoder, stdout: Captured, stderr: str | Captured, allowance: int, mode: str, stderr_suffix: str
) -> tuple[StreamDelivery, StreamDelivery] | None:
    """The response with its text clipped inside; None when stdout is no JSON-RPC response of text."""
    try:
        response = json.loads(stdout.data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(response, dict) or response.get("jsonrpc") != "2.0":
        return None
    holder: dict[str, object]
    result, error = response.get("result"), response.get("error")
    if isinstance(result, str):
        holder, key, text = response, "result", result
    elif isinstance(error, dict) and isinstance(message := error.get("message"), str):
        holder, key, text = error, "message", message
    else:
        return None
    inner, err = fit(encoder, text, stderr, allowance, mode, stderr_suffix)
    holder[key] = inner.text
    # The envelope is the transport's, not the model's: its tokens are not the agent's to pay.
    return inner._replace(text=json.dumps(response, ensure_ascii=False)), err


__all__ = ["CHUNK", "Captured", "StreamDelivery", "fit", "fit_reply", "notice", "pieces"]
