"""Capabilities (edgespec.control.capabilities): what a verifier's or a drafter's engine reports in Info, and a
session's plan (the settled SpeculationConfig, the first event of a generation) from what each verifier of the pool
and the drafter do when the session opens (trees where all verifiers score them and the drafter drafts them, cloud
drafting where all verifiers score trees; a sampling mode one of them cannot do refused up front), with the engines'
checks left as guards."""
from __future__ import annotations

import asyncio
import logging
import socket
from types import SimpleNamespace

import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.backends.tokenizer import TextStream, load_tokenizer
from edgespec.control.capabilities import Capabilities
from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from edgespec.engines.vllm_verifier import VllmVerifierEngine
from edgespec.errors import FailedPrecondition
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.generation import GenerationConfig, GenerationRequest, Generations, GenerationStats, TextChunk
from edgespec.loop.pool import VerifierPool
from edgespec.verify.sampling import Relaxation, SamplingParams
from harness.inprocess import InProcessDrafter, InProcessVerifier
from tests.tiny import target_only_greedy, tiny

TARGET, DRAFT = "tiny:7", "tiny:7~1"


def test_capabilities_are_read_from_an_info_and_name_what_a_session_lacks():
    every, none = Capabilities.every(), Capabilities()
    assert Capabilities.of(None) == none and Capabilities.of(every) == every
    assert Capabilities.of(SimpleNamespace(token_trees=True, coupled=0)) == Capabilities(token_trees=True)
    assert every.lacks(SamplingParams(temperature=0.9, seed=1, coupled=True, logprobs=2, min_length=5)) is None
    assert none.lacks(SamplingParams()) is None and none.lacks(SamplingParams(temperature=0.8, seed=1)) is None
    assert none.lacks(SamplingParams(temperature=0.9, seed=1, coupled=True)) == "coupled sampling"
    assert none.lacks(SamplingParams(relaxation=Relaxation(method="diversed", weight=0.5))) == "relaxed verification"
    assert none.lacks(SamplingParams(min_length=9)) == "min_tokens"
    assert none.lacks(SamplingParams(logprobs=0)) == "log-probabilities"


def test_each_engine_reports_what_it_does():
    assert VerifierEngine(tiny(TARGET), [TINY_EOS]).capabilities() == Capabilities.every()   # torch: all of it
    vllm = VllmVerifierEngine(SimpleNamespace(vocab_size=320, kv_bytes_per_token=0), [TINY_EOS])
    assert vllm.capabilities() == Capabilities()
    # a drafter reports token trees only: the torch backend drafts them
    assert DrafterEngine(tiny(DRAFT)).capabilities() == Capabilities(token_trees=True)


def closed_port() -> str:
    """An address nothing listens on: a verifier of the pool that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def generate(gen: Generations, request: GenerationRequest
                   ) -> tuple[list[int], GenerationStats, SpeculationConfig]:
    """(tokens, stats, the plan), the plan first of the events."""
    events = [event async for event in gen.run("s", request)]
    plan, *chunks, stats = events
    assert isinstance(plan, SpeculationConfig) and isinstance(stats, GenerationStats)
    assert all(isinstance(chunk, TextChunk) for chunk in chunks)
    return [t for chunk in chunks for t in chunk.token_ids], stats, plan


def run(gen: Generations, request: GenerationRequest) -> tuple[list[int], GenerationStats, SpeculationConfig]:
    return asyncio.run(generate(gen, request))


def generations(endpoints: dict, drafter, **config) -> Generations:
    tokenizer = load_tokenizer("bytes")
    verifier = FailoverVerifier(VerifierPool(list(endpoints)), endpoints, 5)
    return Generations(GenerationConfig(max_new_tokens=64,
                                        speculation=SpeculationConfig(max_window=8, **config)), tokenizer,
                       lambda: TextStream(tokenizer), {"draft": drafter}, verifier)


def test_trees_where_every_verifier_scores_them_and_chains_while_one_has_not_answered(caplog):
    from services.coordinator.clients import GrpcVerifier

    prompt, new = "def add(a, b):", 24
    expected = target_only_greedy(TARGET, list(prompt.encode()), new)
    endpoint = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    drafter = InProcessDrafter(DrafterEngine(tiny(DRAFT)))
    tokens, stats, plan = run(generations({endpoint.address: endpoint}, drafter, tree_depth=2),
                              GenerationRequest(prompt, new, window=3))
    assert tokens == expected and stats.drafted_tokens > 3 * stats.rounds    # chains of 3 and their runner-ups
    assert (plan.window, plan.tree_depth, plan.notes) == (3, 2, ())

    down = closed_port()

    async def with_one_down():   # a gRPC client needs its event loop
        pool = {endpoint.address: endpoint, down: GrpcVerifier(down, 5)}
        gen = generations(pool, drafter, tree_depth=2, cloud_draft="fallback")
        return await generate(gen, GenerationRequest(prompt, new, window=3))
    with caplog.at_level(logging.INFO, logger="edgespec.loop.generation"):
        tokens, stats, plan = asyncio.run(with_one_down())
    assert tokens == expected and 0 < stats.drafted_tokens <= 3 * stats.rounds   # chains only
    reason = f"tree depth 2, cloud draft fallback off: verifier {down} has not answered Info yet"
    assert (plan.tree_depth, plan.cloud_draft, plan.notes) == (0, "off", (reason,))
    assert reason in caplog.text   # the session's log line says it too


def test_a_drafter_that_drafts_no_trees_gets_chains_by_its_info_and_cloud_drafting_stays():
    """The n-gram drafter drafts chains only: its Info says so, and the plan has chains from the first window (the
    verifier still drafts for itself where asked: that needs no drafter)."""
    from edgespec.backends.ngram import NgramDrafter

    prompt, new = "def add(a, b):", 16
    endpoint = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    drafter = InProcessDrafter(DrafterEngine(NgramDrafter(320)))
    assert asyncio.run(drafter.info()).capabilities == Capabilities()
    tokens, _, plan = run(generations({endpoint.address: endpoint}, drafter, tree_depth=2, cloud_draft="fallback"),
                          GenerationRequest(prompt, new, window=3))
    assert tokens == target_only_greedy(TARGET, list(prompt.encode()), new)
    assert (plan.tree_depth, plan.cloud_draft, plan.notes) == (0, "fallback", ("tree depth 2 off: drafter draft does "
                                                                               "not draft token trees",))


def test_a_pool_whose_verifier_scores_no_trees_plans_chains_and_a_tree_sent_anyway_is_refused():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")
    from edgespec.backends import llamacpp
    from edgespec.control.window import FixedWindow
    from edgespec.errors import InvalidArgument
    from edgespec.loop.session import SessionLog
    from edgespec.loop.speculation import speculate

    lm = llamacpp.load("smollm2", threads=2, ctx_tokens=2048, max_sequences=4)
    try:
        engine = VerifierEngine(lm, lm.eos_ids())
        assert engine.capabilities() == Capabilities(coupled=True, relaxed=True, min_tokens=True, logprobs=True)
        endpoint = InProcessVerifier(engine)
        # the plan, settled from its Info before the first window: chains and edge drafting
        gen = generations({endpoint.address: endpoint}, InProcessDrafter(DrafterEngine(lm)), tree_depth=2,
                          cloud_draft="on")
        _, _, plan = run(gen, GenerationRequest("def f(x):", 4, window=3))
        assert (plan.tree_depth, plan.cloud_draft) == (0, "off")
        assert plan.notes == (f"tree depth 2, cloud draft on off: verifier {endpoint.address} does not score token "
                              "trees",)

        # the engine's guard: a tree window sent to it all the same fails the session and changes nothing
        prompt = list(range(100, 130))
        log = SessionLog(prompt, 16, frozenset(lm.eos_ids()))
        engine.open("s", prompt)

        async def trees():
            async for _ in speculate(log, "s", InProcessDrafter(DrafterEngine(lm)), endpoint, FixedWindow(3),
                                     config=SpeculationConfig(tree_depth=2)):
                pass
        with pytest.raises(InvalidArgument, match="score token trees"):
            asyncio.run(trees())
        # the first token is a target-only step; the tree window after it changed nothing
        assert len(log.generated) == 1 and engine.committed("s") == prompt + log.generated
    finally:
        lm.close()


def test_a_sampling_mode_a_verifier_of_the_pool_cannot_do_is_refused_before_anything_opens():
    """The vLLM engine does no coupled sampling: with it in the pool, a coupled request is refused up front,
    though the verifier the session would open on first (the torch one) does it."""
    torch_endpoint = InProcessVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]), "torch")
    vllm = InProcessVerifier(VllmVerifierEngine(SimpleNamespace(vocab_size=320, kv_bytes_per_token=0), [TINY_EOS]),
                             "vllm")
    gen = generations({"torch": torch_endpoint, "vllm": vllm}, InProcessDrafter(DrafterEngine(tiny(DRAFT))))
    with pytest.raises(FailedPrecondition, match="verifier vllm .* does not do coupled sampling"):
        run(gen, GenerationRequest("hi", 8, window=3,
                                   params=SamplingParams(temperature=0.9, seed=1, coupled=True)))
    assert torch_endpoint.engine.usage().sessions == 0   # nothing was opened
    tokens, _, _ = run(gen, GenerationRequest("hi", 8, window=3))   # greedy: both do it
    assert tokens == target_only_greedy(TARGET, list(b"hi"), 8)
