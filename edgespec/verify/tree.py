"""Token trees and their greedy verification — pure, no I/O, no torch.

A tree window proposes several continuations at once: nodes in topological order, each with its parent (an
earlier node, or -1: the root, the session's last committed token). The main chain goes first, so a chain is
the tree whose every parent is the node before it, and an accepted path that is a prefix of the feed order
needs no reordering of the cache. The verifier feeds the root and every node in one target pass, each node
seeing only its ancestors (``attention``), at position root + depth; row 0 of the result scores the token
after the root, row 1 + i the token after node i.

Greedy verification walks from the root: at each step the child whose token is the target's choice there is
accepted (at most one child can match: siblings carry distinct tokens), and the walk stops at the first node
without one. As for a chain, the verdict commits the accepted path and then the target's own token, and an
EOS token is never accepted (it becomes the next token), so the result equals target-only greedy decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

ROOT = -1


@dataclass(frozen=True, slots=True)
class TokenTree:
    tokens: tuple[int, ...]    # one per node, in topological order
    parents: tuple[int, ...]   # parents[i] < i, or ROOT (-1)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a tree has one parent per token: {len(self.tokens)} tokens, "
                             f"{len(self.parents)} parents")
        seen: set[tuple[int, int]] = set()
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i}: parent {parent} is not the root (-1) or an earlier node")
            if (parent, token) in seen:
                raise ValueError(f"node {i}: token {token} repeats a sibling (siblings carry distinct tokens)")
            seen.add((parent, token))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "TokenTree":
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, len(self.tokens) - 1))

    def depths(self) -> list[int]:
        """Depth of each node: 1 for a child of the root."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent == ROOT else out[parent] + 1)
        return out

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def attention(self) -> np.ndarray:
        """bool [n + 1, n + 1] over [root, node 0, ..., node n-1]: entry (q, s) is True when s is q itself
        or one of its ancestors (the root is everyone's)."""
        n = len(self.tokens)
        mask = np.zeros((n + 1, n + 1), dtype=bool)
        mask[:, 0] = True
        for i, parent in enumerate(self.parents):
            mask[i + 1] = mask[parent + 1] if parent != ROOT else mask[0]
            mask[i + 1, i + 1] = True
        return mask


@dataclass(frozen=True, slots=True)
class TreeVerdict:
    path: tuple[int, ...]   # accepted node indices, root's child first
    next_token: int         # the target's token after the last accepted node

    @property
    def accepted(self) -> int:
        return len(self.path)

    def committed(self, tree: TokenTree) -> list[int]:
        """The tokens this verdict commits: the accepted path's tokens, then next_token."""
        return [*(tree.tokens[i] for i in self.path), self.next_token]


def verify_tree_greedy(tree: TokenTree, target_argmax: Sequence[int], eos_ids: Collection[int] = ()) -> TreeVerdict:
    """Accept the longest root-to-node path whose every token is the target's greedy choice.

    target_argmax: [n + 1], the target's choice after the root (row 0) and after each node (row 1 + i).
    """
    if len(target_argmax) != len(tree) + 1:
        raise ValueError(f"target_argmax has {len(target_argmax)} entries, expected one per node plus the root's "
                         f"({len(tree) + 1})")
    children: dict[int, dict[int, int]] = {}
    for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):
        children.setdefault(parent, {})[token] = i
    path: list[int] = []
    node = ROOT
    while True:
        chosen = target_argmax[node + 1]
        child = children.get(node, {}).get(chosen)
        if child is None or chosen in eos_ids:
            return TreeVerdict(tuple(path), chosen)
        path.append(child)
        node = child
