"""The llama.cpp backend on a real GGUF model (SmolLM2-135M-Instruct, packaged): the incremental-model
contract, sessions as sequences of one context, batching, rollback, and edgespec's round loop on it.

The reference for exactness is llama.cpp itself: target-only greedy decoding with the same backend, one
token per llama_decode (what `services.verifier --backend llamacpp` does at window 0).
"""
import asyncio
import dataclasses
import gc

from dataclasses import replace

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from edgespec.backends import llamacpp  # noqa: E402
from edgespec.engines.drafter import DrafterEngine  # noqa: E402
from edgespec.engines.verifier import VerifierEngine, VerifierLimits  # noqa: E402
from edgespec.errors import ResourceExhausted  # noqa: E402
from edgespec.loop.session import SessionLog  # noqa: E402
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate  # noqa: E402
from edgespec.control.telemetry import Telemetry  # noqa: E402
from edgespec.control.window import FixedWindow, GoodputWindow  # noqa: E402
from edgespec.verify.sampling import SamplingParams  # noqa: E402
from harness.inprocess import InProcessDrafter, InProcessVerifier  # noqa: E402

PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
            8182, 2, 198, 1, 4093, 198],   # a chat-template-like prefix of SmolLM2 ids
           list(range(400, 430)), [504, 3301, 28, 216, 11, 2030, 327, 1330]]


@pytest.fixture(scope="module")
def lm():
    model = llamacpp.load("smollm2", threads=2, ctx_tokens=4096, max_sequences=8)
    yield model
    model.close()


def greedy_reference(lm, prompt, n):
    """llama.cpp target-only greedy: one token per decode, a session of its own."""
    state, out = lm.new_state(), []
    seq = list(prompt)
    eos = set(lm.eos_ids())
    for _ in range(n):
        token = int(np.argmax(lm.logits_rows(state, seq, 1)[0]))
        out.append(token)
        if token in eos:
            break
        seq.append(token)
    return out


def test_metadata_of_the_packaged_gguf(lm):
    assert lm.vocab_size == 49152 and lm.kv_bytes_per_token > 0
    assert lm.eos_ids() and all(0 <= t < lm.vocab_size for t in lm.eos_ids())


def test_weights_are_read_not_mapped(lm):
    # llama.cpp repacks the quantised weights for the CPU: a mapped GGUF would stay resident as a second copy.
    with open("/proc/self/maps") as maps:
        assert lm.name not in maps.read()


def test_incremental_rows_match_one_pass_and_rollback_is_set_the_position(lm):
    seq = PROMPTS[1]
    whole = lm.logits(lm.new_state(), seq)                      # 30 rows, one decode
    state = lm.new_state()
    lm.prefill(state, seq[:10])
    tail = lm.logits_rows(state, seq, 20)                       # the rest, after a cached prefix
    assert tail.shape == (20, lm.vocab_size)
    assert np.array_equal(whole[-20:].argmax(-1), tail.argmax(-1))
    assert np.abs(whole[-20:] - tail).max() < 1e-2
    # Rollback: ask for a shorter, diverging sequence; the cache keeps the common prefix only.
    other = seq[:15] + [7, 8, 9]
    rows = lm.logits_rows(state, other, 3)
    assert lm.cached_length(state) == len(other)
    fresh = lm.logits_rows(lm.new_state(), other, 3)
    assert np.array_equal(rows.argmax(-1), fresh.argmax(-1)) and np.abs(rows - fresh).max() < 1e-2


def test_sessions_in_one_batch_get_their_own_rows(lm):
    states = [lm.new_state() for _ in PROMPTS]
    batched = lm.logits_rows_batch(states, PROMPTS, [3, 1, 2])
    alone = [lm.logits_rows(lm.new_state(), p, n) for p, n in zip(PROMPTS, [3, 1, 2])]
    for b, a in zip(batched, alone):
        assert b.shape == a.shape and np.array_equal(b.argmax(-1), a.argmax(-1))
        assert np.abs(b - a).max() < 1e-2
    assert [lm.cached_length(s) for s in states] == [len(p) for p in PROMPTS]


def test_sequence_ids_are_recycled_and_a_full_context_is_resource_exhausted(lm):
    for _ in range(3 * lm.max_sequences):        # far more states than sequences, dropped one by one
        state = lm.new_state()
        lm.logits_rows(state, PROMPTS[2], 1)
        del state
        gc.collect()
    held = [lm.new_state() for _ in range(lm.max_sequences)]
    for state in held:
        lm.logits_rows(state, PROMPTS[2], 1)
    with pytest.raises(ResourceExhausted):
        lm.logits_rows(lm.new_state(), PROMPTS[2], 1)
    del held
    gc.collect()
    lm.logits_rows(lm.new_state(), PROMPTS[2], 1)   # free again


def run(lm, draft_lm, prompt, max_new, policy, params=SamplingParams(), pipeline=False):
    eos = lm.eos_ids()
    verifier = InProcessVerifier(VerifierEngine(lm, eos))
    drafter = InProcessDrafter(DrafterEngine(draft_lm), q_ids=16)
    session = SessionLog(list(prompt), max_new, frozenset(eos))

    async def go():
        await verifier.open("s", session.committed, params)
        telemetry = getattr(policy, "telemetry", None)   # the goodput policy reads the round loop's telemetry
        async for _ in speculate(session, "s", drafter, verifier, policy, params,
                                 config=SpeculationConfig(pipeline=pipeline),
                                 telemetry=telemetry):
            pass
        await verifier.close("s")
    asyncio.run(go())
    return session


@pytest.fixture(scope="module")
def draft_lm():
    model = llamacpp.load("smollm2", threads=2, ctx_tokens=2048, max_sequences=4)
    yield model
    model.close()


@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_speculative_greedy_on_llamacpp_equals_its_own_target_only_greedy(lm, draft_lm, prompt):
    expected = greedy_reference(lm, PROMPTS[prompt], 40)
    for policy, pipeline in [(FixedWindow(0), False), (FixedWindow(3), False), (FixedWindow(4), True),
                             (GoodputWindow(Telemetry(), max_k=4), False)]:
        session = run(lm, draft_lm, PROMPTS[prompt], 40, policy, pipeline=pipeline)
        assert session.generated == expected, (policy, pipeline)


def test_coupled_sampling_on_llamacpp_equals_its_target_only_sampling(lm, draft_lm):
    params = SamplingParams(temperature=0.9, top_k=40, seed=11, coupled=True)
    target_only = run(lm, draft_lm, PROMPTS[0], 32, FixedWindow(0), params).generated
    speculative = run(lm, draft_lm, PROMPTS[0], 32, FixedWindow(3), params)
    assert speculative.generated == target_only and speculative.stats.accepted > 0


def test_missing_or_wrong_gguf_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF"):
        llamacpp.load(str(tmp_path / "absent.gguf"))
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="could not load"):
        llamacpp.load(str(not_gguf))


@pytest.fixture
def sharing():
    model = llamacpp.load("smollm2", threads=2, ctx_tokens=2048, max_sequences=8, share_prefixes=True)
    yield model
    model.close()


def test_a_prompt_another_session_holds_is_shared_not_recomputed(lm, sharing):
    """With share_prefixes, a session starting with a prefix (16+ tokens) that a live session holds takes its
    cells; its logits are those of computing the prompt itself; rolling either session back leaves the other
    intact. Without (the default), every session computes its own."""
    prompt = PROMPTS[0] + PROMPTS[1]                        # 54 tokens
    alone = lm.logits_rows(lm.new_state(), prompt + [5, 6], 3)
    held = lm.new_state()
    lm.logits_rows(held, prompt, 1)
    alone_other = lm.logits_rows(lm.new_state(), prompt[:40] + [9, 10, 11], 2)
    assert lm.shared_tokens == 0
    lm = sharing
    first, second, third = lm.new_state(), lm.new_state(), lm.new_state()
    lm.logits_rows(first, prompt, 1)
    before = lm.shared_tokens
    rows = lm.logits_rows(second, prompt + [5, 6], 3)
    assert lm.shared_tokens - before == len(prompt) - 1   # all but the prompt's last token: never recomputed
    assert np.array_equal(rows.argmax(-1), alone.argmax(-1)) and np.abs(rows - alone).max() < 1e-2
    lm.crop(first, 5)                                      # the first session rolls back far ...
    lm.logits_rows(first, [1, 2, 3, 4, 5, 6, 7], 1)
    again = lm.logits_rows(second, prompt + [5, 6], 1)     # ... the second still holds all of its cells
    assert lm.cached_length(second) == len(prompt) + 2 and np.abs(again - rows[-1:]).max() < 1e-2
    other = lm.logits_rows(third, prompt[:40] + [9, 10, 11], 2)   # a prefix of 40 from the second
    assert np.array_equal(other.argmax(-1), alone_other.argmax(-1)) and np.abs(other - alone_other).max() < 1e-2
    short = lm.new_state()
    before = lm.shared_tokens
    lm.logits_rows(short, prompt[:12] + [9], 1)            # under 16 tokens in common: computed, not shared
    assert lm.shared_tokens == before


def test_a_closed_sessions_cells_are_kept_for_a_retry_and_given_back_when_needed(sharing):
    """share_prefixes keeps the cells of dropped states (a quarter of the sequences): the same prompt after its
    session closed is shared, not recomputed; past the quota the least recently used are given back; a context
    out of cells gives them all back and goes on."""
    import gc

    lm = sharing
    prompt = PROMPTS[0] + PROMPTS[1]
    first = lm.new_state()
    expected = lm.logits_rows(first, prompt + [5, 6], 2)
    del first
    gc.collect()
    retry = lm.new_state()
    before = lm.shared_tokens
    rows = lm.logits_rows(retry, prompt + [5, 6], 2)
    assert lm.shared_tokens - before == len(prompt) and np.array_equal(rows.argmax(-1), expected.argmax(-1))
    del retry
    for i in range(4):                                   # 8 sequences: at most 2 kept
        state = lm.new_state()
        lm.logits_rows(state, [i + 1] * 20 + prompt, 1)
        del state
        gc.collect()
    lm.logits_rows(lm.new_state(), [1, 2, 3], 1)        # recycling happens on the worker's next attach
    assert len(lm._retained) <= lm.max_retained == 2
    big = lm.new_state()
    lm.logits_rows(big, list(range(10, 10 + 1960)), 1)  # more cells than are free: the kept ones are given back
    assert lm.retained_tokens == 0 and lm.cached_length(big) == 1960


def rows_after_a_rollback_before_its_cells(exact):
    """Session A's logits for six one-token steps after session B rolled back a window whose cells lie before A's
    (B's prompt, B's window, A's prompt, then B's crop), and the same steps of A alone."""
    b_prompt, a_prompt, steps = PROMPTS[0] * 4, PROMPTS[1] * 3, PROMPTS[2][:6]
    shared = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=2, exact=exact)
    a, b = shared.new_state(), shared.new_state()
    shared.prefill(b, b_prompt)
    shared.logits_rows(b, b_prompt + steps[:4], 4)
    shared.prefill(a, a_prompt)
    shared.crop(b, len(b_prompt))
    together = [shared.logits_rows(a, a_prompt + steps[:i], 1)[0] for i in range(1, 7)]
    del a, b
    shared.close()
    solo = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=2, exact=exact)
    a = solo.new_state()
    solo.prefill(a, a_prompt)
    alone = [solo.logits_rows(a, a_prompt + steps[:i], 1)[0] for i in range(1, 7)]
    del a
    solo.close()
    return together, alone


def test_exact_mode_keeps_each_session_in_its_own_cells():
    """With --exact on each session has a stream of cells of its own: its tokens stay in order whatever other
    sessions roll back. In one unified cache the next token of A lands in the cells B freed, before A's prompt,
    and flash attention sums A's cells in another order (the probe can tell: the logits differ)."""
    assert not llamacpp.EXACT.unified
    together, alone = rows_after_a_rollback_before_its_cells(llamacpp.EXACT)
    assert all(np.array_equal(x, y) for x, y in zip(together, alone))
    together, alone = rows_after_a_rollback_before_its_cells(dataclasses.replace(llamacpp.EXACT, unified=True))
    assert not all(np.array_equal(x, y) for x, y in zip(together, alone))


def test_context_size_defaults_by_cache_layout():
    unified, streams = llamacpp.LlamaExact(), llamacpp.EXACT
    assert llamacpp.context_size(unified, None, None) == (16384, 64)
    assert llamacpp.context_size(streams, None, None) == (32768, 16)          # 2048 cells per session
    assert llamacpp.context_size(streams, 4096, None) == (4096, 2)            # 2048 per session kept
    assert llamacpp.context_size(streams, 1024, None) == (1024, 1)
    assert llamacpp.context_size(streams, None, 4) == (8192, 4)
    assert llamacpp.context_size(streams, 6144, 6) == (6144, 6)
    assert llamacpp.context_size(unified, 4096, None) == (4096, 64)
    lm = llamacpp.load("smollm2", threads=1, ctx_tokens=1024, max_sequences=4, exact=streams)
    try:   # a stream per sequence: 256 cells each (llama.cpp pads a stream to 256)
        assert (lm.ctx_tokens, lm.session_tokens) == (1024, 256)
        state = lm.new_state()
        with pytest.raises(ResourceExhausted):   # one session cannot take another's cells
            lm.logits_rows(state, list(range(300, 560)), 1)
    finally:
        lm.close()


def test_shared_prefixes_with_a_stream_per_session():
    """With exact mode's stream per session a shared prefix is a copy of the donor's stream, cropped: the sharer
    holds the prefix and what it fed, the donor keeps its cells and goes on as if alone."""
    prompt = PROMPTS[0] + PROMPTS[1]                        # 54 tokens
    solo = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=2, exact=llamacpp.EXACT)
    alone_shared = solo.logits_rows(solo.new_state(), prompt[:40] + [5, 6], 2)
    donor_alone = solo.new_state()
    solo.logits_rows(donor_alone, prompt + [7, 8, 9], 1)
    donor_next_alone = solo.logits_rows(donor_alone, prompt + [7, 8, 9, 10], 1)
    del donor_alone
    solo.close()
    lm = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=4, share_prefixes=True,
                       exact=llamacpp.EXACT)
    try:
        donor, sharer = lm.new_state(), lm.new_state()
        lm.logits_rows(donor, prompt + [7, 8, 9], 1)
        rows = lm.logits_rows(sharer, prompt[:40] + [5, 6], 2)
        assert lm.shared_tokens == 40 and lm.cached_length(sharer) == 42
        assert np.array_equal(rows.argmax(-1), alone_shared.argmax(-1)) and np.abs(rows - alone_shared).max() < 1e-2
        assert np.array_equal(lm.logits_rows(donor, prompt + [7, 8, 9, 10], 1), donor_next_alone)
    finally:
        lm.close()


def window_matches_steps(lm, prompt, n):
    """A window of n tokens after ``prompt`` scored in one call, and the same tokens decoded one at a time."""
    state = lm.new_state()
    steps = [lm.logits_rows(state, prompt, 1)[0]]
    cont = []
    for _ in range(n):
        cont.append(int(np.argmax(steps[-1])))
        steps.append(lm.logits_rows(state, prompt + cont, 1)[0])
    lm.crop(state, len(prompt))
    return np.array_equal(lm.logits_rows(state, prompt + cont, n), np.stack(steps[1:]))


def test_exact_mode_checks_its_window_rows_on_this_cpu():
    """Exact mode feeds windows in decodes of at most 3 rows, as repacked weights compute 1 to 3 rows each as one row
    alone; load checks that here. The default target's repacked gemm takes over at 4 rows, and the check finds it:
    asked for 6 rows a decode, it settles on 3, and a window of 6 is then its one-token decodes exactly."""
    assert llamacpp.EXACT.window_rows == 3 and llamacpp.EXACT.repack
    lm = llamacpp.load("target", threads=1, ctx_tokens=1024, max_sequences=2,
                       exact=dataclasses.replace(llamacpp.EXACT, window_rows=6))
    try:
        assert lm.exact.window_rows == 3
        assert window_matches_steps(lm, PROMPTS[0], 6)
        lm.exact = dataclasses.replace(lm.exact, window_rows=6)   # the rows the check refused: not exact here
        assert not window_matches_steps(lm, PROMPTS[0], 6)
    finally:
        lm.close()


def test_rows_go_in_decodes_as_even_as_the_row_limit_allows():
    assert llamacpp.chunk_lengths(4, 3) == [2, 2]          # not 3 + a one-token decode on one thread
    assert llamacpp.chunk_lengths(7, 3) == [3, 2, 2]
    assert llamacpp.chunk_lengths(6, 3) == [3, 3] and llamacpp.chunk_lengths(1, 3) == [1]
    assert llamacpp.chunk_lengths(100, 2048) == [100] and llamacpp.chunk_lengths(0, 3) == []


def test_exact_mode_computes_sessions_batched_rows_as_each_ones_one_token_decode():
    """Exact mode, 2 threads: four sessions' next tokens in one call (decodes of 2 + 2 rows), past 256 cached
    positions (where a one-token decode's attention would split over 2 threads), are bit for bit each session's
    one-token decode alone."""
    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=4096, max_sequences=8, exact=llamacpp.EXACT)
    try:
        prompts = [(PROMPTS[k % 3] * 20)[:300 + k] for k in range(4)]
        together = [lm.new_state() for _ in prompts]
        for state, prompt in zip(together, prompts):
            lm.prefill(state, prompt)
        rows = lm.logits_rows_batch(together, [p + [5] for p in prompts], [1] * 4)
        for prompt, row in zip(prompts, rows):
            alone = lm.new_state()
            lm.prefill(alone, prompt)
            assert np.array_equal(lm.logits_rows(alone, prompt + [5], 1), row)
            del alone
    finally:
        del together
        lm.close()


def test_exact_mode_keeps_one_row_passes_of_a_mixed_decode_in_one_chunk():
    """A decode of several sessions' rows is split by llama.cpp into passes of consecutive streams with as many rows
    each; a pass left with one row runs on the one-token decode's threads. Session A's window of 2 rows beside
    session B's 1 row (B just decoded a token below ONE_CHUNK_POSITIONS, on both threads) leaves A's second row
    alone in a pass, past 256 cached positions: it must still be A's own rows, bit for bit (the 16-session
    divergences on Spec-Bench's long prompts, 2026-12-07)."""
    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=4096, max_sequences=8, exact=llamacpp.EXACT)
    try:
        long, short = (PROMPTS[0] * 20)[:300], PROMPTS[1][:20]
        a, b = lm.new_state(), lm.new_state()
        lm.prefill(a, long)
        lm.prefill(b, short)
        lm.logits_rows(b, short + [9], 1)                    # a one-token decode at position 20: both threads
        rows = lm.logits_rows_batch([a, b], [long + [5, 6], short + [9, 7]], [2, 1])
        alone = lm.new_state()
        lm.prefill(alone, long)
        assert np.array_equal(lm.logits_rows(alone, long + [5, 6], 2), rows[0])
        del a, b, alone
    finally:
        lm.close()


def test_exact_rows_past_the_one_chunk_positions_are_decoded_alone_on_every_thread():
    """Exact mode feeds windows in decodes of a few rows below ONE_CHUNK_POSITIONS, where flash attention computes
    a row in one chunk whatever the threads, and every row alone past it, where a one-token decode on 2 threads
    splits its attention by thread: so a window's rows are llama.cpp's own one-token decodes on every thread (-t 2),
    across the boundary and past it. In decodes of 3 rows past it (on the batch's threads), they are not."""
    tokens = PROMPTS[0] * 14
    across = tokens[:llamacpp.ONE_CHUNK_POSITIONS - 3]    # a window of 6 over positions 237 .. 242
    past = tokens[:llamacpp.ONE_CHUNK_POSITIONS + 60]     # 300 cells: a 512-cell view, split by thread
    assert len(past) == llamacpp.ONE_CHUNK_POSITIONS + 60
    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=2048, max_sequences=2, exact=llamacpp.EXACT)
    try:
        assert lm.far_positions == llamacpp.ONE_CHUNK_POSITIONS and lm.exact.cli(2).startswith("-t 2 -tb 2 ")
        assert window_matches_steps(lm, across, 6) and window_matches_steps(lm, past, 6)
        lm.exact = replace(lm.exact, far_rows_alone=False)
        assert window_matches_steps(lm, across[:-10], 6)      # all below: 3-row decodes are exact there
        assert not window_matches_steps(lm, past, 6)
    finally:
        lm.close()


def test_a_failed_window_row_check_feeds_windows_one_row_a_decode(monkeypatch, caplog):
    monkeypatch.setenv("EDGESPEC_LLAMA_FAIL_ROW_CHECK", "1")
    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=1024, max_sequences=2, exact=llamacpp.EXACT)
    try:
        assert lm.exact.window_rows == 1
        assert "windows go in decodes of 1 row(s)" in caplog.text
        assert window_matches_steps(lm, PROMPTS[0], 5)
    finally:
        lm.close()


def test_a_prompt_prefilled_in_parts_of_the_ubatch_is_computed_as_one_prefill():
    """The verifier prefills a prompt in parts of its --prefill-chunk, which is also llama.cpp's ubatch: the cells
    and the next logits are then bit for bit those of the prompt fed in one call (as llama.cpp's own run with that
    -ub feeds it), and the verifier engine's parts decode the same tokens."""
    prompt = PROMPTS[0] + PROMPTS[1] + PROMPTS[2] + PROMPTS[1]      # 92 tokens: parts of 16, the last of 12
    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=2048, max_sequences=4,
                       exact=llamacpp.exact_settings("on", 2, 16))
    try:
        assert lm.exact.ubatch_tokens == 16 and "-ub 16" in lm.exact.cli(2)
        whole = lm.new_state()
        lm.prefill(whole, prompt)
        parted = lm.new_state()
        for end in range(16, len(prompt) + 16, 16):
            lm.prefill(parted, prompt[:end])
        assert np.array_equal(lm.logits_rows(parted, prompt + [5], 2), lm.logits_rows(whole, prompt + [5], 2))
        engine = VerifierEngine(lm, lm.eos_ids(), VerifierLimits(max_window=4, prefill_chunk_tokens=16))
        engine.begin_open("s", prompt)
        assert [engine.prefill_more("s") for _ in range(5)] == [None] * 5 and engine.prefill_more("s") > 0
        for _ in range(6):
            engine.verify("s", len(engine.committed("s")), [])
        alone = VerifierEngine(lm, lm.eos_ids())
        alone.open("s", prompt)
        for _ in range(6):
            alone.verify("s", len(alone.committed("s")), [])
        assert engine.committed("s") == alone.committed("s")
    finally:
        lm.close()
