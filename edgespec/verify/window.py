"""A draft window: what the coordinator sends and the verifier scores (docs/architecture.md §2). Pure.

One type for the round loop (edgespec.loop), the verifier engine (edgespec.engines.verifier) and the
wire (edgespec.net.wire); the answer to a window is a Verdict (edgespec.verify.greedy).
"""
from __future__ import annotations

from dataclasses import dataclass

from edgespec.verify.sampling import SparseDist
from edgespec.verify.tree import TokenTree


@dataclass(frozen=True, slots=True)
class Window:
    seq: int                       # caller's window number, echoed in the verdict
    base_position: int             # committed position the draft starts at
    draft: tuple[int, ...]         # proposed tokens (empty = one target-only step)
    q: tuple[SparseDist, ...] = () # sampling drafters: the distribution of each draft token (empty = one-hot)
    params_fingerprint: int = 0    # SamplingParams.fingerprint() the draft was made with
    parent: int | None = None      # optimistic: the assumed token at base_position - 1
    parents: tuple[int, ...] = ()  # a token tree (edgespec.verify.tree): each draft token's parent; () = a chain
    self_draft: int = 0            # cloud drafting: the verifier drafts this window itself (draft empty),
                                   # committing at most this many of its own tokens before its next token
    steps: int = 0                 # a target-only window (draft empty): the target's own tokens to commit, each
                                   # a one-token step, in one round trip (0 or 1 = one)

    @property
    def tree(self) -> TokenTree | None:
        """The draft as a TokenTree when it is one (parents given), else None (ValueError if malformed)."""
        return TokenTree(self.draft, self.parents) if self.parents else None
