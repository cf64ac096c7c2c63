"""Chaos with real processes: verifiers SIGKILLed, stalled, cut off and reset mid-generation;
drafter and coordinator killed and restarted. In every trial the client's stream must equal
the fault-free output, with no token lost or repeated.

Tiny models keep each trial to seconds; `edgespec bench-chaos` runs many more trials.
"""
import asyncio
import signal
import time

import pytest

from edge_client.client import generate, generate_resilient
from edgespec.tools.cluster import LocalCluster
from edgespec.tools.wan import LinkProfile
from tests.tiny import target_only_greedy

TARGET, DRAFT = "tiny:12", "tiny:12~1"
PROMPT = "Once upon a time"
MAX_NEW = 300


@pytest.fixture(scope="module")
def reference():
    return target_only_greedy(TARGET, list(PROMPT.encode()), MAX_NEW)


def start_cluster(log_dir, *coordinator_args, verifiers=2):
    return LocalCluster(log_dir, verifier_count=verifiers, link=LinkProfile(),
                        verifier_args=["--model", TARGET, "--max-window", "8"],
                        drafter_args=["--model", DRAFT, "--max-window", "9"],
                        coordinator_args=["--tokenizer", "bytes", "--window", "3", "--max-window", "8",
                                          "--max-new-tokens", "400", "--deadline", "2", "--ban", "0.2",
                                          "--failover-deadline", "20", *coordinator_args])


@pytest.fixture(scope="module", params=["blocking", "pipelined"])
def cluster(request, tmp_path_factory):
    with start_cluster(tmp_path_factory.mktemp("chaos"), "--pipeline",
                       "on" if request.param == "pipelined" else "off") as running:
        yield running


def serving_verifier(cluster, opened_before):
    """The verifier that opened a session since ``opened_before`` (counts of 'opened' lines per log)."""
    for verifier, before in zip(cluster.verifiers, opened_before):
        if opened_count(verifier) > before:
            return verifier
    raise AssertionError("no verifier opened the session")


def opened_count(verifier) -> int:
    return verifier.log_path.read_text(errors="replace").count(" opened: ")


def run_with_fault(cluster, fault, at_tokens, resilient=False):
    """Generate; call ``fault()`` (in a thread) once ``at_tokens`` tokens have streamed.

    Returns (chunks, stats). The fault runs beside the stream, as a real one would.
    """
    async def go():
        chunks, stats, faulted = [], None, None
        stream = generate_resilient if resilient else generate
        async for event in stream(cluster.coordinator.address, PROMPT, MAX_NEW, chat=False, timeout_seconds=120):
            if event.HasField("chunk"):
                chunks.append(event.chunk)
                if faulted is None and sum(len(c.token_ids) for c in chunks) >= at_tokens:
                    faulted = asyncio.ensure_future(asyncio.to_thread(fault))
            else:
                stats = event.stats
        if faulted is not None:
            await faulted
        return chunks, stats
    return asyncio.run(go())


def assert_exact_stream(chunks, reference):
    """The client's view (a chunk at position P replaces unverified tokens from P) equals the reference,
    and verified chunks tile the output: nothing lost, nothing repeated."""
    view: list[int] = []
    for chunk in chunks:
        if chunk.token_ids:
            del view[chunk.position:]
            view += chunk.token_ids
    assert view == reference
    verified = [c for c in chunks if c.token_ids and not c.unverified]
    positions = [c.position for c in verified]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert sum(len(c.token_ids) for c in verified) == len(reference)


@pytest.mark.parametrize("at_tokens", [5, 60, 150])
def test_sigkill_the_serving_verifier_mid_generation(cluster, reference, at_tokens):
    before = [opened_count(v) for v in cluster.verifiers]
    victim = {}

    def kill():
        victim["v"] = serving_verifier(cluster, before)
        cluster.kill(victim["v"])

    chunks, stats = run_with_fault(cluster, kill, at_tokens)
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
        chunks, stats = run_with_fault(cluster, stall, 40)
    finally:
        if "v" in stalled:
            cluster.kill(stalled["v"], signal.SIGCONT)
    assert_exact_stream(chunks, reference)
    assert stats.failovers >= 1 and stats.recovery_seconds < 10


def test_connection_reset_mid_generation(cluster, reference):
    resets = []
    chunks, stats = run_with_fault(cluster, lambda: resets.append(sum(p.reset_connections() for p in cluster.proxies)), 50)
    assert_exact_stream(chunks, reference)
    assert resets[0] >= 1   # a reset between windows costs a new stream, one during a window a re-open


def test_link_partition_for_a_few_seconds(cluster, reference):
    # Both links cut for 3 s (deadline 2 s): the session waits for a verifier, then continues.
    chunks, stats = run_with_fault(cluster, lambda: [p.partition(3.0) for p in cluster.proxies], 50)
    assert_exact_stream(chunks, reference)
    assert stats.failovers >= 1


def test_drafter_killed_and_restarted_mid_generation(cluster, reference):
    def kill_and_restart():
        cluster.kill(cluster.drafter)
        cluster.restart(cluster.drafter)

    chunks, stats = run_with_fault(cluster, kill_and_restart, 20)
    assert_exact_stream(chunks, reference)


def test_coordinator_restart_client_resumes_with_its_committed_prefix(cluster, reference):
    def kill_and_restart():
        cluster.kill(cluster.coordinator)
        cluster.restart(cluster.coordinator)

    chunks, stats = run_with_fault(cluster, kill_and_restart, 30, resilient=True)
    assert_exact_stream(chunks, reference)
    assert stats.new_tokens == len(reference)


def test_no_verifier_degrades_to_flagged_draft_tokens_then_recovers(tmp_path, reference):
    """--on-verifier-loss draft-only: both verifiers die; the stream goes on, flagged unverified;
    a verifier comes back and verified output resumes, replacing the unverified tokens."""
    with start_cluster(tmp_path, "--on-verifier-loss", "draft-only", "--failover-deadline", "3",
                       "--max-unverified-tokens", "16", verifiers=1) as running:
        (verifier,) = running.verifiers

        def outage():   # longer than the failover deadline, shorter than deadline + unverified run + one more wait
            running.kill(verifier)
            time.sleep(4.0)
            running.restart(verifier)

        chunks, stats = run_with_fault(running, outage, 30)
    assert any(c.unverified for c in chunks)
    assert_exact_stream(chunks, reference)
    assert stats.finish_reason in ("eos", "length") and stats.unverified_tokens == 0
