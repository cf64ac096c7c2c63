"""vLLM's ignore_eos and min_tokens under speculation: the output is the target's own (EOS-masked) decoding.

The target is tiny:7, whose greedy continuation of "The cat" ends with EOS at its 34th token: what the masks and
the flag change is visible there. References decode the target alone, a token at a time, with vLLM's rule written
out (EOS logits at -inf while fewer than min_tokens tokens are generated).
"""
import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.backends.tokenizer import TextStream, load_tokenizer
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from edgespec.errors import InvalidArgument
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.generation import GenerationConfig, GenerationRequest, Generations, GenerationStats
from edgespec.loop.pool import VerifierPool
from edgespec.loop.stops import StopCutter
from edgespec.verify.eos import ending_ids, mask_eos
from edgespec.verify.sampling import Relaxation, SamplingParams
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy_eos, tiny

TARGET, DRAFT = "tiny:7", "tiny:7~1"
PROMPT = "The cat"
EOS_AT = 33          # index of the EOS in the target's greedy continuation of PROMPT


def target_alone(max_new: int, min_tokens: int = 0, ignore_eos: bool = False) -> tuple[int, ...]:
    return target_only_greedy_eos(TARGET, tuple(PROMPT.encode()), max_new, min_tokens, ignore_eos)


def generate(request: GenerationRequest, window: int = 3) -> tuple[list[int], str, GenerationStats]:
    endpoint = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    verifier = FailoverVerifier(VerifierPool([endpoint.address]), {endpoint.address: endpoint}, 5)
    tokenizer = load_tokenizer("bytes")
    gen = Generations(GenerationConfig(max_new_tokens=64,
                                       speculation=SpeculationConfig(window=window, max_window=8)), tokenizer,
                      lambda: TextStream(tokenizer), {"draft": InProcessDrafter(DrafterEngine(tiny(DRAFT)))}, verifier)

    async def go():
        return [event async for event in gen.run("s1", request)]
    _plan, *chunks, stats = asyncio.run(go())
    return [t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks), stats


def test_mask_eos_masks_only_rows_scoring_positions_below_min_length():
    rows = np.zeros((3, 6), dtype=np.float32)
    masked = mask_eos(rows, [9, 10, 11], {2, 5}, 11)
    assert masked[0, 2] == masked[0, 5] == masked[1, 2] == masked[1, 5] == -np.inf
    assert np.all(masked[2] == 0) and np.all(np.delete(masked[:2], [2, 5], axis=1) == 0)
    assert np.all(rows == 0)                                      # a copy: the raw logits stay for log-probabilities
    assert mask_eos(rows, [11, 12, 13], {2}, 11) is rows          # nothing below min_length: untouched
    assert ending_ids(SamplingParams(), {2}) == {2} and ending_ids(SamplingParams(ignore_eos=True), {2}) == set()


def test_the_target_ends_early_without_the_flags():
    tokens, _, stats = generate(GenerationRequest(PROMPT, 48))
    assert tokens == list(target_alone(48)) and len(tokens) == EOS_AT + 1 and stats.finish_reason == "eos"


@pytest.mark.parametrize("window", [0, 3, -1], ids=["target-only", "k3", "adaptive"])
def test_min_tokens_is_the_targets_own_output_with_eos_masked(window):
    tokens, _, stats = generate(GenerationRequest(PROMPT, 48, min_tokens=40), window)
    assert tokens == list(target_alone(48, min_tokens=40))
    assert TINY_EOS not in tokens[:40] and tokens[:EOS_AT] == list(target_alone(48)[:EOS_AT])
    assert stats.new_tokens == len(tokens)


@pytest.mark.parametrize("window", [0, 3], ids=["target-only", "k3"])
def test_ignore_eos_runs_past_eos_to_max_tokens(window):
    tokens, text, stats = generate(GenerationRequest(PROMPT, 48, params=SamplingParams(ignore_eos=True)), window)
    assert tokens == list(target_alone(48, ignore_eos=True)) and tokens[EOS_AT] == TINY_EOS
    assert (len(tokens), stats.finish_reason) == (48, "length")
    assert text == load_tokenizer("bytes").decode(tokens)


def test_an_eos_draft_below_min_length_is_never_accepted_greedy_or_sampled():
    """At the position where the target's own choice is EOS: without the mask EOS is committed; with it, never."""
    context = list(PROMPT.encode()) + list(target_alone(48)[:EOS_AT])
    engine = VerifierEngine(tiny(TARGET), [TINY_EOS])
    eos_seen = {False: 0, True: 0}
    for seed in range(12):
        for temperature in (0.0, 1.0):
            for masked in (False, True):
                params = SamplingParams(temperature=temperature, seed=seed,
                                        min_length=len(context) + 1 if masked else 0)
                engine.open("s", context, params)
                verdict = engine.verify("s", len(context), [TINY_EOS], params_fingerprint=params.fingerprint()).verdict
                eos_seen[masked] += verdict.next_token == TINY_EOS
                assert verdict.accepted == 0
    assert eos_seen == {False: eos_seen[False], True: 0} and eos_seen[False] >= 12   # greedy's 12 at least


def test_no_stop_sequence_ends_within_the_first_min_tokens():
    tokens = target_alone(48, min_tokens=40)
    full = load_tokenizer("bytes").decode(tokens)
    stop = full[:2]                                        # the first two characters, found nowhere else
    assert full.count(stop) == 1 and len(tokens) > 40
    _, early, stats = generate(GenerationRequest(PROMPT, 48, stop=(stop,)))
    assert (early, stats.finish_reason) == ("", "stop")
    _, text, stats = generate(GenerationRequest(PROMPT, 48, stop=(stop,), min_tokens=40))
    assert (text, stats.finish_reason) == (full, "eos" if TINY_EOS in tokens else "length")


def test_stop_cutter_counts_only_stops_ending_in_armed_text():
    cutter = StopCutter(["ab", "xyz"])
    assert cutter.push("..ab..x", armed=False) == "..ab.."   # "ab" ended while unarmed; "x" may begin "xyz"
    assert cutter.push("yz!") == ""                          # "xyz" began unarmed and ends armed: it counts
    assert cutter.matched == "xyz"
    cutter = StopCutter(["ab", "zab"])
    assert cutter.push("za", armed=False) == ""              # held: may begin "zab" (or "ab")
    assert cutter.push("b") == "" and cutter.matched == "zab"
    cutter = StopCutter(["ab"])
    assert cutter.push("a", armed=False) + cutter.push("b") == "" and cutter.matched == "ab"


@pytest.mark.parametrize("request_,field", [
    (GenerationRequest(PROMPT, 8, min_tokens=9), "min_tokens"),
    (GenerationRequest(PROMPT, 8, min_tokens=-1), "min_tokens"),
    (GenerationRequest(PROMPT, 8, params=SamplingParams(min_length=20)), "sampling.min_length"),
    (GenerationRequest(PROMPT, 8, min_tokens=2, params=SamplingParams(relaxation=Relaxation("cospec", margin=1.0))),
     "min_tokens"),
], ids=["over-max", "negative", "min-length-by-hand", "relaxed"])
def test_bad_min_tokens_are_refused(request_, field):
    with pytest.raises(InvalidArgument, match=field):
        generate(request_)


def test_the_vllm_backend_refuses_min_tokens_and_logprobs_at_open():
    """It cannot mask EOS inside vLLM's requests nor report log-probabilities: a clear refusal, not a wrong answer."""
    from edgespec.engines.vllm_verifier import VllmVerifierEngine
    from edgespec.errors import FailedPrecondition

    engine = VllmVerifierEngine(SimpleNamespace(vocab_size=320, kv_bytes_per_token=0), [TINY_EOS])
    for params in (SamplingParams(min_length=9), SamplingParams(logprobs=0)):
        with pytest.raises(FailedPrecondition, match="min_tokens" if params.min_length else "log-probabilities"):
            engine.open("s", [1, 2], params)
    assert engine.session_count == 0
