"""The policy benchmark and its sim-vs-real fidelity check run end to end (tiny models, real services)."""
import json

from bench import bench_policy


def test_bench_policy_runs_every_policy_and_measures_the_simulator_error(tmp_path):
    out = tmp_path / "policy.json"
    bench_policy.main(["--tiny", "--rtts", "0,30", "--max-new-tokens", "12", "--json", str(out)])
    report = json.loads(out.read_text())
    assert [r["rtt_ms"] for r in report["results"]] == [0, 30]
    assert 25 < report["results"][1]["measured_rtt_ms"] < 60
    for result in report["results"]:
        for regime in ("code", "chat"):
            rows = result["rows"][regime]
            assert set(rows) == {"1", "2", "3", "4", "goodput", "heuristic", "awc"}
            assert all(r["tokens"] == 12 and r["tok_s"] > 0 for r in rows.values())
            assert all(abs(rows[k]["tok_s_error"]) < 1.0 for k in "1234")   # computed, and not absurd
    assert 0 < report["profile"]["alpha"]["code"] < 1
