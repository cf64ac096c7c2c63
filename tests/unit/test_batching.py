"""Cross-session batching, the bounded queue, KV memory limits and idle eviction — on tiny real models.

The scheduler, engine and model are real; only the clock is injected (TTL tests).
"""
import asyncio
import threading
import time

import numpy as np
import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.batching import BatchPolicy, Turnarounds, VerifyScheduler
from edgespec.engines.drafter import DrafterEngine
from edgespec.errors import Aborted, InvalidArgument, NotFound, ResourceExhausted
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.pool import VerifierPool
from edgespec.verify.window import Window
from edgespec.loop.session import SessionLog
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate
from edgespec.verify.greedy import Verdict
from edgespec.engines.verifier import VerifierEngine, VerifierLimits
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow
from edgespec.engines.worker import ModelWorker
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny

TARGET, DRAFT = "tiny:3", "tiny:3~1"
PROMPTS = [list(p) for p in (b"def hello():", b"The capital of France is", b"Hi!", b"x",
                             b"for i in range(10):\n    print(i)", b"import numpy as np", b"SELECT * FROM", b"# TODO")]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class ScheduledVerifier:
    """The round loop's verifier port through the batching scheduler (what the servicer does, minus gRPC)."""

    def __init__(self, scheduler: VerifyScheduler):
        self.scheduler = scheduler
        self.address = "scheduled"

    async def open(self, session_id, tokens, params=None):
        self.scheduler.engine.open(session_id, tokens)

    async def verify(self, session_id, window: Window) -> Verdict | None:
        self.scheduler.streams += 1
        try:
            result, depth = await self.scheduler.verify(session_id, window)
        finally:
            self.scheduler.streams -= 1
        return result.verdict

    async def close(self, session_id):
        self.scheduler.engine.close(session_id)

    async def discard(self, session_id):
        self.scheduler.engine.close(session_id)

    def forget(self, session_id):
        pass


def generate_concurrently(engine: VerifierEngine, policy: BatchPolicy, windows: list[int], max_new: int = 24,
                          pipeline: bool = False) -> tuple[list[list[int]], list[int]]:
    """Run one session per prompt at once through one scheduler; returns their outputs and the batch sizes."""
    batches: list[int] = []

    async def go():
        scheduler = VerifyScheduler(engine, ModelWorker("test-verifier"), policy, lambda done: batches.append(done.windows))
        scheduler.streams = len(PROMPTS)   # every session has a stream open for the whole run
        port = ScheduledVerifier(scheduler)
        drafter = DrafterEngine(tiny(DRAFT))

        async def one(i: int, prompt: list[int]) -> list[int]:
            log = SessionLog(prompt, max_new, frozenset({TINY_EOS}))
            engine.open(f"s{i}", prompt)
            k = windows[i % len(windows)]
            telemetry = Telemetry()
            policy_ = GoodputWindow(telemetry, max_k=4) if k < 0 else FixedWindow(k)
            async for _ in speculate(log, f"s{i}", InProcessDrafter(drafter), port, policy_,
                                     config=SpeculationConfig(pipeline=pipeline),
                                     telemetry=telemetry):
                pass
            assert engine.committed(f"s{i}") == log.committed
            return log.generated

        try:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))
        finally:
            scheduler.worker.shutdown()

    return asyncio.run(go()), batches


@pytest.mark.parametrize("windows", [[3], [0, 1, 2, 4, -1]], ids=["k3", "mixed-windows"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["blocking", "pipelined"])
def test_batched_sessions_equal_target_only(windows, pipeline):
    policy = BatchPolicy(max_batch=8, wait_seconds=0.05, wait_fraction=float("inf"))   # a tiny model: fixed wait
    outputs, batches = generate_concurrently(VerifierEngine(tiny(TARGET), [TINY_EOS]), policy, windows,
                                             pipeline=pipeline)
    for prompt, out in zip(PROMPTS, outputs):
        assert out == target_only_greedy(TARGET, prompt, 24)
    assert max(batches) > 1, "no two sessions ever shared a forward"
    assert max(batches) <= 8


def test_batching_off_is_one_window_per_forward():
    outputs, batches = generate_concurrently(VerifierEngine(tiny(TARGET), [TINY_EOS]), BatchPolicy(max_batch=1), [3])
    assert set(batches) == {1}
    assert outputs[0] == target_only_greedy(TARGET, PROMPTS[0], 24)


def test_max_batch_bounds_a_forward():
    policy = BatchPolicy(max_batch=3, wait_seconds=0.05, wait_fraction=float("inf"))
    _, batches = generate_concurrently(VerifierEngine(tiny(TARGET), [TINY_EOS]), policy, [2], max_new=12)
    assert max(batches) == 3


def test_a_batch_equals_the_same_windows_one_by_one():
    target = tiny(TARGET)
    batched, single = VerifierEngine(target, [TINY_EOS]), VerifierEngine(target, [TINY_EOS])
    requests = []
    for i, prompt in enumerate(PROMPTS):
        for engine in (batched, single):
            engine.open(f"s{i}", prompt)
        requests.append((f"s{i}", Window(0, len(prompt), tuple(range(40, 40 + i % 5)))))
    results = batched.verify_batch(requests)
    for (session_id, window), result in zip(requests, results):
        alone = single.verify(session_id, window.base_position, window.draft)
        assert result.verdict.committed(window.draft) == alone.verdict.committed(window.draft)
        assert result.verdict.target_logprob == pytest.approx(alone.verdict.target_logprob, abs=1e-4)
        assert result.batch_size == len(PROMPTS)
        assert result.batch_tokens == sum(len(w.draft) + 1 for _, w in requests)   # every window's k + 1
        assert batched.committed(session_id) == single.committed(session_id)


def test_a_bad_window_fails_alone_and_changes_nothing():
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS], VerifierLimits(max_window=4))
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.open(f"s{i}", prompt)
    before = {f"s{i}": engine.committed(f"s{i}") for i in range(4)}
    requests = [("s0", Window(0, len(PROMPTS[0]), (1, 2))),
                ("s1", Window(0, len(PROMPTS[1]), (1,) * 5)),            # too long
                ("s2", Window(0, len(PROMPTS[2]) - 1, (1,))),            # stale
                ("nope", Window(0, 3, (1,))),                            # unknown session
                ("s3", Window(0, len(PROMPTS[3]), (1, 999)))]            # outside the vocabulary
    results = engine.verify_batch(requests)
    assert isinstance(results[0].verdict, Verdict)
    assert isinstance(results[1], InvalidArgument) and results[1].field == "draft_tokens"
    assert isinstance(results[2], Aborted)
    assert isinstance(results[3], NotFound)
    assert isinstance(results[4], InvalidArgument)
    for i in (1, 2, 3):
        assert engine.committed(f"s{i}") == before[f"s{i}"]


def test_two_windows_of_one_session_in_a_batch_run_in_order():
    """A pipelined session's optimistic window may queue with its parent: it must see the parent's commit."""
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])
    prompt = PROMPTS[0]
    truth = target_only_greedy(TARGET, prompt, 6)
    engine.open("s", prompt)
    engine.open("t", PROMPTS[1])
    first = ("s", Window(0, len(prompt), tuple(truth[:2])))
    second = ("s", Window(0, len(prompt) + 3, tuple(truth[3:5]), parent=truth[2]))
    results = engine.verify_batch([first, ("t", Window(0, len(PROMPTS[1]), ())), second])
    assert results[0].verdict.accepted == 2 and results[2].verdict is not None
    assert engine.committed("s") == prompt + truth[:6]


def test_full_queue_is_resource_exhausted_with_a_retry_hint_and_changes_nothing():
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.open(f"s{i}", prompt)

    async def go():
        worker = ModelWorker("test-verifier")
        scheduler = VerifyScheduler(engine, worker, BatchPolicy(max_batch=1, max_queue=2))
        release = threading.Event()
        blocker = asyncio.ensure_future(worker.call(release.wait))   # the model is busy
        try:
            waiting = []
            for i in range(3):
                waiting.append(asyncio.ensure_future(scheduler.verify(f"s{i}", Window(0, len(PROMPTS[i]), (5,)))))
                await asyncio.sleep(0.02)
            # s0 was taken into a batch (waiting for the model); s1 and s2 fill the queue.
            assert scheduler.queue_depth == 2
            with pytest.raises(ResourceExhausted) as refused:
                await scheduler.verify("s3", Window(0, len(PROMPTS[3]), (5,)))
            assert refused.value.retry_after_seconds > 0 and scheduler.rejected == 1
            assert engine.committed("s3") == PROMPTS[3]
        finally:
            release.set()
        await blocker
        results = await asyncio.gather(*waiting)
        assert [depth for _, depth in results] == [0, 1, 0]   # windows still waiting when each one's batch started
        worker.shutdown()

    asyncio.run(go())


def test_idle_ttl_evicts_the_cache_and_the_next_window_restores_it():
    clock = FakeClock()
    target = tiny(TARGET)
    engine = VerifierEngine(target, [TINY_EOS], VerifierLimits(idle_ttl_seconds=60, forget_after_seconds=600),
                            clock=clock)
    reference = VerifierEngine(target, [TINY_EOS])
    for e in (engine, reference):
        e.open("a", PROMPTS[0])
        e.open("b", PROMPTS[1])
    engine.verify("a", len(PROMPTS[0]), [1, 2])
    reference.verify("a", len(PROMPTS[0]), [1, 2])
    held = engine.kv_bytes
    clock.now += 30
    engine.verify("b", len(PROMPTS[1]), [3])
    reference.verify("b", len(PROMPTS[1]), [3])
    clock.now += 40                           # a: idle 70 s, b: idle 40 s
    evicted = engine.evict_idle()
    assert evicted.kv_dropped == ["a"] and evicted.forgotten == []
    assert engine.kv_bytes < held and engine.committed("a") == reference.committed("a")
    for e in (engine, reference):             # the next windows: a restores from its committed prefix
        base = len(e.committed("a"))
        e.verify_batch([("a", Window(0, base, (7, 8, 9))), ("b", Window(0, len(e.committed("b")), (4,)))])
    assert engine.committed("a") == reference.committed("a") and engine.committed("b") == reference.committed("b")
    assert engine.restores == 1
    clock.now += 700
    assert sorted(engine.evict_idle().forgotten) == ["a", "b"]
    with pytest.raises(NotFound):
        engine.committed("a")


def test_a_forgotten_session_is_reopened_by_the_coordinator_and_loses_nothing():
    """NOT_FOUND after a forget: the failover port re-opens it with its committed prefix."""
    clock = FakeClock()
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS], VerifierLimits(forget_after_seconds=10), clock=clock)
    failover = FailoverVerifier(VerifierPool(["v"]), {"v": InProcessVerifier(engine, "v")})
    drafter = DrafterEngine(tiny(DRAFT))
    prompt = PROMPTS[0]
    log = SessionLog(prompt, 30, frozenset({TINY_EOS}))

    async def go():
        await failover.open("s", prompt, None)
        async for chunk in speculate(log, "s", InProcessDrafter(drafter), failover, FixedWindow(3)):
            if len(log.generated) >= 10 and failover.stats("s").failovers == 0:
                clock.now += 11
                assert engine.evict_idle().forgotten == ["s"]

    asyncio.run(go())
    assert failover.stats("s").failovers == 1
    assert log.generated == target_only_greedy(TARGET, prompt, 30)


def test_kv_budget_evicts_least_recently_used_caches_then_refuses():
    clock = FakeClock()
    target = tiny(TARGET)
    per_token = target.kv_bytes_per_token
    engine = VerifierEngine(target, [TINY_EOS], VerifierLimits(kv_budget_bytes=40 * per_token), clock=clock)
    engine.open("a", [5] * 21)             # caches 20 positions
    clock.now += 1
    engine.open("b", [6] * 16)             # 15 more: 35 held
    clock.now += 1
    engine.open("c", [7] * 11)             # 10 more would be 45: a (least recently used) is evicted
    assert target.cached_length(engine._sessions["a"].kv) == 0 and engine.kv_bytes == 25 * per_token
    with pytest.raises(ResourceExhausted):
        engine.open("d", [8] * 60)         # larger than the whole budget
    with pytest.raises(NotFound):
        engine.committed("d")
    before = engine.committed("b")
    with pytest.raises(ResourceExhausted) as refused:   # b may not grow past the budget by itself either
        engine.open("b", [6] * 45)
    assert refused.value.retry_after_seconds is not None
    assert engine.committed("b") == before  # a refused re-open keeps the old session


def test_per_session_kv_limit():
    target = tiny(TARGET)
    engine = VerifierEngine(target, [TINY_EOS], VerifierLimits(max_session_kv_bytes=12 * target.kv_bytes_per_token))
    with pytest.raises(ResourceExhausted):
        engine.open("big", [5] * 13)
    engine.open("s", [5] * 8)
    with pytest.raises(ResourceExhausted):
        engine.verify("s", 8, [1, 2, 3, 4, 5])     # would hold 13 positions
    assert engine.committed("s") == [5] * 8
    assert engine.verify("s", 8, [1, 2, 3]).committed_position > 8


def test_overloaded_sessions_back_off_and_lose_nothing():
    """A tiny queue refuses most windows; the failover port waits out each retry hint and resends."""
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])

    async def go():
        worker = ModelWorker("test-verifier")
        scheduler = VerifyScheduler(engine, worker, BatchPolicy(max_batch=1, max_queue=1))
        failover = FailoverVerifier(VerifierPool(["v"]), {"v": ScheduledVerifier(scheduler)})
        drafter = DrafterEngine(tiny(DRAFT))

        async def one(i: int, prompt: list[int]) -> list[int]:
            log = SessionLog(prompt, 16, frozenset({TINY_EOS}))
            await failover.open(f"s{i}", prompt, None)
            async for _ in speculate(log, f"s{i}", InProcessDrafter(drafter), failover, FixedWindow(2)):
                pass
            assert failover.stats(f"s{i}").failovers == 0     # backed off on the same verifier, never re-homed
            return log.generated

        try:
            outputs = await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))
        finally:
            worker.shutdown()
        assert scheduler.rejected > 0
        assert sum(failover.stats(f"s{i}").overload_waits for i in range(len(PROMPTS))) == scheduler.rejected
        return outputs

    for prompt, out in zip(PROMPTS, asyncio.run(go())):
        assert out == target_only_greedy(TARGET, prompt, 16)


@pytest.mark.parametrize("evicted", [[0], [1, 2], [0, 1, 2, 3]], ids=["alone", "two-of-four", "all"])
def test_evicted_caches_in_a_batch_are_rebuilt_exactly(evicted):
    LONG = [PROMPTS[0], PROMPTS[1], PROMPTS[4], PROMPTS[5]]
    target = tiny(TARGET)
    reference = [target.logits_rows(target.new_state(), p, 3) for p in LONG]
    states = []
    for i, prompt in enumerate(LONG):
        state = target.new_state()
        if i not in evicted:
            target.prefill(state, prompt[:-2])     # caches all but the last 3 tokens
        states.append(state)
    rows = target.logits_rows_batch(states, LONG, [3] * 4) if len(evicted) < 4 else \
        [target.logits_rows_batch([s], [p], [3])[0] for s, p in zip(states, LONG)]
    for got, expected, state, prompt in zip(rows, reference, states, LONG):
        np.testing.assert_allclose(got, expected, atol=1e-4)
        assert state.tokens == prompt


def test_the_wait_for_more_windows_is_a_fraction_of_a_forward():
    """With sessions about to send, the scheduler waits for them, but at most wait_fraction of a forward."""
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])

    async def waited(batch_seconds: float | None, streams: int) -> float:
        scheduler = VerifyScheduler(engine, ModelWorker("test-verifier"),
                                    BatchPolicy(max_batch=8, wait_seconds=5.0, wait_fraction=0.25))
        scheduler.rule.forward_ema, scheduler.streams = batch_seconds, streams
        scheduler._queue.append((("s", Window(0, 1, ())), asyncio.get_running_loop().create_future()))
        started = asyncio.get_running_loop().time()
        await scheduler._gather()
        scheduler.worker.shutdown()
        return asyncio.get_running_loop().time() - started

    assert 0.15 <= asyncio.run(waited(0.8, streams=2)) < 1.5    # a quarter of a 0.8 s forward, not 5 s
    assert asyncio.run(waited(0.8, streams=1)) < 0.1             # every open session already has a window queued


def test_windows_due_within_a_forward_are_waited_for_when_that_saves_verifier_time():
    """Over a WAN a session's next window comes a round trip after its verdict, past a fraction of a forward:
    the scheduler waits for windows its sessions' turnarounds say are due within one forward, when the wait
    costs less than the forward of their own they would need."""
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])

    async def waited(sent_ago: float, turnaround: float, curve: dict) -> float:
        scheduler = VerifyScheduler(engine, ModelWorker("test-verifier"),
                                    BatchPolicy(max_batch=8, wait_seconds=5.0, wait_fraction=0.01))
        scheduler.rule.forward_ema, scheduler.streams, scheduler.rule.forward_curve = 0.8, 2, curve
        scheduler.rule.turnarounds.seconds["b"] = turnaround
        scheduler.rule.turnarounds.verdict_sent("b", time.monotonic() - sent_ago)
        scheduler._queue.append((("a", Window(0, 1, ())), asyncio.get_running_loop().create_future()))
        started = asyncio.get_running_loop().time()
        await scheduler._gather()
        scheduler.worker.shutdown()
        return asyncio.get_running_loop().time() - started

    batched = {1: 0.8, 2: 0.85}       # a second row costs little: waiting 0.26 s saves 0.8 - 0.26 - 0.05
    assert 0.2 <= asyncio.run(waited(0.1, 0.3, batched)) < 0.6   # due 1.2 x 0.3 s after its verdict: in 0.26 s
    assert asyncio.run(waited(0.1, 0.3, {1: 0.8, 2: 1.6})) < 0.1  # rows cost in proportion: nothing to save
    assert asyncio.run(waited(1.0, 0.3, batched)) < 0.1          # overdue: not waited for beyond the budget (8 ms)
    assert asyncio.run(waited(0.0, 2.0, batched)) < 0.1          # due after more than one forward: not worth a wait
    assert asyncio.run(waited(0.1, 0.3, {})) < 0.1               # no forward measured yet: no basis for a wait


def test_turnarounds_learn_from_verdict_to_next_window_and_forget_idle_sessions():
    t = Turnarounds(smoothing=0.5)
    t.window_arrived("s", 1.0)                     # a first window: nothing to learn from
    assert t.seconds == {}
    t.verdict_sent("s", 2.0)
    t.window_arrived("s", 2.4, tokens=3)
    t.verdict_sent("s", 3.0)
    t.window_arrived("s", 3.2, tokens=3)
    assert t.seconds["s"] == pytest.approx(0.3) and "s" not in t.answered
    t.verdict_sent("s", 4.0)
    due = 4.0 + 1.2 * 0.3 + 0.002
    assert t.due(4.1, 1.0) == [(pytest.approx(due), 3, "s")]
    assert t.due(4.1, 0.1) == [] and t.due(4.5, 1.0) == []    # beyond the horizon; overdue
    cheap = {1: 1.0, 3: 1.05, 4: 1.1}.get                      # tokens -> forward seconds
    assert t.wait_for(4.1, 1.0, [("q", 1)], cheap) == (pytest.approx(due), ["s"])
    assert t.wait_for(4.1, 1.0, [("q", 1)], lambda tokens: 0.1 * tokens) is None   # no batching gain: apart
    assert not t.arrived(["s"])
    t.window_arrived("s", 4.3, tokens=3)
    assert t.arrived(["s"]) and t.arrived([])
    t.forget_older_than(5.0)
    assert t.answered == {} and t.seconds == {} and t.tokens == {} and t.seen == {}


def test_a_window_that_arrives_during_another_sessions_steps_joins_the_next_step_and_is_answered_after_it():
    class Recording(VerifierEngine):
        """Records each forward's work (new windows, windows of steps going on); the first waits for the test."""
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls, self.started, self.first = [], threading.Event(), threading.Event()

        def verify_step(self, requests, going=()):
            if not self.calls:
                self.started.set()
                self.first.wait(10)
            self.calls.append((len(requests), len([s for s in going if s.result is None])))
            return super().verify_step(requests, going)

    engine = Recording(tiny(TARGET), [TINY_EOS], VerifierLimits(max_window=8))
    alone = VerifierEngine(tiny(TARGET), [TINY_EOS], VerifierLimits(max_window=8))
    for e in (engine, alone):
        e.open("steps", PROMPTS[0])
        e.open("other", PROMPTS[1])
    steps = Window(0, len(PROMPTS[0]), (), steps=8)
    other = Window(0, len(PROMPTS[1]), tuple(target_only_greedy(TARGET, PROMPTS[1], 2)))

    async def go():
        worker = ModelWorker("test-verifier")
        scheduler = VerifyScheduler(engine, worker, BatchPolicy())
        answered = []

        async def verify(session_id, window):
            result, _ = await scheduler.verify(session_id, window)
            answered.append(session_id)
            return result
        stepping = asyncio.ensure_future(verify("steps", steps))
        while not engine.started.is_set():   # the steps' first forward is under way
            await asyncio.sleep(0.01)
        drafted = asyncio.ensure_future(verify("other", other))
        await asyncio.sleep(0.05)
        engine.first.set()
        results = await asyncio.gather(stepping, drafted)
        worker.shutdown()
        return results, answered

    (steps_result, other_result), answered = asyncio.run(go())
    assert engine.calls[:2] == [(1, 0), (1, 1)]   # the drafted window went into the steps' second forward
    assert answered == ["other", "steps"]         # ... and was answered after it, before the steps were done
    assert len(engine.calls) == 8                 # one forward per step
    assert steps_result.verdict == alone.verify_batch([("steps", steps)])[0].verdict   # as in a batch of its own
    assert engine.committed("steps") == PROMPTS[0] + target_only_greedy(TARGET, PROMPTS[0], 8)
    assert engine.committed("other") == PROMPTS[1] + target_only_greedy(TARGET, PROMPTS[1], 3)
    assert other_result.verdict.accepted == 2 and steps_result.committed_position == len(PROMPTS[0]) + 8


def test_a_window_of_steps_alone_takes_its_steps_in_one_worker_call_and_each_forward_is_reported():
    """Nothing else waiting: every step in one worker call (no hop through the event loop between steps), each
    forward reported on its own (metrics and the gather rule see forwards, not calls), the verdict unchanged."""
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS], VerifierLimits(max_window=8))
    alone = VerifierEngine(tiny(TARGET), [TINY_EOS], VerifierLimits(max_window=8))
    for e in (engine, alone):
        e.open("steps", PROMPTS[0])
    steps = Window(0, len(PROMPTS[0]), (), steps=6)

    async def go():
        worker = ModelWorker("test-verifier")
        calls = []
        original = worker.call

        async def counted(fn, *args):
            calls.append(fn.__name__)
            return await original(fn, *args)
        worker.call = counted
        done = []
        scheduler = VerifyScheduler(engine, worker, BatchPolicy(), on_batch=done.append)
        result, _ = await scheduler.verify("steps", steps)
        worker.shutdown()
        return result, calls, done, scheduler.rule.forward_curve

    result, calls, done, curve = asyncio.run(go())
    assert calls == ["_verify"]
    assert [(d.windows, d.tokens) for d in done] == [(1, 1)] * 6 and all(d.seconds > 0 for d in done)
    assert set(curve) == {1}
    assert result.verdict == alone.verify_batch([("steps", steps)])[0].verdict
    assert engine.committed("steps") == PROMPTS[0] + target_only_greedy(TARGET, PROMPTS[0], 6)


def test_a_worker_call_queued_during_steps_runs_between_them_not_after_them():
    """A session opening (its prefill is a worker call of its own) while another takes steps gets the worker after
    the step under way, not after all of them."""
    class Gated(VerifierEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.forwards, self.started, self.first = 0, threading.Event(), threading.Event()

        def verify_step(self, requests, going=()):
            if not self.forwards:
                self.started.set()
                self.first.wait(10)
            self.forwards += 1
            return super().verify_step(requests, going)

    engine = Gated(tiny(TARGET), [TINY_EOS], VerifierLimits(max_window=8))
    engine.open("steps", PROMPTS[0])
    steps = Window(0, len(PROMPTS[0]), (), steps=8)

    async def go():
        worker = ModelWorker("test-verifier")
        scheduler = VerifyScheduler(engine, worker, BatchPolicy())
        stepping = asyncio.ensure_future(scheduler.verify("steps", steps))
        while not engine.started.is_set():
            await asyncio.sleep(0.01)
        opening = asyncio.ensure_future(worker.call(lambda: engine.forwards))
        await asyncio.sleep(0.05)
        engine.first.set()
        (seen, _), (result, _) = await asyncio.gather(opening, stepping)
        worker.shutdown()
        return seen, result

    seen, result = asyncio.run(go())
    assert seen == 1                      # it ran after the first step, before the second
    assert engine.committed("steps") == PROMPTS[0] + target_only_greedy(TARGET, PROMPTS[0], 8)
