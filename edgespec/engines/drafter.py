"""The drafter's sessions: a mirror of the committed tokens and a draft KV cache.

The cache is synced lazily to the committed tokens on the next draft (longest
common prefix), so a rollback is only a change of the committed list.

Idle sessions go as on the verifier (edgespec.engines.sessions): an evicted KV
cache is rebuilt from the committed tokens on the next draft, so eviction costs a
prefill, never a different draft.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from edgespec.control.capabilities import Capabilities
from edgespec.errors import Aborted, InvalidArgument, NotFound
from edgespec.engines.limits import check_prefix, check_session_id, check_token_ids
from edgespec.engines.sessions import Evictions, Session, SessionTable
from edgespec.verify.sampling import (DRAFT, SamplingParams, SparseDist, check_params, race_times, truncate_to_sparse,
                                      uniform, warp)
from edgespec.verify.tree import nth


class DraftModel(Protocol):
    vocab_size: int

    def new_state(self) -> Any: ...
    def greedy_draft(self, state: Any, committed: Sequence[int], k: int) -> list[int]: ...
    def prefill(self, state: Any, tokens: Sequence[int]) -> None: ...
    def logits_rows(self, state: Any, seq: Sequence[int], last: int) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class DrafterLimits:
    max_window: int = 16            # largest k per Draft call, tokens
    max_session_tokens: int = 8192  # largest committed length of one session, tokens
    idle_ttl_seconds: float = 0.0   # drop the KV cache of a session idle this long (0 = never)
    forget_after_seconds: float = 0.0  # drop a session idle this long entirely (0 = never)


@dataclass(frozen=True, slots=True)
class Proposal:
    tokens: list[int]               # k proposed tokens
    q: list[SparseDist] | None      # what each was sampled from; None = deterministic (one-hot q)
    seconds: float                  # model time, seconds
    parents: list[int] | None = None   # a token tree's parents (edgespec.verify.tree); None = a chain


@dataclass(slots=True)
class _Session(Session):
    q_ids: int = 0        # ids of q kept per position when sampling; 0 = deterministic drafting
    cached: bool = True   # kv may hold positions (False right after an eviction)


class DrafterEngine:
    def __init__(self, model: DraftModel, limits: DrafterLimits = DrafterLimits(),
                 clock: Callable[[], float] = time.monotonic):
        self.model = model
        self.limits = limits
        self.clock = clock
        self._sessions: SessionTable[_Session] = SessionTable("drafter")

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def committed(self, session_id: str) -> list[int]:
        return list(self._get(session_id).committed)

    def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams = SamplingParams(),
             q_ids: int = 0) -> int:
        check_session_id(session_id)
        check_prefix("tokens", tokens, self.model.vocab_size, self.limits.max_session_tokens)
        check_params(params)
        if not 0 <= q_ids <= self.model.vocab_size:
            raise InvalidArgument("q_ids", f"must be in 0..{self.model.vocab_size}, got {q_ids}")
        session = _Session(list(tokens), self.model.new_state(), params, self.clock(), q_ids)
        self.model.prefill(session.kv, tokens)   # so the first draft costs what later ones do
        self._sessions[session_id] = session
        return len(tokens)

    def close(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is None:
            raise NotFound(f"session {session_id!r} is not open on this drafter")

    def crop(self, session_id: str, position: int) -> int:
        session = self._get(session_id)
        if not 1 <= position <= len(session.committed):
            raise InvalidArgument("position", f"must be in 1..{len(session.committed)}, got {position}")
        del session.committed[position:]
        session.last_used = self.clock()
        return position

    def capabilities(self) -> Capabilities:
        """What it does beyond drafting chains (its Info says so): token trees where the backend drafts them."""
        return Capabilities(token_trees=hasattr(self.model, "tree_draft"))

    def draft(self, session_id: str, base_position: int, append: Sequence[int], k: int,
              tree_depth: int = 0) -> Proposal:
        """Set committed = committed[:base_position - len(append)] + append; propose k tokens (with
        ``tree_depth``, a token tree: also the runner-up at each of the chain's first tree_depth positions).

        All checks run before any state changes.
        """
        session = self._get(session_id)
        if not 1 <= k <= self.limits.max_window:
            raise InvalidArgument("k", f"must be in 1..{self.limits.max_window}, got {k}")
        if not 0 <= tree_depth <= k or k + tree_depth > self.limits.max_window:
            raise InvalidArgument("tree_depth", f"must be in 0..k ({k}) with k + tree_depth <= "
                                  f"{self.limits.max_window}, got {tree_depth}")
        if tree_depth and session.params.relaxation.lossy:
            raise InvalidArgument("tree_depth", "token trees are drafted for lossless sessions only (relaxed "
                                  "verification scores chains)")
        if tree_depth and not hasattr(self.model, "tree_draft"):
            raise InvalidArgument("tree_depth", f"this drafter's backend ({type(self.model).__name__}) does not "
                                  "draft token trees")
        check_token_ids("append", append, self.model.vocab_size)
        start = base_position - len(append)
        if base_position < 1 or start < 0:
            raise InvalidArgument("base_position", f"{base_position} is negative or shorter than append ({len(append)} tokens)")
        if start > len(session.committed):
            raise Aborted(f"drafter has no tokens between {len(session.committed)} and {start}", len(session.committed))
        if base_position + k > self.limits.max_session_tokens:
            raise InvalidArgument("base_position", f"session would exceed {self.limits.max_session_tokens} tokens")
        session.committed[start:] = append
        session.last_used, session.cached = self.clock(), True
        started = time.perf_counter()
        if session.params.greedy:
            if tree_depth:
                tokens, parents = self.model.tree_draft(session.kv, session.committed, k, tree_depth)
                return Proposal(tokens, None, time.perf_counter() - started, parents)
            return Proposal(self.model.greedy_draft(session.kv, session.committed, k), None,
                            time.perf_counter() - started)
        tokens, q, parents = self._sample_draft(session, k, tree_depth)
        return Proposal(tokens, q, time.perf_counter() - started, parents if tree_depth else None)

    def _sample_draft(self, session: _Session, k: int,
                      depth: int = 0) -> tuple[list[int], list[SparseDist] | None, list[int]]:
        """Sample k tokens from the warped draft distribution (truncated to q_ids ids),
        or take its argmax when q_ids is 0 (a deterministic drafter: one-hot q).
        The coupled sampler proposes argmax(q / E) with the position's race times and sends no q.

        With ``depth``, a token tree (edgespec.verify.tree): at each of the first depth positions also a
        sibling of the chain's token, drawn from the same q without it (the second argmax for the
        deterministic and coupled drafters); its q row is the chain token's. Returns (tokens, q, parents)."""
        seq = list(session.committed)
        params, coupled = session.params, session.params.coupled
        chain: list[int] = []
        dists: list[SparseDist] = []
        siblings: list[tuple[int, int, SparseDist | None]] = []   # (token, parent, q row)
        for j in range(k):
            probs = warp(self.model.logits_rows(session.kv, seq, 1)[0], params)
            dist, runner_up = None, None
            if coupled or session.q_ids == 0:
                scores = probs / race_times(params.seed, len(seq), probs.shape[-1]) if coupled else probs
                token = int(np.argmax(scores))
                if j < depth:
                    rest = scores.copy()
                    rest[token] = -np.inf
                    second = int(np.argmax(rest))
                    runner_up = second if rest[second] > 0 else None
            else:
                dist = truncate_to_sparse(probs, session.q_ids)
                token = dist.sample(uniform(params.seed, len(seq), DRAFT))
                rest = dist.without((token,))
                if j < depth and rest.ids:
                    runner_up = rest.sample(uniform(params.seed, len(seq), nth(DRAFT, 1)))
                dists.append(dist)
            if runner_up is not None:
                siblings.append((runner_up, j - 1, dist))
            chain.append(token)
            seq.append(token)
        tokens = chain + [token for token, _, _ in siblings]
        parents = list(range(-1, k - 1)) + [parent for _, parent, _ in siblings]
        q = dists + [dist for _, _, dist in siblings] if session.q_ids and not coupled else None
        return tokens, q, parents

    def evict_idle(self) -> Evictions:
        """Free the KV caches of sessions idle past the TTL; drop those idle past ``forget_after``."""
        return self._sessions.evict_idle(self.clock(), self.limits.idle_ttl_seconds,
                                         self.limits.forget_after_seconds, self._drop_kv)

    def _drop_kv(self, session: _Session) -> bool:
        if not session.cached:
            return False
        session.kv, session.cached = self.model.new_state(), False   # rebuilt from committed on the next draft
        return True

    def _get(self, session_id: str) -> _Session:
        return self._sessions.find(session_id)
