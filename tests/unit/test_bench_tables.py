"""The bench's table of the policy's choice and acceptance by depth, from rows as bench.py records them."""
from bench.bench import depth_table


def test_depth_table_reports_mean_window_runner_ups_and_acceptance_by_depth():
    rows = [dict(config="edgespec k=3 tree=2 draft=fp32", rounds=10, drafted_tokens=50,
                 offered_at_depth=[10, 10, 10], accepted_at_depth=[8, 5, 2]),
            dict(config="edgespec k=3 tree=2 draft=fp32", rounds=10, drafted_tokens=50,
                 offered_at_depth=[10, 10, 10], accepted_at_depth=[6, 3, 0]),
            dict(config="edgespec cloud-draft (PTD, 12 tokens/pass)", rounds=20, drafted_tokens=240,
                 offered_at_depth=[], accepted_at_depth=[5, 1]),
            dict(config="target-only (HF generate)", rounds=0)]
    table = depth_table(rows)
    assert "| edgespec k=3 tree=2 draft=fp32 | 3.00 | 2.00 | 0.70, 0.40, 0.10 |" in table
    assert "| edgespec cloud-draft (PTD, 12 tokens/pass) | 0.00 | 12.00 | 0.25, 0.05 |" in table
    assert "target-only" not in table and depth_table(rows[3:]) == ""
