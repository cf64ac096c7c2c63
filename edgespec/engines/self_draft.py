"""Cloud drafting: the verifier drafts for itself with Progressive Tree Drafting (PTD). Pure, no torch.

A session with no edge drafter (down, refusing, too slow a link, a device too weak to draft) can still
speculate: the target proposes its own guesses. Each pass feeds one tree (edgespec.verify.tree) after the
last committed token, the union of two tries:

- the **guess trie**: continuations that followed the last committed token before, from an n-gram pool
  keyed by one token. The pool holds every n-gram of the committed text (the prompt included: prompt
  lookup) and every path the target itself produced at scored nodes;
- the **progressive draft trie**: kept from pass to pass and grown by the target's own output — after each
  pass every node gets the target's choice there as a child (at most ``max_children``). Its paths are
  continuations the target would take from contexts close to this one; they feed the pool, and since every
  node is scored exactly (its logits are the target's after the root and its path), a draft path that the
  target would take is accepted like a guess. When a first-level subtree reaches ``max_depth`` it is
  replaced by its oldest child (the trie slides forward), first-level nodes are refilled from the last
  one's choice, and subtrees at an EOS are dropped.

The tree is verified by the same rules as an edge drafter's tree (greedy walk, lossless multi-draft with
one-hot q, coupled), so the output is the target's: the guesses only decide how many tokens a pass commits.
At most ``nodes`` tokens join the root per pass, guesses first (they are the likelier to be accepted), then
draft nodes, breadth first.

Differs from the PTD paper's code (MINE-USTC/PTD) in what does not change the output: first-level draft
nodes do not see each other (here each is a child of the root), draft paths can be accepted, the pool also
indexes the committed text, and the trie is sized by a token budget rather than by depth and fan-out alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from edgespec.verify.tree import ROOT, TokenTree

Trie = dict  # token -> Trie of what follows it (insertion order = age: the oldest first)


@dataclass(frozen=True, slots=True)
class SelfDraftConfig:
    nodes: int = 12          # tokens per pass beyond the root (the forward feeds nodes + 1)
    max_depth: int = 6       # deepest draft path, tokens
    max_children: int = 4    # children per draft node
    spine: int = 4           # first-level draft nodes kept
    pool_nodes: int = 60     # continuations kept per pool key (oldest branches dropped past it), nodes
    ngram: int = 4           # committed-text n-grams indexed: a key and up to ngram - 1 tokens after it


def _size(trie: Trie) -> int:
    return sum(1 + _size(child) for child in trie.values())


def _depth(trie: Trie) -> int:
    return max((1 + _depth(child) for child in trie.values()), default=0)


def _merge(into: Trie, path: Sequence[int]) -> None:
    """Insert ``path`` below ``into``, refreshing the age of the branch it goes through."""
    node = into
    for token in path:
        child = node.pop(token, None)
        node[token] = child if child is not None else {}
        node = node[token]


def _paths(trie: Trie, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every root-to-leaf path of ``trie``."""
    out = []
    for token, child in trie.items():
        out += _paths(child, prefix + (token,)) if child else [prefix + (token,)]
    return out


class SelfDrafter:
    """One session's PTD state: its n-gram pool and its progressive draft trie."""

    def __init__(self, committed: Sequence[int], eos_ids: Collection[int], config: SelfDraftConfig = SelfDraftConfig()):
        self.config, self.eos_ids = config, frozenset(eos_ids)
        self.pool: dict[int, Trie] = {}
        self.indexed = 0                     # committed tokens whose n-grams are in the pool
        self.draft: Trie = {}
        self.index(committed)
        for token in dict.fromkeys(reversed(committed[-8:])):   # seeds: the last distinct tokens
            if len(self.draft) < 2 and token not in self.eos_ids:
                self.draft[token] = {}

    def index(self, committed: Sequence[int]) -> None:
        """Add the n-grams of the committed text not indexed yet (each key with what followed it)."""
        n = self.config.ngram
        for start in range(max(0, self.indexed - n + 1), len(committed) - 1):
            self._add(committed[start], committed[start + 1:start + n])
        self.indexed = len(committed)

    def _add(self, key: int, path: Sequence[int]) -> None:
        trie = self.pool.setdefault(key, {})
        _merge(trie, path)
        while _size(trie) > self.config.pool_nodes and len(trie) > 1:
            del trie[next(iter(trie))]

    def window(self, last: int, depth_limit: int) -> TokenTree:
        """This pass's tree after ``last`` (the last committed token): guesses, then draft nodes, breadth first,
        at most ``nodes`` of them and none deeper than ``depth_limit``."""
        budget = self.config.nodes
        union: Trie = {}
        guesses = self.pool.get(last, {})
        for source in (guesses, self.draft):
            for path in sorted(_paths(source), key=len):
                _merge_within(union, path[:depth_limit], budget)
        return _as_tree(union)

    def update(self, tree: TokenTree, choices: Sequence[int], committed: Sequence[int]) -> None:
        """After a pass: ``choices`` [len(tree) + 1] are the target's greedy choices after the root and after each
        node; ``committed`` the session's tokens now. Feeds the pool and grows the draft trie."""
        c = self.config
        paths = _node_paths(tree)
        # What the target produced at each scored node: the node's path extended by its choice, indexed
        # under every token on it (an n-gram that ends in the target's own next token).
        for i, path in enumerate(paths):
            extended = (*path, choices[i + 1])
            if extended[-1] in self.eos_ids:
                continue
            for j in range(len(extended) - 1):
                self._add(extended[j], extended[j + 1:j + c.max_depth + 1])
        self.index(committed)
        # The draft trie grows by one level: each node gets its choice as a child. Nodes not scored this
        # pass (past the budget) grow next time.
        scored = {path: choices[i + 1] for i, path in enumerate(paths)}
        self._grow(self.draft, (), scored)
        self._refill()
        self._prune()

    def _grow(self, trie: Trie, prefix: tuple[int, ...], scored: dict[tuple[int, ...], int]) -> None:
        for token, child in list(trie.items()):
            path = prefix + (token,)
            self._grow(child, path, scored)
            choice = scored.get(path)
            if (choice is not None and choice not in child and choice not in self.eos_ids
                    and len(child) < self.config.max_children and len(path) < self.config.max_depth):
                child[choice] = {}

    def _refill(self) -> None:
        """Keep ``spine`` first-level nodes: the next one is the last one's newest child, moved up."""
        while 0 < len(self.draft) < self.config.spine:
            last = self.draft[next(reversed(self.draft))]
            candidates = [t for t in reversed(last) if t not in self.draft]
            if not candidates:
                break
            self.draft[candidates[0]] = last.pop(candidates[0])

    def _prune(self) -> None:
        """A first-level subtree as deep as max_depth is replaced by its oldest child (moved to the end);
        then the trie is cut to the token budget, oldest branches first."""
        for token in list(self.draft):
            subtree = self.draft[token]
            if 1 + _depth(subtree) >= self.config.max_depth:
                del self.draft[token]
                oldest = next((t for t in subtree if t not in self.draft), None)
                if oldest is not None:
                    self.draft[oldest] = subtree[oldest]
        while _size(self.draft) > 2 * self.config.nodes and len(self.draft) > 1:
            del self.draft[next(iter(self.draft))]


def _merge_within(union: Trie, path: Sequence[int], budget: int) -> None:
    """Insert as much of ``path`` as the budget allows (nodes already there cost nothing)."""
    node, size = union, _size(union)
    for token in path:
        if token not in node:
            if size >= budget:
                return
            node[token] = {}
            size += 1
        node = node[token]


def _as_tree(trie: Trie) -> TokenTree:
    """A trie as a TokenTree, breadth first (parents before children)."""
    tokens, parents, frontier = [], [], [(ROOT, trie)]
    while frontier:
        nxt = []
        for parent, children in frontier:
            for token, child in children.items():
                tokens.append(token)
                parents.append(parent)
                nxt.append((len(tokens) - 1, child))
        frontier = nxt
    return TokenTree(tuple(tokens), tuple(parents))


def _node_paths(tree: TokenTree) -> list[tuple[int, ...]]:
    """Each node's tokens from the root's child down to it."""
    out: list[tuple[int, ...]] = []
    for token, parent in zip(tree.tokens, tree.parents):
        out.append((token,) if parent == ROOT else (*out[parent], token))
    return out
