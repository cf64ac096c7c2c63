"""Prefix caching: a prompt prefilled once serves later sessions (verifier and drafter, torch backend)."""
import numpy as np
import pytest
import torch

from edgespec.backends.prefix_cache import PrefixCache
from edgespec.backends.registry import tiny_lm
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from services.drafter.__main__ import parse_args as drafter_args
from services.verifier.__main__ import parse_args as verifier_args

rng = np.random.default_rng(3)
PROMPT = rng.integers(5, 250, 41).tolist()           # 40 positions to prefill: 2 whole blocks of 16 and a tail of 8


def sliced(start, end):
    return ("kv", start, end), (end - start) * 10


# -- the store ---------------------------------------------------------------------------------------------

def test_blocks_are_found_only_under_the_exact_tokens_before_them():
    store = PrefixCache(budget_bytes=10_000, block_tokens=4)
    store.store(list(range(10)), 0, sliced)                    # blocks 0-3, 4-7 and the tail 8-9
    assert [b.payload for b in store.match(list(range(10)))] == [("kv", 0, 4), ("kv", 4, 8), ("kv", 8, 10)]
    assert [b.end for b in store.match(list(range(9)))] == [4, 8]         # a tail matches only exactly
    assert [b.end for b in store.match([0, 1, 2, 3, 4, 5, 6, 9, 8])] == [4]
    assert store.match([9, 1, 2, 3]) == []                     # same block, different tokens before it: no
    assert store.match([1, 2, 3, 4, 5]) == []
    assert store.stored_tokens == 10 and store.nbytes == 100


def test_storing_again_computes_only_what_is_new():
    store = PrefixCache(budget_bytes=10_000, block_tokens=4)
    calls = []

    def slice_kv(start, end):
        calls.append((start, end))
        return sliced(start, end)

    store.store(list(range(8)), 0, slice_kv)
    store.store(list(range(8)) + [50, 51, 52, 53, 54], 8, slice_kv)
    assert calls == [(0, 4), (4, 8), (8, 12), (12, 13)]
    assert store.stored_tokens == 13 and len(store) == 4


def test_over_budget_the_least_recently_used_leaves_go_first():
    store = PrefixCache(budget_bytes=100, block_tokens=4)     # 40 bytes a block: two fit
    a, b = [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9]
    store.store(a, 0, sliced)                                  # [1-4] -> [5-8]
    store.store(b, 0, sliced)                                  # shares [1-4]; [9...] pushes out a's leaf
    assert store.nbytes <= 100 and store.evicted_blocks == 1
    assert [blk.end for blk in store.match(b)] == [4, 8]
    assert [blk.end for blk in store.match(a)] == [4]          # the shared parent stays while a child needs it
    store.store([7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], 0, sliced)  # 3 blocks: more than the budget alone
    assert store.nbytes <= 100 and all(len(store.match(p)) == 0 for p in (a, b))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        PrefixCache(budget_bytes=0)
    with pytest.raises(ValueError):
        PrefixCache(budget_bytes=10, block_tokens=0)


# -- the torch backend -------------------------------------------------------------------------------------

def forwards(lm):
    count = [0]
    lm.model.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def same_kv(a, b):
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


def test_a_repeated_prompt_is_served_whole_from_the_store_bitwise():
    lm = tiny_lm("tiny:1")
    lm.use_prefix_cache(64 * 2**20)
    calls = forwards(lm)
    first, second = lm.new_state(), lm.new_state()
    lm.prefill(first, PROMPT)
    assert calls[0] == 1 and lm.prefix_cache.stored_tokens == 40
    lm.prefill(second, PROMPT)
    assert calls[0] == 1, "nothing computed for a prompt already stored"
    assert second.tokens == PROMPT[:-1] and same_kv(first.cache, second.cache)
    assert lm.prefix_cache.hit_tokens == 40
    # The session goes on from it exactly as the first one does.
    assert np.array_equal(lm.logits_rows(first, PROMPT + [7, 8], 3), lm.logits_rows(second, PROMPT + [7, 8], 3))


def test_a_shared_system_prompt_is_reused_and_the_rest_computed():
    cached, plain = tiny_lm("tiny:1"), tiny_lm("tiny:1")
    cached.use_prefix_cache(64 * 2**20)
    cached.prefill(cached.new_state(), PROMPT)
    other = PROMPT[:35] + [9, 10, 11, 12]                        # the first 32 positions are 2 stored blocks
    state, reference = cached.new_state(), plain.new_state()
    cached.prefill(state, other)
    plain.prefill(reference, other)
    assert cached.prefix_cache.hit_tokens == 32
    got, want = cached.logits_rows(state, other, 1), plain.logits_rows(reference, other, 1)
    np.testing.assert_allclose(got, want, atol=1e-5)            # computed with the stored past: last bits only
    assert got.argmax() == want.argmax()


def test_a_session_with_a_cache_of_its_own_is_synced_not_replaced():
    lm = tiny_lm("tiny:2")
    lm.use_prefix_cache(64 * 2**20)
    state = lm.new_state()
    lm.prefill(state, PROMPT[:20])
    lm.prefill(state, PROMPT)            # extends what it holds; the store is not asked for its 16-token block
    assert state.tokens == PROMPT[:-1] and lm.prefix_cache.hit_tokens == 0


def test_engines_give_the_same_verdicts_and_drafts_with_and_without_the_store():
    def run(budget):
        target, draft = tiny_lm("tiny:1"), tiny_lm("tiny:1~7")
        target.use_prefix_cache(budget)
        draft.use_prefix_cache(budget)
        verifier, drafter = VerifierEngine(target, eos_ids=[]), DrafterEngine(draft)
        out = []
        for session in ("a", "b", "c"):              # b repeats a's prompt while a is open, c after a closed
            verifier.open(session, PROMPT)
            drafter.open(session, PROMPT)
            proposal = drafter.draft(session, len(PROMPT), [], 4)
            verifier.verify(session, len(PROMPT), proposal.tokens)
            out.append((proposal.tokens, verifier.committed(session)))
            if session == "a":
                verifier.close("a")
        return out, verifier.usage()
    with_store, usage = run(64 * 2**20)
    without, plain = run(0)
    assert with_store == without
    assert (usage.prefilled_tokens, usage.prefix_cache_tokens) == (120, 80) and usage.prefix_cache_bytes > 0
    assert (plain.prefilled_tokens, plain.prefix_cache_tokens, plain.prefix_cache_bytes) == (120, 0, 0)


def test_the_flag_reaches_both_services_and_bad_values_are_usage_errors(monkeypatch, capsys):
    assert verifier_args([]).service.prefix_cache_bytes == 256 * 2**20
    assert drafter_args(["--prefix-cache-mb", "0"]).service.prefix_cache_bytes == 0
    monkeypatch.setenv("EDGESPEC_DRAFTER_PREFIX_CACHE_MB", "1.5")
    assert drafter_args([]).service.prefix_cache_bytes == round(1.5 * 2**20)
    with pytest.raises(SystemExit) as exit_:
        verifier_args(["--prefix-cache-mb", "-1"])
    assert exit_.value.code == 2 and "--prefix-cache-mb must be >= 0" in capsys.readouterr().err
    monkeypatch.setenv("EDGESPEC_VERIFIER_PREFIX_CACHE_MB", "lots")
    with pytest.raises(SystemExit):
        verifier_args([])
    assert "EDGESPEC_VERIFIER_PREFIX_CACHE_MB" in capsys.readouterr().err
