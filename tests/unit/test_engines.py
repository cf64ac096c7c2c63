"""Verifier and drafter engines on tiny real models: exactness, rollback, bad input."""
import asyncio

import pytest
import torch

from edgespec.backends.registry import TINY_EOS
from edgespec.backends.torch_lm import TorchCausalLM
from edgespec.engines.drafter import DrafterEngine, DrafterLimits
from edgespec.errors import Aborted, InvalidArgument, NotFound
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine, VerifierLimits
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny

PROMPTS = [b"def hello():", b"The capital of France is", b"Hi!", b"x", b"for i in range(10):\n    print(i)"]


def run_speculation(target: str, draft: str, prompt: list[int], max_new: int, window: int) -> tuple[list[int], SessionLog]:
    verifier = VerifierEngine(tiny(target), [TINY_EOS])
    drafter = DrafterEngine(tiny(draft))
    log = SessionLog(prompt, max_new, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s", prompt)
        drafter.open("s", prompt)
        telemetry = Telemetry()
        policy = GoodputWindow(telemetry, max_k=4) if window < 0 else FixedWindow(window)
        async for _ in speculate(log, "s", InProcessDrafter(drafter), InProcessVerifier(verifier), policy,
                                 telemetry=telemetry):
            pass

    asyncio.run(go())
    assert verifier.committed("s") == log.committed
    return log.generated, log


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window", [0, 1, 3, 8, -1], ids=["k0", "k1", "k3", "k8", "goodput"])
def test_greedy_output_identical_to_target_only(seed, window):
    target = f"tiny:{seed}"
    for i, prompt in enumerate(PROMPTS):
        draft = f"tiny:{seed}~{i}" if i % 2 == 0 else f"tiny:{seed + 100}"
        got, log = run_speculation(target, draft, list(prompt), 40, window)
        assert got == target_only_greedy(target, list(prompt), 40), (seed, window, prompt, draft)


def test_perturbed_draft_gives_partial_acceptance():
    _, log = run_speculation("tiny:1", "tiny:1~0", list(PROMPTS[0]), 60, 4)
    assert 0.2 < log.stats.acceptance_rate < 0.9  # the rollback paths are really exercised


def test_identical_draft_accepts_everything():
    got, log = run_speculation("tiny:2", "tiny:2", list(PROMPTS[1]), 41, 4)
    assert log.stats.acceptance_rate == 1.0 and log.stats.rounds == 41 // 5 + (41 % 5 > 0)


class RecordingLM(TorchCausalLM):
    """The real backend, recording how many cached positions each crop drops."""

    def __init__(self, inner: TorchCausalLM):
        super().__init__(inner.model, inner.name, inner.device)
        self.drops: list[int] = []

    def crop(self, state, length):
        drop = len(state.tokens) - length
        if drop > 0:
            self.drops.append(drop)
        super().crop(state, length)


def test_rollback_arithmetic_target_crops_k_minus_n_drafter_crops_k_minus_1_minus_n():
    target, draft = RecordingLM(tiny("tiny:3")), RecordingLM(tiny("tiny:3~1"))
    verifier, drafter = VerifierEngine(target, [TINY_EOS]), DrafterEngine(draft)
    prompt = list(b"abcdefgh")
    verifier.open("s", prompt)
    drafter.open("s", prompt)
    base, append, seen = len(prompt), [], set()
    k = 4
    for _ in range(40):
        target.drops.clear()
        draft.drops.clear()
        proposal = drafter.draft("s", base, append, k).tokens
        # Drafter crop happens lazily at the start of this draft, for the previous round.
        assert len(drafter._sessions["s"].kv.tokens) == base + k - 1   # the last draft token is never fed
        result = verifier.verify("s", base, proposal)
        n = result.verdict.accepted
        assert target.drops == ([k - n] if k - n else [])
        assert len(verifier._sessions["s"].kv.tokens) == base + n
        committed = result.verdict.committed(proposal)
        # Next round's drafter sync: it keeps committed[:base + min(n, k-1)], i.e. drops (k-1)-n.
        target.drops.clear()
        draft.drops.clear()
        drafter.draft("s", base + n + 1, committed, 1)
        expected = (k - 1) - n
        assert draft.drops[:1] == ([expected] if expected > 0 else []), (n, draft.drops)
        seen.add(n)
        # Roll the drafter back to the committed position for the real next round.
        base, append = base + n + 1, []
        drafter.crop("s", base)
    assert 0 in seen and k in seen and len(seen) >= 3   # rejection, partial and full-acceptance paths


def test_crop_then_logits_matches_a_fresh_cache():
    lm = tiny("tiny:4")
    seq = list(b"speculative decoding")
    state = lm.new_state()
    lm.logits(state, seq + list(b" is fast"))
    after_crop = lm.logits(state, seq)          # shares 20 tokens: crops 8, feeds 1
    fresh = lm.logits(lm.new_state(), seq)[-1:]
    assert len(state.tokens) == len(seq)
    torch.testing.assert_close(after_crop, fresh, rtol=1e-4, atol=1e-4)


@pytest.fixture
def verifier():
    engine = VerifierEngine(tiny("tiny:5"), [TINY_EOS], VerifierLimits(max_window=4, max_session_tokens=64))
    engine.open("s", list(b"hello"))
    return engine


@pytest.mark.parametrize("call,error,field", [
    (lambda v: v.verify("nope", 5, [1]), NotFound, None),
    (lambda v: v.verify("s", 5, [1] * 5), InvalidArgument, "draft_tokens"),
    (lambda v: v.verify("s", 5, [1, 320]), InvalidArgument, "draft_tokens"),
    (lambda v: v.verify("s", 5, [-1]), InvalidArgument, "draft_tokens"),
    (lambda v: v.verify("s", -1, [1]), InvalidArgument, "base_position"),
    (lambda v: v.verify("s", 6, [1]), InvalidArgument, "base_position"),
    (lambda v: v.verify("s", 3, [1]), Aborted, None),
    (lambda v: v.open("s", []), InvalidArgument, "tokens"),
    (lambda v: v.open("s", [1] * 65), InvalidArgument, "tokens"),
    (lambda v: v.open("s", [999]), InvalidArgument, "tokens"),
    (lambda v: v.open("", [1]), InvalidArgument, "session_id"),
    (lambda v: v.close("nope"), NotFound, None),
], ids=["unknown_session", "window_too_long", "id_above_vocab", "negative_id", "negative_base", "future_base",
        "stale_base", "empty_prefix", "prefix_too_long", "prefix_bad_id", "empty_session_id", "close_unknown"])
def test_verifier_bad_input_is_rejected_and_changes_nothing(verifier, call, error, field):
    before = verifier.committed("s")
    with pytest.raises(error) as raised:
        call(verifier)
    if field:
        assert raised.value.field == field
    assert verifier.committed("s") == before
    # The session still verifies exactly as a fresh one would.
    fresh = VerifierEngine(tiny("tiny:5"), [TINY_EOS])
    fresh.open("s", before)
    assert verifier.verify("s", len(before), [1, 2]).verdict == fresh.verify("s", len(before), [1, 2]).verdict


def test_stale_window_reports_committed_position(verifier):
    verifier.verify("s", 5, [1, 2])
    committed = len(verifier.committed("s"))
    with pytest.raises(Aborted) as raised:
        verifier.verify("s", 5, [3, 4])
    assert raised.value.committed_position == committed


def test_replayed_window_gets_the_identical_verdict_and_commits_nothing(verifier):
    first = verifier.verify("s", 5, [1, 2, 3])
    after = verifier.committed("s")
    again = verifier.verify("s", 5, [1, 2, 3])
    assert again == first
    assert verifier.committed("s") == after


@pytest.fixture
def drafter():
    engine = DrafterEngine(tiny("tiny:6"), DrafterLimits(max_window=4, max_session_tokens=64))
    engine.open("s", list(b"hello"))
    return engine


@pytest.mark.parametrize("call,error", [
    (lambda d: d.draft("nope", 5, [], 2), NotFound),
    (lambda d: d.draft("s", 5, [], 0), InvalidArgument),
    (lambda d: d.draft("s", 5, [], 5), InvalidArgument),
    (lambda d: d.draft("s", 6, [400], 2), InvalidArgument),
    (lambda d: d.draft("s", -1, [], 2), InvalidArgument),
    (lambda d: d.draft("s", 1, [1, 2], 2), InvalidArgument),
    (lambda d: d.draft("s", 9, [1], 2), Aborted),
    (lambda d: d.crop("s", 0), InvalidArgument),
    (lambda d: d.crop("s", 6), InvalidArgument),
    (lambda d: d.close("nope"), NotFound),
], ids=["unknown_session", "k_zero", "k_too_big", "bad_append_id", "negative_base", "append_longer_than_base",
        "gap_after_committed", "crop_to_zero", "crop_past_end", "close_unknown"])
def test_drafter_bad_input_is_rejected_and_changes_nothing(drafter, call, error):
    before = drafter.committed("s")
    with pytest.raises(error):
        call(drafter)
    assert drafter.committed("s") == before


def test_drafter_set_position_then_append(drafter):
    drafter.draft("s", 7, [10, 11], 2)
    assert drafter.committed("s") == [*b"hello", 10, 11]
    drafter.draft("s", 4, [12], 1)      # rewinds to 3 tokens, appends one
    assert drafter.committed("s") == [*b"hel", 12]
    assert drafter.crop("s", 2) == 2 and drafter.committed("s") == list(b"he")


class RecordingPolicy(FixedWindow):
    """A fixed window that records the round samples the round loop hands it."""

    def __init__(self, k):
        super().__init__(k)
        self.seen = []

    def observe(self, sample):
        self.seen.append(sample)


def test_round_loop_reports_every_round_to_the_policy():
    verifier, drafter = VerifierEngine(tiny("tiny:3"), [TINY_EOS]), DrafterEngine(tiny("tiny:3~1"))
    prompt = list(b"abc")
    log = SessionLog(prompt, 30, frozenset({TINY_EOS}))
    policy = RecordingPolicy(3)

    async def go():
        verifier.open("s", prompt)
        drafter.open("s", prompt)
        async for _ in speculate(log, "s", InProcessDrafter(drafter), InProcessVerifier(verifier), policy):
            pass
    asyncio.run(go())
    assert len(policy.seen) == log.stats.rounds
    assert sum(s.accepted for s in policy.seen) == log.stats.accepted
    assert all((s.draft_seconds > 0) == (s.k > 0) and s.verify_wall_seconds > 0 for s in policy.seen)
    # one record per round: the session's stats add up the very samples the policy saw
    assert sum(s.verify_wall_seconds for s in policy.seen) == pytest.approx(log.stats.verify_wall_seconds)
    assert all(s.link == "in-process" and s.verify_compute_seconds > 0 for s in policy.seen)


def test_a_window_of_steps_commits_the_targets_own_tokens_as_single_steps_would():
    """A target-only window of 4 steps commits, in one answer, the 4 tokens that 4 target-only windows commit,
    greedy and sampled (each step is its own one-token pass; a sampled token is drawn at its own position); a
    replay of it gets the same answer and commits nothing."""
    from edgespec.verify.sampling import SamplingParams
    from edgespec.verify.window import Window

    for params in (SamplingParams(), SamplingParams(temperature=0.9, seed=11)):
        engine = VerifierEngine(tiny("tiny:5"), [TINY_EOS], VerifierLimits(max_window=4, max_session_tokens=64))
        prompt = list(b"def f(x):")
        fingerprint = params.fingerprint()
        engine.open("steps", prompt, params)
        engine.open("single", prompt, params)
        base = len(prompt)
        for _ in range(3):
            [result] = engine.verify_batch([("steps", Window(0, base, (), params_fingerprint=fingerprint, steps=4))])
            for position in range(base, base + 4):
                engine.verify("single", position, [], params_fingerprint=fingerprint)
            assert result.committed_position == base + 4 and len(result.verdict.drafted) == 3
            assert result.verdict.accepted == 0 and result.verdict.committed(()) == engine.committed("steps")[base:]
            assert engine.committed("steps") == engine.committed("single")
            [again] = engine.verify_batch([("steps", Window(1, base, (), params_fingerprint=fingerprint, steps=4))])
            assert again == result and len(engine.committed("steps")) == base + 4   # a replay commits nothing
            base += 4


@pytest.mark.parametrize("window", [dict(draft=(1,), steps=2), dict(steps=5), dict(steps=-1),
                                    dict(parent=5, steps=2)], ids=["with_draft", "too_many", "negative", "optimistic"])
def test_a_bad_window_of_steps_is_rejected_and_changes_nothing(verifier, window):
    from edgespec.errors import EdgespecError
    from edgespec.verify.window import Window

    before = verifier.committed("s")
    fields = {"draft": (), **window}
    [result] = verifier.verify_batch([("s", Window(0, len(before), **fields))])
    assert isinstance(result, EdgespecError) and isinstance(result, InvalidArgument) and result.field == "steps"
    assert verifier.committed("s") == before


def test_a_draft_is_not_sent_where_catching_the_drafter_up_costs_more_than_drafting_could_save():
    """Opening the drafter prefills the whole committed text there; priced by the drafter's own measure, that is
    weighed against what drafting could save in the rest of the session with every token accepted."""
    from edgespec.loop.rounds import Rounds
    from edgespec.verify.sampling import SamplingParams

    def rounds(prompt_tokens, max_new):
        telemetry = Telemetry()
        telemetry.draft_per_token, telemetry.draft_prefill_per_token = 0.01, 0.001
        telemetry.profile = {1: 0.1, 2: 0.11, 3: 0.12, 4: 0.13, 5: 0.14}   # a pass over 5 tokens ~ over 1
        log = SessionLog([1] * prompt_tokens, max_new, frozenset({TINY_EOS}))
        return Rounds(log, "s", object(), object(), GoodputWindow(telemetry, max_k=4), SamplingParams(),
                      SpeculationConfig(max_window=4), telemetry)

    # 4 drafted tokens for one pass: 0.036 s a token against 0.1, so 0.064 s saved a token at best
    assert rounds(2000, 16).catchup_outweighs_drafting()        # a 2 s prefill for at most 1.0 s saved
    assert not rounds(2000, 64).catchup_outweighs_drafting()    # ... for at most 4.1 s
    assert not rounds(20, 16).catchup_outweighs_drafting()      # a 0.02 s prefill
    slow = rounds(20, 16)
    slow.telemetry.profile = {n: 0.1 * n for n in range(1, 6)}  # a pass costs a step per token: nothing to save
    assert slow.catchup_outweighs_drafting()
    slow.telemetry.draft_prefill_per_token = 0.0                # the prefill's price unknown: no veto
    assert not slow.catchup_outweighs_drafting()


def test_a_prompt_prefilled_in_parts_lets_other_sessions_verify_between_them_and_decodes_as_target_only():
    """With prefill_chunk_tokens, an open's prompt is prefilled a part per prefill_more call; another session's
    windows verify between the parts; the opening session takes no windows until its last part, then decodes the
    target's own greedy tokens. Closing it half-open, or re-opening it, leaves nothing behind."""
    prompt = list(b"for i in range(10):\n    print(i)")   # 32 tokens: 4 parts of 8
    engine = VerifierEngine(tiny("tiny:3"), [TINY_EOS],
                            VerifierLimits(max_window=4, max_session_tokens=128, prefill_chunk_tokens=8))
    engine.open("other", list(b"Hi!"))
    engine.begin_open("long", prompt)
    parts = 0
    while (seconds := engine.prefill_more("long")) is None:
        parts += 1
        with pytest.raises(NotFound):
            engine.verify("long", len(prompt), [])
        engine.verify("other", len(engine.committed("other")), [])   # runs between the parts
    assert parts == 3 and seconds > 0 and engine.session_count == 2
    while len(engine.committed("long")) < len(prompt) + 12:
        engine.verify("long", len(engine.committed("long")), [])
    assert engine.committed("long")[len(prompt):] == target_only_greedy("tiny:3", prompt, 12)
    assert engine.usage().prefilled_tokens == len(prompt) - 1 + 2

    engine.begin_open("half", prompt)
    engine.prefill_more("half")
    engine.close("half")                                   # closed half-open: gone
    with pytest.raises(NotFound):
        engine.prefill_more("half")
    engine.begin_open("long", prompt[:9])                  # a re-open replaces the session
    with pytest.raises(NotFound):
        engine.verify("long", 9, [])
    assert engine.prefill_more("long") is None and engine.prefill_more("long") is not None
    assert engine.committed("long") == prompt[:9] and engine.session_count == 2


def test_an_opening_session_holds_its_room_in_the_kv_budget():
    """What an opening session reserved counts as held while its parts are prefilled, so another open that would
    not fit beside it is refused instead of over-filling the budget."""
    from edgespec.errors import ResourceExhausted

    lm = tiny("tiny:3")
    engine = VerifierEngine(lm, [TINY_EOS], VerifierLimits(max_window=4, max_session_tokens=128, prefill_chunk_tokens=8,
                                                           kv_budget_bytes=40 * lm.kv_bytes_per_token))
    engine.begin_open("a", [1] * 30)
    assert engine.prefill_more("a") is None
    with pytest.raises(ResourceExhausted):
        engine.open("b", [1] * 20)
    engine.open("c", [1] * 9)
    assert engine.session_count == 1 and engine.prefill_more("a") is None
