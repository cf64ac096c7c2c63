"""Lossless speculative sampling — pure functions over numpy arrays, no torch, no I/O.

Leviathan et al. 2023 / Chen et al. 2023. ``p`` is the target's distribution,
``q`` the draft's, both after the *same* warping (temperature, top-k, top-p).
For each draft token x_i: accept iff u_i < p_i(x)/q_i(x) (strict; never when
p_i(x) = 0 or q_i(x) = 0); at the first rejection emit a token from the residual
norm(max(0, p_i - q_i)) drawn with a fresh uniform; after a fully accepted
window emit a bonus token from p_k. The emitted sequence is then distributed
exactly as sampling from the target alone.

Randomness is injected: every uniform comes from (seed, position, purpose), so a
replayed window gets the same verdict. The same seed does *not* always give the same
text: whether a position was a tested draft position, a residual or a bonus position
decides which uniform picks its token, so anything that moves window boundaries
(another window, a drafter outage, a resume) can change the text, while its
distribution stays the target's.

The **coupled** sampler (opt-in, ``SamplingParams.coupled``) makes the text a
function of (seed, position, the target's warped distribution) alone: every position
has its own Gumbel noise g, the drafter proposes argmax(log q + g), and the verifier
accepts while that equals argmax(log p + g), committing argmax(log p + g) at the
first difference. By the Gumbel-max trick argmax(log p + g) is an exact sample from
p, so the output is exactly target-only sampling with that seed, token for token,
whatever the windows, drafters, failovers or resumes; only token ids cross the wire.
Its price is acceptance: P(accept) = P(both argmaxes agree), below the sum of
min(p, q) that the standard rule reaches.
"""
from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, replace
from typing import Collection, Sequence

import numpy as np

from edgespec.verify.greedy import Verdict, verify_greedy
from edgespec.verify.logprobs import MAX_LOGPROBS

ACCEPT, RESIDUAL, BONUS, DRAFT = "accept", "residual", "bonus", "draft"   # uniform purposes
GUMBEL = "gumbel"   # the coupled sampler's noise


RELAXED_METHODS = ("lossless", "diversed", "cospec")
TASKS = ("", "auto", "code", "qa", "chat")


@dataclass(frozen=True, slots=True)
class Relaxation:
    """Opt-in, lossy verification (edgespec.verify.relaxed). The default is lossless.

    diversed: verify against r = w*q + (1 - w)*p; ``weight`` is w, or the cap on a
              learned per-position w when ``learned``; ``task`` asks the coordinator
              for its measured per-task w ("auto" = the prompt's category).
    cospec:   keep a draft token at a mismatch when log p(x) >= log max p - ``margin`` nats.
    """
    method: str = "lossless"
    weight: float = 0.0
    learned: bool = False
    margin: float = 0.0
    task: str = ""

    @property
    def lossy(self) -> bool:
        return self.method != "lossless"

    @property
    def label(self) -> str:
        if self.method == "diversed":
            source = "learned" if self.learned else f"task {self.task}" if self.task else "static"
            return f"relaxed-diversed({source}, w{'<=' if self.learned else '='}{self.weight:.2f})"
        if self.method == "cospec":
            return f"relaxed-cospec(margin={self.margin:.2f})"
        return "lossless"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0   # 0 = greedy; > 0 samples from softmax(logits / temperature)
    top_k: int = 0             # keep the k most likely tokens (0 = all)
    top_p: float = 1.0         # keep the smallest set with cumulative probability >= top_p (1 = all)
    seed: int = 0              # with the position, determines every random draw
    relaxation: Relaxation = Relaxation()   # lossless unless a relaxed verifier is asked for
    coupled: bool = False      # the coupled (Gumbel) sampler: text a function of seed and position alone
    # vLLM's ignore_eos, min_tokens (edgespec.verify.eos) and logprobs. Not in the fingerprint: they change which
    # tokens may end a generation, the target's p before an EOS and what a verdict reports, never how p and q warp.
    ignore_eos: bool = False   # an EOS token does not end the generation (it runs to its budget)
    min_length: int = 0        # EOS has probability 0 at session positions below this, tokens (0 = never)
    logprobs: int | None = None  # verdicts carry each committed token's log-probability and those of this many
                                 # most likely tokens (edgespec.verify.logprobs); None = none

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def sampler(self) -> str:
        """How tokens are chosen: "greedy", "coupled" or "standard" (speculative sampling)."""
        return "greedy" if self.greedy else "coupled" if self.coupled else "standard"

    def fingerprint(self) -> int:
        """A 63-bit hash carried by every window, so both sides provably warp alike."""
        # seed is a uint64 on the wire: packed unsigned (the same bytes as signed below 2**63)
        raw = struct.pack("<dqdQ", self.temperature, self.top_k, self.top_p, self.seed)
        relax = self.relaxation
        if relax.lossy:   # lossless sessions keep the fingerprint they always had
            raw += struct.pack("<Bd?d", RELAXED_METHODS.index(relax.method), relax.weight, relax.learned, relax.margin)
        if self.coupled:
            raw += GUMBEL.encode()
        return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") >> 1


def float32_decimal(value: float) -> float:
    """The decimal a float32 holding ``value`` was set from: 0.8 travels as 0.800000011920929, and the
    shortest decimal that rounds to the same float32 is what the sender meant (and what a target-only
    reference computed with 0.8 uses). Idempotent."""
    return float(str(np.float32(value)))


def as_float32(params: SamplingParams) -> SamplingParams:
    """``params`` as a peer reads them from the wire, whose floats are float32 (each one through
    ``float32_decimal``): the coordinator's own copy (with a per-task weight it resolved, say) then
    fingerprints exactly as the drafter's and the verifiers' do."""
    relax = params.relaxation
    return replace(params, temperature=float32_decimal(params.temperature), top_p=float32_decimal(params.top_p),
                   relaxation=replace(relax, weight=float32_decimal(relax.weight),
                                      margin=float32_decimal(relax.margin)))


def check_params(params: SamplingParams) -> None:
    from edgespec.errors import InvalidArgument

    if not 0.0 <= params.temperature <= 100.0 or params.temperature != params.temperature:
        raise InvalidArgument("temperature", f"must be in [0, 100], got {params.temperature}")
    if params.top_k < 0:
        raise InvalidArgument("top_k", f"must be >= 0, got {params.top_k}")
    if not 0.0 < params.top_p <= 1.0:
        raise InvalidArgument("top_p", f"must be in (0, 1], got {params.top_p}")
    if not 0 <= params.seed < 1 << 64:
        raise InvalidArgument("seed", f"must be in [0, 2**64), got {params.seed}")
    if not -1 << 31 <= params.top_k < 1 << 31:
        raise InvalidArgument("top_k", f"must fit in 32 bits, got {params.top_k}")
    check_relaxation(params.relaxation)
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_LOGPROBS:
        raise InvalidArgument("logprobs", f"must be in 0..{MAX_LOGPROBS}, got {params.logprobs}")
    if not 0 <= params.min_length < 1 << 31:
        raise InvalidArgument("min_length", f"must be in [0, 2**31), got {params.min_length}")
    if params.min_length and params.relaxation.lossy:
        raise InvalidArgument("min_length", "min_tokens masks the target's EOS; relaxed verification blends in the "
                              "draft's distribution, which does not: not together")
    if params.coupled and params.relaxation.lossy:
        raise InvalidArgument("coupled", "the coupled sampler is lossless: it cannot be combined with relaxed verification")


def check_relaxation(relax: Relaxation) -> None:
    from edgespec.errors import InvalidArgument

    if relax.method not in RELAXED_METHODS:
        raise InvalidArgument("relaxation.method", f"must be one of {', '.join(RELAXED_METHODS)}, got {relax.method!r}")
    if not 0.0 <= relax.weight <= 0.95:   # w = 1 would accept every draft token: the target would not matter
        raise InvalidArgument("relaxation.weight", f"must be in [0, 0.95], got {relax.weight}")
    if not 0.0 <= relax.margin <= 20.0:
        raise InvalidArgument("relaxation.margin", f"must be in [0, 20] nats, got {relax.margin}")
    if relax.task not in TASKS:
        raise InvalidArgument("relaxation.task", f"must be one of {', '.join(repr(t) for t in TASKS)}, got {relax.task!r}")
    if relax.method != "diversed" and (relax.weight or relax.learned or relax.task):
        raise InvalidArgument("relaxation", "weight, learned and task apply to the diversed method only")
    if relax.method != "cospec" and relax.margin:
        raise InvalidArgument("relaxation.margin", "applies to the cospec method only")
    if relax.learned and relax.task:
        raise InvalidArgument("relaxation", "learned and task are two different weight sources: pick one")


def uniform(seed: int, position: int, purpose: str) -> float:
    """A uniform in [0, 1) determined by (seed, position, purpose): 53 random bits."""
    digest = hashlib.blake2b(f"{seed}:{position}:{purpose}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) / float(1 << 53)


def race_times(seed: int, position: int, size: int) -> np.ndarray:
    """Exponential(1) "arrival times" [size] (float64, > 0) determined by (seed, position), the same on every
    machine: the coupled sampler's noise. argmax(p / E) is the Gumbel-max trick argmax(log p + g) with
    g = -log E, at one logarithm per token instead of two.

    A counter-based generator (Philox) keyed by a hash of (seed, position): the first n values do not
    depend on ``size``, so a draft and a target with different vocabulary sizes share their noise.
    """
    digest = hashlib.blake2b(f"{seed}:{position}:{GUMBEL}".encode(), digest_size=16).digest()
    u = np.random.Generator(np.random.Philox(key=int.from_bytes(digest, "little"))).random(size)
    times = -np.log1p(-u)
    times[times == 0.0] = np.finfo(np.float64).tiny   # u = 0 (p = 2**-53): never 0/0
    return times


def coupled_choice(probs: np.ndarray, seed: int, position: int) -> int:
    """argmax(probs / E) with the race times E of (seed, position): an exact sample from probs [V]."""
    return int(np.argmax(probs / race_times(seed, position, probs.shape[-1])))


def verify_coupled(draft: Sequence[int], p: np.ndarray, seed: int, base_position: int,
                   eos_ids: Collection[int] = ()) -> Verdict:
    """The coupled sampler's verification: the greedy rule against argmax(p / E) per position.

    draft: [k] proposed ids (the drafter's argmax(q / E)); p: [k + 1, V] warped target probabilities.
    """
    if p.shape[0] != len(draft) + 1:
        raise ValueError(f"p has {p.shape[0]} rows, expected k + 1 = {len(draft) + 1}")
    choices = [coupled_choice(row, seed, base_position + i) for i, row in enumerate(p)]
    return verify_greedy(draft, choices, eos_ids)


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """logits [V] -> probabilities [V] after temperature, top-k and top-p (float64).

    Greedy (temperature 0) is the one-hot of the argmax.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        probs = np.zeros_like(logits)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - np.max(scaled))
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Smallest prefix reaching top_p (with slack for float rounding in the cumulative sum).
        keep = int(np.searchsorted(cumulative, params.top_p - 1e-9)) + 1
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[:keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return probs


def sample(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from ``probs`` [V] (need not be normalised) with uniform ``u``."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    # Guard the float edge (u * total rounding onto the last step): never return a zero-mass token.
    while probs[min(index, len(probs) - 1)] <= 0.0:
        index -= 1
    return min(index, len(probs) - 1)


@dataclass(frozen=True, slots=True)
class SparseDist:
    """A (truncated) draft distribution for one position, as it crosses the wire.

    ``weights`` are float32-representable and need not sum to 1: both sides use
    q(x) = weight(x) / sum(weights) in float64, so the drafter samples from exactly
    the distribution the verifier computes its residual against.
    """
    ids: tuple[int, ...]
    weights: tuple[float, ...]

    def prob(self, token: int) -> float:
        try:
            return self.weights[self.ids.index(token)] / math.fsum(self.weights)
        except ValueError:
            return 0.0

    def dense(self, vocab_size: int) -> np.ndarray:
        out = np.zeros(vocab_size)
        out[list(self.ids)] = self.weights
        return out / math.fsum(self.weights)

    def sample(self, u: float) -> int:
        return self.ids[sample(np.array(self.weights), u)]

    def without(self, tokens: Collection[int]) -> "SparseDist":
        """This distribution with ``tokens`` removed (renormalised by the remaining weights): what the next
        sibling of a token tree is drawn from once its elder siblings are taken (sampling without replacement)."""
        kept = [(i, w) for i, w in zip(self.ids, self.weights) if i not in tokens]
        return SparseDist(tuple(i for i, _ in kept), tuple(w for _, w in kept))

    @staticmethod
    def from_dense(probs: np.ndarray) -> "SparseDist":
        ids = np.flatnonzero(probs > 0)
        return SparseDist(tuple(int(i) for i in ids), tuple(float(probs[i]) for i in ids))


def accepts(px: float, qx: float, u: float) -> bool:
    """The lossless test: u < p(x)/q(x), strict, never when p(x) = 0 or q(x) = 0."""
    return px > 0.0 and qx > 0.0 and u < px / qx


def residual(p_row: np.ndarray, q_row: SparseDist | None, x: int) -> np.ndarray:
    """What to sample from after rejecting x: norm(max(0, p - q)); one-hot q (None) = p without x."""
    out = np.array(p_row, dtype=np.float64)
    if q_row is None:
        out[x] = 0.0
    else:
        out = np.maximum(out - q_row.dense(out.shape[0]), 0.0)
    if out.sum() <= 0.0:
        # Only reachable when p == q exactly and x had p = 0, which q could not sample.
        out = np.array(p_row, dtype=np.float64)
    return out


def verify_sampling(draft: Sequence[int], q: Sequence[SparseDist] | None, p: np.ndarray, seed: int,
                    base_position: int, eos_ids: Collection[int] = ()) -> Verdict:
    """Lossless verification of one window.

    draft:  [k]        proposed token ids for positions base_position .. base_position+k-1
    q:      [k] or None  the draft distribution each token was sampled from; None means a
                       deterministic drafter (one-hot q: accept with probability p(x),
                       resample from p with x removed)
    p:      [k + 1, V] target probabilities (already warped) at those positions and the bonus
    """
    k = len(draft)
    if p.shape[0] != k + 1:
        raise ValueError(f"p has {p.shape[0]} rows, expected k + 1 = {k + 1}")
    if q is not None and len(q) != k:
        raise ValueError(f"q has {len(q)} rows, expected k = {k}")
    for i, x in enumerate(draft):
        position = base_position + i
        px = float(p[i, x])
        qx = 1.0 if q is None else q[i].prob(x)
        if accepts(px, qx, uniform(seed, position, ACCEPT)):
            if x in eos_ids:
                return Verdict(accepted=i, next_token=x)   # EOS ends the window, as in verify_greedy
            continue
        return Verdict(accepted=i, next_token=sample(residual(p[i], None if q is None else q[i], x),
                                                     uniform(seed, position, RESIDUAL)))
    return Verdict(accepted=k, next_token=sample(p[k], uniform(seed, base_position + k, BONUS)))


def truncate_to_sparse(probs: np.ndarray, max_ids: int) -> SparseDist:
    """Keep the ``max_ids`` most likely tokens of a draft distribution (0 = every nonzero one).

    Weights are rounded to float32 here, before anyone samples, so the drafter
    samples from exactly what it sends and the verifier's residual is exact.
    """
    support = np.flatnonzero(probs > 0)
    if 0 < max_ids < len(support):
        support = np.argpartition(-probs, max_ids - 1)[:max_ids]
    support = support[np.argsort(-probs[support], kind="stable")]
    weights = probs[support].astype(np.float32)
    keep = weights > 0
    return SparseDist(tuple(int(i) for i in support[keep]), tuple(float(w) for w in weights[keep]))
