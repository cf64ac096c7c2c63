"""The verifier's sessions on vLLM (services.verifier --backend vllm): windows verified by vLLM's own
speculative decoding, inside the engine, with the session's request kept alive between windows.

The engine's request for a session holds its committed tokens and, after a prefill, the one token vLLM
sampled past them ("ahead": the target's next token, which vLLM always samples when it prefills). A window:

1. is compared with the ahead tokens first: if the draft departs from them at position m, the verdict is
   m accepted and the ahead token at m next, with no forward (greedy: the ahead token is the argmax; sampling:
   it is a sample from p, and accepting a draft token exactly when it equals it keeps the output a sample of p,
   whatever the drafter did);
2. else its remaining tokens become the request's speculative tokens and one engine step verifies them
   (vLLM's rejection sampler: greedy, or the one-hot rule, lossless for any drafter); the step appends the
   accepted tokens and one token of the target's own, which is the verdict.

So the session's request is always its committed tokens plus the ahead tokens, and a verdict never needs a
rollback inside vLLM. Windows of different sessions that arrive together share a step (vLLM's batch); sessions
without a window sit out the step.

What this backend cannot do exactly, it refuses: coupled and relaxed sampling, min_tokens and log-probabilities
(FAILED_PRECONDITION at open: the torch backend does them), token trees and cloud drafting (INVALID_ARGUMENT, as
llama.cpp). Its Info says so (capabilities), and the coordinator plans sessions by it: such requests are refused
before anything opens, and sessions run chains and edge drafting. Draft distributions (q) are accepted and not
needed: the one-hot rule is lossless without them, at a lower acceptance than the rule with q. No per-token
log-probabilities (Verdict.target_logprob is 0).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

from edgespec.errors import EdgespecError, FailedPrecondition, ResourceExhausted, Unavailable
from edgespec.control.capabilities import Capabilities
from edgespec.engines.limits import check_prefix, check_session_id
from edgespec.engines.verifier import (REPLAY_MEMORY, VerifierEngine, VerifierLimits, WindowResult, _key, _Opening,
                                       _Session)
from edgespec.verify.eos import ending_ids
from edgespec.verify.greedy import Verdict, common_prefix_length
from edgespec.verify.sampling import SamplingParams, check_params
from edgespec.verify.window import Window

log = logging.getLogger(__name__)

PREFILL_STEPS = 64   # steps a (chunked) prefill may take before the engine is called full


@dataclass(slots=True)
class RequestState:
    """A session's request in the engine (the verifier engine's ``kv`` for this backend)."""
    request_id: str | None = None   # None: no request (evicted, or vLLM ended it); a window adds one
    tokens: int = 0                 # tokens the request holds: committed + ahead
    ahead: list[int] = field(default_factory=list)   # sampled past the committed tokens, not yet committed


class StepOutput(Protocol):
    tokens: list[int]
    finished: bool


class EngineTarget(Protocol):
    """What this engine needs of the vLLM target (edgespec.backends.vllm_lm.VllmTarget)."""
    vocab_size: int
    kv_bytes_per_token: int

    def add(self, tokens: Sequence[int], temperature: float, top_k: int, top_p: float, seed: int | None) -> str: ...
    def abort(self, request_id: str) -> None: ...
    def cached_tokens(self, request_id: str) -> int: ...
    def step(self, drafts: dict[str, Sequence[int]]) -> dict[str, StepOutput]: ...


class VllmVerifierEngine(VerifierEngine):
    def __init__(self, target: EngineTarget, eos_ids: Sequence[int], limits: VerifierLimits = VerifierLimits(),
                 clock: Callable[[], float] = time.monotonic):
        # vLLM manages its own KV pool (paged, shared prefixes, preemption): no budget of the engine's on top
        super().__init__(target, eos_ids, replace(limits, kv_budget_bytes=0), clock)

    def capabilities(self) -> Capabilities:
        """None of them: begin_open and the window checks refuse each (see the module doc)."""
        return Capabilities()

    @property
    def kv_bytes(self) -> int:
        """Bytes the sessions' requests hold in vLLM's KV cache (shared prefix blocks counted per session)."""
        return self.target.kv_bytes_per_token * sum(s.kv.tokens for s in self._sessions.values()
                                                    if s.kv.request_id is not None)

    def begin_open(self, session_id: str, tokens: Sequence[int], params: SamplingParams = SamplingParams()) -> None:
        """The whole open at once (vLLM's own scheduler chunks the prefill); prefill_more then finishes it."""
        check_session_id(session_id)
        check_prefix("tokens", tokens, self.target.vocab_size, self.limits.max_session_tokens)
        self._check_session_memory(len(tokens))
        check_params(params)
        if params.coupled or params.relaxation.lossy:
            mode = "coupled" if params.coupled else "relaxed"
            raise FailedPrecondition(f"the vLLM backend does not do {mode} sampling (vLLM samples with its own "
                                     "generator); run a verifier with --backend torch for it")
        if params.min_length:
            raise FailedPrecondition("the vLLM backend does not mask EOS for min_tokens (its requests restart at the "
                                     "committed tokens); run a verifier with --backend torch or llamacpp for it")
        if params.logprobs is not None:
            raise FailedPrecondition("the vLLM backend returns no per-token log-probabilities; run a verifier with "
                                     "--backend torch or llamacpp for them")
        old = self._sessions.pop(session_id, None)
        if old is not None:
            self._release(old)
        self.abandon_open(session_id)
        started = time.perf_counter()
        session = _Session(committed=list(tokens), kv=RequestState(), params=params, last_used=self.clock())
        self._start(session)
        self._opening[session_id] = _Opening(session, len(tokens), time.perf_counter() - started)

    def _start(self, session: _Session) -> None:
        """A request over the session's committed tokens, prefilled: vLLM samples one token past them."""
        params = session.params
        request_id = self.target.add(session.committed, params.temperature, params.top_k, params.top_p,
                                     None if params.greedy else params.seed)
        session.kv = RequestState(request_id, len(session.committed))
        try:
            for _ in range(PREFILL_STEPS):
                output = self.target.step({request_id: ()}).get(request_id)
                if output is not None and output.tokens:
                    break
            else:
                raise ResourceExhausted("vLLM could not schedule the session's prefill (its KV cache is full)",
                                        retry_after_seconds=1.0)
        except Exception as error:
            self._drop_kv(session)
            if isinstance(error, EdgespecError):
                raise
            log.exception("vLLM prefill failed")
            raise Unavailable(f"target prefill failed: {type(error).__name__}: {error}") from None
        self.prefix_cache_tokens += min(self.target.cached_tokens(request_id), max(0, len(session.committed) - 1))
        self._appended(session, output)

    def _appended(self, session: _Session, output: StepOutput) -> None:
        session.kv.ahead.extend(output.tokens)
        session.kv.tokens += len(output.tokens)
        if output.finished:   # vLLM ended the request (its length limit); the next window starts a new one
            self._drop_kv(session)

    def _release(self, session: _Session) -> None:
        self._drop_kv(session)

    def _drop_kv(self, session: _Session) -> bool:
        state = session.kv
        session.kv = RequestState()
        if state.request_id is None:
            return False
        try:
            self.target.abort(state.request_id)
        except Exception:   # an engine that already ended it: nothing held
            log.debug("abort of vLLM request %s failed", state.request_id, exc_info=True)
        return True

    def _verify_wave(self, requests: Sequence[tuple[str, Window]], wave: list[int],
                     results: list[WindowResult | EdgespecError | None]) -> None:
        stepping: dict[str, tuple[int, _Session, int, tuple[int, ...]]] = {}
        for i in wave:
            try:
                immediate, session = self._admit(*requests[i])
                if immediate is not None:
                    results[i] = immediate
                    continue
                if session.kv.request_id is None:   # evicted or ended: a new request (a prefill) first
                    self._start(session)
                    self.restores += 1
            except EdgespecError as error:
                results[i] = error
                continue
            window = requests[i][1]
            draft = _until_eos(window.draft, ending_ids(session.params, self.eos_ids))
            ahead = session.kv.ahead
            m = common_prefix_length(draft, ahead)
            if m < len(ahead):   # decided by what vLLM already sampled: no forward
                results[i] = self._settle(session, window, m, ahead[m], 0.0, 1, 0)
            else:
                stepping[session.kv.request_id] = (i, session, m, tuple(draft[m:]))
        if not stepping:
            return
        started = time.perf_counter()
        try:
            outputs = self.target.step({request_id: spec for request_id, (_, _, _, spec) in stepping.items()})
        except Exception as error:   # a failed step: every window in it fails, none commits
            log.exception("vLLM step over %d windows failed", len(stepping))
            for i, session, _, _ in stepping.values():
                self._drop_kv(session)
                results[i] = Unavailable(f"target step failed: {type(error).__name__}: {error}")
            return
        seconds = time.perf_counter() - started
        fed = sum(len(spec) + 1 for _, _, _, spec in stepping.values())
        for request_id, (i, session, m, spec) in stepping.items():
            output = outputs.get(request_id)
            if output is None or not output.tokens:   # vLLM could not schedule it (memory): nothing changed
                results[i] = ResourceExhausted("vLLM could not schedule this window (its KV cache is full)",
                                               retry_after_seconds=1.0)
                continue
            new = output.tokens
            if list(new[:-1]) != list(spec[:len(new) - 1]):
                log.error("vLLM appended %s for drafts %s", new, spec)
                self._drop_kv(session)
                results[i] = Unavailable("vLLM appended tokens that are not the window's accepted drafts")
                continue
            session.kv.ahead.extend(new)
            session.kv.tokens += len(new)
            results[i] = self._settle(session, requests[i][1], m + len(new) - 1, new[-1], seconds, len(stepping), fed)
            if output.finished:
                self._drop_kv(session)

    def _settle(self, session: _Session, window: Window, accepted: int, next_token: int, seconds: float,
                batch_size: int, batch_tokens: int) -> WindowResult:
        """Commit n accepted draft tokens and the target's next token (all of them the request's ahead tokens)."""
        verdict = Verdict(accepted, next_token)
        tokens = verdict.committed(window.draft)
        assert tokens == session.kv.ahead[:len(tokens)], (tokens, session.kv.ahead)
        session.committed.extend(tokens)
        del session.kv.ahead[:len(tokens)]
        result = WindowResult(verdict, window.base_position, len(session.committed), seconds, batch_size,
                              batch_tokens)
        session.replies[window.base_position] = (_key(window), result)
        while len(session.replies) > REPLAY_MEMORY:
            session.replies.popitem(last=False)
        return result


def _until_eos(draft: Sequence[int], eos_ids: frozenset[int]) -> tuple[int, ...]:
    """The draft up to its first EOS token: an EOS is never accepted (edgespec.verify.greedy), so what follows
    it cannot be, and the target's own token at the EOS's position is the verdict's next token."""
    for i, token in enumerate(draft):
        if token in eos_ids:
            return tuple(draft[:i])
    return tuple(draft)


def vllm_profile(target: EngineTarget, largest: int, context: int = 32, repeats: int = 2) -> dict[int, float]:
    """c(n) on vLLM, as edgespec.engines.profile measures it on the other backends: seconds of one step that
    feeds n tokens (n - 1 drafts, all rejected: the cost does not depend on acceptance) after a ``context``-token
    prefix, the fastest of ``repeats`` after one warm-up, for n = 1..largest."""
    vocab = target.vocab_size
    request_id = target.add([(11 + 7 * i) % vocab for i in range(context)], 0.0, 0, 1.0, None)
    curve: dict[int, float] = {}
    try:
        target.step({request_id: ()})                      # the prefill
        for n in range(1, largest + 1):
            times = []
            for attempt in range(repeats + (n == 1)):       # the very first step pays one-time costs
                started = time.perf_counter()
                output = target.step({request_id: [vocab - 1 - i for i in range(n - 1)]}).get(request_id)
                if output is not None and output.finished:
                    return curve
                if n > 1 or attempt > 0:
                    times.append(time.perf_counter() - started)
            curve[n] = min(times)
    finally:
        target.abort(request_id)
    return curve
