"""Token trees and their verification (greedy, speculative sampling, coupled) — pure, no I/O, no torch.

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

Sampling stays lossless with several drafts per position (``verify_tree_sampling``): the children of a node
are tried in order, each as a speculative-sampling step against what the earlier ones left. The first child
was drawn from the draft's q, each later one from q without its elder siblings (sampling without
replacement, ``SparseDist.without``); child j is accepted with probability min(1, r_j(x) / q_j(x)), where r_0
is the target's p and r_{j+1} = norm(max(0, r_j - q_j)) the residual of the rejection before. Each step
emits a token distributed as its r_j (the chain rule's proof, once per child), so the node emits p; when every
child is rejected the token comes from the last residual. A rejected x has r_j(x) < q_j(x), so it has no mass
left in r_{j+1}: the siblings' distinct tokens are exactly what the residuals exclude. A deterministic drafter
(one-hot q) proposes runner-ups: child j is accepted with probability r_j(x) and r_{j+1} is r_j without x.
A tree that is a chain gets exactly ``verify_sampling``'s verdict (same uniforms, same arithmetic).

The coupled sampler needs no new rule: the target's choice at every node is argmax(p / E) with the race times
of that node's position, and the greedy walk over those choices commits exactly target-only coupled sampling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

from edgespec.verify.sampling import (ACCEPT, BONUS, RESIDUAL, SparseDist, accepts, coupled_choice, residual, sample,
                                      uniform)

ROOT = -1


def nth(purpose: str, sibling: int) -> str:
    """The uniform purpose of a node's ``sibling``-th child (0: the chain's own purpose, so a chain replays
    verify_sampling's draws)."""
    return purpose if sibling == 0 else f"{purpose}:{sibling}"


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


def _children(tree: TokenTree) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    return children


def verify_tree_sampling(tree: TokenTree, q: Sequence[SparseDist] | None, p: np.ndarray, seed: int,
                         base_position: int, eos_ids: Collection[int] = ()) -> TreeVerdict:
    """Lossless multi-draft verification of a token tree (the rule in the module docstring).

    q: [n] the draft distribution each node's *first-born* sibling was drawn from (the same row for all the
       children of one node; elder siblings are removed here), or None for a deterministic drafter (one-hot q).
    p: [n + 1, V] warped target probabilities after the root (row 0) and after each node (row 1 + i).
    """
    if p.shape[0] != len(tree) + 1:
        raise ValueError(f"p has {p.shape[0]} rows, expected one per node plus the root's ({len(tree) + 1})")
    if q is not None and len(q) != len(tree):
        raise ValueError(f"q has {len(q)} rows, expected one per node ({len(tree)})")
    children = _children(tree)
    path: list[int] = []
    node, depth = ROOT, 0
    while True:
        position = base_position + depth
        target, mass = p[node + 1], 1.0          # r_j, unnormalised after a rejection (mass: its sum)
        taken: list[int] = []
        kids = children.get(node, [])
        for j, child in enumerate(kids):
            x = tree.tokens[child]
            drawn_from = None if q is None else q[child].without(taken)
            qx = 1.0 if drawn_from is None else drawn_from.prob(x)
            if accepts(float(target[x]) / mass, qx, uniform(seed, position, nth(ACCEPT, j))):
                if x in eos_ids:
                    return TreeVerdict(tuple(path), x)   # EOS ends the window, as in verify_sampling
                path.append(child)
                node, depth = child, depth + 1
                break
            target = residual(target / mass, drawn_from, x)
            mass = float(target.sum())
            taken.append(x)
        else:
            return TreeVerdict(tuple(path), sample(target, uniform(seed, position, RESIDUAL if kids else BONUS)))


def verify_tree_coupled(tree: TokenTree, p: np.ndarray, seed: int, base_position: int,
                        eos_ids: Collection[int] = ()) -> TreeVerdict:
    """The coupled sampler over a tree: the greedy walk against argmax(p / E) at each node's position."""
    if p.shape[0] != len(tree) + 1:
        raise ValueError(f"p has {p.shape[0]} rows, expected one per node plus the root's ({len(tree) + 1})")
    positions = [base_position] + [base_position + depth for depth in tree.depths()]
    choices = [coupled_choice(row, seed, position) for row, position in zip(p, positions)]
    return verify_tree_greedy(tree, choices, eos_ids)
