"""Greedy verification of a draft window — pure, no I/O, no torch.

Notation (everywhere in edgespec): ``p`` target, ``q`` draft, ``k`` window,
``n`` accepted. A verdict always commits ``n + 1`` tokens: the accepted draft
prefix, then the target's own token at the first rejection (*recovered*) or after a
fully accepted window (*bonus*).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Sequence

from edgespec.verify.logprobs import TokenLogprob


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: int     # n, 0..k: draft tokens kept
    next_token: int   # the recovered or bonus token from the target
    # Telemetry that comes with a verdict (not part of its meaning: equality ignores them).
    verify_compute_seconds: float = field(default=0.0, compare=False)  # target forward + verification, seconds
    queue_depth: int = field(default=0, compare=False)           # windows waiting when this one started
    verifier_seconds: float = field(default=0.0, compare=False)  # arrival at the verifier to verdict (0 = unknown)
    target_logprob: float = field(default=0.0, compare=False)    # sum of log p (T=1) over the committed tokens
    verifier: str = field(default="", compare=False)             # address of the verifier that gave it ("" = unknown)
    batch_windows: int = field(default=0, compare=False)         # windows in the forward that scored it (0 = unknown)
    batch_tokens: int = field(default=0, compare=False)          # tokens that forward fed, all windows (0 = unknown)
    path: tuple[int, ...] = ()   # a tree window's accepted draft indices, root's child first; () = draft[:n]
    drafted: tuple[int, ...] = ()  # a self-drafted window (cloud drafting): the accepted tokens the verifier drafted
    self_drafted: int = field(default=0, compare=False)   # ... and how many it scored (its tree's nodes)
    # sessions asking for them (SamplingParams.logprobs): the target's log-probabilities, one per committed token
    logprobs: tuple[TokenLogprob, ...] = field(default=(), compare=False)

    def committed(self, draft: Sequence[int]) -> list[int]:
        """The tokens this verdict commits: draft[:n] (a tree's: its accepted path; a self-drafted window's:
        the verifier's own accepted tokens) + [next_token]."""
        if self.drafted:
            return [*self.drafted, self.next_token]
        accepted = [draft[i] for i in self.path] if self.path else draft[: self.accepted]
        return [*accepted, self.next_token]


def verify_greedy(draft: Sequence[int], target_argmax: Sequence[int],
                  eos_ids: Collection[int] = ()) -> Verdict:
    """Accept draft tokens while they equal the target's greedy choice.

    draft:          [k]     proposed token ids for positions b .. b+k-1
    target_argmax:  [k + 1] argmax of p at positions b .. b+k (the last is the bonus)
    eos_ids:        tokens that end generation

    An EOS token is never *accepted*: when the draft and the target agree on EOS,
    it becomes the verdict's next token, so nothing follows it and the verdict
    still commits exactly ``n + 1`` tokens.
    """
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(f"target_argmax has {len(target_argmax)} entries, expected k + 1 = {len(draft) + 1}")
    n = 0
    for proposed, chosen in zip(draft, target_argmax):
        if proposed != chosen or proposed in eos_ids:
            break
        n += 1
    return Verdict(accepted=n, next_token=target_argmax[n])


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
