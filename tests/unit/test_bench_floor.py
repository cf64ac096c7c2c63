"""`edgespec bench floor`'s table: a ratio below --floor is marked where it fell, with the digit that shows it."""
import pytest

from bench.bench_floor import main, markdown, summarise


def prompt(category: str, decode: float, e2e: float) -> dict:
    """One prompt's pair: the default's decode rate and end-to-end time as the given ratios to window 0's."""
    window0 = {"decode_tps": 10.0, "e2e": 10.0, "ttft": 1.0, "free_accepted": 0, "free_drafted": 0}
    auto = {**window0, "decode_tps": 10.0 * decode, "e2e": 10.0 / e2e}
    return {"category": category, "auto": auto, "window0": window0, "identical": True}


def test_a_ratio_below_the_floor_is_marked_in_its_own_column():
    table = summarise([prompt("summarization", 1.06, 0.978), prompt("qa", 0.964, 1.01), prompt("math", 0.98, 0.99)],
                      0.98)
    assert [row["below_floor"] for row in table[:3]] == [["e2e"], ["decode"], []]
    result = {"date": "d", "machine": "m", "layout": "l", "args": {"tokens": "64"}, "command": "c", "table": table}
    text = markdown(result)
    assert "| summarization | 1 | 1.06x | 0.978x (below the floor) |" in text
    assert "| qa | 1 | 0.964x (below the floor) | 1.01x |" in text
    assert "| math | 1 | 0.98x | 0.99x |" in text


def test_an_unknown_layout_is_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--layout", "everywhere"])
    assert refused.value.code == 2 and "--layout" in capsys.readouterr().err
