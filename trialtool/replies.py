"""Replies a program parses, not text an agent reads: a JSON-RPC response clipped inside, its envelope kept.

A harness's own tools speak JSON-RPC through a call (inspect's `text_editor`
execs its sandbox tools with a request on stdin and parses the response on
stdout). Clipping that stdout as text would cut the JSON, and the tool would
fail on its own reply. What the model reads is the text inside: the
response's string `result`, or its error's `message`. That text is clipped to
the call's allowance (the clip notice inside it), and the envelope written
again around it, so the reply stays valid JSON and the tokens charged are
those of the text the model reads. Anything else on stdout is delivered as
text, as for any call.
"""

from __future__ import annotations

import json
from typing import Any

from . import clipping
from .call import REPLIES  # the reply kinds a call may name, and the record's `reply` field


def deliver_json_rpc(
    encoder: Any,
    stdout: clipping.Captured,
    stderr: clipping.Captured,
    allowance: int,
    mode: str,
    notice: str,
) -> tuple[clipping.StreamDelivery, clipping.StreamDelivery] | None:
    """The response with its text clipped inside; None when stdout is no whole JSON-RPC response of text."""
    if stdout.cut_at_cap:
        return None  # a response the capture cap cut is no response: delivered as text
    try:
        response = json.loads(stdout.data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(response, dict) or response.get("jsonrpc") != "2.0":
        return None
    holder: dict[str, Any]
    if isinstance(response.get("result"), str):
        holder, key = response, "result"
    elif isinstance(response.get("error"), dict) and isinstance(response["error"].get("message"), str):
        holder, key = response["error"], "message"
    else:
        return None
    inner, err = clipping.fit(encoder, holder[key], stderr, allowance, mode, notice)
    holder[key] = inner.text
    # The envelope is the transport's, not the model's: its tokens are not the agent's to pay.
    return inner._replace(text=json.dumps(response, ensure_ascii=False)), err


__all__ = ["REPLIES", "deliver_json_rpc"]
