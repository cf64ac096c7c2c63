"""Free drafts from earlier outputs (edgespec.backends.output_store): per tenant, bounded by tokens, least
recently matched dropped first; the suffix drafter takes them where they match more than the session's text."""
import asyncio

import pytest

from edgespec.backends.output_store import OutputStore
from edgespec.backends.suffix import PRIOR_STORED, SuffixDrafter, bucket
from edgespec.backends.registry import TINY_EOS
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import GoodputWindow
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.verify.sampling import SamplingParams
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny
from tests.unit.test_suffix_drafter import DRAFT, TARGET, run

ANSWER = list(range(100, 140))


def test_a_tenant_drafts_from_its_own_earlier_outputs_only():
    store = OutputStore(1000)
    store.add("alice", ANSWER)
    assert store.follower("alice", (100, 101, 102)) == (103, 1.0)
    assert store.follower("bob", (100, 101, 102)) is None
    assert store.follower("alice", (100, 101)) is None          # shorter than min_ngram: chance, not indexed
    assert store.follower("alice", tuple(ANSWER[-3:])) is None  # the end: no follower


def test_the_most_frequent_follower_wins_and_a_repeat_is_kept_once():
    store = OutputStore(1000)
    store.add("a", [1, 2, 3, 4, 9])
    store.add("a", [1, 2, 3, 5, 9])
    store.add("a", [7, 1, 2, 3, 5])
    assert store.follower("a", (1, 2, 3)) == (5, pytest.approx(2 / 3))
    kept = store.tokens
    store.add("a", [7, 1, 2, 3, 5])
    assert store.tokens == kept and len(store) == 3


def test_the_budget_drops_the_least_recently_matched_output():
    store = OutputStore(12)
    store.add("a", [1, 2, 3, 4, 5, 6])
    store.add("a", [11, 12, 13, 14, 15, 16])
    assert store.follower("a", (1, 2, 3)) == (4, 1.0)           # the first output is used: the second is older now
    store.add("a", [21, 22, 23, 24, 25, 26])
    assert store.tokens == 12 and len(store) == 2
    assert store.follower("a", (11, 12, 13)) is None
    assert store.follower("a", (1, 2, 3)) == (4, 1.0) and store.follower("a", (21, 22, 23)) == (24, 1.0)
    store.add("a", list(range(50, 80)))                           # longer than the budget: its last 12 tokens
    assert store.tokens == 12 and store.follower("a", (68, 69, 70)) == (71, 1.0)
    assert store.follower("a", (50, 51, 52)) is None and store.follower("a", (1, 2, 3)) is None


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"max_tokens": 9, "min_ngram": 0},
                                 {"max_tokens": 9, "min_ngram": 9, "max_ngram": 8}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        OutputStore(**bad)


def test_the_drafter_proposes_an_earlier_answer_to_the_same_question():
    tenant = ["alice"]
    drafter = SuffixDrafter(store_tokens=1000, tenant=lambda: tenant[0])
    prompt = [1, 2, 3, 4, 5]
    first = drafter.session()
    assert first.propose(prompt + ANSWER[:3], 8).tokens == ()    # nothing before: nothing proposed
    drafter.absorb(first, ANSWER)
    again = drafter.session().propose(prompt + ANSWER[:3], 8)
    assert again.tokens == tuple(ANSWER[3:11]) and all(again.stored)
    assert again.confidence[0] == pytest.approx(PRIOR_STORED[bucket(3)])
    assert bucket(3, stored=True) != bucket(3)
    tenant[0] = "bob"
    assert drafter.session().propose(prompt + ANSWER[:3], 8).tokens == ()
    off = SuffixDrafter()
    off.absorb(off.session(), ANSWER)
    assert off.store is None and off.session().propose(prompt + ANSWER[:3], 8).tokens == ()


def test_the_session_s_own_text_wins_a_match_as_long():
    drafter = SuffixDrafter(store_tokens=1000)
    drafter.absorb(drafter.session(), [10, 11, 12, 13, 50])
    own = drafter.session().propose([10, 11, 12, 13, 60, 9, 10, 11, 12, 13], 1)
    assert own.tokens == (60,) and own.stored == (False,)
    longer = drafter.session().propose([12, 13, 60, 9, 10, 11, 12, 13], 1)   # the store matches 4, the text 3
    assert longer.tokens == (50,) and longer.stored == (True,)


def test_verdicts_on_stored_tokens_move_their_own_buckets():
    drafter = SuffixDrafter(store_tokens=1000, smoothing=0.5)
    drafter.absorb(drafter.session(), ANSWER)
    session = drafter.session()
    proposal = session.propose([1] + ANSWER[:3], 2)
    session.observe(proposal, 0)
    assert session.acceptance[bucket(3, True)] == pytest.approx(0.5 * PRIOR_STORED[bucket(3)])
    assert session.acceptance[bucket(3)] == drafter.acceptance[bucket(3)]


def test_a_repeated_question_is_the_target_s_own_output_with_stored_drafts():
    """In the round loop: the second generation of a prompt drafts from the first one's output, and its text is
    still target-only greedy's. (A verifier profiled as cheap for longer windows, as a GPU is: whether a draft pays
    on this machine's measured costs is the decision's business, tested with pick_free_draft.)"""
    prompt = list(range(40, 60))
    reference = target_only_greedy(TARGET, prompt, 40)
    drafter = SuffixDrafter(store_tokens=1000)
    first = drafter.session()
    assert run(prompt, 40, -1, first).generated == reference
    drafter.absorb(first, reference)
    verifier = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    log = SessionLog(list(prompt), 40, frozenset([TINY_EOS]))
    telemetry = Telemetry(profile={n: 1.0 + 0.05 * (n - 1) for n in range(1, 10)})

    async def go():
        await verifier.open("s", log.committed, SamplingParams())
        async for _ in speculate(log, "s", InProcessDrafter(DrafterEngine(tiny(DRAFT))), verifier,
                                 GoodputWindow(telemetry, max_k=4), SamplingParams(), telemetry=telemetry,
                                 free=drafter.session()):
            pass
    asyncio.run(go())
    assert log.generated == reference
    assert log.stats.free_rounds >= 1 and log.stats.free_accepted >= 1
