"""What a call delivers: o200k_base tokens, counted exactly, and output clipped to an allowance (pure).

`tokens` finds and verifies the rank file and builds the encoder; `clipping`
fits captured output into a token allowance exactly.
"""

from __future__ import annotations

from . import _clipping as clipping
from . import _tokens as tokens
from ._tokens import RANK_FILE_ENV, seed_tiktoken_cache

__all__ = ["RANK_FILE_ENV", "clipping", "seed_tiktoken_cache", "tokens"]
