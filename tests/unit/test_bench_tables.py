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


def test_a_bench_report_goes_to_stdout_json_and_markdown(tmp_path, capsys):
    import json

    from bench.report import write_report
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    write_report({"rows": [1, 2]}, table, tmp_path / "new" / "run.json")   # the table beside the JSON
    assert capsys.readouterr().out == table + "\n"
    assert json.loads((tmp_path / "new" / "run.json").read_text()) == {"rows": [1, 2]}
    assert (tmp_path / "new" / "run.md").read_text() == table + "\n"
    write_report({"rows": []}, table + "\n", str(tmp_path / "b.json"), tmp_path / "md" / "table.md")   # as named
    assert (tmp_path / "md" / "table.md").read_text() == table + "\n" and not (tmp_path / "b.md").exists()
    write_report({}, table, None, None)   # only printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "md", "new"]


def test_llama_completion_s_end_marker_is_not_text():
    from bench.llamacpp_tools import completion_text

    assert completion_text("Canberra. [end of text]\n") == "Canberra."      # EOS reached
    assert completion_text("def f():\n    return 1\n\n") == "def f():\n    return 1"   # --tokens reached
    assert completion_text("no [end of text] here") == "no [end of text] here"
