"""Cloud drafting (Progressive Tree Drafting on the verifier): its tries, and its windows through the engine
and the round loop on tiny models — greedy output is target-only's, sampling keeps the target's distribution,
coupled sampling is target-only coupled sampling token for token."""
import asyncio

import numpy as np
import pytest

from harness.inprocess import InProcessDrafter, InProcessVerifier
from edgespec.backends.registry import TINY_EOS
from edgespec.control.window import FixedWindow, GoodputWindow
from edgespec.control.telemetry import Telemetry
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.self_draft import SelfDraftConfig, SelfDrafter
from edgespec.engines.verifier import VerifierEngine
from edgespec.errors import InvalidArgument, Unavailable
from edgespec.loop.session import SessionLog
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate
from edgespec.verify.sampling import Relaxation, SamplingParams
from edgespec.verify.tree import ROOT
from tests.stats import chi2_critical, chi_square_gof
from tests.tiny import target_only_coupled, target_only_greedy, tiny
from tests.unit.test_sampling_engines import PARAMS, exact_first_two

TARGET = "tiny:3"
# Repetitive text: a tiny random model continues it in ways its own earlier output makes guessable.
PROMPT = list(b"for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor")


# -- the tries ----------------------------------------------------------------------------------------------

def test_the_pool_guesses_what_followed_the_last_token_before_within_the_budget():
    drafter = SelfDrafter([5, 6, 7, 8, 5, 6, 9], eos_ids={0}, config=SelfDraftConfig(nodes=4))
    tree = drafter.window(5, depth_limit=6)
    assert tree.tokens[:3] == (6, 7, 9) or (6 in tree.tokens and 7 in tree.tokens and 9 in tree.tokens)
    paths = {tuple(tree.tokens[i] for i in tree.path(n)) for n in range(len(tree))}
    assert (6, 7, 8) in paths and (6, 9) in paths and len(tree) <= 4
    assert all(len(p) <= 2 for p in {tuple(tree.tokens[i] for i in drafter.window(5, 2).path(n))
                                      for n in range(len(drafter.window(5, 2)))})


def test_the_draft_trie_grows_by_the_targets_choices_and_feeds_the_pool():
    drafter = SelfDrafter([1, 2, 3], eos_ids={0}, config=SelfDraftConfig(nodes=8))
    assert list(drafter.draft) == [3, 2]                 # seeded with the last distinct tokens
    tree = drafter.window(3, 6)
    choices = [40 + i for i in range(len(tree) + 1)]     # what the "target" chose after the root and each node
    drafter.update(tree, choices, [1, 2, 3, 4])
    for i, token in enumerate(tree.tokens):
        if tree.parents[i] == ROOT and token in drafter.draft:
            assert choices[i + 1] in drafter.draft[token] or len(drafter.draft) > 2
    assert 4 in drafter.pool[3]                          # the committed text is indexed as it grows
    grown = drafter.window(3, 6)
    assert len(grown) > len(tree)


def test_eos_is_never_guessed_past():
    drafter = SelfDrafter([1, 2, 1, 0], eos_ids={0}, config=SelfDraftConfig(nodes=8))
    tree = drafter.window(1, 6)
    drafter.update(tree, [0] * (len(tree) + 1), [1, 2, 1, 0, 1])
    assert all(0 not in child for child in drafter.draft.values())


# -- the engine -----------------------------------------------------------------------------------------------

def self_drafted(engine: VerifierEngine, session_id: str, prompt: list[int], new: int, limit: int = 6):
    out, accepted = [], 0
    while len(out) < new:
        result = engine.verify(session_id, len(prompt) + len(out), [], self_draft=min(limit, new - len(out) - 1) or 1)
        out += result.verdict.committed([])
        accepted += result.verdict.accepted
        if out[-1] == TINY_EOS:
            break
    return out, accepted


def test_self_drafted_windows_give_target_only_greedy_output_and_accept_guesses():
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])
    engine.open("s", PROMPT)
    out, accepted = self_drafted(engine, "s", PROMPT, 60)
    assert out[:60] == target_only_greedy(TARGET, PROMPT, 60)[:len(out[:60])]
    assert accepted > 5, accepted


def test_a_self_drafted_window_replays_and_bad_ones_change_nothing():
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])
    engine.open("s", PROMPT)
    first = engine.verify("s", len(PROMPT), [], self_draft=4)
    assert engine.verify("s", len(PROMPT), [], self_draft=4) == first   # a replay
    committed = engine.committed("s")
    for kwargs in (dict(draft=[5], self_draft=3), dict(draft=[], self_draft=99), dict(draft=[], self_draft=-1),
                   dict(draft=[], self_draft=2, parent=7)):
        draft = kwargs.pop("draft")
        with pytest.raises(InvalidArgument, match="self_draft"):
            engine.verify("s", len(committed), draft, **kwargs)
    assert engine.committed("s") == committed
    relaxed = SamplingParams(temperature=0.8, seed=1, relaxation=Relaxation("cospec", margin=1.0))
    engine.open("r", PROMPT, relaxed)
    with pytest.raises(InvalidArgument, match="losslessly"):
        engine.verify("r", len(PROMPT), [], params_fingerprint=relaxed.fingerprint(), self_draft=3)


# -- the round loop ---------------------------------------------------------------------------------------------

class DownDrafter:
    """A drafter port whose drafter is unreachable."""

    async def open(self, session_id, tokens, params=None):
        raise Unavailable("drafter down (test)")

    async def close(self, session_id):
        pass

    def observe(self, draft, sample):
        pass


def run(params, new, cloud_draft, drafter=None, policy=None, target=TARGET, prompt=PROMPT, first_token_alone=True):
    engine = VerifierEngine(tiny(target), [TINY_EOS])
    log = SessionLog(prompt, new, frozenset({TINY_EOS}))

    async def go():
        engine.open("s", prompt, params)
        async for _ in speculate(log, "s", drafter or DownDrafter(), InProcessVerifier(engine),
                                 policy or FixedWindow(3), params, config=SpeculationConfig(cloud_draft=cloud_draft,
                                                                       first_token_alone=first_token_alone)):
            pass
    asyncio.run(go())
    return log


@pytest.mark.parametrize("mode,drafter", [("on", None), ("fallback", None), ("on", "edge")])
def test_cloud_drafted_rounds_give_target_only_greedy_output(mode, drafter):
    edge = InProcessDrafter(DrafterEngine(tiny(f"{TARGET}~5"))) if drafter else None
    log = run(SamplingParams(), 60, mode, edge)
    assert log.generated == target_only_greedy(TARGET, PROMPT, 60)
    assert log.stats.accepted > 5 and log.stats.rounds < 55     # guesses were accepted: fewer rounds than tokens
    adaptive = run(SamplingParams(), 40, mode, edge, GoodputWindow(Telemetry(), max_k=8))
    assert adaptive.generated == target_only_greedy(TARGET, PROMPT, 40)


def test_without_cloud_drafting_a_down_drafter_means_target_only_rounds():
    log = run(SamplingParams(), 20, "off")
    assert log.generated == target_only_greedy(TARGET, PROMPT, 20) and log.stats.accepted == 0
    assert log.stats.rounds == 20


def test_cloud_drafted_sampling_keeps_the_target_distribution():
    from tests.unit.test_sampling_engines import PROMPT as SAMPLING_PROMPT

    p0, p1 = exact_first_two()
    counts = np.zeros((2, len(p0)), dtype=np.int64)
    accepted = 0
    for seed in range(1200):
        log = run(SamplingParams(PARAMS.temperature, PARAMS.top_k, PARAMS.top_p, seed), 3, "on", target="tiny:11",
                  prompt=SAMPLING_PROMPT, first_token_alone=False)   # guesses at both positions
        counts[0, log.generated[0]] += 1
        counts[1, log.generated[1]] += 1
        accepted += log.stats.accepted
    assert accepted > 100, accepted     # guesses really were accepted, not every token sampled afresh
    for position, p in enumerate((p0, p1)):
        statistic, df = chi_square_gof(counts[position], p)
        assert statistic < chi2_critical(df), (position, statistic, df)


def test_cloud_drafted_coupled_sampling_is_target_only_coupled_sampling():
    for seed in range(4):
        params = SamplingParams(temperature=0.9, top_k=50, seed=seed, coupled=True)
        log = run(params, 40, "on")
        assert log.generated == target_only_coupled(TARGET, PROMPT, 40, params), seed


def test_a_verifier_that_cannot_draft_for_itself_refuses_and_changes_nothing():
    """Cloud drafting is planned only where every verifier scores trees (tests/unit/test_capabilities.py); a
    self-drafted window sent to one that does not is refused by the engine's guard, the session unchanged."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")
    from edgespec.backends import llamacpp

    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=2048, max_sequences=4)
    try:
        prompt, new = list(range(100, 130)), 12
        engine = VerifierEngine(lm, lm.eos_ids())
        log = SessionLog(prompt, new, frozenset(lm.eos_ids()))

        async def go():
            engine.open("s", prompt)
            async for _ in speculate(log, "s", DownDrafter(), InProcessVerifier(engine), FixedWindow(3),
                                     config=SpeculationConfig(cloud_draft="on")):
                pass

        with pytest.raises(InvalidArgument, match="draft for itself"):
            asyncio.run(go())
        # the first token is a target-only step; the self-drafted window after it changed nothing
        assert len(log.generated) == 1 and engine.committed("s") == prompt + log.generated
    finally:
        lm.close()
