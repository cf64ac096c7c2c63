"""Lossless speculative sampling over token trees (edgespec.verify.tree.verify_tree_sampling).

A toy Markov target and draft over 6 tokens; each seed drafts a tree (a chain of 2, two siblings of its
first token, one of its second) the way the drafter does (siblings drawn from q without their elder
siblings), verifies it, and the committed tokens are counted: the first against p(. | root), the second,
given the first was an accepted node a, against p(. | a). Chi-square at alpha = 0.001. A verifier that
forgets the elder siblings (the with-replacement rule applied to siblings drawn without replacement) must
fail the same test; so must one that resamples from p instead of the last residual.
"""
import numpy as np
import pytest

from edgespec.verify.sampling import (ACCEPT, DRAFT, RESIDUAL, SparseDist, accepts, sample, uniform,
                                      verify_sampling)
from edgespec.verify.tree import ROOT, TokenTree, TreeVerdict, _children, nth, verify_tree_sampling
from tests.stats import chi2_critical, chi_square_gof

V = 6
N = 40_000
P_ROOT = np.array([0.05, 0.3, 0.25, 0.2, 0.2, 0.0])
Q_ROOT = np.array([0.5, 0.3, 0.1, 0.0, 0.05, 0.05])           # mass where p has none, none where p has some
P_NEXT = np.random.default_rng(11).dirichlet(np.full(V, 0.7), size=V)   # p(. | last token)
Q_NEXT = np.random.default_rng(12).dirichlet(np.full(V, 0.7), size=V)
P_NEXT[:, 5] = 0.0
P_NEXT /= P_NEXT.sum(axis=1, keepdims=True)


def draft_tree(seed: int, deterministic: bool) -> tuple[TokenTree, list[SparseDist] | None]:
    """Chain x0 x1; siblings s1, s2 of x0 and t1 of x1 — drawn as DrafterEngine._sample_draft draws them
    (or, deterministic, the runner-ups in order: one-hot q)."""
    def children(q_row: np.ndarray, position: int, count: int) -> list[int]:
        if deterministic:
            return [int(t) for t in np.argsort(-q_row, kind="stable")[:count]]
        dist, out = SparseDist.from_dense(q_row), []
        for j in range(count):
            rest = dist.without(out)
            if not rest.ids:
                break
            out.append(rest.sample(uniform(seed, position, nth(DRAFT, j))))
        return out

    x0, *root_siblings = children(Q_ROOT, 0, 3)
    x1, *second_siblings = children(Q_NEXT[x0], 1, 2)
    tokens = [x0, x1, *root_siblings, *second_siblings]
    parents = [ROOT, 0, *[ROOT] * len(root_siblings), *[0] * len(second_siblings)]
    q = None if deterministic else [SparseDist.from_dense(Q_ROOT if parent == ROOT else Q_NEXT[x0])
                                    for parent in parents]
    return TokenTree(tuple(tokens), tuple(parents)), q


def target_rows(tree: TokenTree) -> np.ndarray:
    return np.stack([P_ROOT] + [P_NEXT[token] for token in tree.tokens])


def emitted(verify, deterministic: bool, n: int = N) -> tuple[np.ndarray, np.ndarray, int]:
    """Counts of the first committed token [V], of the second given an accepted first [V, V], and how many
    windows took a sibling."""
    first, second, siblings = np.zeros(V, dtype=np.int64), np.zeros((V, V), dtype=np.int64), 0
    for seed in range(n):
        tree, q = draft_tree(seed, deterministic)
        verdict = verify(tree, q, target_rows(tree), seed, 0)
        tokens = verdict.committed(tree)
        first[tokens[0]] += 1
        if len(tokens) > 1:
            second[tokens[0], tokens[1]] += 1
        siblings += any(tree.parents[i] != i - 1 for i in verdict.path)
    return first, second, siblings


def assert_target_distribution(first: np.ndarray, second: np.ndarray) -> None:
    statistic, df = chi_square_gof(first, P_ROOT)
    assert statistic < chi2_critical(df), ("first token", statistic, first)
    for a in range(V):
        if second[a].sum() >= 2000:
            statistic, df = chi_square_gof(second[a], P_NEXT[a])
            assert statistic < chi2_critical(df), ("second token after", a, statistic, second[a])


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-siblings", "one-hot-runner-ups"])
def test_tree_sampling_emits_the_target_distribution(deterministic):
    first, second, siblings = emitted(verify_tree_sampling, deterministic)
    assert siblings > N // 10, "siblings were hardly ever accepted: the test would not exercise them"
    assert (second.sum(axis=1) >= 2000).sum() >= 2   # second tokens after at least two different first tokens
    assert_target_distribution(first, second)


def forgets_elder_siblings(tree, q, p, seed, base_position, eos_ids=()):
    """The bug: every sibling tested against the full q, as if siblings were drawn with replacement."""
    return _walk(tree, q, p, seed, base_position, forget=True)


def resamples_from_p(tree, q, p, seed, base_position, eos_ids=()):
    """The classic bug, on trees: when every child is rejected, sample from p instead of the last residual."""
    return _walk(tree, q, p, seed, base_position, from_p=True)


def _walk(tree, q, p, seed, base, forget=False, from_p=False):
    children, path, node, depth = _children(tree), [], ROOT, 0
    while True:
        position, target, taken = base + depth, p[node + 1] / p[node + 1].sum(), []
        kids = children.get(node, [])
        for j, child in enumerate(kids):
            x = tree.tokens[child]
            drawn_from = q[child] if forget else q[child].without(taken)
            if accepts(float(target[x]), drawn_from.prob(x), uniform(seed, position, nth(ACCEPT, j))):
                path.append(child)
                node, depth = child, depth + 1
                break
            target = np.maximum(target - drawn_from.dense(V), 0.0)
            target /= target.sum()
            taken.append(x)
        else:
            return TreeVerdict(tuple(path), sample(p[node + 1] if from_p else target,
                                                   uniform(seed, position, RESIDUAL)))


@pytest.mark.parametrize("biased", [forgets_elder_siblings, resamples_from_p])
def test_the_test_can_fail_biased_tree_verifiers_are_detected(biased):
    first, second, _ = emitted(biased, deterministic=False)
    statistic, df = chi_square_gof(first, P_ROOT)
    assert statistic > 5 * chi2_critical(df), statistic


def test_a_chain_tree_gets_exactly_verify_sampling_s_verdict():
    rng = np.random.default_rng(3)
    for seed in range(3000):
        k = int(rng.integers(1, 5))
        p = rng.dirichlet(np.full(V, 0.5), size=k + 1)
        q = [SparseDist.from_dense(row) for row in rng.dirichlet(np.full(V, 0.5), size=k)]
        draft = [dist.sample(uniform(seed, 40 + i, DRAFT)) for i, dist in enumerate(q)]
        for rows in (q, None):
            chain = verify_sampling(draft, rows, p, seed, 40, eos_ids={4})
            tree = TokenTree.chain(draft)
            found = verify_tree_sampling(tree, rows, p, seed, 40, eos_ids={4})
            assert (found.accepted, found.next_token) == (chain.accepted, chain.next_token)
            assert found.committed(tree) == chain.committed(draft)


def test_bad_shapes_are_refused():
    tree = TokenTree((1, 2, 3), (ROOT, 0, ROOT))
    with pytest.raises(ValueError, match="rows"):
        verify_tree_sampling(tree, None, np.ones((3, V)) / V, 0, 0)
    with pytest.raises(ValueError, match="one per node"):
        verify_tree_sampling(tree, [SparseDist((1,), (1.0,))], np.ones((4, V)) / V, 0, 0)


def test_without_removes_tokens_and_renormalises():
    dist = SparseDist((3, 1, 4), (0.5, 0.3, 0.2))
    rest = dist.without((3,))
    assert rest.ids == (1, 4) and abs(rest.prob(1) - 0.6) < 1e-12 and rest.prob(3) == 0.0
    assert dist.without((3, 1, 4)).ids == ()


# -- through the engines and the round loop, on tiny models ---------------------------------------------------

import asyncio  # noqa: E402

from harness.inprocess import InProcessDrafter, InProcessVerifier  # noqa: E402
from edgespec.backends.registry import TINY_EOS  # noqa: E402
from edgespec.control.window import FixedWindow  # noqa: E402
from edgespec.engines.drafter import DrafterEngine  # noqa: E402
from edgespec.engines.verifier import VerifierEngine  # noqa: E402
from edgespec.loop.session import SessionLog  # noqa: E402
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate  # noqa: E402
from edgespec.verify.sampling import SamplingParams  # noqa: E402
from tests.tiny import target_only_coupled, tiny  # noqa: E402
from tests.unit.test_sampling_engines import PARAMS, PROMPT, exact_first_two  # noqa: E402


class CountingVerifier(InProcessVerifier):
    """The in-process verifier port, counting tree windows and the verdicts that took a sibling."""

    def __init__(self, engine):
        super().__init__(engine)
        self.trees = self.took_sibling = 0

    async def verify(self, session_id, window):
        verdict = await super().verify(session_id, window)
        if window.parents:
            self.trees += 1
            self.took_sibling += any(window.parents[i] != i - 1 for i in verdict.path)
        return verdict


def tree_generation(params: SamplingParams, q_ids: int, max_new: int, window: int = 2, depth: int = 2,
                    target="tiny:11", draft="tiny:11~2"):
    verifier, drafter = VerifierEngine(tiny(target), [TINY_EOS]), DrafterEngine(tiny(draft))
    port = CountingVerifier(verifier)
    log = SessionLog(PROMPT, max_new, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s", PROMPT, params)
        drafter.open("s", PROMPT, params, q_ids)
        async for _ in speculate(log, "s", InProcessDrafter(drafter, q_ids), port, FixedWindow(window), params,
                                 config=SpeculationConfig(tree_depth=depth)):
            pass
    asyncio.run(go())
    return log, port


@pytest.mark.parametrize("q_ids", [0, 16], ids=["one-hot-runner-ups", "sparse-q-top16"])
def test_sampled_tree_rounds_match_the_target_only_distribution(q_ids):
    p0, p1 = exact_first_two()
    counts = np.zeros((2, len(p0)), dtype=np.int64)
    trees = took_sibling = 0
    for seed in range(1500):
        log, port = tree_generation(SamplingParams(PARAMS.temperature, PARAMS.top_k, PARAMS.top_p, seed), q_ids, 3)
        counts[0, log.generated[0]] += 1
        counts[1, log.generated[1]] += 1
        trees, took_sibling = trees + port.trees, took_sibling + port.took_sibling
    assert trees >= 1500 and took_sibling > 100, (trees, took_sibling)   # siblings really were taken
    for position, p in enumerate((p0, p1)):
        statistic, df = chi_square_gof(counts[position], p)
        assert statistic < chi2_critical(df), (position, statistic, df)


def test_coupled_tree_rounds_are_target_only_coupled_sampling_token_for_token():
    took = 0
    for seed in range(6):
        params = SamplingParams(temperature=0.9, top_k=50, seed=seed, coupled=True)
        log, port = tree_generation(params, 0, 24, window=3)
        assert log.generated == target_only_coupled("tiny:11", PROMPT, 24, params), seed
        took += port.took_sibling
    assert took > 0
