"""The n-gram (prompt lookup) drafter: matching rules, exactly k tokens, rollback, the engine."""
import asyncio
import random

import numpy as np
import pytest

from edgespec.backends.ngram import NOT_PROPOSED, NgramDrafter
from edgespec.backends.registry import TINY_EOS, TINY_VOCAB
from edgespec.engines.drafter import DrafterEngine
from edgespec.verify.sampling import SamplingParams
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.window import FixedWindow
from services.drafter.__main__ import load_model, parse_args as drafter_args
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny


def draft(committed, k, drafter=None):
    drafter = drafter or NgramDrafter(100)
    return drafter.greedy_draft(drafter.new_state(), committed, k)


def test_no_match_repeats_the_last_token():
    assert draft([1, 2, 3], 4) == [3, 3, 3, 3]


def test_single_match_proposes_what_followed():
    assert draft([5, 6, 7, 8, 9, 1, 6, 7], 2) == [8, 9]


def test_longest_suffix_wins_over_a_more_recent_shorter_one():
    # "7" last occurred before 4, but "6 7" occurred before 8.
    assert draft([6, 7, 8, 0, 7, 4, 6, 7], 1) == [8]


def test_most_recent_occurrence_wins():
    assert draft([1, 2, 10, 0, 1, 2, 20, 0, 1, 2], 1) == [20]


def test_window_longer_than_the_continuation_matches_again():
    # "1 2" -> 3, then the sequence ends: the lookup repeats on 1 2 3 1 2 3 and keeps cycling.
    assert draft([1, 2, 3, 1, 2], 7) == [3, 1, 2, 3, 1, 2, 3]
    # "9" -> 5 9 reaches the end; on 4 9 5 9 5 9 the 3-gram "9 5 9" matches and gives 5.
    assert draft([4, 9, 5, 9], 3) == [5, 9, 5]


def test_no_match_of_at_least_min_ngram_pads():
    assert draft([1, 2, 3, 1], 3, NgramDrafter(100, min_ngram=2)) == [1, 1, 1]


def test_max_ngram_bounds_the_match():
    short = NgramDrafter(100, max_ngram=1)
    # With 1-grams only, the last "3" (before 5) wins; with 3-grams, "1 2 3" (before 4).
    assert draft([1, 2, 3, 4, 3, 5, 1, 2, 3], 1, short) == [5]
    assert draft([1, 2, 3, 4, 3, 5, 1, 2, 3], 1) == [4]


@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_always_exactly_k_tokens(k):
    rng = random.Random(k)
    drafter = NgramDrafter(8)
    for _ in range(50):
        committed = [rng.randrange(8) for _ in range(rng.randrange(1, 30))]
        assert len(draft(committed, k, drafter)) == k


def test_rollback_equals_fresh_index():
    rng = random.Random(3)
    drafter = NgramDrafter(6)
    state = drafter.new_state()
    committed = [rng.randrange(6) for _ in range(20)]
    for _ in range(200):
        proposal = drafter.greedy_draft(state, committed, 4)
        assert proposal == draft(committed, 4, drafter)
        accepted = rng.randrange(5)
        committed = committed[:rng.randrange(1, len(committed) + 1)] if rng.random() < 0.2 else \
            committed + proposal[:accepted] + [rng.randrange(6)]
        fresh = drafter.new_state()
        drafter.prefill(fresh, committed)
        drafter.prefill(state, committed)
        assert state == fresh   # the index after any rollback is the one built from scratch


def test_logits_rows_are_one_hot_on_the_proposal():
    drafter = NgramDrafter(10)
    rows = drafter.logits_rows(drafter.new_state(), [1, 2, 3, 1, 2], 2)
    assert rows.shape == (2, 10) and rows.dtype == np.float32
    # After 1 2 3 1: "1" was followed by 2; after 1 2 3 1 2: "1 2" was followed by 3.
    assert rows.argmax(axis=1).tolist() == [2, 3]
    assert set(rows[0].tolist()) == {0.0, NOT_PROPOSED}


def test_engine_drafts_and_rolls_back():
    engine = DrafterEngine(NgramDrafter(100))
    engine.open("s", [7, 1, 2, 3, 4, 5, 1, 2])
    assert engine.draft("s", 8, [], 4).tokens == [3, 4, 5, 1]
    # The verifier accepted "3" and corrected "4" to 9: committed 7 1 2 3 4 5 1 2 3 9.
    assert engine.draft("s", 10, [3, 9], 3).tokens == [9, 9, 9]
    # Back to before the correction, through Crop.
    engine.crop("s", 9)
    assert engine.draft("s", 9, [], 2).tokens == [4, 5]


@pytest.mark.parametrize("q_ids", [0, 4])
def test_engine_sampling_proposes_the_lookup(q_ids):
    committed = [7, 1, 2, 3, 4, 5, 1, 2]
    engine = DrafterEngine(NgramDrafter(100))
    engine.open("s", committed, SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=1), q_ids=q_ids)
    proposal = engine.draft("s", len(committed), [], 4)
    assert proposal.tokens == draft(committed, 4)
    if q_ids:   # one-hot q: the verifier accepts each with probability min(1, p(x))
        assert [(q.ids, q.weights) for q in proposal.q] == [((t,), (1.0,)) for t in proposal.tokens]
    else:
        assert proposal.q is None


def test_speculation_with_lookup_output_identical_to_target_only():
    target, prompt = "tiny:1", list(b"abcabcabc abcabc")
    verifier, drafter = VerifierEngine(tiny(target), [TINY_EOS]), DrafterEngine(NgramDrafter(TINY_VOCAB))
    log = SessionLog(prompt, 40, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s", prompt)
        drafter.open("s", prompt)
        async for _ in speculate(log, "s", InProcessDrafter(drafter), InProcessVerifier(verifier), FixedWindow(4)):
            pass

    asyncio.run(go())
    assert log.generated == target_only_greedy(target, prompt, 40)


def test_drafter_service_loads_the_ngram_backend():
    model = load_model(drafter_args(["--backend", "ngram", "--vocab-size", "320"]))
    assert isinstance(model, NgramDrafter) and model.vocab_size == 320
    assert load_model(drafter_args(["--backend", "ngram"])).vocab_size == 151936   # the default pair's
