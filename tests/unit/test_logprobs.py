"""Log-probabilities of the output: the target's own log-softmax at each committed token and its most likely
alternatives, whatever the windows (chains, target-only steps, token trees, pipelining), greedy or sampled,
checked against the target run alone over the same text."""
import asyncio

import numpy as np
import pytest
import torch

from edgespec.api.openai_compat import ApiError, logprobs_body, parse_chat, parse_completion
from edgespec.backends.registry import TINY_EOS
from edgespec.backends.tokenizer import TextStream, load_tokenizer
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from edgespec.errors import InvalidArgument
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.generation import GenerationConfig, GenerationRequest, Generations
from edgespec.loop.pool import VerifierPool
from edgespec.net.wire import logprobs_from_pb, logprobs_to_pb
from edgespec.verify.logprobs import TokenLogprob, token_logprobs
from edgespec.verify.sampling import SamplingParams
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy_eos, tiny

TARGET, DRAFT = "tiny:7", "tiny:7~1"
PROMPT = "The cat"
TOP = 5


def target_alone_logprobs(tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V]: the target alone over the prompt and ``tokens`` in one forward, log-softmax at T = 1,
    row i scoring tokens[i]."""
    prompt = list(PROMPT.encode())
    with torch.no_grad():
        logits = tiny(TARGET).model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.double(), dim=-1)


def assert_target_logprobs(tokens: list[int], entries) -> None:
    reference = target_alone_logprobs(tokens)
    assert [e.token for e in entries] == tokens
    for row, entry in zip(reference, entries):
        assert entry.logprob == pytest.approx(float(row[entry.token]), abs=1e-4)
        values, ids = row.topk(TOP)
        assert [t for t, _ in entry.top] == ids.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


def generate(request: GenerationRequest, **config):
    endpoint = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    verifier = FailoverVerifier(VerifierPool([endpoint.address]), {endpoint.address: endpoint}, 5)
    tokenizer = load_tokenizer("bytes")
    gen = Generations(GenerationConfig(max_new_tokens=64,
                                       speculation=SpeculationConfig(max_window=8, **config)), tokenizer,
                      lambda: TextStream(tokenizer), {"draft": InProcessDrafter(DrafterEngine(tiny(DRAFT)), q_ids=16)},
                      verifier)

    async def go():
        return [event async for event in gen.run("s1", request)]
    _plan, *chunks, stats = asyncio.run(go())
    return chunks, stats


def test_token_logprobs_are_the_rows_log_softmax_with_the_top_tokens_in_order():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(4, 50)).astype(np.float32) * 4
    rows[2, [7, 9]] = rows[2].max() + 1            # a tie at the top: the lower id first
    entries = token_logprobs(rows, [1, 2, 3, 4], top=3)
    reference = torch.log_softmax(torch.tensor(rows, dtype=torch.float64), dim=-1)
    for i, entry in enumerate(entries):
        assert entry.token == i + 1 and entry.logprob == pytest.approx(float(reference[i, i + 1]), abs=1e-6)
        assert [t for t, _ in entry.top] == sorted(range(50), key=lambda t: (-rows[i, t], t))[:3]
    assert [t for t, _ in entries[2].top[:2]] == [7, 9]
    assert token_logprobs(rows, [1], top=0)[0].top == () and token_logprobs(rows, []) == ()
    assert logprobs_from_pb(logprobs_to_pb(entries))[1].top[0][0] == entries[1].top[0][0]


@pytest.mark.parametrize("config", [dict(window=0), dict(window=3),
                                    dict(window=3, tree_depth=1), dict(window=3, pipeline=True),
                                    dict(window=-1)],
                         ids=["target-only-steps", "chain", "tree", "pipelined", "adaptive"])
def test_greedy_logprobs_are_the_targets_own(config):
    chunks, stats = generate(GenerationRequest(PROMPT, 30, params=SamplingParams(logprobs=TOP)), **config)
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == list(target_only_greedy_eos(TARGET, tuple(PROMPT.encode()), 30))
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    entries = [e for c in chunks for e in c.logprobs]
    assert_target_logprobs(tokens, entries)
    assert all(e.top[0][0] == e.token for e in entries)                 # greedy: each token is the top one
    assert sum(e.logprob for e in entries) / len(entries) == pytest.approx(stats.target_logprob, abs=1e-4)


@pytest.mark.parametrize("coupled", [False, True], ids=["standard", "coupled"])
def test_sampled_logprobs_are_the_targets_own_at_the_sampled_tokens(coupled):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, coupled=coupled, logprobs=TOP)
    chunks, _ = generate(GenerationRequest(PROMPT, 30, params=params), window=3)
    tokens = [t for c in chunks for t in c.token_ids]
    assert_target_logprobs(tokens, [e for c in chunks for e in c.logprobs])
    assert tokens != list(target_only_greedy_eos(TARGET, tuple(PROMPT.encode()), 30))   # sampled, not greedy


def test_logprobs_stay_raw_under_min_tokens_and_follow_a_stop_cut():
    """min_tokens masks EOS for the choice, not in the reported log-probabilities; a stop sequence cuts them with
    the tokens."""
    eos_at = 33
    chunks, _ = generate(GenerationRequest(PROMPT, 40, min_tokens=40, params=SamplingParams(logprobs=2)),
                         window=3)
    entries = [e for c in chunks for e in c.logprobs]
    assert entries[eos_at].top[0][0] == TINY_EOS and entries[eos_at].token != TINY_EOS
    chunks, stats = generate(GenerationRequest(PROMPT, 40, stop=("+",), params=SamplingParams(logprobs=0)),
                             window=3)
    tokens = [t for c in chunks for t in c.token_ids]
    assert stats.finish_reason == "stop" and tokens[-1] == ord("+")
    assert [e.token for c in chunks for e in c.logprobs] == tokens and all(not e.top for c in chunks
                                                                          for e in c.logprobs)


def test_without_logprobs_verdicts_carry_none():
    chunks, _ = generate(GenerationRequest(PROMPT, 10), window=3)
    assert all(c.logprobs == () for c in chunks)
    with pytest.raises(InvalidArgument, match="logprobs"):
        generate(GenerationRequest(PROMPT, 4, params=SamplingParams(logprobs=21)))


# -- the OpenAI shapes ---------------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TEXT = {"prompt": "hi", "max_tokens": 4}


def test_logprobs_parse_as_openai_and_vllm_send_them():
    assert parse_chat(CHAT).logprobs is None
    assert parse_chat({**CHAT, "logprobs": True}).logprobs == 0
    assert parse_chat({**CHAT, "logprobs": True, "top_logprobs": 20}).logprobs == 20
    assert parse_chat({**CHAT, "logprobs": False, "top_logprobs": 0}).logprobs is None
    assert parse_completion({**TEXT, "logprobs": None}).logprobs is None   # what `vllm bench serve` sends
    assert parse_completion({**TEXT, "logprobs": 0}).logprobs == 0
    assert parse_completion({**TEXT, "logprobs": 5}).logprobs == 5


@pytest.mark.parametrize("parse,body,param", [
    (parse_chat, {**CHAT, "logprobs": "yes"}, "logprobs"),
    (parse_chat, {**CHAT, "logprobs": 1}, "logprobs"),
    (parse_chat, {**CHAT, "top_logprobs": 2}, "top_logprobs"),                     # without logprobs: true
    (parse_chat, {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (parse_chat, {**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    (parse_chat, {**CHAT, "logprobs": True, "top_logprobs": "2"}, "top_logprobs"),
    (parse_completion, {**TEXT, "logprobs": True}, "logprobs"),
    (parse_completion, {**TEXT, "logprobs": -1}, "logprobs"),
    (parse_completion, {**TEXT, "logprobs": 21}, "logprobs"),
    (parse_completion, {**TEXT, "logprobs": 1.5}, "logprobs"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_logprobs_are_a_400_naming_the_parameter(parse, body, param):
    with pytest.raises(ApiError) as raised:
        parse(body)
    assert (raised.value.status, raised.value.param) == (400, param)


def test_logprobs_bodies_in_openais_shapes():
    entries = [TokenLogprob(104, -0.5, ((104, -0.5), (105, -1.5))), TokenLogprob(105, -float("inf"), ((104, -0.1),))]
    chat = logprobs_body(parse_chat({**CHAT, "logprobs": True, "top_logprobs": 1}), entries, chr)
    assert chat == {"content": [
        {"token": "h", "logprob": -0.5, "bytes": [104],
         "top_logprobs": [{"token": "h", "logprob": -0.5, "bytes": [104]}]},
        {"token": "i", "logprob": -9999.0, "bytes": [105], "top_logprobs": [{"token": "h", "logprob": -0.1,
                                                                              "bytes": [104]}]}]}
    text = logprobs_body(parse_completion({**TEXT, "logprobs": 2}), entries, chr, text_offset=3)
    assert text == {"tokens": ["h", "i"], "token_logprobs": [-0.5, -9999.0],
                    "top_logprobs": [{"h": -0.5, "i": -1.5}, {"i": -9999.0, "h": -0.1}], "text_offset": [3, 4]}
    assert logprobs_body(parse_chat(CHAT), entries, chr) is None
