"""Chaos with real processes: verifiers SIGKILLed, stalled, cut off and reset mid-generation;
drafter and coordinator killed and restarted. In every trial the client's stream must equal
the fault-free output, with no token lost or repeated.

Tiny models keep each trial to seconds; `edgespec bench chaos` runs many more trials.
"""
import signal
import time

import pytest

from bench.chaos import chaos_cluster, client_view, exactly_once, opened_count, run_with_fault, serving_verifier
from tests.tiny import target_only_greedy

TARGET, DRAFT = "tiny:12", "tiny:12~1"
PROMPT = "Once upon a time"
MAX_NEW = 300


@pytest.fixture(scope="module")
def reference():
    return target_only_greedy(TARGET, list(PROMPT.encode()), MAX_NEW)


def start_cluster(log_dir, *coordinator_args, verifiers=2):
    return chaos_cluster(log_dir, TARGET, DRAFT, *coordinator_args, verifiers=verifiers)


@pytest.fixture(scope="module", params=["blocking", "pipelined"])
def cluster(request, tmp_path_factory):
    with start_cluster(tmp_path_factory.mktemp("chaos"), "--pipeline",
                       "on" if request.param == "pipelined" else "off") as running:
        yield running


def with_fault(cluster, fault, at_tokens, resilient=False):
    chunks, stats, _ = run_with_fault(cluster.coordinator.address, PROMPT, MAX_NEW, fault, at_tokens, resilient)
    return chunks, stats


def assert_exact_stream(chunks, reference):
    assert client_view(chunks) == reference
    assert exactly_once(chunks, reference)   # verified chunks tile the output: nothing lost or repeated


@pytest.mark.parametrize("at_tokens", [5, 60, 150])
def test_sigkill_the_serving_verifier_mid_generation(cluster, reference, at_tokens):
    before = [opened_count(v) for v in cluster.verifiers]
    victim = {}

    def kill():
        victim["v"] = serving_verifier(cluster, before)
        cluster.kill(victim["v"])

    chunks, stats = with_fault(cluster, kill, at_tokens)
    assert_exact_stream(chunks, reference)
    assert stats.failovers >= 1 and stats.verifier != ""
    cluster.restart(victim["v"])


def test_stalled_verifier_past_the_deadline_is_left_behind(cluster, reference):
    before = [opened_count(v) for v in cluster.verifiers]
    stalled = {}

    def stall():
        stalled["v"] = serving_verifier(cluster, before)
        cluster.kill(stalled["v"], signal.SIGSTOP)

    try:
        chunks, stats = with_fault(cluster, stall, 40)
    finally:
        if "v" in stalled:
            cluster.kill(stalled["v"], signal.SIGCONT)
    assert_exact_stream(chunks, reference)
    assert stats.failovers >= 1 and stats.recovery_seconds < 10


def test_connection_reset_mid_generation(cluster, reference):
    resets = []
    chunks, stats = with_fault(cluster, lambda: resets.append(sum(p.reset_connections() for p in cluster.proxies)), 50)
    assert_exact_stream(chunks, reference)
    assert resets[0] >= 1   # a reset between windows costs a new stream, one during a window a re-open


def test_link_partition_for_a_few_seconds(cluster, reference):
    # Both links cut for 3 s (deadline 2 s): the session waits for a verifier, then continues.
    chunks, stats = with_fault(cluster, lambda: [p.partition(3.0) for p in cluster.proxies], 50)
    assert_exact_stream(chunks, reference)
    assert stats.failovers >= 1


def test_drafter_killed_and_restarted_mid_generation(cluster, reference):
    def kill_and_restart():
        cluster.kill(cluster.drafter)
        cluster.restart(cluster.drafter)

    chunks, stats = with_fault(cluster, kill_and_restart, 20)
    assert_exact_stream(chunks, reference)


def test_coordinator_restart_client_resumes_with_its_committed_prefix(cluster, reference):
    def kill_and_restart():
        cluster.kill(cluster.coordinator)
        cluster.restart(cluster.coordinator)

    chunks, stats = with_fault(cluster, kill_and_restart, 30, resilient=True)
    assert_exact_stream(chunks, reference)
    assert stats.new_tokens == len(reference)


def test_no_verifier_degrades_to_flagged_draft_tokens_then_recovers(tmp_path, reference):
    """--on-verifier-loss draft-only: both verifiers die; the stream goes on, flagged unverified;
    a verifier comes back and verified output resumes, replacing the unverified tokens."""
    with start_cluster(tmp_path, "--on-verifier-loss", "draft-only", "--failover-deadline", "8",
                       "--max-unverified-tokens", "16", verifiers=1) as running:
        (verifier,) = running.verifiers

        def outage():
            # Longer than the failover deadline (so the stream degrades), and back within the two probe
            # waits that follow the unverified run (2 x 8 s): a restart that takes up to ~15 s (a loaded
            # 2-core machine imports torch slowly; the run may also end early at a drafted EOS) still fits.
            running.kill(verifier)
            time.sleep(9.0)
            running.restart(verifier)

        chunks, stats = with_fault(running, outage, 30)
    assert any(c.unverified for c in chunks)
    assert_exact_stream(chunks, reference)
    assert stats.finish_reason in ("eos", "length") and stats.unverified_tokens == 0
