"""Token-tree windows through the real services (coordinator --tree-depth): greedy output equals target-only."""
import pytest

from harness.cluster import LocalCluster
from tests.streams import generated, planned
from tests.tiny import target_only_greedy

PROMPTS = ["def add(a, b):", "Speculative decoding is"]


def collect(address, prompt, max_new, window, chat=False, **sampling):
    return generated(address, prompt, max_new, window, chat=chat, timeout_seconds=300, **sampling)


@pytest.mark.parametrize("depth", ["2", "auto"])
def test_tree_windows_over_grpc_give_target_only_greedy_output(tmp_path, depth):
    target, draft = "tiny:3", "tiny:3~5"
    with LocalCluster(tmp_path, verifier_args=["--model", target], drafter_args=["--model", draft],
                      coordinator_args=["--tokenizer", "bytes", "--tree-depth", depth]) as cluster:
        for prompt in PROMPTS:
            for window in (3, -1):
                tokens, stats = collect(cluster.coordinator.address, prompt, 48, window)
                assert tokens == target_only_greedy(target, list(prompt.encode()), 48), (prompt, window)
                assert stats.accepted_tokens + stats.rounds == len(tokens)
                # acceptance by depth: every accepted token counted once at its depth, never past what was offered
                assert sum(stats.accepted_at_depth) == stats.accepted_tokens
                assert all(a <= o for a, o in zip(stats.accepted_at_depth, stats.offered_at_depth))
            if depth == "2":   # window 3 with two runner-ups: up to 5 tokens drafted per round, more than a chain
                plan, tokens, stats = planned(cluster.coordinator.address, prompt, 48, 3, timeout_seconds=300)
                assert stats.drafted_tokens > 3 * stats.rounds
                # planned from both Infos (the verifier scores trees, the drafter drafts them), told up front
                assert (plan.window, plan.tree_depth, list(plan.notes)) == (3, 2, [])


def test_sampled_and_coupled_tree_windows_over_grpc(tmp_path):
    """Sampling sessions draft trees too: coupled sampling stays target-only coupled sampling token for token,
    the standard sampler replays by seed, and runner-ups travel with their q rows (more drafted than k a round)."""
    from edgespec.verify.sampling import SamplingParams
    from tests.tiny import target_only_coupled

    target, draft, prompt = "tiny:11", "tiny:11~2", "def add(a, b):"
    with LocalCluster(tmp_path, verifier_args=["--model", target], drafter_args=["--model", draft],
                      coordinator_args=["--tokenizer", "bytes", "--tree-depth", "2"]) as cluster:
        address = cluster.coordinator.address
        expected = target_only_coupled(target, list(prompt.encode()), 32,
                                       SamplingParams(temperature=0.9, top_k=50, seed=7, coupled=True))
        tokens, stats = collect(address, prompt, 32, 3, temperature=0.9, top_k=50, seed=7, coupled=True)
        assert tokens == expected and stats.verification == "coupled-sampling"
        assert stats.drafted_tokens > 3 * stats.rounds    # chains of 3 and their runner-ups
        first, stats = collect(address, prompt, 32, 3, temperature=0.9, seed=11)
        assert stats.verification == "lossless-sampling" and stats.drafted_tokens > 3 * stats.rounds
        assert collect(address, prompt, 32, 3, temperature=0.9, seed=11)[0] == first
        assert "tree depth 2 off" not in cluster.coordinator.log_path.read_text()


def test_a_verifier_that_cannot_score_trees_gets_chains_and_the_output_is_unchanged(tmp_path):
    """A llama.cpp verifier's Info says it scores no trees: the coordinator plans chains before the first window."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")
    llama = ["--backend", "llamacpp", "--model", "smollm2", "--threads", "1", "--ctx-tokens", "2048",
             "--max-sequences", "4"]
    with LocalCluster(tmp_path, verifier_args=llama, drafter_args=llama,
                      coordinator_args=["--tokenizer", "smollm2", "--tree-depth", "2"]) as cluster:
        # the prompt and window that tests/rpc/test_llamacpp_rpc.py checks against llama.cpp target-only
        prompt = "What is the capital of France?"
        reference, _ = collect(cluster.coordinator.address, prompt, 24, 0, chat=True)
        plan, tokens, stats = planned(cluster.coordinator.address, prompt, 24, 3, chat=True, timeout_seconds=300)
        assert tokens == reference and 0 < stats.drafted_tokens <= 3 * stats.rounds    # chains
        # settled from its Info when the session opened, and told to the client before the first token
        assert plan.tree_depth == 0 and len(plan.notes) == 1 and "does not score token trees" in plan.notes[0]
        assert plan.notes[0] in cluster.coordinator.log_path.read_text()


REPETITIVE = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor"


def test_cloud_drafting_over_grpc_gives_target_only_output(tmp_path):
    """--cloud-draft on: the verifier drafts every window itself; fallback: it does once the edge drafter is gone."""
    from harness.cluster import stop_service

    target = "tiny:3"
    reference = target_only_greedy(target, list(REPETITIVE.encode()), 48)
    with LocalCluster(tmp_path, verifier_args=["--model", target], drafter_args=["--model", "tiny:3~5"],
                      coordinator_args=["--tokenizer", "bytes", "--cloud-draft", "on"]) as cluster:
        tokens, stats = collect(cluster.coordinator.address, REPETITIVE, 48, 3)
        assert tokens == reference and stats.accepted_tokens > 0 and stats.rounds < 48
        assert sum(stats.accepted_at_depth) == stats.accepted_tokens and not stats.offered_at_depth
        assert "drafter opened" not in cluster.coordinator.log_path.read_text()   # the edge drafter was never used
        assert collect(cluster.coordinator.address, REPETITIVE, 16, 0)[1].accepted_tokens == 0   # window 0: target-only
    with LocalCluster(tmp_path / "fallback", verifier_args=["--model", target], drafter_args=["--model", "tiny:3~5"],
                      coordinator_args=["--tokenizer", "bytes", "--cloud-draft", "fallback"]) as cluster:
        stop_service(cluster.drafter)
        tokens, stats = collect(cluster.coordinator.address, REPETITIVE, 48, 3)
        assert tokens == reference and stats.accepted_tokens > 0
