"""A vLLM speculative proposer (``speculative_config.method = "custom_class"``) that proposes a known
continuation: what a verifier pays inside the engine for windows of k tokens that are all accepted.

Used by ``bench/vllm_probe.py --in-engine`` in the vLLM environment (.venv-vllm); vLLM instantiates it in its
worker process with the engine's config and calls ``propose`` every step. The continuation and the window
size come from files the probe writes (``EDGESPEC_ORACLE_TOKENS``: JSON token ids of prefix + continuation;
``EDGESPEC_ORACLE_K``: k, re-read every step so one engine measures every k).
"""
from __future__ import annotations

import json
import os


class OracleProposer:
    def __init__(self, vllm_config) -> None:
        self.max_k = vllm_config.speculative_config.num_speculative_tokens
        self.tokens_path, self.k_path = os.environ["EDGESPEC_ORACLE_TOKENS"], os.environ["EDGESPEC_ORACLE_K"]

    def load_model(self, target_model) -> None:
        """The CPU model runner calls this on every drafter (there is no draft model here)."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, **_) -> list[list[int]]:
        with open(self.k_path) as source:
            k = min(int(source.read().strip() or 0), self.max_k)
        with open(self.tokens_path) as source:
            self.sequence = json.load(source)
        drafts = []
        for row in range(len(sampled_token_ids)):
            length = int(num_tokens_no_spec[row])
            known = list(token_ids_cpu[row, :length]) == self.sequence[:length]
            drafts.append(self.sequence[length:length + k] if known and k else [])
        return drafts
