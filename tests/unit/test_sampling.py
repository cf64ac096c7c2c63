"""Lossless speculative sampling: emitted tokens are distributed exactly as p.

Seeded, >= 10^5 samples per case, chi-square at alpha = 0.001 (critical values
hard-coded). A deliberately biased verifier (resample from p instead of the
residual) must fail the same test, which shows the test can fail.
"""
import numpy as np
import pytest

from edgespec.verify.sampling import (ACCEPT, DRAFT, RESIDUAL, SamplingParams, SparseDist, sample, truncate_to_sparse,
                               check_params, uniform, verify_sampling, warp)
from edgespec.verify.greedy import Verdict

N = 100_000
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, int]:
    support = p > 0
    assert counts[~support].sum() == 0, f"emitted a token with p = 0: {np.flatnonzero(counts * ~support)}"
    n = counts.sum()
    expected = p[support] * n
    return float((((counts[support] - expected) ** 2) / expected).sum()), int(support.sum() - 1)


def emitted_first_tokens(p, q_rows, verify=verify_sampling, n=N, sparse=True):
    """Draft k tokens from q (seeded), verify, and count the token emitted at each position."""
    k = len(q_rows)
    vocab = p.shape[1]
    counts = np.zeros((k + 1, vocab), dtype=np.int64)
    q_sparse = [SparseDist.from_dense(row) for row in q_rows]
    for seed in range(n):
        draft = [dist.sample(uniform(seed, i, DRAFT)) for i, dist in enumerate(q_sparse)]
        verdict = verify(draft, q_sparse if sparse else None, p, seed, 0)
        for i, token in enumerate(verdict.committed(draft)):
            counts[i, token] += 1
    return counts


P = np.array([[0.5, 0.2, 0.2, 0.1, 0.0, 0.0],     # zeros, ties
              [0.0, 0.25, 0.25, 0.25, 0.25, 0.0],
              [0.1, 0.1, 0.1, 0.1, 0.1, 0.5]])
Q_CASES = {
    "q_disjoint_support": [np.array([0.0, 0.0, 0.0, 0.0, 0.5, 0.5]), np.array([1.0, 0, 0, 0, 0, 0])],
    "q_overlapping_with_zeros": [np.array([0.1, 0.6, 0.0, 0.3, 0.0, 0.0]), np.array([0.0, 0.1, 0.1, 0.4, 0.4, 0.0])],
    "q_equals_p": [P[0].copy(), P[1].copy()],
    "q_topk_truncated": [truncate_to_sparse(np.array([.3, .25, .2, .15, .07, .03]), 2).dense(6),
                         truncate_to_sparse(np.array([.05, .4, .3, .1, .1, .05]), 3).dense(6)],
}


@pytest.mark.parametrize("case", list(Q_CASES))
def test_sparse_q_emits_target_distribution(case):
    counts = emitted_first_tokens(P, Q_CASES[case])
    for position in range(3):
        if counts[position].sum() < 1000:   # e.g. disjoint support: the window never gets that far
            continue
        stat, df = chi_square(counts[position], P[position])
        assert stat < CHI2_999[df], (case, position, stat, counts[position])


def test_one_hot_q_deterministic_drafter_emits_target_distribution():
    # Argmax drafter: q is one-hot on a fixed guess; the second guess has p = 0.
    q_rows = [np.eye(6)[0], np.eye(6)[0]]
    counts = emitted_first_tokens(P, q_rows, sparse=False)
    assert counts[1].sum() > 1000 and counts[2].sum() == 0   # the p = 0 guess at position 1 is never accepted
    for position in range(3):
        if counts[position].sum() < 1000:
            continue
        stat, df = chi_square(counts[position], P[position])
        assert stat < CHI2_999[df], (position, stat, counts[position])


def biased_verify(draft, q, p, seed, base_position, eos_ids=()):
    """The classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    for i, x in enumerate(draft):
        px, qx = float(p[i, x]), q[i].prob(x)
        if px > 0 and qx > 0 and uniform(seed, base_position + i, ACCEPT) < px / qx:
            continue
        return Verdict(i, sample(p[i], uniform(seed, base_position + i, RESIDUAL)))
    return Verdict(len(draft), sample(p[-1], uniform(seed, base_position + len(draft), "bonus")))


def test_the_test_can_fail_biased_resampling_is_detected():
    counts = emitted_first_tokens(P, Q_CASES["q_overlapping_with_zeros"], verify=biased_verify)
    stat, df = chi_square(counts[0], P[0])
    assert stat > CHI2_999[df] * 10, stat


def test_never_accepts_p_zero_or_q_zero():
    p = np.array([[0.0, 1.0], [0.5, 0.5]])
    for seed in range(200):
        assert verify_sampling([0], [SparseDist((0,), (1.0,))], p, seed, 0) == Verdict(0, 1)   # p(x) = 0
        # q(x) = 0: a token the drafter could not have sampled is never accepted.
        assert verify_sampling([1], [SparseDist((0,), (1.0,))], np.array([[0.5, 0.5], [0.5, 0.5]]), seed, 0).accepted == 0


def test_truncate_to_sparse_keeps_top_ids_as_float32_weights():
    dist = truncate_to_sparse(np.array([0.1, 0.5, 0.0, 0.3, 0.1]), 2)
    assert dist.ids == (1, 3)
    assert all(np.float32(w) == w for w in dist.weights)
    assert dist.prob(1) == pytest.approx(0.625) and dist.prob(0) == 0.0
    assert truncate_to_sparse(np.array([0.1, 0.5, 0.0, 0.4]), 0).ids == (1, 3, 0)


def test_same_seed_same_verdict_replay():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(50), size=4)
    q = [SparseDist.from_dense(r) for r in rng.dirichlet(np.ones(50), size=3)]
    draft = [int(np.argmax(r.dense(50))) for r in q]
    verdicts = {verify_sampling(draft, q, p, seed=1234, base_position=77) for _ in range(5)}
    assert len(verdicts) == 1
    assert len({verify_sampling(draft, q, p, seed=s, base_position=77) for s in range(40)}) > 1


def test_eos_accepted_ends_the_window():
    p = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    q = [SparseDist((1,), (1.0,)), SparseDist((2,), (1.0,))]
    assert verify_sampling([1, 2], q, p, 0, 0, eos_ids={1}) == Verdict(0, 1)


def test_uniforms_are_independent_by_purpose_and_position():
    values = [uniform(7, pos, purpose) for pos in range(2000) for purpose in (ACCEPT, RESIDUAL, DRAFT)]
    assert 0 <= min(values) and max(values) < 1
    assert abs(np.mean(values) - 0.5) < 0.01
    assert len(set(values)) == len(values)


@pytest.mark.parametrize("params,expected", [
    (SamplingParams(temperature=0.0), [0, 0, 1, 0]),
    (SamplingParams(temperature=1.0, top_k=2), None),
    (SamplingParams(temperature=1.0, top_p=0.5), [0, 0, 1, 0]),
])
def test_warp(params, expected):
    logits = np.array([1.0, 2.0, 3.0, -1.0])
    probs = warp(logits, params)
    assert probs.sum() == pytest.approx(1.0)
    if expected is not None:
        assert (probs > 0).astype(int).tolist() == expected
    else:
        assert (probs > 0).tolist() == [False, True, True, False]
        assert probs[2] / probs[1] == pytest.approx(np.e)


def test_warp_top_p_keeps_the_smallest_set_reaching_p():
    probs = warp(np.log(np.array([0.5, 0.3, 0.15, 0.05])), SamplingParams(temperature=1.0, top_p=0.8))
    assert probs.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])


def test_fingerprint_changes_with_every_field():
    base = SamplingParams(0.7, 20, 0.9, 1)
    variants = [SamplingParams(0.8, 20, 0.9, 1), SamplingParams(0.7, 21, 0.9, 1),
                SamplingParams(0.7, 20, 0.95, 1), SamplingParams(0.7, 20, 0.9, 2)]
    assert len({base.fingerprint(), *(v.fingerprint() for v in variants)}) == 5
    assert base.fingerprint() == SamplingParams(0.7, 20, 0.9, 1).fingerprint()


def test_fingerprint_takes_every_uint64_seed():
    """Found by bench-fuzz: a seed >= 2**63 (valid on the wire, uint64) crashed the fingerprint."""
    for seed in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        params = SamplingParams(0.7, 0, 1.0, seed)
        check_params(params)
        assert 0 <= params.fingerprint() < 1 << 63
    assert SamplingParams(0.7, 0, 1.0, 1 << 63).fingerprint() != SamplingParams(0.7, 0, 1.0, 0).fingerprint()


def test_negative_top_p_from_the_wire_is_rejected_not_treated_as_unset():
    from edgespec.errors import InvalidArgument
    from edgespec.v1 import common_pb2
    from edgespec.net.wire import params_from_pb

    assert params_from_pb(common_pb2.SamplingParams(temperature=1.0)).top_p == 1.0   # 0 = unset = all
    with pytest.raises(InvalidArgument, match="top_p"):
        check_params(params_from_pb(common_pb2.SamplingParams(temperature=1.0, top_p=-0.5)))
