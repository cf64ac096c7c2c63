"""Speculative sampling through the engines on tiny models: distribution, reproducibility, bad input."""
import asyncio

import numpy as np
import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.drafter import DrafterEngine
from edgespec.errors import InvalidArgument
from edgespec.verify.sampling import SamplingParams, SparseDist, warp
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.window import FixedWindow
from tests.stats import chi2_critical, chi_square_gof
from tests.tiny import InProcessDrafter, InProcessVerifier, tiny

PROMPT = list(b"Once upon a time")
PARAMS = SamplingParams(temperature=1.3, top_k=8, seed=0)


def generate(seed: int, window: int, q_ids: int, max_new: int = 3, target="tiny:11", draft="tiny:11~2"):
    params = SamplingParams(PARAMS.temperature, PARAMS.top_k, PARAMS.top_p, seed)
    verifier = VerifierEngine(tiny(target), [TINY_EOS])
    drafter = DrafterEngine(tiny(draft))
    log = SessionLog(PROMPT, max_new, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s", PROMPT, params)
        drafter.open("s", PROMPT, params, q_ids)
        async for _ in speculate(log, "s", InProcessDrafter(drafter, q_ids), InProcessVerifier(verifier),
                                 FixedWindow(window), params):
            pass
    asyncio.run(go())
    return log


def exact_first_two(target="tiny:11"):
    """Exact target-only distributions: p(token 0) and the marginal of token 1."""
    lm = tiny(target)
    p0 = warp(lm.logits_rows(lm.new_state(), PROMPT, 1)[0], PARAMS)
    p1 = np.zeros_like(p0)
    for x in np.flatnonzero(p0):
        p1 += p0[x] * warp(lm.logits_rows(lm.new_state(), PROMPT + [int(x)], 1)[0], PARAMS)
    return p0, p1


@pytest.mark.parametrize("q_ids", [0, 4, 16], ids=["one-hot-q", "sparse-q-top4", "sparse-q-top16"])
def test_speculative_sampling_matches_target_only_distribution(q_ids):
    p0, p1 = exact_first_two()
    counts = np.zeros((2, len(p0)), dtype=np.int64)
    accepted = 0
    for seed in range(2000):
        log = generate(seed, window=3, q_ids=q_ids)
        counts[0, log.generated[0]] += 1
        counts[1, log.generated[1]] += 1
        accepted += log.stats.accepted
    assert accepted > 300   # the draft is really being accepted, not just resampled
    for position, p in enumerate((p0, p1)):
        stat, df = chi_square_gof(counts[position], p)
        assert stat < chi2_critical(df), (position, stat, df)


def test_same_seed_same_text_different_seed_different_text():
    first = generate(5, window=3, q_ids=16, max_new=24).generated
    assert generate(5, window=3, q_ids=16, max_new=24).generated == first
    assert any(generate(s, window=3, q_ids=16, max_new=24).generated != first for s in range(6, 10))


def test_sampling_replayed_window_same_verdict():
    params = SamplingParams(1.0, 0, 1.0, 42)
    verifier = VerifierEngine(tiny("tiny:11"), [TINY_EOS])
    drafter = DrafterEngine(tiny("tiny:11~2"))
    verifier.open("s", PROMPT, params)
    drafter.open("s", PROMPT, params, 8)
    proposal = drafter.draft("s", len(PROMPT), [], 3)
    first = verifier.verify("s", len(PROMPT), proposal.tokens, proposal.q, params.fingerprint())
    again = verifier.verify("s", len(PROMPT), proposal.tokens, proposal.q, params.fingerprint())
    assert first == again


@pytest.mark.parametrize("window_q,fingerprint,field", [
    ([SparseDist((1,), (1.0,))], None, "draft_probs"),                 # draft token 5 not in q's ids
    ([SparseDist((5, 5), (0.5, 0.5))], None, "draft_probs"),           # repeated ids
    ([SparseDist((5,), (0.0,))], None, "draft_probs"),                 # zero weight
    ([SparseDist((5, 999), (0.5, 0.5))], None, "draft_probs"),         # id outside the vocabulary
    ([SparseDist((5,), (1.0,)), SparseDist((6,), (1.0,))], None, "draft_probs"),   # more q than tokens
    ([], 0, "params_fingerprint"),                                      # missing for a sampling session
    ([], 12345, "params_fingerprint"),                                  # wrong parameters
])
def test_sampling_window_bad_input_changes_nothing(window_q, fingerprint, field):
    params = SamplingParams(0.7, 0, 1.0, 1)
    verifier = VerifierEngine(tiny("tiny:11"), [TINY_EOS])
    verifier.open("s", PROMPT, params)
    with pytest.raises(InvalidArgument) as raised:
        verifier.verify("s", len(PROMPT), [5], window_q, params.fingerprint() if fingerprint is None else fingerprint)
    assert raised.value.field == field
    assert verifier.committed("s") == PROMPT


def test_greedy_session_rejects_draft_distributions_and_bad_params():
    verifier = VerifierEngine(tiny("tiny:11"), [TINY_EOS])
    verifier.open("g", PROMPT)
    with pytest.raises(InvalidArgument, match="draft_probs"):
        verifier.verify("g", len(PROMPT), [5], [SparseDist((5,), (1.0,))])
    for bad in (SamplingParams(temperature=-1), SamplingParams(temperature=1, top_p=1.5),
                SamplingParams(temperature=1, top_k=-2)):
        with pytest.raises(InvalidArgument):
            verifier.open("h", PROMPT, bad)
