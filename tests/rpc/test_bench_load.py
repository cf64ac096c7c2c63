"""`edgespec bench load` end to end on a tiny model: a real verifier process, sessions drafting from the reference."""
import json

import pytest

from bench import bench_load

TINY = ["--model", "tiny:3", "--verifier-args", "--threads 1", "--tokens", "12"]


def run(tmp_path, *args):
    out = tmp_path / "load.json"
    code = bench_load.main([*TINY, "--references", str(tmp_path / "refs.json"), "--json", str(out), *args])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_every_session_reproduces_the_reference_in_both_modes(tmp_path):
    # Flags that exist today, one list per mode (see the batching test below for --max-batch).
    code, report = run(tmp_path, "--sessions", "1,2", "--verifier-args-on", "--max-window 8",
                       "--verifier-args-off", "--max-window 4")
    assert code == 0
    assert [(r["mode"], r["sessions"]) for r in report["rows"]] == [("on", 1), ("on", 2), ("off", 1), ("off", 2)]
    references = json.loads((tmp_path / "refs.json").read_text())
    assert len(references) == 2 and all(len(ref) <= 12 for ref in references.values())
    lengths = [len(ref) for ref in references.values()]   # sessions take prompts round-robin, in cache order
    for row in report["rows"]:
        assert row["error"] is None and row["mismatches"] == 0
        assert row["tokens"] == sum(lengths[:row["sessions"]])
        assert row["tokens_per_second"] > 0 and row["tpot_p50_ms"] > 0 and row["window_p99_ms"] > 0
        assert row["rounds"] >= row["tokens"] / 5 and 0 <= row["acceptance"] <= 1
        assert row["verifier_memory"]["rss_mib"] > 0 and row["verifier_memory"]["hwm_mib"] >= row["verifier_memory"]["rss_mib"]
        assert set(row["queue_depth"]) == {"mean", "p50", "p99", "max"}
    assert set(report["ratios_on_off"]) == {"1", "2"} and report["mismatches"] == 0
    for row in report["rows"]:   # from the verifier's /metrics when it serves one, else explicitly absent
        available = not report["batch_size_source"][row["mode"]].startswith("unavailable")
        assert (row["batch_size"] is not None) == available


def test_output_that_differs_from_the_reference_is_counted_and_fails_the_run(tmp_path):
    code, _ = run(tmp_path, "--sessions", "1", "--modes", "off", "--verifier-args-off", "")
    assert code == 0
    cache_path = tmp_path / "refs.json"
    cache = json.loads(cache_path.read_text())
    (key, reference), = cache.items()
    cache[key] = reference[:5] + [(reference[5] + 1) % 256] + reference[6:]   # a wrong "target" token at 5
    cache_path.write_text(json.dumps(cache))
    code, report = run(tmp_path, "--sessions", "1", "--modes", "off", "--verifier-args-off", "")
    assert code == 1
    (row,) = report["rows"]
    assert row["mismatches"] == 1 and row["mismatch_details"][0]["position"] == 5


def test_a_flag_the_verifier_does_not_take_is_refused_before_starting(tmp_path, capsys):
    code, report = run(tmp_path, "--verifier-args-on", "--no-such-flag 3")
    assert code == 2 and report is None
    assert "--no-such-flag" in capsys.readouterr().err


def test_batching_on_and_off_with_the_batching_flags(tmp_path):
    if "--max-batch" not in bench_load.verifier_help():
        pytest.skip("the verifier has no --max-batch yet (cross-session batching not merged)")
    code, report = run(tmp_path, "--sessions", "1,4", "--verifier-args-on", "--max-batch 8 --batch-wait-ms 5",
                       "--verifier-args-off", "--max-batch 1")
    assert code == 0 and report["mismatches"] == 0
    if not report["batch_size_source"]["on"].startswith("unavailable"):
        batched = next(r for r in report["rows"] if (r["mode"], r["sessions"]) == ("on", 4))["batch_size"]
        assert batched["forwards"] > 0 and batched["mean"] >= 1
        alone = next(r for r in report["rows"] if (r["mode"], r["sessions"]) == ("off", 4))["batch_size"]
        assert alone["mean"] == 1


def histogram_text(buckets: dict[str, float], total: float, count: float) -> str:
    """The exposition a Prometheus exporter writes, with an unrelated metric after it."""
    return ("# TYPE edgespec_verifier_batch_size histogram\n"
            + "".join(f'edgespec_verifier_batch_size_bucket{{le="{le}"}} {n}\n' for le, n in buckets.items())
            + f"edgespec_verifier_batch_size_sum {total}\nedgespec_verifier_batch_size_count {count}\n"
            + 'edgespec_verifier_queue_depth_bucket{le="1.0"} 100.0\n')


def test_batch_size_distribution_between_two_scrapes():
    before = bench_load.read_histogram(histogram_text({"1.0": 1, "2.0": 2, "4.0": 2, "+Inf": 2}, 3, 2),
                                       bench_load.BATCH_METRIC)
    after = bench_load.read_histogram(histogram_text({"1.0": 3, "2.0": 5, "4.0": 9, "+Inf": 9}, 23, 9),
                                      bench_load.BATCH_METRIC)
    assert after == {"buckets": {"1.0": 3, "2.0": 5, "4.0": 9, "+Inf": 9}, "sum": 23, "count": 9}
    # Between the scrapes: 7 forwards, 20 windows; 2 forwards of size 1, 1 of size 2, 4 of size 3..4.
    assert bench_load.batch_sizes(before, after) == {"forwards": 7, "mean": 2.86,
                                                     "buckets": {"<=1.0": 2, "<=2.0": 1, "<=4.0": 4}}
    assert bench_load.read_histogram("other_metric 1\n", bench_load.BATCH_METRIC) is None
    assert bench_load.batch_sizes(None, after) is None


def test_the_metrics_url_is_read_from_the_verifier_log():
    line = "2026-11-30 04:14:25,391 INFO edgespec.observe.exporters: verifier metrics on http://127.0.0.1:9464/metrics"
    assert bench_load.METRICS_URL.search(line).group(1) == "http://127.0.0.1:9464/metrics"
