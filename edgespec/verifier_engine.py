"""The verifier's sessions: committed tokens, a target KV cache, idempotent windows.

Synchronous and single-threaded by design: the servicer runs every call on one
worker thread, so the target model sees one forward at a time.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Sequence

import numpy as np

from edgespec.errors import Aborted, InvalidArgument, NotFound
from edgespec.limits import check_draft_probs, check_prefix, check_session_id, check_token_ids
from edgespec.relaxed import WeightHead, committed_logprob, load_head, verify_relaxed
from edgespec.sampling import SamplingParams, SparseDist, check_params, verify_sampling, warp
from edgespec.verification import Verdict, verify_greedy

REPLAY_MEMORY = 16  # verdicts remembered per session for retried / replayed windows


class TargetModel(Protocol):
    vocab_size: int

    def new_state(self) -> Any: ...
    def crop(self, state: Any, length: int) -> None: ...
    def logits_rows(self, state: Any, seq: Sequence[int], last: int) -> np.ndarray: ...
    def prefill(self, state: Any, tokens: Sequence[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class VerifierLimits:
    max_window: int = 16            # largest draft window, tokens
    max_session_tokens: int = 8192  # largest committed length of one session, tokens


@dataclass(frozen=True, slots=True)
class WindowResult:
    verdict: Verdict | None  # None: an optimistic window whose assumption did not hold (discarded)
    base_position: int     # where the window started
    committed_position: int  # base_position + n + 1
    verify_seconds: float  # target forward + verification, seconds


@dataclass(slots=True)
class _Session:
    committed: list[int]
    kv: Any
    params: SamplingParams
    replies: OrderedDict[int, tuple[tuple, WindowResult]] = field(default_factory=OrderedDict)


class VerifierEngine:
    def __init__(self, target: TargetModel, eos_ids: Sequence[int], limits: VerifierLimits = VerifierLimits()):
        self.target = target
        self.eos_ids = frozenset(eos_ids)
        self.limits = limits
        self._sessions: dict[str, _Session] = {}
        self._head: WeightHead | None = None   # the learned DIVERSED weight head, loaded on first use

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def committed(self, session_id: str) -> list[int]:
        return list(self._get(session_id).committed)

    def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams = SamplingParams()) -> float:
        """Create or replace a session; prefill its cache. Returns prefill seconds."""
        check_session_id(session_id)
        check_prefix("tokens", tokens, self.target.vocab_size, self.limits.max_session_tokens)
        check_params(params)
        if params.relaxation.learned and self._head is None:
            try:
                self._head = load_head()
            except (OSError, ValueError, KeyError) as error:
                raise InvalidArgument("relaxation.learned", f"this verifier has no usable weight head: {error}") from None
        started = time.perf_counter()
        session = _Session(committed=list(tokens), kv=self.target.new_state(), params=params)
        self.target.prefill(session.kv, tokens)
        self._sessions[session_id] = session
        return time.perf_counter() - started

    def close(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is None:
            raise NotFound(f"session {session_id!r} is not open on this verifier")

    def verify(self, session_id: str, base_position: int, draft: Sequence[int],
               q: Sequence[SparseDist] = (), params_fingerprint: int = 0,
               parent: int | None = None) -> WindowResult:
        """Score ``draft`` in one target pass and commit n + 1 tokens.

        q: the draft distributions (sampling sessions; empty = one-hot q).
        parent: set for an optimistic window (pipelining): verify only if the
        committed tokens are exactly base_position long and end in ``parent``,
        else discard it (verdict None) — unless it replays an earlier window.
        Every check happens before any state changes, so a rejected window
        leaves the session exactly as it was.
        """
        session = self._get(session_id)
        draft, q = tuple(draft), tuple(q)
        self._check_window(session, base_position, draft, q, params_fingerprint, optimistic=parent is not None)
        committed = len(session.committed)
        if parent is not None and (base_position > committed or (
                base_position == committed and session.committed[-1] != parent)):
            return WindowResult(None, base_position, committed, 0.0)
        if base_position < committed:
            return self._replay(session, base_position, (draft, q), optimistic=parent is not None)
        started = time.perf_counter()
        k = len(draft)
        seq = session.committed + list(draft)
        params = session.params
        # Logits after committed[-1] and after each draft token: k + 1 rows.
        logits = self.target.logits_rows(session.kv, seq, k + 1)
        if params.relaxation.lossy:
            verdict = verify_relaxed(draft, q or None, logits, params, base_position, self.eos_ids, self._head)
        elif params.greedy:
            verdict = verify_greedy(draft, np.argmax(logits, axis=-1).tolist(), self.eos_ids)
        else:
            p = np.stack([warp(row, params) for row in logits])
            verdict = verify_sampling(draft, q or None, p, params.seed, base_position, self.eos_ids)
        verdict = replace(verdict, target_logprob=committed_logprob(logits, verdict.committed(draft)))
        session.committed.extend(verdict.committed(draft))
        # The target fed k tokens past the committed prefix; keep n of them (crop k - n).
        self.target.crop(session.kv, len(session.committed) - 1)
        result = WindowResult(verdict, base_position, len(session.committed), time.perf_counter() - started)
        session.replies[base_position] = ((draft, q), result)
        while len(session.replies) > REPLAY_MEMORY:
            session.replies.popitem(last=False)
        return result

    def _get(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise NotFound(f"session {session_id!r} is not open on this verifier; open it with its committed prefix") from None

    def _check_window(self, session: _Session, base_position: int, draft: tuple[int, ...],
                      q: tuple[SparseDist, ...], params_fingerprint: int, optimistic: bool) -> None:
        if len(draft) > self.limits.max_window:
            raise InvalidArgument("draft_tokens", f"window of {len(draft)} tokens exceeds max_window {self.limits.max_window}")
        check_token_ids("draft_tokens", draft, self.target.vocab_size)
        expected = session.params.fingerprint()
        if params_fingerprint != expected and (params_fingerprint != 0 or not session.params.greedy):
            raise InvalidArgument("params_fingerprint", f"{params_fingerprint} does not match the session's sampling "
                                  f"parameters ({expected}): drafter and verifier would warp differently")
        check_draft_probs(q, draft, self.target.vocab_size, sampling=not session.params.greedy)
        if base_position < 0:
            raise InvalidArgument("base_position", f"must be >= 0, got {base_position}")
        committed = len(session.committed)
        if base_position > committed and not optimistic:
            raise InvalidArgument("base_position", f"{base_position} is past the committed position {committed}")
        if max(base_position, committed) + len(draft) + 1 > self.limits.max_session_tokens:
            raise InvalidArgument("draft_tokens", f"session would exceed {self.limits.max_session_tokens} tokens")

    def _replay(self, session: _Session, base_position: int, window: tuple, optimistic: bool) -> WindowResult:
        """A window at an old position: the same verdict if it is a replay, else
        discarded (optimistic) or ABORTED."""
        remembered = session.replies.get(base_position)
        if remembered is not None and remembered[0] == window:
            return remembered[1]
        if optimistic:
            return WindowResult(None, base_position, len(session.committed), 0.0)
        raise Aborted(f"stale window at base_position {base_position}", len(session.committed))
