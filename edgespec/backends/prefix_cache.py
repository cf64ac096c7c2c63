"""KV blocks of prompts seen before, found again by their tokens (automatic prefix caching).

A prompt many sessions share — a system prompt, a chat template, a retried request, a stream resumed with its
committed prefix — is prefilled once; later sessions start from the stored keys and values. The store is a
trie of fixed-size token blocks, as vLLM's block hashing is, but keyed by the tokens themselves (no hash, so
no collision): a block is found only under the exact tokens before it. A prompt's last, partial block is stored
too, so an identical prompt is served entirely from the store.

What a block holds is opaque here (the backend slices and joins its own tensors); the store only counts its
bytes and evicts the least recently used blocks past its budget. A block is always touched after the blocks
it extends, and ancestors after descendants, so the least recently used block has no descendants and
evicting it never strands one.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Callable, Sequence

_ids = count()


@dataclass(eq=False, slots=True)
class Block:
    tokens: tuple[int, ...]       # this block's tokens (block_tokens of them; fewer for a prompt's tail)
    start: int                    # position of its first token
    payload: Any                  # the backend's keys and values for these positions
    nbytes: int
    parent: "Block | None"
    children: dict[tuple[int, ...], "Block"] = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class PrefixCache:
    """Blocks of ``block_tokens`` tokens, at most ``budget_bytes`` in all (least recently used evicted)."""

    def __init__(self, budget_bytes: int, block_tokens: int = 16):
        if budget_bytes <= 0 or block_tokens < 1:
            raise ValueError(f"a prefix cache needs budget_bytes > 0 and block_tokens >= 1, got {budget_bytes} "
                             f"and {block_tokens}")
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self._roots: dict[tuple[int, ...], Block] = {}
        self._lru: OrderedDict[int, Block] = OrderedDict()   # least recently used first
        self.nbytes = 0
        self.hit_tokens = 0      # prompt positions taken from the store
        self.stored_tokens = 0   # prompt positions computed and stored
        self.evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._lru)

    def _spans(self, tokens: Sequence[int]):
        """The block-sized pieces of ``tokens``, the last one possibly shorter."""
        size = self.block_tokens
        for start in range(0, len(tokens), size):
            yield start, tuple(tokens[start:start + size])

    def match(self, tokens: Sequence[int]) -> list[Block]:
        """The stored blocks that spell the longest prefix of ``tokens`` (whole blocks, or the last one
        exactly), first to last; marks them used."""
        chain: list[Block] = []
        level = self._roots
        for _, piece in self._spans(tokens):
            block = level.get(piece)
            if block is None:
                break
            chain.append(block)
            level = block.children
        self._touch(chain)
        self.hit_tokens += sum(len(b.tokens) for b in chain)
        return chain

    def store(self, tokens: Sequence[int], cached: int, slice_kv: Callable[[int, int], tuple[Any, int]]) -> None:
        """Store the blocks of ``tokens`` that are not stored yet. ``slice_kv(start, end)`` returns the
        backend's keys and values for positions start..end-1 and their bytes; ``cached`` positions were taken
        from the store (their blocks exist)."""
        chain: list[Block] = []
        level, parent = self._roots, None
        for start, piece in self._spans(tokens):
            block = level.get(piece)
            if block is None:
                payload, nbytes = slice_kv(start, start + len(piece))
                block = Block(piece, start, payload, nbytes, parent)
                level[piece] = block
                self._lru[block.id] = block
                self.nbytes += nbytes
                if start >= cached:
                    self.stored_tokens += len(piece)
            chain.append(block)
            level, parent = block.children, block
        self._touch(chain)
        self._fit()

    def _touch(self, chain: list[Block]) -> None:
        for block in reversed(chain):   # descendants first: an ancestor is never older than its descendants
            self._lru.move_to_end(block.id)

    def _fit(self) -> None:
        while self.nbytes > self.budget_bytes and self._lru:
            _, block = self._lru.popitem(last=False)   # a leaf (see the module docstring)
            siblings = block.parent.children if block.parent is not None else self._roots
            del siblings[block.tokens]
            self.nbytes -= block.nbytes
            self.evicted_blocks += 1

    def clear(self) -> None:
        self._roots.clear()
        self._lru.clear()
        self.nbytes = 0
