"""Greedy verification table tests: the pure rule, no models."""
import pytest

from edgespec.verify.greedy import Verdict, common_prefix_length, verify_greedy

EOS = 99

CASES = [
    # scenario,              draft,          target argmax (k + 1),  eos,    accepted, next
    ("perfect_match_bonus",  [1, 2, 3],      [1, 2, 3, 4],           (),     3,        4),
    ("early_mismatch",       [1, 2, 3],      [7, 2, 3, 4],           (),     0,        7),
    ("late_mismatch",        [1, 2, 3],      [1, 2, 8, 4],           (),     2,        8),
    ("empty_window",         [],             [5],                    (),     0,        5),
    ("single_token_reject",  [5],            [6, 1],                 (),     0,        6),
    ("eos_inside_window",    [1, EOS, 3],    [1, EOS, 3, 4],         {EOS},  1,        EOS),
    ("eos_at_window_start",  [EOS, 2],       [EOS, 2, 3],            {EOS},  0,        EOS),
    ("eos_draft_rejected",   [1, EOS],       [1, 2, 3],              {EOS},  1,        2),
    ("target_eos_recovered", [1, 2],         [1, EOS, 3],            {EOS},  1,        EOS),
    ("match_after_mismatch_ignored", [1, 2, 3], [1, 9, 3, 4],        (),     1,        9),
]


@pytest.mark.parametrize("scenario,draft,target,eos,accepted,next_token", CASES, ids=[c[0] for c in CASES])
def test_verify_greedy_table(scenario, draft, target, eos, accepted, next_token):
    verdict = verify_greedy(draft, target, eos)
    assert verdict == Verdict(accepted, next_token)
    assert verdict.committed(draft) == [*draft[:accepted], next_token]


def test_window_at_max_length_fully_accepted():
    k = 16
    draft = list(range(100, 100 + k))
    verdict = verify_greedy(draft, draft + [7])
    assert verdict == Verdict(k, 7)
    assert len(verdict.committed(draft)) == k + 1


def test_target_choices_must_be_k_plus_one():
    with pytest.raises(ValueError, match="k \\+ 1"):
        verify_greedy([1, 2], [1, 2])


@pytest.mark.parametrize("a,b,n", [([], [], 0), ([1, 2], [1, 2, 3], 2), ([1, 2], [1, 3], 1), ([4], [5], 0)])
def test_common_prefix_length(a, b, n):
    assert common_prefix_length(a, b) == n
