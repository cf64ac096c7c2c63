"""`edgespec bench capacity` end to end with SmolLM2 in llama.cpp as target and draft: a real verifier process,
emulated edge devices proposing the draft model's recorded choices, over a real delay proxy."""
import json
import os

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from bench import bench_capacity, sim_capacity  # noqa: E402
from edgespec.backends import llamacpp  # noqa: E402
from edgespec.backends.tokenizer import load_tokenizer  # noqa: E402

SMALL = ["--model", "smollm2", "--draft", "smollm2", "--tokens", "10", "--draft-ms", "2",
         "--verifier-args", "--ctx-tokens 4096"]
ROW_KEYS = {"mode", "sessions", "rtt_ms", "backend", "tokens_per_second", "tpot_p50_ms", "tpot_p99_ms", "limit",
            "mismatches"}


def run(tmp_path, *args):
    out = tmp_path / "capacity.json"
    cpus = os.sched_getaffinity(0)
    code = bench_capacity.main([*SMALL, "--references", str(tmp_path / "refs.json"), "--drafts",
                                str(tmp_path / "drafts.json"), "--json", str(out), *args])
    assert os.sched_getaffinity(0) == cpus   # it moves off the verifier's CPUs while it runs, and back
    return code, json.loads(out.read_text()) if out.exists() else None


def test_every_mode_n_and_rtt_is_measured_and_exact(tmp_path):
    code, report = run(tmp_path, "--sessions", "1,2", "--rtt", "0,20", "--modes", "ar,k=2,auto",
                       "--plot", str(tmp_path / "capacity.png"))
    rows = report["rows"]
    # One session decodes deterministically and must equal the target's greedy output; two sessions share
    # forwards whose composition depends on timing, and llama.cpp's numerics on the batch: a near-tie may
    # flip there (docs/benchmarks.md, "Capacity"), which the bench counts and fails on.
    assert all(r["mismatches"] == 0 for r in rows if r["sessions"] == 1)
    assert code == (1 if report["mismatches"] else 0)
    assert [(r["rtt_ms"], r["sessions"], r["mode"]) for r in rows] == [
        (rtt, n, mode) for rtt in (0.0, 20.0) for n in (1, 2) for mode in ("ar", "k=2", "auto")]
    for row in rows:
        assert ROW_KEYS <= set(row) and row["error"] is None and row["backend"] == "llamacpp"
        assert row["tokens_per_second"] > 0 and 0 < row["tpot_p50_ms"] <= row["tpot_p99_ms"]
        assert row["limit"] > 0 and row["limit_with_link"] > 0 and row["vs_ar"] > 0
        assert row["verifier_cpu_seconds_per_1k_tokens"] > 0
    for row in (r for r in rows if r["mode"] == "ar"):
        assert row["tokens_per_round"] == 1 and row["acceptance"] is None and row["windows"].keys() == {"0"}
        assert row["vs_ar"] == 1
    for row in (r for r in rows if r["mode"] == "k=2" and r["mismatches"] == 0):
        # the draft is the target: its recorded choices are the target's own, so nearly every token is accepted
        assert row["acceptance"] >= 0.8 and row["tokens_per_round"] > 2
    assert (tmp_path / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # What DSD-Sim needs to replay the run, and the calibrated simulator predicting it
    assert report["verifier_batch"] == {"max_batch": 16, "batch_wait_ms": 200.0, "wait_fraction": 0.25}
    assert [len(p["matches"]) for p in report["prompts"]] == [p["tokens"] for p in report["prompts"]]
    assert all(r["forwards"] for r in rows)
    for row in (r for r in rows if r["sessions"] == 1 and r["mode"] != "auto"):   # a forward holds its window only
        assert {key.split(",")[0] for key in row["forwards"]} == {"1"}
    sim = tmp_path / "sim.json"
    assert sim_capacity.main([str(tmp_path / "capacity.json"), "--json", str(sim)]) == 0
    predicted = json.loads(sim.read_text())["rows"]
    assert [(r["rtt_ms"], r["sessions"], r["mode"]) for r in predicted] == [
        (r["rtt_ms"], r["sessions"], r["mode"]) for r in rows]
    assert all(r["simulated_tokens_per_second"] > 0 for r in predicted)


def test_pipelined_devices_send_look_aheads_that_hold_and_stay_exact(tmp_path):
    """pipe=K: look-aheads go out while a window is in flight; with the draft equal to the target nearly all
    hold, and the output is the target's greedy output (one session: deterministic)."""
    code, report = run(tmp_path, "--tokens", "24", "--sessions", "1", "--rtt", "20", "--modes", "k=2,pipe=2")
    blocking, pipelined = report["rows"]
    assert code == 0 and pipelined["mode"] == "pipe=2" and pipelined["mismatches"] == 0
    assert pipelined["lookaheads_per_round"] > 0.5 and pipelined["lookahead_hit_rate"] > 0.5
    assert "lookahead_hit_rate" not in blocking
    assert pipelined["vs_blocking"] > 0 and pipelined["pipeline_limit"] > 1
    # A held look-ahead saves its window's draft time and round trip: fewer seconds for the same tokens.
    assert pipelined["tokens"] == blocking["tokens"]


def test_recorded_choices_are_the_draft_models_greedy_chain():
    """A window of k from position p, taken from the one-pass choices, is accepted exactly as far as the draft
    model's own greedy chain of k from that prefix (decoded token by token) would be."""
    prompt = load_tokenizer("smollm2").encode("List three prime numbers.", True)
    lm = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=1)
    try:
        state = lm.new_state()
        reference = lm.greedy_draft(state, prompt, 12)   # a stand-in "target output": the model's own greedy text
        reference[6] = (reference[6] + 1) % 1000         # one token the draft would not choose
    finally:
        lm.close()
    lm = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=1)
    try:
        choices = bench_capacity.draft_choices(lm, prompt, reference)
    finally:
        lm.close()
    assert len(choices) == len(reference)
    for p in range(len(reference) - 3):
        lm = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=1)
        try:
            chain = lm.greedy_draft(lm.new_state(), [*prompt, *reference[:p]], 3)
        finally:
            lm.close()

        def accepted(window):
            n = 0
            while n < len(window) and window[n] == reference[p + n]:
                n += 1
            return n
        assert accepted(choices[p:p + 3]) == accepted(chain), p
        assert choices[p] == chain[0], p


def test_output_that_differs_from_the_reference_is_counted_and_fails_the_run(tmp_path):
    code, _ = run(tmp_path, "--sessions", "1", "--rtt", "0", "--modes", "ar")
    assert code == 0
    cache_path = tmp_path / "refs.json"
    cache = json.loads(cache_path.read_text())
    (key, reference), = cache.items()
    cache[key] = reference[:4] + [(reference[4] + 1) % 1000] + reference[5:]   # a wrong "target" token at 4
    cache_path.write_text(json.dumps(cache))
    code, report = run(tmp_path, "--sessions", "1", "--rtt", "0", "--modes", "ar")
    assert code == 1
    (row,) = report["rows"]
    assert row["mismatches"] == 1 and row["mismatch_details"][0]["position"] == 4
    assert row["tokens"] == len(reference)   # it goes on (target-only: the recorded drafts hold along the reference)


@pytest.mark.parametrize("args, message", [
    (["--modes", "ar,k=9"], "k=1..k=8"),
    (["--modes", "greedy"], "expected ar, auto"),
    (["--sessions", "0"], ">= 1"),
    (["--sessions", "1,x"], "comma-separated"),
    (["--rtt", "-5"], ">= 0"),
    (["--tokens", "1"], "--tokens"),
    (["--draft-ms", "-1"], "--draft-ms"),
])
def test_bad_flags_are_refused_before_anything_starts(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        bench_capacity.main([*SMALL, "--json", str(tmp_path / "x.json"), *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_flag_the_verifier_does_not_take_is_refused(tmp_path, capsys):
    code, report = run(tmp_path, "--verifier-args", "--no-such-flag 3")
    assert code == 2 and report is None and "--no-such-flag" in capsys.readouterr().err
