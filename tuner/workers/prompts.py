"""Synthetic prompts of exactly a trace's lengths, as token ids.

Traces carry lengths, not text. Requests with the same prefix block id get the same tokens for that block, so
prefix caching hits as it did in the original; everything else is unique per request, so it does not.
"""

from __future__ import annotations

import numpy as np

from tuner.traces.records import PREFIX_BLOCK_TOKENS, TraceRequest

# Low ids are special tokens in most vocabularies; prompts stay above them.
_LOWEST_ID = 10


class PromptBuilder:
    """Token-id prompts of a trace's exact lengths, ids below `vocab_size`: requests that share a prefix block share
    its tokens, the rest are unique to each request; the same seed gives the same prompts."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self._high = max(_LOWEST_ID + 1, vocab_size)
        self._seed = seed
        self._blocks: dict[int, np.ndarray] = {}

    def _tokens(self, key: tuple[int, ...], n: int) -> np.ndarray:
        rng = np.random.default_rng((self._seed, *key))
        return rng.integers(_LOWEST_ID, self._high, size=n, dtype=np.int64)

    def _block(self, block_id: int) -> np.ndarray:
        block = self._blocks.get(block_id)
        if block is None:
            block = self._blocks[block_id] = self._tokens((1, block_id), PREFIX_BLOCK_TOKENS)
        return block

    def token_ids(self, index: int, request: TraceRequest) -> list[int]:
        """Exactly `request.input_tokens` ids: its prefix blocks first, then tokens unique to this request."""
        parts = [self._block(b) for b in request.prefix_blocks]
        shared = sum(len(p) for p in parts)
        if shared < request.input_tokens:
            parts.append(self._tokens((2, index), request.input_tokens - shared))
        return np.concatenate(parts)[: request.input_tokens].tolist() if parts else []
