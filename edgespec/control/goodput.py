"""The goodput model of docs/architecture.md §4: tokens a window commits, per second it costs. Pure.

    goodput(k) = E(k) / (k * t_draft + overhead + t_verify(k)),   E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j

and a target-only round of S steps (k = 0) commits S tokens in S passes for one overhead: S / (overhead + S t_verify(0)).

One formula and one argmax for everything that weighs windows: the goodput window policy and AWC's
analytic feature (both over edgespec.control.telemetry's estimates), the drafter router, the simulator's
oracle and the AWC training labels.
"""
from __future__ import annotations

from typing import Callable, Sequence


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j: tokens a window of k commits, alpha_j the acceptance
    at position j given acceptance before it."""
    total, reach = 1.0, 1.0
    for j in range(k):
        reach *= alphas[j]
        total += reach
    return total


def goodput(alphas: Sequence[float], k: int, draft_per_token: float, overhead: float, forward_seconds: float,
            steps: int = 1) -> float:
    """Expected tokens per second of a window of k: E(k) / (k * t_draft + overhead + t_verify); of a target-only
    window of ``steps`` (k = 0, a pass each): steps / (overhead + steps * t_verify)."""
    if k == 0 and steps > 1:
        return steps / max(1e-9, overhead + steps * forward_seconds)
    return expected_tokens(alphas, k) / max(1e-9, k * draft_per_token + overhead + forward_seconds)


def best_rate(alphas: Sequence[float], draft_per_token: float, overhead: float, verify: Callable[[int], float],
              max_k: int, min_k: int = 0, steps: int = 1) -> tuple[int, float]:
    """(k, goodput) of the k in [min_k, max_k] with the highest goodput (k = 0: a target-only window of ``steps``);
    the smallest such k on a tie."""
    best_k, best = min_k, -1.0
    for k in range(min_k, max_k + 1):
        rate = goodput(alphas, k, draft_per_token, overhead, verify(k), steps)
        if rate > best + 1e-12:
            best_k, best = k, rate
    return best_k, best


def best_window(alphas: Sequence[float], draft_per_token: float, overhead: float, verify: Callable[[int], float],
                max_k: int, min_k: int = 0, steps: int = 1) -> int:
    """The k in [min_k, max_k] maximising E(k) / (k * t_draft + overhead + verify(k)) (k = 0: ``steps`` steps)."""
    return best_rate(alphas, draft_per_token, overhead, verify, max_k, min_k, steps)[0]


def tree_gain(alphas: Sequence[float], depth: int, beta: float) -> float:
    """Tokens a tree adds to its chain's E(k) with runner-ups at the first ``depth`` positions: where the chain
    reaches position j and is rejected there (prob prod_{i<j} alpha_i * (1 - alpha_j)), the target takes the
    runner-up with probability ``beta``, which commits it and then the target's next token: one more."""
    gain, reach = 0.0, 1.0
    for j in range(min(depth, len(alphas))):
        gain += reach * (1 - alphas[j]) * beta
        reach *= alphas[j]
    return gain


def best_tree_depth(alphas: Sequence[float], k: int, beta: float, draft_per_token: float, overhead: float,
                    forward: Callable[[int], float], max_depth: int) -> int:
    """The runner-up depth d in [0, min(k, max_depth)] maximising (E(k) + tree_gain) / (k t_draft + overhead +
    forward(k + 1 + d)), forward the verifier's time for a pass over that many tokens (siblings come free from
    the chain's drafting); the smallest such d on a tie."""
    base = expected_tokens(alphas, k)
    best_d, best = 0, -1.0
    for d in range(0, min(k, max_depth) + 1):
        rate = (base + tree_gain(alphas, d, beta)) / max(1e-9, k * draft_per_token + overhead + forward(k + 1 + d))
        if rate > best + 1e-12:
            best_d, best = d, rate
    return best_d


def curve_seconds(curve: dict[int, float], tokens: float, low: bool = False) -> float | None:
    """A verifier's forward time for a forward that feeds ``tokens`` (all its windows), from measured forward times
    by tokens fed: measured sizes as measured, sizes between them interpolated, a size past the largest measured
    extrapolated along the last measured segment (or, with one size measured, in proportion to it), below the
    smallest as the smallest. ``low``: a lower bound for a forward time that grows with the tokens, and less than
    in proportion to them (batching pays): below the smallest size in proportion to it, past the largest as the
    largest, so that a size never measured looks cheap and gets tried once. None before any measurement."""
    if not curve:
        return None
    sizes = sorted(curve)
    if tokens <= sizes[0]:
        return curve[sizes[0]] * tokens / sizes[0] if low else curve[sizes[0]]
    if tokens >= sizes[-1] and low:
        return curve[sizes[-1]]
    if tokens >= sizes[-1]:
        if len(sizes) == 1:
            return curve[sizes[0]] * tokens / sizes[0]
        lo, hi = sizes[-2], sizes[-1]
        return curve[hi] + max(0.0, (curve[hi] - curve[lo]) / (hi - lo)) * (tokens - hi)
    hi = next(n for n in sizes if n >= tokens)
    lo = max(n for n in sizes if n <= tokens)
    return curve[lo] if lo == hi else curve[lo] + (curve[hi] - curve[lo]) * (tokens - lo) / (hi - lo)


def curve_slope(curve: dict[int, float]) -> float:
    """The least-squares slope of measured seconds against size (seconds per token), at least 0; with one size
    measured, in proportion to it (0 with none)."""
    if len(curve) < 2:
        return sum(curve.values()) / sum(curve) if curve else 0.0
    mean_n, mean_t = sum(curve) / len(curve), sum(curve.values()) / len(curve)
    spread = sum((n - mean_n) ** 2 for n in curve)
    return max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in curve.items()) / spread)
