"""Relaxed verification — opt-in and lossy: a DIVERSED-style blend and a CoSpec-style arbiter.

Pure numpy, no torch, no I/O. The lossless rules (edgespec.verify.greedy and
edgespec.verify.sampling) give the target's output exactly; these trade some of that for
acceptance, and every surface that uses them says so (``Relaxation.label``, the
``lossy`` flag in the generation stats). Their quality loss is measured by
``edgespec bench relaxed``, never assumed.

DIVERSED (Wang et al., AISTATS 2026) verifies against the blend r = w·q + (1 − w)·p
instead of p: accept x when u < r(x)/q(x), else resample from norm(max(0, r − q)),
which equals norm(max(0, p − q)). The standard speculative-sampling argument with r
as the target shows the emitted tokens are distributed as r, so the bias is bounded:
TV(r, p) = w·TV(q, p). Greedy sessions take the argmax of r with p the target's
T=1 softmax and q the one-hot draft token: keep x iff w + (1 − w)·p(x) ≥ (1 − w)·max p.
The weight w is static, per task (measured by ``edgespec train relaxed``), or
predicted per position by a small learned head over features the verifier has.
The paper trains its weights with sequence-level RL on task reward; the shipped head
is a supervised per-position proxy (see ``training.train_relaxed``).

CoSpec (Li et al. 2026) may keep a draft token where it disagrees with the target.
The paper learns that arbitration with RL; here it is a margin rule: at a mismatch
keep x when log p(x) ≥ log max p − margin (p the warped target distribution; T=1
for greedy sessions). A token the target gives zero probability is never kept.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Collection, Sequence

import numpy as np

from edgespec.verify.sampling import (ACCEPT, BONUS, RESIDUAL, Relaxation, SamplingParams, SparseDist, accepts, residual,
                               sample, uniform, verify_sampling, warp)
from edgespec.verify.greedy import Verdict

HEAD_FILE = "relaxed_head.json"
FEATURES = ("bias", "entropy", "log_p_max", "log_p_draft", "offset")
LOG_FLOOR = -30.0   # log-probabilities are clamped here, so features stay finite


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax at temperature 1, float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def features(p1: np.ndarray, draft: Sequence[int]) -> np.ndarray:
    """Per draft position, what the verifier knows without the drafter's distribution: [k, len(FEATURES)].

    p1: [>= k, V] the target's T=1 distribution at each draft position.
    """
    rows = []
    for i, x in enumerate(draft):
        p = p1[i]
        logs = np.log(np.maximum(p, 1e-300))
        entropy = float(-(p * logs).sum())
        rows.append((1.0, entropy, max(float(logs.max()), LOG_FLOOR), max(float(logs[x]), LOG_FLOOR), i / 16.0))
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(FEATURES))


@dataclass(frozen=True, slots=True)
class WeightHead:
    """w = cap · sigmoid(theta · features): the learned per-position DIVERSED weight."""
    theta: tuple[float, ...]
    task_weights: dict[str, float]   # measured static w per prompt category
    meta: dict                       # how it was trained (data, lambda, sizes)

    def weights(self, feats: np.ndarray, cap: float) -> np.ndarray:
        z = feats @ np.array(self.theta)
        return cap / (1.0 + np.exp(-np.clip(z, -50.0, 50.0)))

    def to_json(self) -> dict:
        return {"features": list(FEATURES), "theta": list(self.theta), "task_weights": self.task_weights,
                "meta": self.meta}

    @staticmethod
    def from_json(data: dict) -> "WeightHead":
        if tuple(data.get("features", ())) != FEATURES:
            raise ValueError(f"head was trained on features {data.get('features')}, this build computes {FEATURES}")
        return WeightHead(tuple(float(t) for t in data["theta"]), {k: float(v) for k, v in data["task_weights"].items()},
                          dict(data.get("meta", {})))


def load_head(path: str | None = None) -> WeightHead:
    """The head shipped with edgespec (or one from ``path``)."""
    if path:
        with open(path) as f:
            return WeightHead.from_json(json.load(f))
    return WeightHead.from_json(json.loads(resources.files("edgespec.verify").joinpath(HEAD_FILE).read_text()))


def draft_weights(relax: Relaxation, p1: np.ndarray, draft: Sequence[int], head: WeightHead | None) -> np.ndarray:
    """The DIVERSED weight w at each draft position: static, or from the head (capped at relax.weight)."""
    if not relax.learned:
        return np.full(len(draft), relax.weight)
    if head is None:
        raise ValueError("a learned weight needs the weight head")
    return head.weights(features(p1, draft), relax.weight)


def verify_relaxed(draft: Sequence[int], q: Sequence[SparseDist] | None, logits: np.ndarray,
                   params: SamplingParams, base_position: int, eos_ids: Collection[int] = (),
                   head: WeightHead | None = None) -> Verdict:
    """Verify one window under ``params.relaxation`` (lossy).

    logits: [k + 1, V] the target's raw logits at the draft positions and the bonus.
    q:      as in verify_sampling (None = deterministic drafter, one-hot q).
    """
    relax = params.relaxation
    k = len(draft)
    if logits.shape[0] != k + 1:
        raise ValueError(f"logits has {logits.shape[0]} rows, expected k + 1 = {k + 1}")
    p1 = softmax(logits)
    if relax.method == "diversed":
        w = draft_weights(relax, p1, draft, head)
        if params.greedy:
            return _diversed_greedy(draft, p1, w, eos_ids)
        p = np.stack([warp(row, params) for row in logits])
        return verify_sampling(draft, q, blend(p, q, draft, w), params.seed, base_position, eos_ids)
    if relax.method == "cospec":
        if params.greedy:
            return _cospec_greedy(draft, p1, relax.margin, eos_ids)
        p = np.stack([warp(row, params) for row in logits])
        return _cospec_sampling(draft, q, p, relax.margin, params.seed, base_position, eos_ids)
    raise ValueError(f"not a relaxed method: {relax.method!r}")


def blend(p: np.ndarray, q: Sequence[SparseDist] | None, draft: Sequence[int], w: np.ndarray) -> np.ndarray:
    """r_i = w_i·q_i + (1 − w_i)·p_i for each draft row; the bonus row stays p."""
    r = np.array(p, dtype=np.float64)
    for i, x in enumerate(draft):
        if q is None:
            qi = np.zeros(p.shape[1])
            qi[x] = 1.0
        else:
            qi = q[i].dense(p.shape[1])
        r[i] = w[i] * qi + (1.0 - w[i]) * p[i]
    return r


def _diversed_greedy(draft: Sequence[int], p1: np.ndarray, w: np.ndarray, eos_ids: Collection[int]) -> Verdict:
    for i, x in enumerate(draft):
        top = int(np.argmax(p1[i]))
        if x != top and w[i] + (1.0 - w[i]) * p1[i, x] < (1.0 - w[i]) * p1[i, top]:
            return Verdict(accepted=i, next_token=top)
        if x in eos_ids:
            return Verdict(accepted=i, next_token=x)
    return Verdict(accepted=len(draft), next_token=int(np.argmax(p1[len(draft)])))


def _within_margin(p_row: np.ndarray, x: int, margin: float) -> bool:
    return p_row[x] > 0.0 and math.log(p_row[x]) >= math.log(float(p_row.max())) - margin


def _cospec_greedy(draft: Sequence[int], p1: np.ndarray, margin: float, eos_ids: Collection[int]) -> Verdict:
    for i, x in enumerate(draft):
        top = int(np.argmax(p1[i]))
        if x != top and not _within_margin(p1[i], x, margin):
            return Verdict(accepted=i, next_token=top)
        if x in eos_ids:
            return Verdict(accepted=i, next_token=x)
    return Verdict(accepted=len(draft), next_token=int(np.argmax(p1[len(draft)])))


def _cospec_sampling(draft: Sequence[int], q: Sequence[SparseDist] | None, p: np.ndarray, margin: float,
                     seed: int, base_position: int, eos_ids: Collection[int]) -> Verdict:
    """Lossless test first; where it rejects, the arbiter may still keep the draft token."""
    for i, x in enumerate(draft):
        position = base_position + i
        qx = 1.0 if q is None else q[i].prob(x)
        if accepts(float(p[i, x]), qx, uniform(seed, position, ACCEPT)) or _within_margin(p[i], x, margin):
            if x in eos_ids:
                return Verdict(accepted=i, next_token=x)
            continue
        return Verdict(accepted=i, next_token=sample(residual(p[i], None if q is None else q[i], x),
                                                     uniform(seed, position, RESIDUAL)))
    k = len(draft)
    return Verdict(accepted=k, next_token=sample(p[k], uniform(seed, base_position + k, BONUS)))


def committed_logprob(logits: np.ndarray, tokens: Sequence[int]) -> float:
    """Sum of the target's T=1 log-probabilities of ``tokens``, row i scoring tokens[i]."""
    if not tokens:
        return 0.0
    # Only the picked entries and each row's log-sum-exp: a full log-softmax of a 152k vocabulary in float64
    # cost ~4 ms a row, most of a llama.cpp step's budget; this is ~0.3 ms (float32 terms, float64 sums).
    rows = np.asarray(logits[: len(tokens)], dtype=np.float32)
    top = rows.max(axis=-1)
    lse = top.astype(np.float64) + np.log(np.exp(rows - top[:, None]).sum(axis=-1, dtype=np.float64))
    picked = rows[np.arange(len(tokens)), np.asarray(tokens)].astype(np.float64)
    return float((picked - lse).sum())
