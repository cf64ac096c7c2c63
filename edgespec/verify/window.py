"""A draft window: what the coordinator sends and the verifier scores (docs/architecture.md §2). Pure.

One type for the round loop (edgespec.loop), the verifier engine (edgespec.engines.verifier) and the
wire (edgespec.net.wire); the answer to a window is a Verdict (edgespec.verify.greedy).
"""
from __future__ import annotations

from dataclasses import dataclass

from edgespec.verify.sampling import SparseDist


@dataclass(frozen=True, slots=True)
class Window:
    seq: int                       # caller's window number, echoed in the verdict
    base_position: int             # committed position the draft starts at
    draft: tuple[int, ...]         # proposed tokens (empty = one target-only step)
    q: tuple[SparseDist, ...] = () # sampling drafters: the distribution of each draft token (empty = one-hot)
    params_fingerprint: int = 0    # SamplingParams.fingerprint() the draft was made with
    parent: int | None = None      # optimistic: the assumed token at base_position - 1
