"""The drafter's idle eviction, with an injected clock: the verifier's TTL semantics.

Idle past ``idle_ttl`` a session's draft KV cache is dropped and rebuilt from its
committed tokens on the next draft (exactly: same tokens, same q); idle past
``forget_after`` the session is dropped (NOT_FOUND, the coordinator re-opens it)
and its owner's session slot is released.
"""
import asyncio

import pytest

from edgespec.engines.drafter import DrafterEngine, DrafterLimits
from edgespec.errors import NotFound
from edgespec.observe.metrics import DrafterMetrics
from edgespec.verify.sampling import SamplingParams
from edgespec.net.security import SessionOwners
from edgespec.v1 import drafter_pb2
from edgespec.engines.worker import ModelWorker
from services.drafter.servicer import DrafterServicer
from tests.tiny import tiny

DRAFT = "tiny:5~1"
PROMPT = list(b"def fib(n):")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def engines(params=SamplingParams(), q_ids=0):
    clock = Clock()
    limits = DrafterLimits(idle_ttl_seconds=10, forget_after_seconds=100)
    engine, reference = DrafterEngine(tiny(DRAFT), limits, clock=clock), DrafterEngine(tiny(DRAFT))
    for e in (engine, reference):
        e.open("s", PROMPT, params, q_ids)
    return engine, reference, clock


@pytest.mark.parametrize("params,q_ids", [(SamplingParams(), 0), (SamplingParams(temperature=0.8, seed=3), 8)],
                         ids=["greedy", "sampling"])
def test_evicted_kv_is_rebuilt_exactly_from_the_committed_tokens(params, q_ids):
    engine, reference, clock = engines(params, q_ids)
    model = tiny(DRAFT)
    first, ref_first = engine.draft("s", len(PROMPT), [], 3), reference.draft("s", len(PROMPT), [], 3)
    assert (first.tokens, first.q) == (ref_first.tokens, ref_first.q)
    clock.now += 9.9
    assert engine.evict_idle().kv_dropped == []          # not idle long enough
    clock.now += 0.1
    evicted = engine.evict_idle()
    assert (evicted.kv_dropped, evicted.forgotten) == (["s"], [])
    assert model.cached_length(engine._sessions["s"].kv) == 0     # the memory is really gone
    assert engine.evict_idle().kv_dropped == []                  # nothing left to drop: not counted twice
    # The next draft (two tokens committed since) rebuilds the cache: the same proposal as a never-evicted one.
    append = first.tokens[:2]
    got = engine.draft("s", len(PROMPT) + 2, append, 4)
    want = reference.draft("s", len(PROMPT) + 2, append, 4)
    assert got.tokens == want.tokens
    # q: the same ids; the weights to float rounding (a cache built in one forward vs token by token).
    assert [d.ids for d in got.q or ()] == [d.ids for d in want.q or ()]
    for mine, theirs in zip(got.q or (), want.q or ()):
        assert mine.weights == pytest.approx(theirs.weights, rel=1e-4, abs=1e-6)
    assert engine.committed("s") == reference.committed("s")


def test_use_keeps_a_session_alive_and_forget_after_drops_it():
    engine, _, clock = engines()
    for _ in range(5):                       # drafted every 8 s: never idle for the TTL
        clock.now += 8
        engine.draft("s", len(PROMPT), [], 2)
        assert engine.evict_idle().kv_dropped == []
    clock.now += 99.9
    assert engine.evict_idle().forgotten == []
    clock.now += 0.1
    assert engine.evict_idle().forgotten == ["s"]
    with pytest.raises(NotFound):
        engine.draft("s", len(PROMPT), [], 2)
    assert engine.session_count == 0


def test_the_sweep_releases_a_forgotten_sessions_owner_slot():
    clock = Clock()
    engine = DrafterEngine(tiny(DRAFT), DrafterLimits(idle_ttl_seconds=10, forget_after_seconds=100), clock=clock)
    owners = SessionOwners(max_per_client=1)
    worker = ModelWorker("drafter-test")
    servicer = DrafterServicer(engine, worker, drafter_pb2.DrafterInfoResponse(), owners, DrafterMetrics())

    async def go():
        owners.claim("leaked", "coordinator")
        await worker.call(engine.open, "leaked", PROMPT, SamplingParams(), 0)
        clock.now += 50
        assert await servicer.sweep_once() == (["leaked"], [])
        assert owners.open_sessions("coordinator") == 1       # evicted KV only: the session and its slot stay
        clock.now += 50
        assert await servicer.sweep_once() == ([], ["leaked"])
        assert owners.open_sessions("coordinator") == 0       # forgotten: the slot is free again
        owners.claim("next", "coordinator")                   # (it would be RESOURCE_EXHAUSTED otherwise)
    try:
        asyncio.run(go())
    finally:
        worker.shutdown()
    with pytest.raises(NotFound):
        engine.draft("leaked", len(PROMPT), [], 2)
