"""The suffix drafter (free drafts at the coordinator): what it proposes, its confidences, rollback, learning,
and the round loop that sends its proposals only where they pay — the output staying the target's."""
import asyncio
import random

import numpy as np
import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.backends.suffix import DECLINED_DRIFT, PRIOR_ACCEPTANCE, SuffixDrafter, bucket
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.verify.sampling import SamplingParams, warp
from tests.stats import chi2_critical, chi_square_gof
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny


def propose(committed, limit=8, drafter=None):
    return (drafter or SuffixDrafter()).session().propose(committed, limit)


def test_nothing_occurred_before_proposes_nothing():
    assert propose([1, 2, 3, 4]).tokens == ()


def test_a_copy_is_followed_with_confidence_growing_with_the_match():
    text = [10, 11, 12, 13, 14, 15, 16, 17, 99, 10, 11, 12]
    proposal = propose(text, limit=5)
    assert proposal.tokens == (13, 14, 15, 16, 17)
    assert proposal.matched == (3, 4, 5, 6, 7)
    assert proposal.confidence == tuple(PRIOR_ACCEPTANCE[bucket(m)] for m in (3, 4, 5, 6, 7))
    assert list(proposal.confidence) == sorted(proposal.confidence)


def test_the_chain_stops_where_the_text_has_no_continuation():
    # "5 6" occurred once, followed by 7 and then the end of what came before: after 7, "6 7" is unknown
    # and "7" never occurred before either: the chain ends instead of guessing.
    assert propose([5, 6, 7, 1, 5, 6], limit=8).tokens[:1] == (7,)
    assert propose([3, 5, 6, 4, 5, 6]).tokens[0] == 4


def test_most_frequent_follower_wins_and_its_share_scales_the_confidence():
    text = [0, 1, 2, 7, 0, 1, 2, 7, 0, 1, 2, 8, 5, 0, 1, 2]   # "0 1 2" is the longest suffix seen before
    proposal = propose(text, limit=1)
    assert proposal.tokens == (7,)
    assert proposal.confidence[0] == pytest.approx(2 / 3 * PRIOR_ACCEPTANCE[bucket(proposal.matched[0])])


def test_among_equally_frequent_followers_the_most_recent_wins():
    assert propose([1, 2, 7, 0, 1, 2, 8, 0, 1, 2], limit=1).tokens == (8,)


def test_longest_match_wins_over_a_more_frequent_shorter_one():
    # "2" is followed by 9 three times, but "1 2" only by 5.
    assert propose([2, 9, 2, 9, 2, 9, 1, 2, 5, 1, 2], limit=1).tokens == (5,)


def test_limit_bounds_the_chain():
    text = list(range(20)) + list(range(5))
    assert len(propose(text, limit=3).tokens) == 3
    assert propose(text, limit=0).tokens == ()


def test_rollback_equals_a_fresh_index():
    rng = random.Random(7)
    drafter = SuffixDrafter(max_ngram=4)
    session = drafter.session()
    committed = [rng.randrange(5) for _ in range(30)]
    for _ in range(300):
        assert session.propose(committed, 6) == drafter.session().propose(committed, 6)
        if rng.random() < 0.2:
            committed = committed[:rng.randrange(1, len(committed) + 1)]
        else:
            committed = committed + [rng.randrange(5) for _ in range(rng.randrange(1, 4))]


def test_verdicts_move_the_confidence_of_the_match_lengths_judged():
    drafter = SuffixDrafter(smoothing=0.5)
    session = drafter.session()
    text = [10, 11, 12, 13, 14, 15, 99, 10, 11, 12]
    proposal = session.propose(text, limit=3)   # matched 3, 4, 5
    session.observe(proposal, 1)                # 13 accepted, 14 rejected, 15 never judged
    b3, b4, b5 = bucket(3), bucket(4), bucket(5)
    assert session.acceptance[b3] == pytest.approx(0.5 * PRIOR_ACCEPTANCE[b3] + 0.5)
    assert session.acceptance[b4] == pytest.approx(0.5 * PRIOR_ACCEPTANCE[b4])
    assert session.acceptance[b5] == PRIOR_ACCEPTANCE[b5]
    drafter.absorb(session, weight=1.0)         # the coordinator's prior for the next session
    assert drafter.acceptance[b4] == session.acceptance[b4] and drafter.acceptance[b5] == PRIOR_ACCEPTANCE[b5]


@pytest.mark.parametrize("bad", [{"max_ngram": 0}, {"smoothing": 0.0}, {"smoothing": 1.5}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SuffixDrafter(**bad)


# -- in the round loop, on tiny models ----------------------------------------------------------------------

TARGET, DRAFT = "tiny:7", "tiny:7~1"


def run(prompt, new, window, free, params=SamplingParams(), target=TARGET, config=SpeculationConfig()):
    verifier = InProcessVerifier(VerifierEngine(tiny(target), [TINY_EOS]))
    drafter = InProcessDrafter(DrafterEngine(tiny(DRAFT)))
    session = SessionLog(list(prompt), new, frozenset([TINY_EOS]))
    telemetry = Telemetry()
    policy = FixedWindow(window) if window >= 0 else GoodputWindow(telemetry, max_k=4)

    async def go():
        await verifier.open("s", session.committed, params)
        async for _ in speculate(session, "s", drafter, verifier, policy, params, config, telemetry=telemetry,
                                 free=free):
            pass
    asyncio.run(go())
    return session


def repeating_prompt():
    """A prompt that repeats one piece of text: the suffix drafter proposes its continuation with confidence, and
    the tiny random target mostly rejects it — rollback on every round, which must change nothing."""
    return [1, 2, 3] + [40, 41, 42, 43, 44, 45, 46, 47] * 6 + [40, 41, 42]


def test_free_drafts_change_nothing():
    prompt = repeating_prompt()
    reference = target_only_greedy(TARGET, prompt, 48)
    for window in (-1, 0):
        session = run(prompt, 48, window, SuffixDrafter().session())
        assert session.generated == reference
    # sent in the adaptive rounds (the first one at least, where it may be drafted: the prompt's repeat is a long
    # match and nothing is measured yet; later rounds send by the measured costs, which vary with the machine's load)
    drafted_first = SpeculationConfig(first_token_alone=False)
    assert run(prompt, 48, -1, SuffixDrafter().session(), config=drafted_first).stats.free_rounds >= 1


SAMPLING = SamplingParams(temperature=1.3, top_k=8)
PIECE = [60, 61, 62, 63, 64, 65]


def copied_token_prompt(target="tiny:11"):
    """(prompt, p0): a prompt ``B + PIECE + [x] + PIECE`` whose suffix drafter proposes x, with x likely under the
    target's own (warped) distribution there, p0, so that free drafts are accepted and rejected both."""
    lm = tiny(target)
    for x in range(100, 320):
        prompt = [1, 2, 3] + PIECE + [x] + PIECE
        p0 = warp(lm.logits_rows(lm.new_state(), prompt, 1)[0], SAMPLING)
        if 0.2 < p0[x] < 0.8:
            return prompt, p0
    raise AssertionError("no token of the tiny target fits")


def test_free_drafts_under_sampling_keep_the_target_distribution():
    """Free drafts are deterministic (one-hot q): accepted with probability p(x), else the token is drawn from p
    without x. The first token's distribution over many seeds is the target's own."""
    prompt, p0 = copied_token_prompt()
    counts = np.zeros(len(p0), dtype=np.int64)
    free_accepted = free_rounds = 0
    for seed in range(1200):
        params = SamplingParams(SAMPLING.temperature, SAMPLING.top_k, seed=seed)
        session = run(prompt, 2, -1, SuffixDrafter().session(), params, target="tiny:11",
                      config=SpeculationConfig(first_token_alone=False))   # a free draft at the first token
        counts[session.generated[0]] += 1
        free_rounds += session.stats.free_rounds
        free_accepted += session.stats.free_accepted
    assert free_rounds == 1200 and 200 < free_accepted < 1000, (free_rounds, free_accepted)
    statistic, df = chi_square_gof(counts, p0)
    assert statistic < chi2_critical(df), (statistic, df)


def test_a_first_token_alone_is_a_target_only_round():
    """Two tokens at a fixed window of 3: drafted, the first round drafts one token (all the budget leaves);
    alone, it drafts none, and the second round has one token left, so nothing is drafted at all."""
    prompt = list(range(40, 60))
    drafted = run(prompt, 2, 3, None, config=SpeculationConfig(first_token_alone=False))
    alone = run(prompt, 2, 3, None, config=SpeculationConfig(first_token_alone=True))
    assert drafted.stats.drafted == 1 and alone.stats.drafted == 0
    assert alone.generated == drafted.generated == target_only_greedy(TARGET, prompt, 2)


def test_only_the_first_round_is_marked_as_answered_after_the_prompt():
    class Rounds:
        def __init__(self):
            self.samples = []

        def round(self, sample):
            self.samples.append(sample)

    for alone in (True, False):
        sink, prompt = Rounds(), list(range(40, 60))
        session = SessionLog(list(prompt), 6, frozenset([TINY_EOS]))
        verifier = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
        drafter = InProcessDrafter(DrafterEngine(tiny(DRAFT)))

        async def go():
            await verifier.open("s", session.committed, SamplingParams())
            async for _ in speculate(session, "s", drafter, verifier, FixedWindow(2), SamplingParams(),
                                     SpeculationConfig(first_token_alone=alone), metrics=sink):
                pass
        asyncio.run(go())
        assert [s.after_prompt for s in sink.samples] == [True] + [False] * (len(sink.samples) - 1)
        assert sink.samples[0].k == (0 if alone else 2) and len(sink.samples) > 1


def test_coupled_sampling_gets_no_free_drafts():
    params = SamplingParams(temperature=0.8, seed=3, coupled=True)
    session = run(repeating_prompt(), 24, -1, SuffixDrafter().session(), params)
    assert session.stats.free_rounds == 0


# -- the free-drafts bench's replay: the coordinator's decision over a recorded output ----------------------

def test_replay_of_a_copied_output_beats_target_only_and_stays_under_its_ceiling():
    from bench.bench_free_drafts import replay

    profile = {n: 1.0 + (n - 1) / 2 for n in range(1, 10)}   # this CPU's c(n): a pass over n costs 1 + (n-1)/2
    body = list(range(100, 160))
    prompt, output = [1, 2] + body + [3], body + [7]         # the answer repeats the prompt's text
    row = replay(prompt, output, SuffixDrafter(), profile, {7}, limit=16)
    assert row["tokens"] == len(output) and row["passes"] < len(output)
    assert row["free_accepted"] > 0 and 1.0 < row["speedup"] <= row["ceiling"]


def test_replay_of_an_output_with_nothing_to_copy_is_target_only():
    from bench.bench_free_drafts import replay

    profile = {n: 1.0 + (n - 1) / 2 for n in range(1, 10)}
    row = replay([1, 2, 3], list(range(100, 140)), SuffixDrafter(), profile, {7}, limit=16)
    assert (row["passes"], row["free_windows"], row["speedup"], row["ceiling"]) == (40, 0, 1.0, 1.0)


def test_pick_free_draft_never_sends_an_eos_and_declines_what_cannot_pay():
    from edgespec.loop.rounds import pick_free_draft

    cheap = Telemetry(profile={n: 1.0 + 0.1 * (n - 1) for n in range(1, 10)})   # a pass over n costs little more
    text = [10, 11, 12, 13, 14, 15, 7, 16, 99, 10, 11, 12]                        # 7 is the EOS after 15
    picked = pick_free_draft(SuffixDrafter().session(), text, {7}, cheap, 8)
    assert picked is not None and picked.tokens == (13, 14, 15)                   # cut before the EOS
    dear = Telemetry(profile={n: float(n) for n in range(1, 10)})                 # a pass over n costs n steps
    session = SuffixDrafter().session()
    b = bucket(3)                                         # the first token's match: "10 11 12"
    session.acceptance[b] = 0.1
    assert pick_free_draft(session, text, {7}, dear, 8).tokens == ()               # declined: sent empty
    assert session.acceptance[b] == pytest.approx(0.1 + DECLINED_DRIFT * (PRIOR_ACCEPTANCE[b] - 0.1))
    assert pick_free_draft(session, [1, 2, 3], {7}, cheap, 8) is None             # nothing matches: nothing sent


@pytest.mark.parametrize("bad", [["--store", "-1"], ["--repeats", "0"], ["--store", "many"]])
def test_the_free_drafts_bench_refuses_bad_flags_before_loading_anything(bad, capsys):
    from bench.bench_free_drafts import main

    with pytest.raises(SystemExit) as exit_:
        main(bad)
    assert exit_.value.code == 2 and "--store" in capsys.readouterr().err


def test_replay_with_the_store_drafts_a_repeated_output_from_the_first_one():
    from bench.bench_free_drafts import replay

    profile = {n: 1.0 + (n - 1) / 2 for n in range(1, 10)}
    output = list(range(100, 160)) + [7]                       # nothing in the prompt to copy
    drafter = SuffixDrafter(store_tokens=1000)
    first = replay([1, 2, 3], output, drafter, profile, {7}, limit=16)
    again = replay([1, 2, 3], output, drafter, profile, {7}, limit=16)
    assert first["stored_accepted"] == 0 and first["speedup"] == 1.0
    assert again["stored_accepted"] > 30 and again["speedup"] > 1.5
