"""The drafter router decides from features and learns from acceptance."""
import pytest

from edgespec.control.router import FEATURES, Arm, Router, SessionRouting, request_features

CODE_EDIT = "Add a docstring to this function:\n\ndef total(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t"


def trained(name: str, cost: float, alpha_by_category: dict[str, float], n: int = 40) -> Arm:
    arm = Arm(name, cost)
    prompts = {"code": CODE_EDIT, "qa": "What is the capital of France?", "chat": "Suggest a name for my cat."}
    for category, alpha in alpha_by_category.items():
        for _ in range(n):
            arm.update(request_features(prompts[category]), alpha)
    return arm


def test_features_see_category_length_and_code():
    x = request_features(CODE_EDIT)
    assert x.shape == (len(FEATURES),) and x[FEATURES.index("code")] == 1 and x[FEATURES.index("code_block")] > 0
    q = request_features("What causes the seasons?")
    assert q[FEATURES.index("qa")] == 1 and q[FEATURES.index("code_block")] == 0
    assert request_features("Tell me a joke.")[FEATURES.index("chat")] == 1


def test_router_picks_the_faster_drafter_per_category():
    """n-gram: free and strong on code edits, weak on chat; the model: costly, steady everywhere."""
    ngram = trained("ngram", 0.0005, {"code": 0.8, "qa": 0.1, "chat": 0.05})
    model = trained("draft", 0.04, {"code": 0.75, "qa": 0.6, "chat": 0.55})
    router = Router([ngram, model], verify_wall_seconds=0.6, explore=0.0)
    assert router.choose(request_features(CODE_EDIT)).drafter == "ngram"
    assert router.choose(request_features("What is the capital of France?")).drafter == "draft"
    assert router.choose(request_features("Suggest a name for my cat.")).drafter == "draft"


def test_cost_matters_when_acceptance_ties():
    cheap, costly = trained("cheap", 0.01, {"qa": 0.6}), trained("costly", 0.2, {"qa": 0.6})
    decision = Router([cheap, costly], explore=0.0).choose(request_features("What is the capital of France?"))
    assert decision.drafter == "cheap" and decision.rates["cheap"] > decision.rates["costly"]


def test_an_untried_arm_gets_an_optimism_bonus():
    known = trained("known", 0.02, {"chat": 0.5})
    x = request_features("Suggest a name for my cat.")
    assert Arm("new", 0.02).predict(x, explore=1.0) > Arm("new", 0.02).predict(x, explore=0.0)
    assert Router([known, Arm("new", 0.02, prior_alpha=0.5)], explore=1.0).choose(x).drafter == "new"


def test_session_switches_once_when_observed_acceptance_is_poor():
    ngram = trained("ngram", 0.0005, {"code": 0.8})
    model = trained("draft", 0.04, {"code": 0.7})
    router = Router([ngram, model], verify_wall_seconds=0.6, explore=0.0)
    x = request_features(CODE_EDIT)
    routing = SessionRouting(router, x, router.choose(x).drafter)
    assert routing.current == "ngram"
    for _ in range(3):
        routing.observe("ngram", 4, 0, 0.001)
    assert routing.maybe_switch() is None            # too few rounds yet
    routing.observe("ngram", 4, 0, 0.001)
    decision = routing.maybe_switch()
    assert decision is not None and decision.drafter == "draft" and routing.current == "draft"
    assert decision.reason.startswith("switch: ngram observed")
    for _ in range(8):
        routing.observe("draft", 4, 0, 0.16)
    assert routing.maybe_switch() is None            # at most one switch per session


def test_session_keeps_a_drafter_that_does_well():
    router = Router([trained("ngram", 0.0005, {"code": 0.5}), trained("draft", 0.04, {"code": 0.7})], explore=0.0)
    x = request_features(CODE_EDIT)
    routing = SessionRouting(router, x, "draft")
    for _ in range(6):
        routing.observe("draft", 4, 4, 0.16)
    assert routing.maybe_switch() is None


def test_finishing_a_session_teaches_the_router():
    arm = Arm("ngram", 0.001)
    router = Router([arm, trained("draft", 0.04, {"qa": 0.6})], explore=0.0)
    x = request_features("What is the capital of France?")
    before = arm.predict(x)
    routing = SessionRouting(router, x, "ngram")
    for _ in range(20):
        routing.observe("ngram", 4, 0, 0.004)
    routing.finish()
    assert arm.predict(x) < before


def test_weights_round_trip_and_unknown_arms_start_from_priors():
    router = Router([trained("ngram", 0.001, {"code": 0.8})])
    arms = Router.arms_from_json(router.to_json(), ["ngram", "smollm2"])
    x = request_features(CODE_EDIT)
    assert arms[0].predict(x) == pytest.approx(router.arms["ngram"].predict(x))
    assert arms[1].predict(x) == pytest.approx(0.5, abs=0.2) and arms[1].name == "smollm2"
    with pytest.raises(ValueError, match="features"):
        Router.arms_from_json({"features": ["bias"], "arms": {}}, ["x"])


def test_a_router_needs_an_arm():
    with pytest.raises(ValueError):
        Router([])
