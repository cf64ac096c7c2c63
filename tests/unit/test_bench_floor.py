"""`edgespec bench floor`'s table: a ratio below --floor is marked where it fell, with the digit that shows it."""
from bench.bench_floor import markdown


def row(category: str, decode: float, e2e: float) -> dict:
    return {"category": category, "prompts": 1, "decode": decode, "e2e": e2e, "ttft": 1.0, "free_accepted": 0,
            "free_drafted": 0, "identical": 1}


def test_a_ratio_below_the_floor_is_marked_in_its_own_column():
    result = {"date": "d", "machine": "m", "layout": "l", "args": {"tokens": "64", "floor": "0.98"}, "command": "c",
              "table": [row("summarization", 1.06, 0.978), row("qa", 0.964, 1.01), row("math", 0.98, 0.99)]}
    lines = markdown(result).splitlines()
    assert "| summarization | 1 | 1.06x | 0.978x (below the floor) |" in "\n".join(lines)
    assert "| qa | 1 | 0.964x (below the floor) | 1.01x |" in "\n".join(lines)
    assert "| math | 1 | 0.98x | 0.99x |" in "\n".join(lines)
