"""`edgespec bench regimes` end to end with SmolLM2 in llama.cpp as target and draft: each mode through a
trace whose link, load and prompts change, one real verifier, a real delay proxy whose RTT is switched."""
import json

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from bench import bench_regimes  # noqa: E402

SMALL = ["--model", "smollm2", "--draft", "smollm2", "--tokens", "8", "--draft-ms", "2",
         "--verifier-args", "--ctx-tokens 4096"]


def test_every_mode_runs_the_whole_trace_and_is_compared_per_phase(tmp_path):
    out, md, png = tmp_path / "regimes.json", tmp_path / "regimes.md", tmp_path / "regimes.png"
    code = bench_regimes.main([*SMALL, "--trace", "0:1:code,30:2:chat", "--modes", "ar,k=2,auto,awc",
                               "--references", str(tmp_path / "refs.json"), "--drafts", str(tmp_path / "drafts.json"),
                               "--json", str(out), "--md", str(md), "--plot", str(png)])
    report = json.loads(out.read_text())
    # one user decodes deterministically; two share forwards, where llama.cpp may flip a near-tie (counted)
    assert all(r["mismatches"] == 0 for r in report["rows"] if r["sessions"] == 1)
    assert code == (1 if report["mismatches"] else 0)
    assert [(r["mode"], r["phase"], r["sessions"], r["rtt_ms"], r["category"]) for r in report["rows"]] == [
        (mode, phase, n, rtt, category) for mode in ("ar", "k=2", "auto", "awc")
        for phase, n, rtt, category in ((0, 1, 0.0, "code"), (1, 2, 30.0, "chat"))]
    for row in report["rows"]:
        assert row["error"] is None and row["tokens_per_second"] > 0
    ar_rows = [r for r in report["rows"] if r["mode"] == "ar"]
    assert all(r["windows"].keys() == {"0"} for r in ar_rows)
    summary = report["summary"]
    best = summary["best_single_fixed"]   # ar is the fixed window 0
    assert best in ("ar", "k=2") and summary["vs_best_single_fixed"][best] == 1
    assert set(summary["trace_tokens_per_second"]) == {"ar", "k=2", "auto", "awc"}
    for phase in summary["phases"]:
        assert phase["best_fixed"] in ("ar", "k=2") and phase["vs_best_fixed"][phase["best_fixed"]] == 1
    assert md.read_text().count("\n") == 5 and "whole trace" in md.read_text()   # header, rule, 2 phases, total
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("trace, message", [
    ("20:1", "RTT_MS:SESSIONS:CATEGORY"),
    ("x:1:code", "must be numbers"),
    ("20:0:code", "SESSIONS >= 1"),
    ("20:1:poetry", "CATEGORY code, qa or chat"),
    ("-5:1:code", "RTT >= 0"),
])
def test_a_bad_trace_is_refused_before_anything_starts(tmp_path, capsys, trace, message):
    with pytest.raises(SystemExit) as exit_:
        bench_regimes.main([*SMALL, f"--trace={trace}", "--json", str(tmp_path / "x.json")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_bad_mode_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_regimes.main([*SMALL, "--modes", "ar,k=0"])
    assert exit_.value.code == 2 and "expected ar, auto" in capsys.readouterr().err
