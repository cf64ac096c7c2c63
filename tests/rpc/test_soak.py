"""`edgespec bench soak` for seconds on tiny models: sessions open and close; deliberate overload is told apart from failure."""
import json

from bench import soak

TINY = ["--verifier-args", "--model tiny:3 --threads 1", "--drafter-args", "--model tiny:3~1 --threads 1",
        "--sample-seconds", "2"]
# Memory after warm-up, per service. This run measures slopes of about 0-2 MiB/min (the allocator settling)
# while completing a few hundred generations a minute; a leak of 100 KiB per generation would show as tens of
# MiB/min (~40 at ~400 generations a minute). The bounds are 15x what is measured, for a loaded machine's noise.
MAX_SLOPE_MIB_PER_MINUTE = 30.0
MAX_GROWTH_MIB = 30.0     # end - start after warm-up


def run(tmp_path, *args):
    out = tmp_path / "soak.json"
    code = soak.main([*TINY, *args, "--json", str(out)])
    return code, json.loads(out.read_text())


def test_short_soak_with_an_overload_burst_has_no_failures_and_samples_memory(tmp_path):
    # 3 clients, plus 3 more in the middle third against a coordinator taking 4 sessions per client: the
    # burst is answered RESOURCE_EXHAUSTED (deliberate overload), never with another error. The soak's clients
    # are anonymous, by default a service identity (no per-client limit): --service-identities= makes them
    # one end user.
    code, report = run(tmp_path, "--minutes", "0.4", "--clients", "3", "--overload-clients", "3",
                       "--coordinator-args", "--tokenizer bytes --service-identities= --max-sessions-per-client 4")
    assert code == 0
    assert report["failures"] == 0 and report["divergences"] == [] and report["exited_services"] == []
    assert report["statuses"]["OK"] >= 6 and report["overloaded"] == report["statuses"]["RESOURCE_EXHAUSTED"] > 0
    assert set(report["statuses"]) == {"OK", "RESOURCE_EXHAUSTED"}
    assert report["tokens"] > 0 and report["warm_up_seconds"] is not None
    assert len(report["memory_samples"]) >= 5
    for name in ("verifier", "drafter", "coordinator"):
        memory = report["memory"][name]
        assert 0 < memory["start_mib"] <= memory["max_mib"] and 0 < memory["end_mib"] <= memory["max_mib"]
        assert memory["slope_mib_per_minute"] is not None, (name, report["memory_samples"])
        assert memory["slope_mib_per_minute"] <= MAX_SLOPE_MIB_PER_MINUTE, (name, memory, report["memory_samples"])
        assert memory["end_mib"] - memory["start_mib"] <= MAX_GROWTH_MIB, (name, memory, report["memory_samples"])


def test_overload_without_a_burst_is_a_failure(tmp_path):
    # One session per client and 3 loops: RESOURCE_EXHAUSTED nobody asked for fails the soak.
    code, report = run(tmp_path, "--minutes", "0.15", "--clients", "3",
                       "--coordinator-args", "--tokenizer bytes --service-identities= --max-sessions-per-client 1")
    assert code == 1
    assert report["overloaded"] == 0 and report["failures"] == report["statuses"]["RESOURCE_EXHAUSTED"] > 0
