"""Token trees: the pure rule and the torch backend's one-pass tree scoring (issue 19, first part)."""
import numpy as np
import pytest
import torch

from edgespec.backends.registry import tiny_lm
from edgespec.verify.tree import ROOT, TokenTree, verify_tree_greedy

PROMPT = list(range(30, 52))


def test_a_tree_checks_its_shape():
    tree = TokenTree((5, 6, 7, 8), (ROOT, 0, ROOT, 1))
    assert tree.depths() == [1, 2, 1, 3] and tree.path(3) == [0, 1, 3] and not tree.is_chain
    assert TokenTree.chain([5, 6, 7]).is_chain
    assert tree.attention().tolist() == [
        [True, False, False, False, False],   # root
        [True, True, False, False, False],    # node 0 (child of the root)
        [True, True, True, False, False],     # node 1 (child of 0)
        [True, False, False, True, False],    # node 2 (child of the root): not node 0 or 1
        [True, True, True, False, True]]      # node 3 (child of 1)
    for tokens, parents in (((5, 6), (ROOT,)), ((5, 6), (ROOT, 1)), ((5, 6), (ROOT, -2)), ((5, 5), (ROOT, ROOT))):
        with pytest.raises(ValueError):
            TokenTree(tokens, parents)


def test_greedy_accepts_the_longest_path_the_target_would_take():
    # root -> 10 -> 11 -> 12 (main chain), with siblings 20 (of 10) and 21 (of 11)
    tree = TokenTree((10, 11, 12, 20, 21), (ROOT, 0, 1, ROOT, 1))
    # the target takes 20 after the root: the sibling's branch; nothing after 20 is drafted
    assert verify_tree_greedy(tree, [20, 11, 12, 99, 7, 8]).committed(tree) == [20, 7]
    # 10 then 21 (the sibling of 12) then the target's own 5
    verdict = verify_tree_greedy(tree, [10, 11, 21, 99, 99, 5])
    assert verdict.path == (0, 1, 4) and verdict.committed(tree) == [10, 11, 21, 5]
    # the whole main chain and the bonus token
    assert verify_tree_greedy(tree, [10, 11, 12, 3, 9, 9]).committed(tree) == [10, 11, 12, 3]
    # nothing matches: the target's own token
    assert verify_tree_greedy(tree, [4, 0, 0, 0, 0, 0]).committed(tree) == [4]
    # an EOS is never accepted: it becomes the next token
    assert verify_tree_greedy(tree, [10, 11, 12, 3, 9, 9], eos_ids={11}).committed(tree) == [10, 11]
    # a chain is verified as verify_greedy verifies it
    chain = TokenTree.chain([10, 11, 12])
    assert verify_tree_greedy(chain, [10, 11, 7, 1]).committed(chain) == [10, 11, 7]
    with pytest.raises(ValueError):
        verify_tree_greedy(tree, [1, 2])


def sequential_rows(lm, tokens, last):
    state = lm.new_state()
    return lm.logits_rows(state, tokens, last)


def test_one_pass_over_a_tree_scores_every_node_as_sequential_decoding_would():
    lm = tiny_lm("tiny:1")
    tree = TokenTree((10, 11, 12, 20, 21, 22), (ROOT, 0, 1, ROOT, 1, 3))
    state = lm.new_state()
    rows = lm.tree_rows(state, PROMPT, tree)
    assert rows.shape == (7, lm.vocab_size) and state.tokens == PROMPT
    np.testing.assert_allclose(rows[0], sequential_rows(lm, PROMPT, 1)[0], atol=2e-5)
    for node in range(len(tree)):
        path_tokens = [tree.tokens[i] for i in tree.path(node)]
        np.testing.assert_allclose(rows[1 + node], sequential_rows(lm, PROMPT + path_tokens, 1)[0], atol=2e-5)


def test_keeping_the_accepted_path_leaves_the_cache_of_sequential_decoding():
    lm = tiny_lm("tiny:2")
    tree = TokenTree((10, 11, 12, 20, 21), (ROOT, 0, 1, ROOT, 3))
    state = lm.new_state()
    lm.tree_rows(state, PROMPT, tree)
    lm.keep_path(state, [3, 4])                                   # the sibling branch 20 -> 21
    assert state.tokens == PROMPT + [20, 21] and state.tree is None
    reference = lm.new_state()
    lm.logits(reference, PROMPT + [20, 21])                       # caches all of it
    for mine, theirs in zip(state.cache.layers, reference.cache.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-4, rtol=0)
        torch.testing.assert_close(mine.values, theirs.values, atol=1e-4, rtol=0)
    # decoding goes on from it exactly as from the sequential cache
    np.testing.assert_allclose(lm.logits_rows(state, PROMPT + [20, 21, 5, 6], 2),
                               lm.logits_rows(reference, PROMPT + [20, 21, 5, 6], 2), atol=2e-5)
    with pytest.raises(ValueError):
        lm.keep_path(state, [0])                                  # the tree's nodes were dropped


def test_greedy_tree_decoding_equals_target_only_decoding():
    """Decode 24 tokens with trees drafted from a noisy copy of the target (top-2 at the first two depths):
    the output is the target's own greedy output."""
    target, draft = tiny_lm("tiny:3"), tiny_lm("tiny:3~5")
    reference = list(PROMPT)
    ref_state = target.new_state()
    for _ in range(24):
        reference.append(int(target.logits_rows(ref_state, reference, 1)[0].argmax()))
    out, state, accepted = list(PROMPT), target.new_state(), 0
    while len(out) < len(reference):
        top = draft.logits_rows(draft.new_state(), out, 1)[0].argsort()[::-1]
        first, second = int(top[0]), int(top[1])
        chain = [first]
        for _ in range(2):
            chain.append(int(draft.logits_rows(draft.new_state(), out + chain, 1)[0].argmax()))
        tree = TokenTree((*chain, second), (ROOT, 0, 1, ROOT))
        rows = target.tree_rows(state, out, tree)
        verdict = verify_tree_greedy(tree, rows.argmax(-1).tolist())
        target.keep_path(state, verdict.path)
        out += verdict.committed(tree)
        accepted += verdict.accepted
    assert out[:len(reference)] == reference and accepted > 0


# -- engines and the round loop -----------------------------------------------------------------------------

import asyncio  # noqa: E402

from harness.inprocess import InProcessDrafter, InProcessVerifier  # noqa: E402
from edgespec.backends.registry import TINY_EOS  # noqa: E402
from edgespec.control.window import FixedWindow  # noqa: E402
from edgespec.engines.drafter import DrafterEngine  # noqa: E402
from edgespec.engines.verifier import VerifierEngine  # noqa: E402
from edgespec.errors import InvalidArgument  # noqa: E402
from edgespec.loop.session import SessionLog  # noqa: E402
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate  # noqa: E402
from edgespec.verify.sampling import Relaxation, SamplingParams  # noqa: E402
from tests.tiny import target_only_greedy, tiny  # noqa: E402


RELAXED = SamplingParams(temperature=0.8, seed=1, relaxation=Relaxation("cospec", margin=1.0))


class RecordingVerifier(InProcessVerifier):
    """The in-process verifier port, keeping each window and verdict it passed on."""

    def __init__(self, engine):
        super().__init__(engine)
        self.seen = []

    async def verify(self, session_id, window):
        verdict = await super().verify(session_id, window)
        self.seen.append((window, verdict))
        return verdict


def test_the_drafter_proposes_its_chain_and_runner_ups_as_a_tree():
    drafter = DrafterEngine(tiny("tiny:3~5"))
    drafter.open("s", PROMPT)
    chain = drafter.draft("s", len(PROMPT), [], 3).tokens
    proposal = drafter.draft("s", len(PROMPT), [], 3, tree_depth=2)
    assert proposal.tokens[:3] == chain and proposal.parents == [ROOT, 0, 1, ROOT, 0]
    TokenTree(tuple(proposal.tokens), tuple(proposal.parents))        # a valid tree: siblings differ
    drafter.open("t", PROMPT, RELAXED, 4)
    with pytest.raises(InvalidArgument, match="lossless sessions only"):
        drafter.draft("t", len(PROMPT), [], 3, tree_depth=1)
    with pytest.raises(InvalidArgument, match="tree_depth"):
        drafter.draft("s", len(PROMPT), [], 2, tree_depth=3)


def tree_rounds(tree_depth: int, new: int):
    """A greedy generation with fixed windows of 3 and the given tree depth, in process; the session log and
    the windows and verdicts the verifier port saw."""
    prompt = list(b"def add(a, b):\n    return")
    verifier, drafter = VerifierEngine(tiny("tiny:3"), [TINY_EOS]), DrafterEngine(tiny("tiny:3~5"))
    port = RecordingVerifier(verifier)
    log = SessionLog(prompt, new, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s", prompt)
        async for _ in speculate(log, "s", InProcessDrafter(drafter), port, FixedWindow(3),
                                 config=SpeculationConfig(tree_depth=tree_depth)):
            pass

    asyncio.run(go())
    return log, port.seen, target_only_greedy("tiny:3", prompt, new)


def test_tree_rounds_give_target_only_output_and_accept_siblings():
    log, seen, reference = tree_rounds(2, 40)
    assert log.generated == reference
    trees = [(w, v) for w, v in seen if w.parents]
    assert trees and all(len(w.draft) == len(w.parents) for w, _ in trees)
    assert any(i >= 3 for _, v in trees for i in v.path), "a runner-up was never the target's choice"


def test_a_relaxed_session_or_a_bad_tree_is_refused_and_changes_nothing():
    verifier = VerifierEngine(tiny("tiny:3"), [TINY_EOS])
    verifier.open("t", PROMPT, RELAXED)
    with pytest.raises(InvalidArgument, match="losslessly only"):
        verifier.verify("t", len(PROMPT), [5, 6, 7], params_fingerprint=RELAXED.fingerprint(),
                        parents=[ROOT, 0, ROOT])
    assert verifier.committed("t") == PROMPT
    verifier.open("s", PROMPT)
    for bad in ([ROOT, 0], [ROOT, 2, 0], [ROOT, ROOT, 5]):
        with pytest.raises(InvalidArgument):
            verifier.verify("s", len(PROMPT), [5, 6, 7], parents=bad)
    with pytest.raises(InvalidArgument, match="repeats a sibling"):
        verifier.verify("s", len(PROMPT), [5, 6, 5], parents=[ROOT, 0, ROOT])
    assert verifier.committed("s") == PROMPT
    result = verifier.verify("s", len(PROMPT), [5, 6, 7], parents=[ROOT, 0, ROOT])
    again = verifier.verify("s", len(PROMPT), [5, 6, 7], parents=[ROOT, 0, ROOT])     # a replay
    assert again == result and verifier.committed("s") == PROMPT + result.verdict.committed([5, 6, 7])


def test_the_coordinators_tree_depth_flag(monkeypatch, capsys):
    from services.coordinator.__main__ import parse_args

    assert parse_args([]).generation.speculation.tree_depth == 0
    assert parse_args(["--tree-depth", "2"]).generation.speculation.tree_depth == 2
    monkeypatch.setenv("EDGESPEC_COORDINATOR_TREE_DEPTH", "3")
    assert parse_args([]).generation.speculation.tree_depth == 3
    assert parse_args(["--tree-depth", "auto"]).generation.speculation.tree_depth == -1
    for bad in ("-1", "5", "deep"):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--tree-depth", bad])
        assert exit_.value.code == 2 and "expected 0..4 or auto" in capsys.readouterr().err


def test_the_tree_depth_follows_the_cost_curve_and_how_often_runner_ups_are_taken():
    from edgespec.control.goodput import best_tree_depth, expected_tokens, tree_gain
    from edgespec.control.sample import RoundSample
    from edgespec.control.telemetry import Telemetry

    alphas = [0.8, 0.7, 0.6]
    assert tree_gain(alphas, 0, 0.5) == 0
    assert tree_gain(alphas, 2, 0.5) == pytest.approx(0.2 * 0.5 + 0.8 * 0.3 * 0.5)
    # this CPU's jagged curve: 3 tokens cost 3x one, 4 tokens 1.9x: one runner-up pads k = 2 to the cheap size
    jagged = {1: 1.0, 2: 2.06, 3: 3.08, 4: 1.91, 5: 2.02, 6: 2.16}
    assert best_tree_depth(alphas, 2, 0.3, 0.0, 0.0, jagged.get, 2) == 1
    smooth = {n: float(n) for n in range(1, 8)}     # every token costs a full pass: runner-ups never pay
    assert best_tree_depth(alphas, 2, 0.3, 0.0, 0.0, smooth.get, 2) == 0
    flat = {n: 1.0 for n in range(1, 8)}            # a GPU-like flat curve: they always do
    assert best_tree_depth(alphas, 3, 0.3, 0.0, 0.0, flat.get, 2) == 2
    assert expected_tokens(alphas, 2) + tree_gain(alphas, 2, 0.3) > expected_tokens(alphas, 2)

    telemetry = Telemetry(max_k=4)
    for tokens, seconds in jagged.items():
        telemetry.forward_curve[tokens] = seconds
    telemetry.draft_per_token = 0.01
    assert telemetry.tree_depth(2, 2) == 0                       # the chain of 2 was never measured alone
    telemetry.verify_compute[2] = jagged[3]
    assert telemetry.tree_depth(2, 2) == 1
    # a tree round whose path ended on a runner-up at depth 2: a chance, a hit; the chain accepted 1
    telemetry.record(RoundSample(2, 2, 0.02, 2.1, 2.02, siblings=2, took_sibling=True, batch_tokens=5,
                                 batch_windows=1))
    assert (telemetry.sibling_chances, telemetry.sibling_hits) == (1, 1)
    assert telemetry.verify_compute[2] == jagged[3]              # a tree's forward is not the chain's cost
    telemetry.batch_windows = 4.0                                # shared forwards: a tree would leave the batch
    assert telemetry.tree_depth(2, 2) == 0


def test_auto_tree_rounds_give_target_only_output():
    log, seen, reference = tree_rounds(-1, 32)
    assert log.generated == reference
    assert log.stats.drafted >= 3 * sum(1 for w, _ in seen if w.draft)
