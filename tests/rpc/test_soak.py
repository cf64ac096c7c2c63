"""`edgespec soak` for seconds on tiny models: sessions open and close; deliberate overload is told apart from failure."""
import json

from edgespec.tools import soak

TINY = ["--verifier-args", "--model tiny:3 --threads 1", "--drafter-args", "--model tiny:3~1 --threads 1",
        "--sample-seconds", "2"]


def run(tmp_path, *args):
    out = tmp_path / "soak.json"
    code = soak.main([*TINY, *args, "--json", str(out)])
    return code, json.loads(out.read_text())


def test_short_soak_with_an_overload_burst_has_no_failures_and_samples_memory(tmp_path):
    # 3 clients, plus 3 more in the middle third against a coordinator taking 4 sessions per client: the
    # burst is answered RESOURCE_EXHAUSTED (deliberate overload), never with another error.
    code, report = run(tmp_path, "--minutes", "0.4", "--clients", "3", "--overload-clients", "3",
                       "--coordinator-args", "--tokenizer bytes --max-sessions-per-client 4")
    assert code == 0
    assert report["failures"] == 0 and report["divergences"] == [] and report["exited_services"] == []
    assert report["statuses"]["OK"] >= 6 and report["overloaded"] == report["statuses"]["RESOURCE_EXHAUSTED"] > 0
    assert set(report["statuses"]) == {"OK", "RESOURCE_EXHAUSTED"}
    assert report["tokens"] > 0 and report["warm_up_seconds"] is not None
    assert len(report["memory_samples"]) >= 5
    for name in ("verifier", "drafter", "coordinator"):
        memory = report["memory"][name]
        assert 0 < memory["start_mib"] <= memory["max_mib"] and 0 < memory["end_mib"] <= memory["max_mib"]
        assert memory["slope_mib_per_minute"] is not None


def test_overload_without_a_burst_is_a_failure(tmp_path):
    # One session per client and 3 loops: RESOURCE_EXHAUSTED nobody asked for fails the soak.
    code, report = run(tmp_path, "--minutes", "0.15", "--clients", "3",
                       "--coordinator-args", "--tokenizer bytes --max-sessions-per-client 1")
    assert code == 1
    assert report["overloaded"] == 0 and report["failures"] == report["statuses"]["RESOURCE_EXHAUSTED"] > 0
