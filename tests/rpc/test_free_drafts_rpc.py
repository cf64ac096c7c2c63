"""Free drafts through the real services: the coordinator's suffix drafter sends what the text repeats, over
gRPC to a real verifier, and the output stays the target's own."""
from edgespec.net.transport import ClientSecurity
from harness.cluster import LocalCluster
from tests.streams import generated
from tests.tiny import target_only_greedy

TARGET, DRAFT = "tiny:3", "tiny:3~5"
REPETITIVE = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor"


def collect(address, prompt, max_new, window, **sampling):
    return generated(address, prompt, max_new, window, chat=False, timeout_seconds=300, **sampling)


def test_free_drafts_over_grpc_give_target_only_output_and_stay_off_where_asked(tmp_path):
    reference = target_only_greedy(TARGET, list(REPETITIVE.encode()), 48)
    # --first-token drafted: the tiny target does not copy this text, so free drafts go where nothing is measured
    # yet, in the first round (later ones decline them, rightly)
    with LocalCluster(tmp_path, verifier_args=["--model", TARGET], drafter_args=["--model", DRAFT],
                      coordinator_args=["--tokenizer", "bytes", "--first-token", "drafted"]) as cluster:
        tokens, stats = collect(cluster.coordinator.address, REPETITIVE, 48, -1)
        assert tokens == reference
        assert stats.free_rounds > 0 and stats.free_drafted_tokens >= stats.free_rounds
        assert stats.free_declined > 0                  # the copies the measured acceptance no longer pays for
        assert stats.free_accepted_tokens <= stats.accepted_tokens and stats.free_drafted_tokens <= stats.drafted_tokens
        tokens, stats = collect(cluster.coordinator.address, REPETITIVE, 48, 0)     # window 0: target-only
        assert tokens == reference and stats.free_rounds == stats.free_declined == 0 and stats.drafted_tokens == 0
        tokens, stats = collect(cluster.coordinator.address, REPETITIVE, 48, 3)     # a fixed window: the drafter's
        assert tokens == reference and stats.free_rounds == 0
        _, stats = collect(cluster.coordinator.address, REPETITIVE, 32, -1, temperature=0.8, seed=5)
        assert stats.verification == "lossless-sampling" and stats.new_tokens == 32
    with LocalCluster(tmp_path / "off", verifier_args=["--model", TARGET], drafter_args=["--model", DRAFT],
                      coordinator_args=["--tokenizer", "bytes", "--free-drafts", "off"]) as cluster:
        tokens, stats = collect(cluster.coordinator.address, REPETITIVE, 48, -1)
        assert tokens == reference and stats.free_rounds == stats.free_declined == 0


def test_a_tenant_s_repeated_request_with_earlier_outputs_kept_is_still_target_only_output(tmp_path):
    """--free-drafts-store (on by default): the coordinator keeps finished outputs per tenant (here the identity of a
    bearer token). Alice asks twice, Bob once: every answer is target-only greedy's. Whether the stored drafts are
    sent depends on the verifier's measured costs, which a loaded machine moves (0 to over 20 of 47 tokens seen
    here), so what is drafted from which tenant's outputs is tested in process with given costs
    (tests/unit/test_output_store.py)."""
    prompt = "Name three colours of the rainbow."
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("alice a-token\nbob b-token\n")
    with LocalCluster(tmp_path, verifier_args=["--model", TARGET], drafter_args=["--model", DRAFT],
                      coordinator_args=["--tokenizer", "bytes", "--auth-tokens", str(tokens_file)]) as cluster:
        def run(token):
            tokens, stats = collect(cluster.coordinator.address, prompt, 48, -1, security=ClientSecurity(token=token))
            assert stats.free_accepted_tokens <= stats.free_drafted_tokens and stats.new_tokens == len(tokens)
            return tokens

        answers = [run("a-token"), run("a-token"), run("b-token")]
    assert answers == [target_only_greedy(TARGET, list(prompt.encode()), 48)] * 3
