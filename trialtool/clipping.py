"""Clip a call's output to its token allowance, exactly, at character boundaries.

Pure functions over an encoder with tiktoken's `encode_ordinary` and
`decode_bytes`. The invariants, checked by tests/test_clipping.py:

* delivered text is made only of characters the command printed, in order
  (plus our own notices); a cut never falls inside a UTF-8 sequence;
* the token count recorded for a stream is a recount of exactly the text
  delivered for it, and the two streams together never exceed the allowance;
* output within the allowance passes through unchanged.

Each stream is tokenized once in full. Cutting at a token boundary and backing
off to a character boundary can change how the cut text tokenizes (BPE is not
prefix-stable at the edges), so every candidate is recounted, and shrunk until
the recount fits; candidates are bounded by the allowance, not by the output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence
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


class _Stream:
    """A stream's text, its UTF-8 bytes and its tokens, computed once."""

    def __init__(self, encoder: Encoder, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self.tokens = encoder.encode_ordinary(text) if text else []

    def head(self, encoder: Encoder, count: int) -> str:
        """The text of the first `count` tokens, cut back to a character boundary."""
        if count <= 0:
            return ""
        end = len(encoder.decode_bytes(self.tokens[:count]))
        while 0 < end < len(self.data) and self.data[end] & 0xC0 == 0x80:
            end -= 1  # inside a multi-byte character: cut before it
        return self.data[:end].decode("utf-8")

    def tail(self, encoder: Encoder, count: int) -> str:
        """The text of the last `count` tokens, cut forward to a character boundary."""
        if count <= 0:
            return ""
        start = len(self.data) - len(encoder.decode_bytes(self.tokens[-count:]))
        while start < len(self.data) and self.data[start] & 0xC0 == 0x80:
            start += 1
        return self.data[start:].decode("utf-8")


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
    total = len(stream.tokens)
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
    observed = len(stream.tokens)
    whole = stream.text + suffix
    whole_tokens = observed if not suffix else _count(encoder, whole)
    if whole_tokens <= budget:
        return StreamDelivery(whole, whole_tokens, observed, False)
    clip = _clip_headtail if mode == "headtail" else _clip_head
    text, used = clip(encoder, stream, budget, suffix)
    return StreamDelivery(text, used, observed, True)


def deliver(
    encoder: Encoder,
    stdout: str,
    stderr: str,
    allowance: int,
    mode: str = "headtail",
    stderr_suffix: str = "",
) -> tuple[StreamDelivery, StreamDelivery]:
    """Fit stdout and stderr (with `stderr_suffix`, trial-tool's own notice) into `allowance`.

    When both do not fit, each stream is guaranteed half the allowance and a
    stream that needs less than half leaves the rest to the other, so stderr is
    never starved by a verbose stdout.
    """
    out = _Stream(encoder, stdout)
    err = _Stream(encoder, stderr)
    out_need = len(out.tokens)
    err_need = len(err.tokens) if not stderr_suffix else _count(encoder, stderr + stderr_suffix)
    if out_need + err_need <= allowance:
        return (
            StreamDelivery(stdout, out_need, out_need, False),
            StreamDelivery(stderr + stderr_suffix, err_need, len(err.tokens), False),
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


__all__ = ["StreamDelivery", "deliver", "notice"]
