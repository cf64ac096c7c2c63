"""The vLLM verifier engine's sampling distribution, checked where vLLM runs (the vLLM environment):

    echo '{"model": DIR, "samples": 400}' | .venv-vllm/bin/python -m tests.vllm_checks

tests/rpc/test_vllm_rpc.py runs it. First greedy windows with wrong tokens among the target's own, against
target-only decoding on the same engine (greedy_windows). Then sampling: each sample opens a session with its own seed (vLLM samples the token past
the prompt) and verifies windows until two tokens are committed: the draft [a, b] (the target's greedy pair)
is settled by that ahead token when it departs from it, else by vLLM's rejection sampler in a step (whose
CPU expand kernel edgespec.backends.vllm_lm.repair_expand replaces: without that, this test fails, chi2 ~ 1300). The pairs
are tested (Pearson chi-square) against the target's exact distribution of its first two tokens, p(x1) p(x2 | x1)
from vLLM's log-probabilities (top 20 at each step, the rest pooled). The same samples with a plausible bias
(half the rejected first tokens replaced by the draft's, a verifier leaning to its drafter) must fail the test,
so the test can fail. Prints one JSON line.
"""
from __future__ import annotations

import json
import math
import random
import sys
from collections import Counter

import numpy as np

from edgespec.backends import vllm_lm
from edgespec.engines.verifier import VerifierLimits
from edgespec.engines.vllm_verifier import VllmVerifierEngine
from edgespec.verify.sampling import SamplingParams
from tests.stats import chi2_critical, chi_square_gof

TEXT = "Once upon a time, there was a little"
TOP = 20


def next_logprobs(target, tokens: list[int]) -> dict[int, float]:
    """log p of the 20 likeliest tokens after ``tokens`` (vLLM's own log-probabilities, temperature 1)."""
    from vllm import SamplingParams as VllmParams

    engine = target.engine
    engine.add_request(f"lp{len(tokens)}-{tokens[-1]}", {"prompt_token_ids": tokens},
                       VllmParams(temperature=1.0, max_tokens=1, logprobs=TOP, seed=0, detokenize=False))
    found: dict[int, float] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            for position in output.outputs[0].logprobs or []:
                found = {token: entry.logprob for token, entry in position.items()}
    return found


def greedy_windows(engine: VllmVerifierEngine, tokens: int) -> dict:
    """Greedy windows of random sizes whose tokens are the target's own, each replaced by a wrong one (or EOS)
    with probability 1/4, the session re-opened from its committed prefix now and then, against target-only decoding of the same engine (empty windows): the committed text
    must be identical, through rejections settled by the ahead token and by steps."""
    engine.open("reference", PROMPT)
    while len(engine.committed("reference")) < len(PROMPT) + tokens:
        engine.verify("reference", len(engine.committed("reference")), [])
    reference = engine.committed("reference")
    engine.close("reference")
    rng, eos = random.Random(3), sorted(engine.eos_ids)[0]
    engine.open("windows", PROMPT)
    stepped = settled = rejected = 0
    while len(engine.committed("windows")) < len(reference):
        committed = engine.committed("windows")
        if rng.random() < 0.3:   # re-opened with its committed prefix (as after a failover): vLLM samples past it
            engine.open("windows", committed)
        truth = reference[len(committed):len(committed) + rng.randint(1, 4)]
        draft = [t if rng.random() < 0.75 else rng.choice([eos, 5, t + 1]) for t in truth]
        result = engine.verify("windows", len(committed), draft)
        stepped += result.batch_tokens > 0
        settled += result.batch_tokens == 0
        rejected += result.verdict.accepted < len(draft)
    got = engine.committed("windows")[:len(reference)]
    engine.close("windows")
    return {"greedy_identical": got == reference, "greedy_stepped": stepped, "greedy_settled_by_ahead": settled,
            "greedy_rejected": rejected}


def main() -> None:
    job = json.load(sys.stdin)
    samples = int(job.get("samples", 400))
    from tokenizers import Tokenizer

    global PROMPT
    PROMPT = Tokenizer.from_file(f"{job['model']}/tokenizer.json").encode(TEXT).ids
    target = vllm_lm.load(job["model"], vllm_lm.VllmOptions(dtype="float32", max_model_len=512, kv_cache_gb=1), 4)
    engine = VllmVerifierEngine(target, vllm_lm.eos_ids(job["model"]), VerifierLimits(max_window=4,
                                                                                      max_session_tokens=500))
    summary = greedy_windows(engine, job.get("greedy_tokens", 160))
    # the draft: the target's greedy pair
    engine.open("greedy", PROMPT)
    engine.verify("greedy", len(PROMPT), [])
    engine.verify("greedy", len(PROMPT) + 1, [])
    a, b = engine.committed("greedy")[len(PROMPT):]
    engine.close("greedy")
    pairs, biased, accepted, rejected = [], [], 0, 0
    lean = random.Random(5)
    for i in range(samples):
        session = SamplingParams(temperature=1.0, seed=1000 + i)
        engine.open("s", PROMPT, session)
        first_verdict = None
        while len(engine.committed("s")) < len(PROMPT) + 2:
            committed = engine.committed("s")
            draft = [a, b] if len(committed) == len(PROMPT) else [a]
            verdict = engine.verify("s", len(committed), draft, params_fingerprint=session.fingerprint()).verdict
            accepted += verdict.accepted > 0
            rejected += verdict.accepted == 0
            first_verdict = first_verdict or verdict
        x1, x2 = engine.committed("s")[len(PROMPT):len(PROMPT) + 2]
        pairs.append((x1, x2))
        leaned = first_verdict.accepted == 0 and x1 != a and lean.random() < 0.5
        biased.append((a, x2) if leaned else (x1, x2))
        engine.close("s")

    # the exact distribution of the first two tokens, over pairs (x1 among the top, x2 among its top) + pools
    first = next_logprobs(target, PROMPT)
    cells: dict[tuple, float] = {}
    for x1, lp1 in first.items():
        second = next_logprobs(target, PROMPT + [x1])
        for x2, lp2 in second.items():
            cells[(x1, x2)] = math.exp(lp1 + lp2)
        cells[(x1, "other")] = max(0.0, math.exp(lp1) * (1 - sum(math.exp(v) for v in second.values())))
    cells[("other",)] = max(0.0, 1 - sum(math.exp(v) for v in first.values()))

    def cell(pair):
        if pair[0] not in first:
            return ("other",)
        return pair if pair in cells else (pair[0], "other")

    keys = sorted(cells, key=str)
    p = np.array([cells[k] for k in keys])
    p = p / p.sum()
    summary.update(samples=samples, windows_accepted=accepted, windows_rejected=rejected, draft=[a, b],
                  p_draft=round(math.exp(first[a]), 3))
    for name, observed in (("", pairs), ("biased_", biased)):
        counts = Counter(cell(pair) for pair in observed)
        vector = np.array([counts.get(k, 0) for k in keys], dtype=float)
        statistic, df = chi_square_gof(vector, p)
        summary[f"{name}chi2"], summary[f"{name}df"] = round(statistic, 2), df
        summary[f"{name}critical"] = round(chi2_critical(max(df, 1)), 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
