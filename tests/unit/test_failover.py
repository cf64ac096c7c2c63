"""Verifier pool, optimistic windows, pipelined rounds, failover and degradation — in process.

The faults here are injected into the endpoints (the environment); the thing under
test — pool, FailoverVerifier, round loops, engines — is real. Real processes are
killed in tests/rpc/test_chaos.py.
"""
import asyncio
import time

import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.drafter import DrafterEngine
from edgespec.errors import Aborted, InvalidArgument, Unavailable
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.pool import VerifierPool
from edgespec.verify.sampling import SamplingParams
from edgespec.loop.session import SessionLog
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.window import FixedWindow
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny

PROMPT = list(b"def fib(n):")


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_pool_picks_least_loaded_and_bans_with_exponential_backoff():
    clock = FakeClock()
    pool = VerifierPool(["a", "b", "c"], base_backoff_seconds=0.5, max_backoff_seconds=3, clock=clock)
    assert pool.pick() == "a"
    pool.pin("a")
    assert pool.pick() == "b"
    bans = []
    for _ in range(4):                       # fails again each time its ban ends
        bans.append(pool.ban("b"))
        clock.now += bans[-1]
    assert bans == [0.5, 1.0, 2.0, 3.0]      # doubles, capped
    clock.now -= 3.0
    assert pool.available() == ["c", "a"]
    clock.now += 3.0
    assert "b" in pool.available()
    pool.succeeded("b")
    assert pool.ban("b") == 0.5                                        # a success resets the backoff
    pool.set_serving("c", False)
    assert pool.available() == ["a", "c"]     # not serving: still tried, after the serving ones
    pool.ban("a")
    pool.ban("c")
    assert pool.pick() is None and pool.seconds_until_available() == pytest.approx(0.5)
    pool.set_serving("b", False)
    pool.set_serving("b", True)              # back to SERVING (restarted): the ban is lifted
    assert pool.pick() == "b"
    with pytest.raises(ValueError):
        VerifierPool([])
    with pytest.raises(ValueError):
        VerifierPool(["a", "a"])


class Blip(InProcessVerifier):
    """From verify call 12 on, each session's next call waits until every session has one waiting, then
    they all fail at once: a shared stream's deadline failing every window on it."""

    def __init__(self, engine, sessions):
        super().__init__(engine, "a")
        self.calls, self.waiting, self.sessions = 0, set(), set(sessions)
        self.blip = asyncio.Event()

    async def verify(self, session_id, window):
        self.calls += 1
        if self.calls >= 12 and not self.blip.is_set():
            self.waiting.add(session_id)
            if self.waiting == self.sessions:
                self.blip.set()
            await self.blip.wait()
            raise Unavailable("a: no verdict within the deadline")
        return await super().verify(session_id, window)


def test_one_blip_seen_by_many_sessions_bans_the_verifier_once():
    """Eight sessions on one verifier see the same outage; the ban is the first failure's, not 2^7 of it
    (which outlasted the recovery deadline, so every session failed: the exactness bench at 16 sessions
    gave up with "no verifier reachable within 30s")."""
    target, draft = "tiny:5", "tiny:5~1"
    logs = {f"s{i}": SessionLog(PROMPT, 24, frozenset({TINY_EOS})) for i in range(8)}
    verifier = Blip(VerifierEngine(tiny(target), [TINY_EOS]), logs)
    pool = VerifierPool(["a"], base_backoff_seconds=0.05, max_backoff_seconds=30)
    failover = FailoverVerifier(pool, {"a": verifier}, recovery_deadline_seconds=2)
    drafter = InProcessDrafter(DrafterEngine(tiny(draft)))

    async def one(session_id):
        await failover.open(session_id, PROMPT, SamplingParams())
        async for _ in speculate(logs[session_id], session_id, drafter, failover, FixedWindow(2)):
            await asyncio.sleep(0)

    async def go():
        await asyncio.gather(*(one(s) for s in logs))
    asyncio.run(go())
    assert all(failover.stats(s).failovers == 1 for s in logs)
    for log in logs.values():
        assert log.generated == target_only_greedy(target, PROMPT, 24)


def opened(target="tiny:3", prompt=PROMPT):
    engine = VerifierEngine(tiny(target), [TINY_EOS])
    engine.open("s", prompt)
    return engine


def test_optimistic_window_verified_only_when_its_assumption_holds():
    engine, reference = opened(), opened()
    base = len(PROMPT)
    truth = target_only_greedy("tiny:3", PROMPT, 4)
    before = engine.committed("s")
    # Assumes one more committed token than there is: discarded, nothing changes.
    assert engine.verify("s", base + 1, truth[1:3], parent=truth[0]).verdict is None
    # Right length, wrong last token: discarded.
    assert engine.verify("s", base, truth[:2], parent=PROMPT[-1] + 1).verdict is None
    assert engine.committed("s") == before
    # Right length and last token: verified exactly as a plain window.
    got = engine.verify("s", base, truth[:2], parent=PROMPT[-1])
    assert got.verdict == reference.verify("s", base, truth[:2]).verdict
    # Replayed: the same verdict; an unknown window at an old position: discarded, not ABORTED.
    assert engine.verify("s", base, truth[:2], parent=PROMPT[-1]) == got
    assert engine.verify("s", base, [7, 7], parent=PROMPT[-1]).verdict is None
    with pytest.raises(Aborted):
        engine.verify("s", base, [7, 7])
    # Bad input is still bad input.
    with pytest.raises(InvalidArgument):
        engine.verify("s", base + 3, [999], parent=1)


def run(target, draft, prompt, max_new, window, pipeline=False, verifier=None, params=SamplingParams(),
        on_verifier_loss="fail", events=None):
    engine = VerifierEngine(tiny(target), [TINY_EOS])
    port = verifier or InProcessVerifier(engine)
    drafter = InProcessDrafter(DrafterEngine(tiny(draft)))
    log = SessionLog(prompt, max_new, frozenset({TINY_EOS}))

    async def go():
        await port.open("s", prompt, params)
        async for chunk in speculate(log, "s", drafter, port, FixedWindow(window), params,
                                     config=SpeculationConfig(pipeline=pipeline, on_verifier_loss=on_verifier_loss)):
            if events is not None:
                events.append(chunk)
    asyncio.run(go())
    return log


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("window", [1, 2, 4])
def test_pipelined_rounds_equal_target_only_greedy(seed, window):
    target = f"tiny:{seed}"
    for draft in (f"tiny:{seed}~1", target, f"tiny:{seed + 50}"):
        log = run(target, draft, PROMPT, 40, window, pipeline=True)
        assert log.generated == target_only_greedy(target, PROMPT, 40), (draft, window)
        if draft == target:   # an identical draft: every optimistic window holds
            assert log.stats.optimistic_hits == log.stats.optimistic_windows > 0


def test_pipelined_sampling_gives_the_blocking_loop_s_text_for_the_same_seed():
    params = SamplingParams(temperature=1.0, top_k=20, seed=1234)
    for seed in range(3):
        params = SamplingParams(1.0, 20, 1.0, seed)
        blocking = run("tiny:11", "tiny:11~2", PROMPT, 30, 3, params=params)
        pipelined = run("tiny:11", "tiny:11~2", PROMPT, 30, 3, pipeline=True, params=params)
        assert pipelined.generated == blocking.generated
        assert pipelined.stats.optimistic_windows > 0


class Faulty(InProcessVerifier):
    """An in-process endpoint that dies on chosen calls: before verifying, or after (the verdict is lost)."""

    def __init__(self, engine, address, fail_on: set[int], lose_verdict=False, dead_for_opens=0):
        super().__init__(engine, address)
        self.calls = 0
        self.fail_on = fail_on
        self.lose_verdict = lose_verdict
        self.dead_for_opens = dead_for_opens

    async def open(self, session_id, tokens, params=None):
        if self.dead_for_opens > 0:
            self.dead_for_opens -= 1
            raise Unavailable(f"{self.address} down")
        await super().open(session_id, tokens, params)

    async def verify(self, session_id, window):
        self.calls += 1
        if self.calls in self.fail_on:
            if self.lose_verdict:
                await super().verify(session_id, window)   # committed there, but the reply never arrives
            raise Unavailable(f"{self.address} connection reset")
        return await super().verify(session_id, window)


@pytest.mark.parametrize("lose_verdict", [False, True], ids=["dies-before", "verdict-lost"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["blocking", "pipelined"])
def test_failover_re_homes_the_session_and_output_is_unchanged(lose_verdict, pipeline):
    target, draft = "tiny:5", "tiny:5~1"
    a = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "a", fail_on={3, 9}, lose_verdict=lose_verdict)
    b = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "b", fail_on={4}, lose_verdict=lose_verdict)
    pool = VerifierPool(["a", "b"], base_backoff_seconds=0.01)
    failover = FailoverVerifier(pool, {"a": a, "b": b}, recovery_deadline_seconds=5)
    events = []
    log = run(target, draft, PROMPT, 48, 3, pipeline=pipeline, verifier=failover, events=events)
    assert log.generated == target_only_greedy(target, PROMPT, 48)
    tokens = [t for e in events for t in e.tokens]
    assert tokens == log.generated and [e.position for e in events] == [
        sum(len(x.tokens) for x in events[:i]) for i in range(len(events))]   # no token lost or repeated
    assert failover.stats("s").failovers >= 1 and b.calls > 0


def test_no_verifier_within_the_deadline_fails_or_degrades_visibly():
    target, draft = "tiny:6", "tiny:6~1"
    dead = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "a", fail_on=set(range(3, 1000)), dead_for_opens=0)
    pool = VerifierPool(["a"], base_backoff_seconds=30)
    with pytest.raises(Unavailable):
        run(target, draft, PROMPT, 30, 2, verifier=FailoverVerifier(pool, {"a": dead}, 0.2))

    # draft-only: verified chunks, then unverified ones (flagged), ending "unverified".
    dead = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "a", fail_on=set(range(3, 1000)))
    events = []
    log = run(target, draft, PROMPT, 30, 2, verifier=FailoverVerifier(VerifierPool(["a"], 30), {"a": dead}, 0.2),
              on_verifier_loss="draft-only", events=events)
    verified = [e for e in events if not e.unverified]
    unverified = [e for e in events if e.unverified]
    assert verified and unverified and events.index(unverified[0]) == len(verified)
    assert log.finish_reason == "unverified" and log.unverified == sum(len(e.tokens) for e in unverified)
    assert log.generated == target_only_greedy(target, PROMPT, 30)[:len(log.generated)]
    assert unverified[0].position == len(log.generated)


def test_degraded_stream_resumes_verified_output_when_a_verifier_returns():
    target, draft = "tiny:6", "tiny:6~1"

    class Outage(InProcessVerifier):
        """Verify call 3 finds the verifier gone; it accepts sessions again 0.3 s later."""
        def __init__(self, engine):
            super().__init__(engine, "a")
            self.calls, self.back_at = 0, None

        async def open(self, session_id, tokens, params=None):
            if self.back_at is not None and time.monotonic() < self.back_at:
                raise Unavailable("a down")
            await super().open(session_id, tokens, params)

        async def verify(self, session_id, window):
            self.calls += 1
            if self.calls == 3:
                self.back_at = time.monotonic() + 0.3
                raise Unavailable("a crashed")
            return await super().verify(session_id, window)

    pool = VerifierPool(["a"], base_backoff_seconds=0.01, max_backoff_seconds=0.05)
    failover = FailoverVerifier(pool, {"a": Outage(VerifierEngine(tiny(target), [TINY_EOS]))},
                                recovery_deadline_seconds=0.2)
    events = []
    drafter = InProcessDrafter(DrafterEngine(tiny(draft)))
    log = SessionLog(PROMPT, 40, frozenset({TINY_EOS}))

    async def go():
        await failover.open("s", PROMPT, SamplingParams())
        async for chunk in speculate(log, "s", drafter, failover, FixedWindow(2),
                                     config=SpeculationConfig(on_verifier_loss="draft-only", max_unverified=4)):
            events.append(chunk)
    asyncio.run(go())
    assert log.finish_reason in ("eos", "length") and log.unverified == 0 and log.stats.degraded == 1
    assert log.generated == target_only_greedy(target, PROMPT, 40)
    assert any(e.unverified for e in events)
    # The client's view: a verified chunk at position P replaces unverified tokens from P on.
    view: list[int] = []
    for e in events:
        del view[e.position:]
        view += e.tokens
    assert view == log.generated


@pytest.mark.parametrize("lose_verdict", [False, True], ids=["dies-before", "verdict-lost"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["blocking", "pipelined"])
def test_every_single_failure_position_loses_nothing(lose_verdict, pipeline):
    """One verify call fails, at each position in turn: an in-flight verdict from the old home is
    never committed unless the new home has it too (pipelining keeps two windows in flight)."""
    target, draft = "tiny:5", "tiny:5~1"
    expected = target_only_greedy(target, PROMPT, 32)
    for failing_call in range(1, 16):
        a = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "a", fail_on={failing_call}, lose_verdict=lose_verdict)
        b = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "b", fail_on=set(), lose_verdict=lose_verdict)
        failover = FailoverVerifier(VerifierPool(["a", "b"], base_backoff_seconds=0.01), {"a": a, "b": b},
                                    recovery_deadline_seconds=5)
        events = []
        log = run(target, draft, PROMPT, 32, 3, pipeline=pipeline, verifier=failover, events=events)
        assert log.generated == expected, failing_call
        assert [t for e in events for t in e.tokens] == expected, failing_call
        if a.calls >= failing_call:
            assert failover.stats("s").failovers == 1, failing_call


def test_pipelining_at_the_largest_window_generates():
    """The look-ahead drafts its bonus guess plus the next window in one call: at k = max_window that must
    not ask the drafter for max_window + 1 tokens (INVALID_ARGUMENT, the generation failed with 0 tokens)."""
    target = "tiny:5"
    log = run(target, target, PROMPT, 48, 16, pipeline=True)
    assert log.generated == target_only_greedy(target, PROMPT, 48)
    assert log.stats.optimistic_windows > 0


def test_a_look_ahead_the_drafter_proposes_nothing_for_is_not_sent():
    """A drafter may return no tokens (a replayed or free drafter with nothing to propose): the pipelined loop
    sends no look-ahead then and goes on (it indexed the empty draft's first token and failed)."""
    target = "tiny:5"

    class Silent(InProcessDrafter):
        async def draft(self, session_id, base_position, append, k):
            tokens, q = await super().draft(session_id, base_position, append, k)
            return (([], None) if base_position > self.committed_at else (tokens, q))

    engine = VerifierEngine(tiny(target), [TINY_EOS])
    port, drafter = InProcessVerifier(engine), Silent(DrafterEngine(tiny(target)))
    log = SessionLog(PROMPT, 24, frozenset({TINY_EOS}))

    async def go():
        await port.open("s", PROMPT, SamplingParams())
        async for _ in speculate(log, "s", drafter, port, FixedWindow(2), config=SpeculationConfig(pipeline=True)):
            drafter.committed_at = log.position

    drafter.committed_at = len(PROMPT)
    asyncio.run(go())
    assert log.generated == target_only_greedy(target, PROMPT, 24)
    assert log.stats.optimistic_windows == 0 and log.stats.accepted > 0   # windows drafted, look-aheads not


class SlowStream(InProcessVerifier):
    """Verdicts take a while; like a gRPC stream, a window whose session was closed under it fails
    with UNAVAILABLE ("stream cancelled") when its verdict would have come."""

    def __init__(self, engine, address):
        super().__init__(engine, address)
        self.closed = False
        self.orphans = 0     # calls that were still running when their session was closed

    async def verify(self, session_id, window):
        await asyncio.sleep(0.2)
        if self.closed:
            self.orphans += 1
            raise Unavailable(f"{self.address}: stream cancelled")
        return await super().verify(session_id, window)

    async def close(self, session_id):
        self.closed = True
        await super().close(session_id)


@pytest.mark.parametrize("how", ["look-ahead raises", "client disconnects"])
def test_a_generation_ending_during_the_look_ahead_orphans_no_verify_call(how):
    """The in-flight window's verify call is cancelled with the generation: left running, it saw its
    session closed under it and banned a healthy verifier."""
    target = "tiny:5"
    endpoint = SlowStream(VerifierEngine(tiny(target), [TINY_EOS]), "a")
    pool = VerifierPool(["a"], base_backoff_seconds=0.01)
    failover = FailoverVerifier(pool, {"a": endpoint}, recovery_deadline_seconds=5)
    inner = InProcessDrafter(DrafterEngine(tiny(target)))
    stuck = asyncio.Event()

    class LookAheadFails:
        def __init__(self):
            self.calls = 0

        async def open(self, *args):
            await inner.open(*args)

        async def draft(self, *args):
            self.calls += 1
            if self.calls == 2:          # the first look-ahead
                if how == "look-ahead raises":
                    raise RuntimeError("drafter bug")
                stuck.set()
                await asyncio.sleep(3600)
            return await inner.draft(*args)

        async def close(self, session_id):
            await inner.close(session_id)

        def observe(self, draft, sample):
            pass

    log = SessionLog(PROMPT, 40, frozenset({TINY_EOS}))

    async def consume():
        async for _ in speculate(log, "s", LookAheadFails(), failover, FixedWindow(3),
                                 config=SpeculationConfig(pipeline=True)):
            pass

    async def go():
        await failover.open("s", PROMPT, SamplingParams())
        task = asyncio.ensure_future(consume())
        if how == "client disconnects":
            await stuck.wait()
            task.cancel()
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            await task
        await failover.close("s")          # what the coordinator does when a generation ends
        await asyncio.sleep(0.5)           # past the orphan's verdict time
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert asyncio.run(go()) == []
    assert endpoint.orphans == 0
    assert pool.endpoints["a"].failures == 0 and pool.available() == ["a"]
