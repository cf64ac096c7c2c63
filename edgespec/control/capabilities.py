"""What a verifier can do beyond plain windows of a chain: its Info reports it, and the coordinator settles each
session's plan from it when the session opens (edgespec.loop.generation), instead of finding out mid-session.

A session may fail over to any verifier of the pool, so its plan is what every verifier of the pool does, each
verifier's Info checked in turn (so that a refusal names the one that cannot). A verifier whose Info has not
answered yet does none of the speed features (token trees, cloud drafting) for the plan, and is not asked about
sampling modes (it may never serve). The engines keep their own checks as guards: a window or a session they cannot do is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from edgespec.verify.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Capabilities:
    token_trees: bool = False   # scores token-tree windows, and so drafts for itself (cloud drafting)
    coupled: bool = False       # coupled speculative sampling
    relaxed: bool = False       # relaxed (lossy) verification
    min_tokens: bool = False    # masks EOS for min_tokens
    logprobs: bool = False      # returns the target's per-token log-probabilities

    @classmethod
    def every(cls) -> "Capabilities":
        return cls(**{f.name: True for f in fields(cls)})

    @classmethod
    def of(cls, message: object) -> "Capabilities":
        """From anything with these fields: a verifier Info's capabilities message (all false when it is absent)."""
        return cls(**{f.name: bool(getattr(message, f.name, False)) for f in fields(cls)})

    def lacks(self, params: SamplingParams) -> str | None:
        """What of a session's decoding (``params``, min_tokens as their min_length) these cannot do, in words;
        None when they do all of it."""
        wanted = (("coupled sampling", params.coupled, self.coupled),
                  ("relaxed verification", params.relaxation.lossy, self.relaxed),
                  ("min_tokens", bool(params.min_length), self.min_tokens),
                  ("log-probabilities", params.logprobs is not None, self.logprobs))
        return next((name for name, asked, done in wanted if asked and not done), None)
