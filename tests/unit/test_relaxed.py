"""Relaxed (lossy) verification: the rules do what they claim, and nothing more.

DIVERSED's emitted tokens follow the blend r = w·q + (1 − w)·p exactly (chi-square at
10^5 seeded samples), w = 0 is lossless sampling, the greedy rule is the argmax of r;
the CoSpec arbiter keeps exactly the draft tokens within its margin and never a
token the target rules out.
"""
import math

import numpy as np
import pytest

from edgespec.errors import InvalidArgument
from edgespec.verify.relaxed import (FEATURES, WeightHead, blend, committed_logprob, features, load_head,
                              softmax, verify_relaxed)
from edgespec.control.categories import resolve_task
from edgespec.verify.sampling import DRAFT, Relaxation, SamplingParams, SparseDist, check_params, uniform, verify_sampling
from edgespec.verify.greedy import verify_greedy
from tests.stats import chi2_critical, chi_square_gof

N = 100_000
P_ROW = np.array([0.5, 0.2, 0.2, 0.1, 0.0, 0.0])
Q_ROW = np.array([0.1, 0.1, 0.2, 0.0, 0.3, 0.3])     # mass where p is 0: only the blend can emit it


def logits_of(p: np.ndarray) -> np.ndarray:
    """Logits whose T=1 softmax is p (zeros become -1e9, i.e. p = 0 to float precision)."""
    return np.where(p > 0, np.log(np.maximum(p, 1e-300)), -1e9)


def sampling(method: str, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=0, relaxation=Relaxation(method=method, **kw))


def first_token_counts(params: SamplingParams, p: np.ndarray, q: np.ndarray, n: int = N) -> np.ndarray:
    """One-token windows drafted from q and verified; counts of the first emitted token."""
    logits = np.stack([logits_of(p), logits_of(p)])
    dist = SparseDist.from_dense(q)
    counts = np.zeros(len(p), dtype=np.int64)
    for seed in range(n):
        x = dist.sample(uniform(seed, 0, DRAFT))
        seeded = SamplingParams(params.temperature, params.top_k, params.top_p, seed, params.relaxation)
        verdict = verify_relaxed([x], [dist], logits, seeded, 0)
        counts[verdict.committed([x])[0]] += 1
    return counts


@pytest.mark.parametrize("w", [0.3, 0.7])
def test_diversed_emits_the_blend(w):
    counts = first_token_counts(sampling("diversed", weight=w), P_ROW, Q_ROW)
    r = w * Q_ROW + (1 - w) * P_ROW
    stat, df = chi_square_gof(counts, r)
    assert stat < chi2_critical(df), (stat, df, counts / N, r)
    # and it is not p: the blend moves mass onto tokens the target rules out
    assert counts[4:].sum() / N == pytest.approx(w * 0.6, abs=0.01)


def test_the_blend_test_can_fail():
    """Counts from w = 0.3 are far from the w = 0.7 blend: the test above can fail."""
    counts = first_token_counts(sampling("diversed", weight=0.3), P_ROW, Q_ROW, n=20_000)
    stat, df = chi_square_gof(counts, 0.7 * Q_ROW + 0.3 * P_ROW)
    assert stat > chi2_critical(df)


def test_diversed_weight_zero_is_lossless_sampling():
    rng = np.random.default_rng(1)
    for seed in range(300):
        p = softmax(rng.normal(size=(4, 12)) * 2)
        q = [SparseDist.from_dense(softmax(rng.normal(size=12) * 2)) for _ in range(3)]
        draft = [int(rng.integers(12)) for _ in range(3)]
        params = SamplingParams(1.0, 0, 1.0, seed, Relaxation("diversed", weight=0.0))
        assert verify_relaxed(draft, q, np.log(p), params, 5) == verify_sampling(draft, q, p, seed, 5)


def test_diversed_one_hot_draft_accepts_with_probability_w_plus_rest():
    """A deterministic drafter (no q): accept x with probability w + (1 − w)·p(x)."""
    w, x = 0.4, 3
    logits = np.stack([logits_of(P_ROW), logits_of(P_ROW)])
    accepted = sum(verify_relaxed([x], None, logits, SamplingParams(1.0, 0, 1.0, seed, Relaxation("diversed", weight=w)),
                                  0).accepted for seed in range(20_000))
    assert accepted / 20_000 == pytest.approx(w + (1 - w) * P_ROW[x], abs=0.012)


def test_diversed_greedy_is_the_argmax_of_the_blend():
    p = np.array([0.6, 0.3, 0.1])
    logits = np.stack([np.log(p), np.log(p)])
    greedy = lambda w: SamplingParams(relaxation=Relaxation("diversed", weight=w))
    # keep x = 1 iff w + (1 − w)·0.3 >= (1 − w)·0.6, i.e. w >= 0.3 / 1.3
    assert verify_relaxed([1], None, logits, greedy(0.22), 0).accepted == 0
    assert verify_relaxed([1], None, logits, greedy(0.24), 0).accepted == 1
    assert verify_relaxed([1], None, logits, greedy(0.22), 0).next_token == 0   # recovered = the target's argmax
    assert verify_relaxed([0], None, logits, greedy(0.0), 0).accepted == 1


def test_relaxed_greedy_with_nothing_relaxed_equals_exact_greedy():
    rng = np.random.default_rng(2)
    for _ in range(200):
        logits = rng.normal(size=(5, 16)) * 3
        draft = [int(t) for t in np.argmax(logits[:4], axis=1)]
        draft[int(rng.integers(4))] = int(rng.integers(16))
        exact = verify_greedy(draft, np.argmax(logits, axis=1).tolist(), eos_ids={7})
        for relax in (Relaxation("diversed", weight=0.0), Relaxation("cospec", margin=0.0)):
            assert verify_relaxed(draft, None, logits, SamplingParams(relaxation=relax), 0, eos_ids={7}) == exact


def test_cospec_keeps_draft_tokens_within_the_margin_only():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.stack([np.log(p)] * 3)
    params = SamplingParams(relaxation=Relaxation("cospec", margin=math.log(0.5 / 0.2)))
    assert verify_relaxed([1, 2], None, logits, params, 0).accepted == 1    # 0.3 within, 0.15 not
    assert verify_relaxed([1, 2], None, logits, params, 0).next_token == 0


def test_cospec_sampling_never_keeps_a_token_the_target_rules_out():
    params = SamplingParams(temperature=1.0, top_k=2, seed=0, relaxation=Relaxation("cospec", margin=20.0))
    logits = np.stack([np.log([0.4, 0.35, 0.25]), np.log([0.4, 0.35, 0.25])])
    for seed in range(200):
        seeded = SamplingParams(1.0, 2, 1.0, seed, params.relaxation)
        verdict = verify_relaxed([2], None, logits, seeded, 0)   # top-k 2 removes token 2
        assert verdict.accepted == 0 and verdict.next_token in (0, 1)


def test_cospec_sampling_keeps_what_lossless_would_reject_within_margin():
    logits = np.stack([np.log([0.6, 0.3, 0.1])] * 2)
    lossless = sum(verify_relaxed([1], None, logits, SamplingParams(1.0, 0, 1.0, s, Relaxation("diversed")), 0).accepted
                   for s in range(2000))
    kept = sum(verify_relaxed([1], None, logits, SamplingParams(1.0, 0, 1.0, s, Relaxation("cospec", margin=1.0)), 0).accepted
               for s in range(2000))
    assert lossless / 2000 == pytest.approx(0.3, abs=0.04) and kept == 2000


def test_blend_rows_and_bonus_row():
    p = softmax(np.zeros((3, 4)))
    r = blend(p, None, [2, 3], np.array([0.5, 0.0]))
    assert r[0].tolist() == [0.125, 0.125, 0.625, 0.125] and r[1].tolist() == p[1].tolist() and (r[2] == p[2]).all()


def test_learned_weights_stay_under_the_cap_and_respond_to_features():
    head = load_head()   # the shipped head
    assert set(head.task_weights) == {"code", "qa", "chat"}
    rng = np.random.default_rng(3)
    p1 = softmax(rng.normal(size=(6, 50)) * 3)
    w = head.weights(features(p1, [int(t) for t in rng.integers(50, size=6)]), 0.8)
    assert ((0 <= w) & (w <= 0.8)).all()
    confident = softmax(np.array([[12.0] + [0.0] * 49]))
    flat = softmax(np.zeros((1, 50)))
    assert features(confident, [0]).shape == (1, len(FEATURES))
    assert not np.allclose(head.weights(features(confident, [1]), 0.9), head.weights(features(flat, [1]), 0.9))


def test_head_rejects_other_features():
    with pytest.raises(ValueError, match="features"):
        WeightHead.from_json({"features": ["bias"], "theta": [0.0], "task_weights": {}})


def test_resolve_task_takes_the_measured_weight_of_the_prompts_category():
    head = WeightHead((0.0,) * len(FEATURES), {"code": 0.4, "qa": 0.1, "chat": 0.2}, {})
    auto = SamplingParams(relaxation=Relaxation("diversed", task="auto"))
    assert resolve_task(auto, "Write a Python function that sorts a list.", head).relaxation.weight == 0.4
    named = SamplingParams(relaxation=Relaxation("diversed", task="chat"))
    assert resolve_task(named, "def f(): pass", head).relaxation == Relaxation("diversed", 0.2, task="chat")


@pytest.mark.parametrize("relax, field", [
    (Relaxation("magic"), "relaxation.method"),
    (Relaxation("diversed", weight=0.99), "relaxation.weight"),
    (Relaxation("diversed", weight=-0.1), "relaxation.weight"),
    (Relaxation("cospec", margin=25.0), "relaxation.margin"),
    (Relaxation("cospec", margin=1.0, weight=0.2), "relaxation"),
    (Relaxation("diversed", margin=1.0), "relaxation.margin"),
    (Relaxation("diversed", task="poetry"), "relaxation.task"),
    (Relaxation("diversed", learned=True, task="code"), "relaxation"),
])
def test_bad_relaxations_are_rejected(relax, field):
    with pytest.raises(InvalidArgument) as error:
        check_params(SamplingParams(relaxation=relax))
    assert error.value.field == field


def test_fingerprint_unchanged_for_lossless_and_distinct_for_each_relaxation():
    base = SamplingParams(0.7, 0, 1.0, 3)
    assert base.fingerprint() == SamplingParams(0.7, 0, 1.0, 3, Relaxation()).fingerprint()
    prints = {SamplingParams(0.7, 0, 1.0, 3, r).fingerprint() for r in (
        Relaxation(), Relaxation("diversed", 0.3), Relaxation("diversed", 0.4), Relaxation("diversed", 0.3, learned=True),
        Relaxation("cospec", margin=1.0))}
    assert len(prints) == 5


def test_labels_say_lossy_methods_apart():
    assert not Relaxation().lossy and Relaxation("cospec", margin=1).lossy
    assert Relaxation("diversed", 0.3).label == "relaxed-diversed(static, w=0.30)"
    assert Relaxation("diversed", 0.9, learned=True).label == "relaxed-diversed(learned, w<=0.90)"


def test_committed_logprob_sums_the_rows():
    logits = np.log(np.array([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]))
    assert committed_logprob(logits, [0, 1]) == pytest.approx(math.log(0.5) + math.log(0.75))
    assert committed_logprob(logits, []) == 0.0


def test_verifier_engine_reports_the_targets_logprob_and_relaxes_on_request():
    from edgespec.backends.registry import TINY_EOS
    from edgespec.engines.verifier import VerifierEngine
    from tests.tiny import tiny

    target = tiny("tiny:3")
    engine = VerifierEngine(target, [TINY_EOS])
    prompt = list(b"def f(x):")
    rows = target.logits_rows(target.new_state(), prompt, 1)
    wrong = (int(np.argmax(rows[0])) + 1) % 256
    engine.open("exact", prompt)
    result = engine.verify("exact", len(prompt), [wrong])
    assert result.verdict.accepted == 0
    committed = engine.committed("exact")[len(prompt):]
    assert result.verdict.target_logprob == pytest.approx(committed_logprob(rows, committed), abs=1e-5)
    engine.open("relaxed", prompt, SamplingParams(relaxation=Relaxation("diversed", weight=0.95)))
    assert engine.verify("relaxed", len(prompt), [wrong]).verdict.accepted == 1   # w = 0.95 keeps nearly anything
    engine.open("learned", prompt, SamplingParams(relaxation=Relaxation("diversed", weight=0.9, learned=True)))
    assert engine.verify("learned", len(prompt), [wrong]).verdict is not None
