"""The coordinator's generation as a library: no gRPC, in-process engines as its ports."""
import random

from edgespec.net.wire import params_from_pb, params_to_pb
from edgespec.verify.sampling import Relaxation, SamplingParams, as_float32, float32_decimal


def test_as_float32_is_what_a_peer_reads_from_the_wire():
    """The coordinator normalises its own params in core types exactly as a protobuf round trip would."""
    rng = random.Random(5)
    for _ in range(200):
        relax = rng.choice([Relaxation(), Relaxation("diversed", weight=round(rng.uniform(0, 0.95), rng.randint(1, 9))),
                            Relaxation("diversed", weight=rng.uniform(0, 0.95), task="code"),
                            Relaxation("cospec", margin=rng.uniform(0, 20))])
        params = SamplingParams(temperature=rng.choice([0.0, 0.8, rng.uniform(0, 3)]), top_k=rng.randint(0, 50),
                                top_p=rng.choice([1.0, 0.9, rng.uniform(0.01, 1)]), seed=rng.getrandbits(63),
                                relaxation=relax, coupled=rng.random() < 0.2)
        assert as_float32(params) == params_from_pb(params_to_pb(params))
        assert as_float32(as_float32(params)) == as_float32(params)
        assert as_float32(params).fingerprint() == params_from_pb(params_to_pb(params)).fingerprint()
    assert float32_decimal(0.8) == 0.8 and float32_decimal(0.123456789) == 0.12345679


# -- the generation, on tiny models in process ------------------------------------------------------------

import asyncio  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

from edgespec.backends.registry import TINY_EOS  # noqa: E402
from edgespec.backends.tokenizer import TextStream, load_tokenizer  # noqa: E402
from edgespec.engines.drafter import DrafterEngine  # noqa: E402
from edgespec.engines.verifier import VerifierEngine  # noqa: E402
from edgespec.errors import InvalidArgument, ResourceExhausted  # noqa: E402
from edgespec.loop.failover import FailoverVerifier  # noqa: E402
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.generation import (GenerationConfig, GenerationRequest, Generations,  # noqa: E402
                                      GenerationStats, TextChunk)
from edgespec.loop.pool import VerifierPool  # noqa: E402
from edgespec.net.security import SessionOwners  # noqa: E402
from edgespec.v1 import coordinator_pb2  # noqa: E402
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny  # noqa: E402

TARGET, DRAFT = "tiny:7", "tiny:7~1"
PROMPT = "def add(a, b):"


class Endpoint(InProcessVerifier):
    """An in-process verifier that also answers Info, and records the params it was opened with."""

    def __init__(self, engine, address="in-process"):
        super().__init__(engine, address)
        self.opened = []

    async def open(self, session_id, tokens, params=None):
        self.opened.append(params)
        await super().open(session_id, tokens, params)


def generations(config=GenerationConfig(max_new_tokens=64,
                                        speculation=SpeculationConfig(window=3, max_window=8)), slots=None):
    endpoint = Endpoint(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    verifier = FailoverVerifier(VerifierPool([endpoint.address]), {endpoint.address: endpoint}, 5)
    tokenizer = load_tokenizer("bytes")
    return Generations(config, tokenizer, lambda: TextStream(tokenizer),
                       {"draft": InProcessDrafter(DrafterEngine(tiny(DRAFT)))}, verifier, slots), endpoint


def collect(gen, request, session_id="s1"):
    async def go():
        return [event async for event in gen.run(session_id, request)]
    return asyncio.run(go())


def test_a_generation_is_the_targets_greedy_output_with_its_text_and_stats():
    owners = SessionOwners(1)
    gen, _ = generations(slots=owners)
    events = collect(gen, GenerationRequest(PROMPT, 40))
    plan, *chunks, stats = events   # the plan first: the coordinator's window, nothing turned off
    assert plan == SpeculationConfig(window=3, max_window=8, free_drafts=False)
    assert all(isinstance(c, TextChunk) for c in chunks) and isinstance(stats, GenerationStats)
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == target_only_greedy(TARGET, list(PROMPT.encode()), 40)
    assert "".join(c.text for c in chunks) == load_tokenizer("bytes").decode(tokens)
    sizes = [len(c.token_ids) for c in chunks if c.token_ids]
    assert [c.position for c in chunks if c.token_ids] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert all(c.generated == c.position + len(c.token_ids) for c in chunks)
    assert (stats.new_tokens, stats.prompt_tokens, stats.verification, stats.drafter) == (
        len(tokens), len(PROMPT), "greedy", "draft")
    assert stats.rounds >= 1 and stats.finish_reason in ("eos", "length") and not stats.pipelined
    assert owners.open_sessions("anonymous") == 0       # the slot is free again before the stats are seen
    # The servicer builds protobuf's messages from these by field name.
    assert {f.name for f in coordinator_pb2.GenerationStats.DESCRIPTOR.fields} == set(GenerationStats.__dataclass_fields__)
    assert {f.name for f in coordinator_pb2.TokenChunk.DESCRIPTOR.fields} == set(TextChunk.__dataclass_fields__)
    assert {f.name for f in coordinator_pb2.SpeculationPlan.DESCRIPTOR.fields} == set(
        SpeculationConfig.__dataclass_fields__)


@pytest.mark.parametrize("request_,field", [
    (GenerationRequest("  ", 4), "prompt"),
    (GenerationRequest(PROMPT, 0), "max_new_tokens"),
    (GenerationRequest(PROMPT, 65), "max_new_tokens"),
    (GenerationRequest(PROMPT, 4, window=9), "window"),
    (GenerationRequest(PROMPT, 4, params=SamplingParams(temperature=-1)), "temperature"),
    (GenerationRequest("x" * 100, 4), "prompt"),
    (GenerationRequest(PROMPT, 4, resume=(1, 2, 3, 4)), "resume_token_ids"),
    (GenerationRequest(PROMPT, 4, resume=(TINY_EOS,)), "resume_token_ids"),
    (GenerationRequest(PROMPT, 4, resume=(10 ** 6,)), "resume_token_ids"),
], ids=["empty", "zero", "over-limit", "window", "temperature", "long-prompt", "resume-length", "resume-eos",
        "resume-vocab"])
def test_invalid_requests_are_refused_before_taking_a_slot(request_, field):
    owners = SessionOwners(1)
    gen, endpoint = generations(GenerationConfig(max_new_tokens=64, max_prompt_tokens=50,
                                                 speculation=SpeculationConfig(max_window=8)), owners)
    with pytest.raises(InvalidArgument, match=field):
        collect(gen, request_)
    assert owners.open_sessions("anonymous") == 0 and endpoint.opened == []


def test_a_client_past_its_slots_is_refused_after_validation():
    owners = SessionOwners(1)
    owners.claim("elsewhere")
    gen, endpoint = generations(slots=owners)
    with pytest.raises(InvalidArgument):
        collect(gen, GenerationRequest("", 4))     # the request's fault is reported first
    with pytest.raises(ResourceExhausted):
        collect(gen, GenerationRequest(PROMPT, 4))
    assert endpoint.opened == []


def test_a_per_task_weight_is_resolved_and_read_as_the_peers_read_it():
    gen, endpoint = generations()
    relaxed = SamplingParams(relaxation=Relaxation("diversed", task="auto"))
    *_, stats = collect(gen, GenerationRequest(PROMPT, 8, params=relaxed))
    [opened] = endpoint.opened
    assert opened.relaxation.task == "code" and opened.relaxation.weight > 0
    assert opened == as_float32(opened) == params_from_pb(params_to_pb(opened))
    assert stats.lossy and stats.verification.startswith("relaxed-diversed(task code")


def test_the_verifiers_forward_profile_becomes_the_coordinators_cost_of_untried_windows():
    class Profiled(Endpoint):
        async def info(self):
            return SimpleNamespace(**vars(await super().info()), forward_seconds=[0.01, 0.03, 0.05, 0.02])

    gen, _ = generations()
    endpoint = Profiled(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    gen.verifier = FailoverVerifier(VerifierPool([endpoint.address]), {endpoint.address: endpoint}, 5)
    collect(gen, GenerationRequest(PROMPT, 8, window=0))       # target-only rounds: window 0 measured only
    assert gen.costs.profile == {1: 0.01, 2: 0.03, 3: 0.05, 4: 0.02}
    assert gen.costs.verify_estimate(3) < gen.costs.verify_estimate(2)   # the profile's shape, not a straight line


def test_a_verifiers_far_profile_costs_the_windows_of_sessions_past_its_far_positions():
    class Profiled(Endpoint):
        async def info(self):
            return SimpleNamespace(**vars(await super().info()), forward_seconds=[0.01, 0.03, 0.05],
                                   far_positions=len(PROMPT) + 4, far_forward_seconds=[0.02, 0.021, 0.03])

    gen, _ = generations()
    endpoint = Profiled(VerifierEngine(tiny(TARGET), [TINY_EOS]))
    gen.verifier = FailoverVerifier(VerifierPool([endpoint.address]), {endpoint.address: endpoint}, 5)
    collect(gen, GenerationRequest(PROMPT, 8, window=0))       # crosses far_positions half-way
    assert gen.costs.far and gen.costs.profile == {1: 0.02, 2: 0.021, 3: 0.03}
    assert gen.costs.other_side[0] == {1: 0.01, 2: 0.03, 3: 0.05} and gen.costs.other_side[1]   # near: measured too
