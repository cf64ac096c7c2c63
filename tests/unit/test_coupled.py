"""The coupled (Gumbel) sampler: each token a function of (seed, position, the target's distribution).

Its claim is exact equality with target-only sampling under the same seed, token for token, whatever
the windows, pipelining, failovers or resumes; and the Gumbel-max draw is an exact sample from p.
"""
import asyncio

import numpy as np
import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.drafter import DrafterEngine
from edgespec.errors import InvalidArgument
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.pool import VerifierPool
from edgespec.verify.relaxed import Relaxation
from edgespec.verify.sampling import (SamplingParams, SparseDist, check_params, coupled_choice, race_times,
                                      verify_coupled)
from edgespec.loop.session import SessionLog
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow
from tests.stats import chi2_critical, chi_square_gof
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_coupled, tiny
from tests.unit.test_failover import Faulty

PROMPT = list(b"def fib(n):")


def test_noise_is_a_function_of_seed_and_position_and_does_not_depend_on_the_vocabulary_size():
    a = race_times(7, 12, 1000)
    assert np.array_equal(a, race_times(7, 12, 1000))
    assert np.array_equal(a[:300], race_times(7, 12, 300))        # a smaller draft vocabulary shares it
    assert not np.array_equal(a, race_times(7, 13, 1000))
    assert not np.array_equal(a, race_times(8, 12, 1000))
    assert (a > 0).all() and abs(a.mean() - 1.0) < 0.1 and abs(a.std() - 1.0) < 0.1   # Exponential(1)


def test_gumbel_max_is_an_exact_sample_and_a_biased_variant_fails_the_same_test():
    p = np.array([0.4, 0.25, 0.2, 0.1, 0.05, 0.0])
    trials = 20000
    counts = np.bincount([coupled_choice(p, seed, 3) for seed in range(trials)], minlength=len(p))
    statistic, df = chi_square_gof(counts, p)
    assert statistic < chi2_critical(df)
    # Noise at half scale (argmax(log p + g / 2), a plausible bug) sharpens the distribution: rejected.
    biased = np.bincount([int(np.argmax(p / np.sqrt(race_times(seed, 3, len(p))))) for seed in range(trials)],
                         minlength=len(p))
    statistic, df = chi_square_gof(biased, p)
    assert statistic > chi2_critical(df)


def test_verify_coupled_accepts_while_the_draft_is_the_target_s_gumbel_argmax():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(50), size=4)
    choices = [coupled_choice(row, 5, 20 + i) for i, row in enumerate(p)]
    assert verify_coupled(choices[:3], p, 5, 20).committed(choices[:3]) == choices
    wrong = [choices[0], (choices[1] + 1) % 50, choices[2]]
    verdict = verify_coupled(wrong, p, 5, 20)
    assert verdict.accepted == 1 and verdict.next_token == choices[1]
    assert verify_coupled(choices[:3], p, 5, 20, eos_ids={choices[1]}).committed(choices[:3]) == choices[:2]


def test_bad_coupled_settings_are_invalid_argument():
    with pytest.raises(InvalidArgument, match="coupled"):
        check_params(SamplingParams(1.0, seed=1, relaxation=Relaxation("diversed", weight=0.3), coupled=True))
    engine = VerifierEngine(tiny("tiny:3"), [TINY_EOS])
    engine.open("s", PROMPT, SamplingParams(1.0, seed=1, coupled=True))
    before = engine.committed("s")
    fingerprint = SamplingParams(1.0, seed=1, coupled=True).fingerprint()
    assert fingerprint != SamplingParams(1.0, seed=1).fingerprint()
    with pytest.raises(InvalidArgument, match="draft_probs"):   # coupled windows carry token ids only
        engine.verify("s", len(PROMPT), [5], [SparseDist((5,), (1.0,))], fingerprint)
    with pytest.raises(InvalidArgument, match="params_fingerprint"):   # a standard-sampler draft
        engine.verify("s", len(PROMPT), [5], (), SamplingParams(1.0, seed=1).fingerprint())
    assert engine.committed("s") == before


def generate(target, draft, params, policy, max_new=40, pipeline=False, verifier=None, resume=(), q_ids=16):
    engine = VerifierEngine(tiny(target), [TINY_EOS])
    port = verifier or InProcessVerifier(engine)
    drafter = InProcessDrafter(DrafterEngine(tiny(draft)), q_ids=q_ids)
    log = SessionLog(PROMPT, max_new, frozenset({TINY_EOS}), generated=list(resume))

    async def go():
        await port.open("s", log.committed, params)
        telemetry = policy.telemetry if isinstance(policy, GoodputWindow) else None   # the policy reads it
        async for _ in speculate(log, "s", drafter, port, policy, params,
                                 config=SpeculationConfig(pipeline=pipeline), telemetry=telemetry):
            pass
    asyncio.run(go())
    return log


@pytest.mark.parametrize("seed", range(3))
def test_coupled_output_equals_target_only_sampling_whatever_the_windows(seed):
    target, draft = f"tiny:{seed + 20}", f"tiny:{seed + 20}~1"
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1000 + seed, coupled=True)
    expected = target_only_coupled(target, PROMPT, 40, params)
    accepted = 0
    for policy, pipeline in [(FixedWindow(0), False), (FixedWindow(1), False), (FixedWindow(2), False),
                             (FixedWindow(3), False), (FixedWindow(4), False), (FixedWindow(3), True),
                             (FixedWindow(4), True), (GoodputWindow(Telemetry(), max_k=4), False)]:
        log = generate(target, draft, params, policy, pipeline=pipeline)
        assert log.generated == expected, (policy, pipeline)
        accepted += log.stats.accepted
    assert accepted > 0   # the drafter's proposals were actually used


def test_coupled_output_survives_a_resume_and_a_failover_token_for_token():
    target, draft = "tiny:24", "tiny:24~1"
    params = SamplingParams(temperature=1.0, seed=77, coupled=True)
    expected = target_only_coupled(target, PROMPT, 40, params)
    assert generate(target, draft, params, FixedWindow(3), resume=expected[:7]).generated == expected
    for pipeline in (False, True):
        a = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "a", fail_on={3}, lose_verdict=True)
        b = Faulty(VerifierEngine(tiny(target), [TINY_EOS]), "b", fail_on=set())
        failover = FailoverVerifier(VerifierPool(["a", "b"], base_backoff_seconds=0.01), {"a": a, "b": b}, 5)
        log = generate(target, draft, params, FixedWindow(2), pipeline=pipeline, verifier=failover)
        assert log.generated == expected and failover.stats("s").failovers == 1 and b.calls > 0


def test_the_standard_sampler_is_reproducible_only_for_equal_windows():
    """Why the coupled sampler exists: the standard rule's token at a position depends on whether the
    position was tested, resampled or a bonus (documented, so the docs do not over-claim)."""
    target, draft = "tiny:21", "tiny:21~1"
    texts = {k: generate(target, draft, SamplingParams(temperature=1.0, seed=5), FixedWindow(k)).generated
             for k in (1, 3)}
    assert generate(target, draft, SamplingParams(temperature=1.0, seed=5), FixedWindow(3)).generated == texts[3]
    differ = sum(generate(target, draft, SamplingParams(temperature=1.0, seed=s), FixedWindow(1)).generated
                 != generate(target, draft, SamplingParams(temperature=1.0, seed=s), FixedWindow(3)).generated
                 for s in range(6))
    assert differ > 0
