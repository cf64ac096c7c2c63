"""What every cached causal LM backend derives from one method, ``logits(state, seq)``.

A backend (torch, ONNX Runtime) implements ``logits``: sync its cache to the
longest common prefix with ``seq``, feed the rest, return one row of logits per
newly fed token. Prefill, the last rows, greedy choices and greedy drafting are
the same on top of it for every backend. No torch here: the ONNX backend runs
where torch is not installed.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class IncrementalLM:
    kv_bytes_per_token: int = 0   # backends that know their cache size say so (the verifier's KV budget)
    far_positions: int = 0        # from this many positions a forward's costs change (its threads): the verifier
                                  # profiles past it too (0: they don't)

    def logits(self, state: Any, seq: Sequence[int]) -> Any:
        """Rows of logits [m, vocab] after each newly fed token of ``seq`` (an array or a tensor)."""
        raise NotImplementedError

    def _numpy(self, rows: Any) -> np.ndarray:
        return rows   # backends whose rows are not numpy arrays convert here

    def prefill(self, state: Any, tokens: Sequence[int]) -> None:
        """Cache all but the last token of ``tokens`` (the next call feeds that one)."""
        if len(tokens) > 1:
            self.logits(state, tokens[:-1])

    def _last_rows(self, state: Any, seq: Sequence[int], last: int) -> Any:
        rows = self.logits(state, seq)
        if last > rows.shape[0]:
            raise ValueError(f"asked for {last} positions but only {rows.shape[0]} were fed")
        return rows[-last:]

    def next_tokens(self, state: Any, seq: Sequence[int], last: int) -> list[int]:
        """Greedy choices after each of the last ``last`` positions of ``seq``."""
        return self._last_rows(state, seq, last).argmax(-1).tolist()

    def logits_rows(self, state: Any, seq: Sequence[int], last: int) -> np.ndarray:
        """Logits after each of the last ``last`` positions of ``seq``: float32 [last, vocab]."""
        return self._numpy(self._last_rows(state, seq, last))

    def logits_rows_batch(self, states: Sequence[Any], seqs: Sequence[Sequence[int]],
                          lasts: Sequence[int]) -> list[np.ndarray]:
        """``logits_rows`` for several sessions; a backend that can batch them in one forward overrides this."""
        return [self.logits_rows(state, seq, last) for state, seq, last in zip(states, seqs, lasts)]

    def cached_length(self, state: Any) -> int:
        """Positions the state's cache holds."""
        return len(state.tokens)

    def tree_draft(self, state: Any, committed: Sequence[int], k: int, depth: int) -> tuple[list[int], list[int]]:
        """A token tree (tokens, parents; edgespec.verify.tree): the greedy chain of k tokens after
        ``committed``, then the runner-up token at each of its first ``depth`` positions, a sibling of the
        chain's token there (free: the chain's forward computed it). The cache ends as greedy_draft's."""
        seq, chain, siblings = list(committed), [], []
        for j in range(k):
            row = self.logits_rows(state, seq, 1)[0]
            first, second = (int(t) for t in np.argsort(row)[::-1][:2])
            chain.append(first)
            if j < depth:
                siblings.append(second)
            seq.append(first)
        parents = list(range(-1, k - 1)) + [j - 1 for j in range(len(siblings))]
        return chain + siblings, parents

    def greedy_draft(self, state: Any, committed: Sequence[int], k: int) -> list[int]:
        """Propose k tokens greedily after ``committed`` (k forward calls).

        Afterwards the cache holds committed + draft[:k-1]: the last draft token is
        chosen but never fed, which is why a drafter crops (k - 1) - n on rollback.
        """
        seq = list(committed)
        draft: list[int] = []
        for _ in range(k):
            token = self.next_tokens(state, seq, 1)[0]
            draft.append(token)
            seq.append(token)
        return draft
