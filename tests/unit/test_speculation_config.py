"""SpeculationConfig (edgespec.loop.config): settings checked when made, and ``settled``, the one place of the rules
that turn off what a session cannot do, with a note where its config asked for it."""
from __future__ import annotations

import pytest

from edgespec.loop.config import SpeculationConfig
from edgespec.verify.sampling import Relaxation, SamplingParams

GREEDY = SamplingParams()
FAST = SpeculationConfig(tree_depth=2, cloud_draft="fallback")


@pytest.mark.parametrize("settings,word", [
    (dict(auto_policy="fixed:2"), "auto_policy"), (dict(cloud_draft="always"), "cloud_draft"),
    (dict(tree_depth=5), "tree_depth"), (dict(on_verifier_loss="retry"), "on_verifier_loss"),
    (dict(max_window=0), "max_window"), (dict(window=17), "window"), (dict(window=-2), "window"),
    (dict(target_steps=0), "target_steps")])
def test_bad_settings_are_refused_naming_the_setting(settings, word):
    with pytest.raises(ValueError, match=word):
        SpeculationConfig(**settings)


def test_settings_are_keywords_only():
    with pytest.raises(TypeError):
        SpeculationConfig(3)   # noqa - the point: no positional settings


def test_settling_keeps_what_the_session_can_do_and_settling_again_changes_nothing():
    plan = FAST.settled(GREEDY)
    assert plan == FAST and plan.settled(GREEDY) == plan
    assert FAST.settled(GREEDY, window=3) == SpeculationConfig(window=3, tree_depth=2, cloud_draft="fallback",
                                                               free_drafts=False)   # a fixed window: no free drafts
    assert FAST.settled(GREEDY, window=-1).window == -1   # -1 asks for the config's window


def test_what_a_session_cannot_do_is_turned_off_with_a_note_where_the_config_asked_for_it():
    lossy = SamplingParams(relaxation=Relaxation(method="diversed", weight=0.5))
    plan = FAST.settled(lossy)
    assert (plan.tree_depth, plan.cloud_draft, plan.free_drafts) == (0, "off", False)
    assert plan.notes == ("tree depth 2, cloud draft fallback off: relaxed verification",)
    assert plan.settled(lossy) == plan   # the note is not repeated

    plan = SpeculationConfig(pipeline=True, tree_depth=1).settled(GREEDY)
    assert (plan.tree_depth, plan.target_steps, plan.free_drafts) == (0, 1, False)
    assert plan.notes == ("tree depth 1 off: pipelined rounds",)

    coupled = SamplingParams(temperature=0.9, seed=1, coupled=True)
    assert SpeculationConfig().settled(coupled) == SpeculationConfig(free_drafts=False)   # nothing asked: no note

    plan = FAST.settled(GREEDY, window=0)   # target-only: asked for by the request, so no note
    assert (plan.window, plan.tree_depth, plan.cloud_draft, plan.free_drafts, plan.notes) == (0, 0, "off", False, ())

    plan = FAST.settled(GREEDY, trees="verifier v does not score token trees")
    assert plan.notes == ("tree depth 2, cloud draft fallback off: verifier v does not score token trees",)
    plan = FAST.settled(GREEDY, drafter_trees="drafter d does not draft token trees")
    assert (plan.tree_depth, plan.cloud_draft) == (0, "fallback")   # the verifier drafts for itself all the same


def test_the_verifier_s_largest_window_bounds_the_session_s_and_no_free_drafter_means_none():
    plan = SpeculationConfig(window=12).settled(GREEDY, max_draft=8)
    assert (plan.window, plan.max_window) == (8, 8)
    assert SpeculationConfig().settled(GREEDY, window=16, max_draft=4).window == 4
    assert not SpeculationConfig().settled(GREEDY, free=False).free_drafts
