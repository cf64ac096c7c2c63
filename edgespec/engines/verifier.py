"""The verifier's sessions: committed tokens, a target KV cache, idempotent windows.

Synchronous and single-threaded by design: the servicer runs every call on one
worker thread, so the target model sees one forward at a time. One forward may
verify windows of several sessions (``verify_batch``: cross-session batching).

Memory: a session's KV cache may be evicted (idle past the TTL, or to make room
under the KV budget) while its committed tokens stay; its next window restores
the cache from the committed prefix, so an eviction costs a prefill, never a
token. A session idle past ``forget_after`` is dropped entirely; the
coordinator then re-opens it with its committed prefix (NOT_FOUND).
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from edgespec.errors import Aborted, EdgespecError, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from edgespec.engines.limits import check_draft_probs, check_prefix, check_session_id, check_token_ids
from edgespec.engines.sessions import Evictions, Session, SessionTable
from edgespec.verify.eos import ending_ids, mask_eos
from edgespec.verify.logprobs import TokenLogprob, token_logprobs
from edgespec.control.capabilities import Capabilities
from edgespec.verify.relaxed import WeightHead, committed_logprob, load_head, verify_relaxed
from edgespec.verify.sampling import SamplingParams, SparseDist, check_params, verify_coupled, verify_sampling, warp
from edgespec.verify.greedy import Verdict, verify_greedy
from edgespec.engines.self_draft import SelfDraftConfig, SelfDrafter
from edgespec.verify.tree import TokenTree, verify_tree_coupled, verify_tree_greedy, verify_tree_sampling
from edgespec.verify.window import Window

log = logging.getLogger(__name__)

REPLAY_MEMORY = 16  # verdicts remembered per session for retried / replayed windows


class TargetModel(Protocol):
    vocab_size: int
    kv_bytes_per_token: int

    def new_state(self) -> Any: ...
    def cached_length(self, state: Any) -> int: ...
    def crop(self, state: Any, length: int) -> None: ...
    def logits_rows_batch(self, states: Sequence[Any], seqs: Sequence[Sequence[int]],
                          lasts: Sequence[int]) -> list[np.ndarray]: ...
    def prefill(self, state: Any, tokens: Sequence[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class VerifierLimits:
    max_window: int = 16            # largest draft window, tokens
    max_session_tokens: int = 8192  # largest committed length of one session, tokens
    max_session_kv_bytes: int = 0   # largest KV cache of one session, bytes (0 = no limit but the tokens)
    kv_budget_bytes: int = 0        # all sessions' KV caches together, bytes (0 = unlimited)
    idle_ttl_seconds: float = 0.0   # evict the KV cache of a session idle this long (0 = never)
    forget_after_seconds: float = 0.0  # drop a session idle this long entirely (0 = never)
    prefill_chunk_tokens: int = 0   # a prompt is prefilled in parts of this many tokens, other sessions' windows
                                    # verified between them (0 = in one part)


@dataclass(frozen=True, slots=True)
class WindowResult:
    verdict: Verdict | None  # None: an optimistic window whose assumption did not hold (discarded)
    base_position: int     # where the window started
    committed_position: int  # base_position + n + 1
    verify_compute_seconds: float  # target forward (shared by the batch) + verification, seconds
    batch_size: int = 1    # windows verified in the same forward pass
    batch_tokens: int = 1  # tokens that forward fed, all its windows together (each window's k + 1)


@dataclass(slots=True)
class Stepping:
    """A window of steps between forwards (VerifierEngine.verify_step): the steps it has taken so far."""
    index: int                 # its place among the requests it came with
    session_id: str
    session: Any               # the engine's session record
    window: Window
    parts: list[WindowResult]  # one result per step taken
    result: WindowResult | None = None   # all its steps merged, once it is done


@dataclass(frozen=True, slots=True)
class Usage:
    """What the engine holds now, and what its memory management did so far."""
    sessions: int
    kv_bytes: int
    memory_evictions: int    # KV caches evicted to fit the KV budget
    prefilled_tokens: int = 0      # prompt positions prefilled by opens, all sessions so far
    prefix_cache_tokens: int = 0   # of those, taken from the prefix cache instead of computed
    prefix_cache_bytes: int = 0    # bytes the prefix cache holds now


@dataclass(slots=True)
class _Session(Session):
    replies: OrderedDict[int, tuple[tuple, WindowResult]] = field(default_factory=OrderedDict)
    self_drafter: SelfDrafter | None = None   # cloud drafting (PTD): made on the first self-drafted window


@dataclass(slots=True)
class _Opening:
    """A session whose prompt is being prefilled, a part at a time."""
    session: _Session
    fed: int = 0            # prompt tokens prefilled so far
    seconds: float = 0.0    # their prefill compute


class VerifierEngine:
    def __init__(self, target: TargetModel, eos_ids: Sequence[int], limits: VerifierLimits = VerifierLimits(),
                 clock: Callable[[], float] = time.monotonic, self_draft: SelfDraftConfig = SelfDraftConfig()):
        self.target = target
        self.eos_ids = frozenset(eos_ids)
        self.limits = limits
        self.self_draft = self_draft   # cloud drafting's budget and tree shape
        self.clock = clock
        self._sessions: SessionTable[_Session] = SessionTable("verifier")
        self._opening: dict[str, _Opening] = {}   # sessions whose prompt is being prefilled
        self._head: WeightHead | None = None   # the learned DIVERSED weight head, loaded on first use
        self.restores = 0                      # windows that re-prefilled an evicted cache
        self.memory_evictions = 0              # caches evicted to fit the KV budget
        self.prefilled_tokens = 0              # prompt positions open() prefilled
        self.prefix_cache_tokens = 0           # of those, taken from the target's prefix cache

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    @property
    def kv_bytes(self) -> int:
        """Bytes held by all sessions' KV caches (those being opened too)."""
        sessions = [*self._sessions.values(), *(o.session for o in self._opening.values())]
        return self.target.kv_bytes_per_token * sum(self.target.cached_length(s.kv) for s in sessions)

    def capabilities(self) -> Capabilities:
        """What it does beyond windows of a chain (its Info says so): every sampling mode, and token trees (so
        cloud drafting too) where the backend scores them (the torch backend's tree_rows)."""
        return replace(Capabilities.every(), token_trees=hasattr(self.target, "tree_rows"))

    def usage(self) -> Usage:
        store = getattr(self.target, "prefix_cache", None)
        return Usage(len(self._sessions), self.kv_bytes, self.memory_evictions, self.prefilled_tokens,
                     self.prefix_cache_tokens, store.nbytes if store is not None else 0)

    def committed(self, session_id: str) -> list[int]:
        return list(self._get(session_id).committed)

    def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams = SamplingParams()) -> float:
        """Create or replace a session; prefill its cache. Returns prefill seconds."""
        self.begin_open(session_id, tokens, params)
        while (seconds := self.prefill_more(session_id)) is None:
            pass
        return seconds

    def begin_open(self, session_id: str, tokens: Sequence[int], params: SamplingParams = SamplingParams()) -> None:
        """Check an open, reserve its room in the KV budget and replace any session of that id; ``prefill_more``
        then prefills the prompt a part at a time, so other sessions' windows run between the parts. Until the
        last part the session takes no windows (NOT_FOUND) and nothing evicts it."""
        check_session_id(session_id)
        check_prefix("tokens", tokens, self.target.vocab_size, self.limits.max_session_tokens)
        self._check_session_memory(len(tokens))
        check_params(params)
        if params.relaxation.learned and self._head is None:
            try:
                self._head = load_head()
            except (OSError, ValueError, KeyError) as error:
                raise InvalidArgument("relaxation.learned", f"this verifier has no usable weight head: {error}") from None
        old = self._sessions.pop(session_id, None)
        self.abandon_open(session_id)
        try:
            self._make_room(len(tokens), keep=())
        except ResourceExhausted:
            if old is not None:
                self._sessions[session_id] = old   # a refused re-open changes nothing
            raise
        session = _Session(committed=list(tokens), kv=self.target.new_state(), params=params, last_used=self.clock())
        self._opening[session_id] = _Opening(session)

    def prefill_more(self, session_id: str) -> float | None:
        """Prefill the next part (``limits.prefill_chunk_tokens``; 0: all) of an opening session's prompt. None
        while parts remain; after the last, the session takes windows and this returns its prefill seconds."""
        opening = self._opening.get(session_id)
        if opening is None:
            raise NotFound(f"session {session_id!r} is not being opened on this verifier")
        tokens = opening.session.committed
        if opening.fed < len(tokens):
            end = min(len(tokens), opening.fed + (self.limits.prefill_chunk_tokens or len(tokens)))
            store = getattr(self.target, "prefix_cache", None)
            hits = store.hit_tokens if store is not None else 0
            started = time.perf_counter()
            try:
                self.target.prefill(opening.session.kv, tokens[:end])
            except BaseException:
                del self._opening[session_id]
                raise
            opening.seconds += time.perf_counter() - started
            opening.fed = end
            self.prefix_cache_tokens += (store.hit_tokens if store is not None else 0) - hits
            if end < len(tokens):
                return None
        del self._opening[session_id]
        self.prefilled_tokens += max(0, len(tokens) - 1)
        opening.session.last_used = self.clock()
        self._sessions[session_id] = opening.session
        return opening.seconds

    def abandon_open(self, session_id: str) -> None:
        """Drop a session whose open did not finish (its caller went away); nothing if there is none."""
        opening = self._opening.pop(session_id, None)
        if opening is not None:
            self._release(opening.session)

    def close(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            if session_id in self._opening:
                return self.abandon_open(session_id)
            raise NotFound(f"session {session_id!r} is not open on this verifier")
        self._release(session)

    def _release(self, session: _Session) -> None:
        """A session dropped (closed, forgotten, replaced): what its backend holds for it outside its KV state
        (nothing here: a torch or llama.cpp state is freed with the session)."""

    def verify(self, session_id: str, base_position: int, draft: Sequence[int],
               q: Sequence[SparseDist] = (), params_fingerprint: int = 0,
               parent: int | None = None, parents: Sequence[int] = (), self_draft: int = 0) -> WindowResult:
        """Score ``draft`` in one target pass and commit n + 1 tokens.

        q: the draft distributions (sampling sessions; empty = one-hot q).
        parent: set for an optimistic window (pipelining): verify only if the
        committed tokens are exactly base_position long and end in ``parent``,
        else discard it (verdict None) — unless it replays an earlier window.
        Every check happens before any state changes, so a rejected window
        leaves the session exactly as it was.
        """
        [result] = self.verify_batch([(session_id, Window(0, base_position, tuple(draft), tuple(q),
                                                          params_fingerprint, parent, tuple(parents), self_draft))])
        if isinstance(result, EdgespecError):
            raise result
        return result

    def verify_batch(self, requests: Sequence[tuple[str, Window]]) -> list[WindowResult | EdgespecError]:
        """Verify (session_id, window) pairs of several sessions; one target forward per wave.

        Each request gets its result or its error (a bad window fails alone and
        changes nothing). Windows of distinct sessions share a forward pass;
        a second window of the same session goes in the next wave, after the
        first one committed (so a pipelined optimistic window sees its parent).
        A window of steps goes on until it has them all (verify_step, one forward a step).
        """
        results, going = self.verify_step(requests)
        while going:
            _, going = self.verify_step((), going)
            for stepping in going:
                if stepping.result is not None:
                    results[stepping.index] = stepping.result
            going = [stepping for stepping in going if stepping.result is None]
        return results

    def verify_step(self, requests: Sequence[tuple[str, Window]], going: Sequence["Stepping"] = ()
                    ) -> tuple[list["WindowResult | EdgespecError | None"], list["Stepping"]]:
        """One forward's work: the next step of each window of steps in ``going`` (target-only windows with steps
        > 1 that have taken some), in the same forward as the first wave of ``requests``.

        Returns the requests' results (None for a window of steps that goes on) and the windows of steps after
        this forward, ``going``'s and the requests' that go on: each with its ``result`` set once it has all its
        steps, an EOS or an error (which ends its steps; what they committed stands). That result covers all its
        tokens (the first verdict's, the others in drafted, next_token the last), and is what a replay of the
        window gets. So the scheduler answers every window after the forward that finished it, and a window that
        arrives while others take their steps joins the next one instead of waiting for all of them."""
        going = [stepping for stepping in going if stepping.result is None]
        stepping_sessions = {stepping.session_id for stepping in going}
        combined = list(requests) + [
            (stepping.session_id, Window(stepping.window.seq, len(stepping.session.committed), (),
                                         params_fingerprint=stepping.window.params_fingerprint))
            for stepping in going]
        results: list[WindowResult | EdgespecError | None] = [None] * len(combined)
        remaining, first = list(range(len(requests))), True
        while remaining or first:
            wave, later, seen = [], [], set(stepping_sessions) if first else set()
            for i in remaining:
                (later if requests[i][0] in seen else wave).append(i)
                seen.add(requests[i][0])
            if first:
                wave += list(range(len(requests), len(combined)))
                first = False
            self._verify_wave(combined, wave, results)
            remaining = later
        after: list[Stepping] = []
        for stepping, result in zip(going, results[len(requests):]):
            after.append(self._stepped(stepping, result))
        for i, (session_id, window) in enumerate(requests):
            result = results[i]
            if window.steps > 1 and isinstance(result, WindowResult) and result.verdict is not None:
                session = self._sessions.get(session_id)
                fresh = session is not None and result.committed_position == window.base_position + 1 == \
                    len(session.committed)   # scored now, not a replay of an earlier answer
                if fresh and result.verdict.next_token not in ending_ids(session.params, self.eos_ids):
                    after.append(Stepping(i, session_id, session, window, [result]))
                    results[i] = None
        return results[:len(requests)], after

    def _stepped(self, stepping: "Stepping", result: WindowResult | EdgespecError | None) -> "Stepping":
        """A window of steps after one more forward: its part added, and its merged result once it is done."""
        done = not isinstance(result, WindowResult) or result.verdict is None
        if not done:
            stepping.parts.append(result)
            done = len(stepping.parts) >= stepping.window.steps or \
                result.verdict.next_token in ending_ids(stepping.session.params, self.eos_ids)
        if done:
            stepping.result = self._merge_steps(stepping.session, stepping.window, stepping.parts)
        return stepping

    def _merge_steps(self, session: _Session, window: Window, parts: list[WindowResult]) -> WindowResult:
        """One result for a window's steps: the tokens of all of them, their forward times summed, the first
        forward's batch; remembered for a replay in place of the steps' own answers."""
        tokens = [part.verdict.next_token for part in parts]
        first = parts[0]
        verdict = replace(first.verdict, drafted=tuple(tokens[:-1]), next_token=tokens[-1],
                          target_logprob=sum(part.verdict.target_logprob for part in parts),
                          logprobs=tuple(entry for part in parts for entry in part.verdict.logprobs))
        merged = WindowResult(verdict, window.base_position, parts[-1].committed_position,
                              sum(part.verify_compute_seconds for part in parts), first.batch_size, first.batch_tokens)
        for part in parts:
            session.replies.pop(part.base_position, None)
        session.replies[window.base_position] = (_key(window), merged)
        return merged

    def _verify_wave(self, requests: Sequence[tuple[str, Window]], wave: list[int],
                     results: list[WindowResult | EdgespecError | None]) -> None:
        scored: list[tuple[int, _Session]] = []
        for i in wave:
            try:
                immediate, session = self._admit(*requests[i])
            except EdgespecError as error:
                results[i] = error
                continue
            if immediate is not None:
                results[i] = immediate
            else:
                scored.append((i, session))
        for i, session in [(i, s) for i, s in scored if requests[i][1].parents or requests[i][1].self_draft]:
            scored.remove((i, session))
            window = requests[i][1]   # trees are scored alone, one forward each
            results[i] = self._self_draft(session, window) if window.self_draft else self._verify_tree(session, window)
        if not scored:
            return
        started = time.perf_counter()
        seqs = [session.committed + list(requests[i][1].draft) for i, session in scored]
        restoring = sum(self.target.cached_length(s.kv) == 0 and len(s.committed) > 1 for _, s in scored)
        try:
            # Logits after committed[-1] and after each draft token: k + 1 rows per window.
            rows = self.target.logits_rows_batch([s.kv for _, s in scored], seqs,
                                                 [len(requests[i][1].draft) + 1 for i, _ in scored])
        except Exception as error:   # every window in it fails, none commits
            log.exception("target forward over %d windows failed", len(scored))
            for i, session in scored:
                results[i] = self._forward_failed(session, error)
            return
        self.restores += restoring
        seconds = time.perf_counter() - started
        fed = sum(len(requests[i][1].draft) + 1 for i, _ in scored)
        for (i, session), logits in zip(scored, rows):
            results[i] = self._commit(session, requests[i][1], logits, seconds, len(scored), fed)

    def _self_draft(self, session: _Session, window: Window) -> WindowResult | EdgespecError:
        """Cloud drafting: this session's PTD tree (edgespec.engines.self_draft) scored and verified like an edge
        drafter's tree; the target's choices at its nodes grow the session's guesses for the next pass."""
        if session.self_drafter is None:
            session.self_drafter = SelfDrafter(session.committed, ending_ids(session.params, self.eos_ids),
                                               self.self_draft)
        drafter = session.self_drafter
        drafter.index(session.committed)      # tokens edge-drafted windows committed meanwhile
        tree = drafter.window(session.committed[-1], window.self_draft)
        if not len(tree):                     # nothing to guess yet: one plain step
            return self._plain_step(session, window)
        return self._verify_tree(session, window, tree, drafter)

    def _plain_step(self, session: _Session, window: Window) -> WindowResult | EdgespecError:
        started = time.perf_counter()
        try:
            [logits] = self.target.logits_rows_batch([session.kv], [session.committed], [1])
        except Exception as error:
            log.exception("target forward failed")
            return self._forward_failed(session, error)
        return self._commit(session, window, logits, time.perf_counter() - started, 1, 1)

    def _verify_tree(self, session: _Session, window: Window, tree: TokenTree | None = None,
                     drafter: SelfDrafter | None = None) -> WindowResult | EdgespecError:
        """A tree window: every node scored in one target forward (the backend's tree_rows), the longest path
        the target would take accepted, its keys and values kept. ``tree`` and ``drafter``: a self-drafted
        window's tree, and the session's drafter that learns from the target's choices at its nodes."""
        tree = window.tree if tree is None else tree
        started = time.perf_counter()
        try:
            rows = self.target.tree_rows(session.kv, session.committed, tree)
        except Exception as error:
            log.exception("target forward over a tree of %d nodes failed", len(tree))
            return self._forward_failed(session, error)
        params, eos = session.params, ending_ids(session.params, self.eos_ids)
        # row 0 scores the token after the root, row 1 + i the one after node i (at depth d: base + d)
        scores = mask_eos(rows, [window.base_position, *(window.base_position + d for d in tree.depths())],
                          self.eos_ids, params.min_length)
        if params.greedy:
            found = verify_tree_greedy(tree, np.argmax(scores, axis=-1).tolist(), eos)
        else:
            p = np.stack([warp(row, params) for row in scores])
            found = (verify_tree_coupled(tree, p, params.seed, window.base_position, eos) if params.coupled
                     else verify_tree_sampling(tree, window.q or None, p, params.seed, window.base_position, eos))
        tokens = found.committed(tree)
        scored = rows[[0, *(1 + j for j in found.path)]]   # the rows that scored the committed tokens
        self.target.keep_path(session.kv, found.path)     # the cache: committed + the accepted path
        session.committed.extend(tokens)
        verdict = Verdict(found.accepted, found.next_token, target_logprob=committed_logprob(scored, tokens),
                          path=found.path, logprobs=_logprobs(scored, tokens, params))
        if drafter is not None:
            drafter.update(tree, np.argmax(scores, axis=-1).tolist(), session.committed)
            verdict = replace(verdict, drafted=tuple(tree.tokens[i] for i in found.path), self_drafted=len(tree))
        result = WindowResult(verdict, window.base_position, len(session.committed), time.perf_counter() - started,
                              1, len(tree) + 1)
        session.replies[window.base_position] = (_key(window), result)
        while len(session.replies) > REPLAY_MEMORY:
            session.replies.popitem(last=False)
        return result

    def _forward_failed(self, session: _Session, error: Exception) -> EdgespecError:
        """A failed target forward (e.g. out of memory) fails the session's window: its cache is reset (restored
        from the committed prefix next time), and a backend that is full says so (RESOURCE_EXHAUSTED: back off);
        anything else is UNAVAILABLE."""
        session.kv = self.target.new_state()
        return error if isinstance(error, ResourceExhausted) else Unavailable(
            f"target forward failed: {type(error).__name__}: {error}")

    def _check_tree(self, session: _Session, window: Window) -> None:
        try:
            window.tree
        except ValueError as error:
            raise InvalidArgument("draft_parents", str(error)) from None
        self._check_scored_alone(session, window, "draft_parents", "score token trees; send chains (the torch "
                                 "backend scores trees)")

    def _check_scored_alone(self, session: _Session, window: Window, field: str, cannot: str) -> None:
        """What a window scored alone as a token tree (a tree, a self-drafted window) needs: a backend that
        scores trees, lossless verification, and no pipelining."""
        if not hasattr(self.target, "tree_rows"):
            raise InvalidArgument(field, f"this verifier's backend ({type(self.target).__name__}) does not {cannot}")
        if session.params.relaxation.lossy:
            raise InvalidArgument(field, "token trees are verified losslessly only: not in relaxed sessions")
        if window.parent is not None:
            raise InvalidArgument(field, "a token tree cannot be optimistic (pipelined)")

    def _check_self_draft(self, session: _Session, window: Window) -> None:
        if window.draft or window.parents or window.q:
            raise InvalidArgument("self_draft", "a self-drafted window carries no draft tokens, parents or q")
        if not 0 < window.self_draft <= self.limits.max_window:
            raise InvalidArgument("self_draft", f"must be in 1..{self.limits.max_window}, got {window.self_draft}")
        self._check_scored_alone(session, window, "self_draft", "draft for itself (it scores no token trees); "
                                 "send drafted windows")
        if max(window.base_position, len(session.committed)) + window.self_draft + 1 > self.limits.max_session_tokens:
            raise InvalidArgument("self_draft", f"session would exceed {self.limits.max_session_tokens} tokens")

    def _admit(self, session_id: str, window: Window) -> tuple[WindowResult | None, _Session]:
        """Check a window; the result if it needs no forward (discarded, replayed), else None."""
        session = self._get(session_id)
        optimistic = window.parent is not None
        self._check_window(session, window.base_position, window.draft, window.q, window.params_fingerprint,
                           optimistic)
        if window.parents:
            self._check_tree(session, window)
        if window.self_draft:
            self._check_self_draft(session, window)
        if window.steps and (window.draft or window.self_draft or window.parents or optimistic
                             or not 0 <= window.steps <= self.limits.max_window):
            raise InvalidArgument("steps", f"a target-only window (no draft tokens, not self-drafted, not optimistic) "
                                  f"of 0..{self.limits.max_window} steps, got {window.steps} steps with "
                                  f"{len(window.draft)} draft tokens")
        session.last_used = self.clock()
        committed = len(session.committed)
        base = window.base_position
        if optimistic and (base > committed or (base == committed and session.committed[-1] != window.parent)):
            return WindowResult(None, base, committed, 0.0), session
        if base < committed:
            return self._replay(session, base, _key(window), optimistic), session
        self._make_room(committed + (self.self_draft.nodes if window.self_draft else len(window.draft)),
                        keep=(session_id,))
        return None, session

    def _commit(self, session: _Session, window: Window, logits: np.ndarray, forward_seconds: float,
                batch_size: int, batch_tokens: int) -> WindowResult:
        started = time.perf_counter()
        draft, q, params = window.draft, window.q, session.params
        eos = ending_ids(params, self.eos_ids)
        # the rules see the target's logits under min_tokens (row i scores position base + i); logprobs the raw ones
        scores = mask_eos(logits, range(window.base_position, window.base_position + len(logits)), self.eos_ids,
                          params.min_length)
        if params.relaxation.lossy:
            verdict = verify_relaxed(draft, q or None, scores, params, window.base_position, eos, self._head)
        elif params.greedy:
            verdict = verify_greedy(draft, np.argmax(scores, axis=-1).tolist(), eos)
        elif params.coupled:
            p = np.stack([warp(row, params) for row in scores])
            verdict = verify_coupled(draft, p, params.seed, window.base_position, eos)
        else:
            p = np.stack([warp(row, params) for row in scores])
            verdict = verify_sampling(draft, q or None, p, params.seed, window.base_position, eos)
        verdict = replace(verdict, target_logprob=committed_logprob(logits, verdict.committed(draft)),
                          logprobs=_logprobs(logits, verdict.committed(draft), params))
        session.committed.extend(verdict.committed(draft))
        # The target fed k tokens past the committed prefix; keep n of them (crop k - n).
        self.target.crop(session.kv, len(session.committed) - 1)
        result = WindowResult(verdict, window.base_position, len(session.committed),
                              forward_seconds + time.perf_counter() - started, batch_size, batch_tokens)
        session.replies[window.base_position] = (_key(window), result)
        while len(session.replies) > REPLAY_MEMORY:
            session.replies.popitem(last=False)
        return result

    def evict_idle(self) -> Evictions:
        """Free the KV caches of sessions idle past the TTL; drop those idle past ``forget_after``."""
        return self._sessions.evict_idle(self.clock(), self.limits.idle_ttl_seconds,
                                         self.limits.forget_after_seconds, self._drop_kv, self._release)

    def _drop_kv(self, session: _Session) -> bool:
        if self.target.cached_length(session.kv) == 0:
            return False
        session.kv = self.target.new_state()
        return True

    def _check_session_memory(self, tokens: int) -> None:
        limit = self.limits.max_session_kv_bytes
        if limit and tokens * self.target.kv_bytes_per_token > limit:
            raise ResourceExhausted(f"a session of {tokens} tokens needs {tokens * self.target.kv_bytes_per_token} "
                                    f"bytes of KV cache, over the per-session limit of {limit} bytes; ask for less")

    def _make_room(self, tokens: int, keep: Sequence[str]) -> None:
        """Make the KV budget fit ``tokens`` more cached positions, evicting least recently used caches
        (never those in ``keep``); RESOURCE_EXHAUSTED if even that cannot."""
        self._check_session_memory(tokens)
        budget = self.limits.kv_budget_bytes
        if not budget:
            return
        need = tokens * self.target.kv_bytes_per_token
        # what opening sessions reserved and have not cached yet counts as held
        held = self.kv_bytes + self.target.kv_bytes_per_token * sum(
            len(o.session.committed) - self.target.cached_length(o.session.kv) for o in self._opening.values())
        if keep:   # a session's own cache is part of the tokens it asks for
            held -= sum(self.target.cached_length(self._sessions[s].kv) for s in keep) * self.target.kv_bytes_per_token
        for session_id, session in sorted(self._sessions.items(), key=lambda item: item[1].last_used):
            if held + need <= budget:
                break
            if session_id in keep:
                continue
            freed = self.target.cached_length(session.kv) * self.target.kv_bytes_per_token
            if self._drop_kv(session):
                held -= freed
                log.info("session %s: KV cache evicted to make room (%d bytes)", session_id, freed)
                self.memory_evictions += 1
        if held + need > budget:
            raise ResourceExhausted(f"KV budget of {budget} bytes is full ({held} held, {need} needed)",
                                    retry_after_seconds=1.0)

    def _get(self, session_id: str) -> _Session:
        return self._sessions.find(session_id)

    def _check_window(self, session: _Session, base_position: int, draft: tuple[int, ...],
                      q: tuple[SparseDist, ...], params_fingerprint: int, optimistic: bool) -> None:
        if len(draft) > self.limits.max_window:
            raise InvalidArgument("draft_tokens", f"window of {len(draft)} tokens exceeds max_window {self.limits.max_window}")
        check_token_ids("draft_tokens", draft, self.target.vocab_size)
        expected = session.params.fingerprint()
        if params_fingerprint != expected and (params_fingerprint != 0 or not session.params.greedy):
            raise InvalidArgument("params_fingerprint", f"{params_fingerprint} does not match the session's sampling "
                                  f"parameters ({expected}): drafter and verifier would warp differently")
        check_draft_probs(q, draft, self.target.vocab_size, session.params.sampler)
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


def _logprobs(rows: np.ndarray, tokens: Sequence[int], params: SamplingParams) -> tuple[TokenLogprob, ...]:
    """The committed tokens' log-probabilities from the raw rows that scored them, where the session asks."""
    return () if params.logprobs is None else token_logprobs(rows, tokens, params.logprobs)


def _key(window: Window) -> tuple:
    """What makes a window the same window again (a replay gets the same verdict)."""
    return window.draft, window.q, window.parents, window.self_draft, window.steps
