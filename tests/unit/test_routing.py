"""A session routed across drafters stays exact, learns from its verdicts and switches once."""
import asyncio

import pytest

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.drafter import DrafterEngine
from edgespec.control.router import Arm, Router, SessionRouting, request_features
from edgespec.loop.routed_drafter import RoutedDrafter
from edgespec.loop.session import SessionLog
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.window import FixedWindow
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny

TARGET = "tiny:7"


def routed_run(first: str, prompt: bytes, max_new: int = 60, pipeline: bool = False, unrelated_known: bool = False):
    ports = {"close": InProcessDrafter(DrafterEngine(tiny("tiny:7~1"))),
             "unrelated": InProcessDrafter(DrafterEngine(tiny("tiny:9")))}
    # Unless told otherwise, the router believes both drafters equal: only what the session observes
    # can tell them apart.
    router = Router([Arm("close", 0.01), Arm("unrelated", 0.01)], verify_wall_seconds=0.05, explore=0.0)
    x = request_features(prompt.decode())
    if unrelated_known:   # earlier sessions taught the router that this drafter rarely agrees
        router.arms["unrelated"].update(x, 0.02, weight=20)
    routed = RoutedDrafter(ports, SessionRouting(router, x, first))
    verifier = VerifierEngine(tiny(TARGET), [TINY_EOS])
    log = SessionLog(list(prompt), max_new, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s", list(prompt))
        async for _ in speculate(log, "s", routed, InProcessVerifier(verifier), FixedWindow(4),
                                 config=SpeculationConfig(pipeline=pipeline)):
            pass
        await routed.close("s")

    asyncio.run(go())
    return log, routed, ports


@pytest.mark.parametrize("pipeline", [False, True], ids=["blocking", "pipelined"])
def test_routed_output_is_exact_and_a_poor_first_choice_is_switched(pipeline):
    prompt = b"def add(a, b):"
    log, routed, ports = routed_run("unrelated", prompt, pipeline=pipeline)
    assert log.generated == target_only_greedy(TARGET, list(prompt), 60)
    assert routed.used == ["unrelated", "close"] and routed.label == "unrelated>close"
    # both drafters' sessions were closed
    assert not ports["close"].engine._sessions and not ports["unrelated"].engine._sessions


def test_a_good_first_choice_is_kept_and_its_acceptance_is_what_the_verifier_saw():
    prompt = b"Speculative decoding is"
    log, routed, _ = routed_run("close", prompt, unrelated_known=True)
    assert log.generated == target_only_greedy(TARGET, list(prompt), 60)
    assert routed.used == ["close"]
    routing = routed.routing
    # what the routing credited to the drafter is what the verifier decided
    # (the first token is a target-only step: the drafter had every round but that one)
    assert routing.accepted["close"] == log.stats.accepted and routing.rounds["close"] == log.stats.rounds - 1
