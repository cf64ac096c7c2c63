"""A target's forward cost by tokens fed, c(n): what one verifier pass over a window of n - 1 tokens costs.

Measured once when a verifier starts (``--profile-window``) and reported in its Info, so the coordinator's
window policy costs a window it has not sent yet by the curve itself instead of extrapolating from the
windows it has: on a CPU the curve is jagged (here a pass over 4 tokens was cheaper than one over 3, MKL
being slow for 2-3-row GEMMs), and an extrapolation that calls 3 tokens dearer than 2 never tries 3.
"""
from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("edgespec.profile")


def forward_profile(lm: Any, largest: int, context: int = 32, repeats: int = 2) -> dict[int, float]:
    """Seconds of one forward that feeds n tokens after a ``context``-token prefix (logits for each, by the
    backend's batched path as the verifier runs it), the fastest of ``repeats`` after one warm-up of that n,
    for n = 1..largest. Token ids are a fixed pattern inside the vocabulary (the cost does not depend on them).

    Every n is warmed up, not only the first: on a GPU the first forward of each new shape pays one-time costs
    (kernel selection, lazy loading). Measured on an H200 (torch, bfloat16): timed cold, windows read 3.6 to
    5.4 times a step; warm, 1.1 times. A profile read cold tells the window policy that drafting never pays."""
    prompt = [(11 + 7 * i) % lm.vocab_size for i in range(context)]
    state = lm.new_state()
    lm.prefill(state, prompt)
    curve: dict[int, float] = {}
    for n in range(1, largest + 1):
        seq = prompt + [prompt[(3 * i) % context] for i in range(n - 1)]
        times = []
        for attempt in range(repeats + 1):               # the first forward of each shape pays one-time costs
            lm.crop(state, context - 1)
            started = time.perf_counter()
            lm.logits_rows_batch([state], [seq], [n])
            if attempt > 0:
                times.append(time.perf_counter() - started)
        curve[n] = min(times)
    return curve


def draft_cost(engine: Any, k: int = 4, context: int = 32, repeats: int = 3) -> tuple[float, float]:
    """(seconds per drafted token, seconds per prefilled token) of a drafter engine: a session over a
    ``context``-token prefix (its open prefills it: the second) drafting ``k`` tokens after it, the fastest of
    ``repeats`` after one warm-up, divided by k (the first)."""
    session = "edgespec-draft-cost"
    prompt = [(11 + 7 * i) % engine.model.vocab_size for i in range(context)]
    engine.open(session, prompt[:4])   # a warm-up
    engine.close(session)
    started = time.perf_counter()
    engine.open(session, prompt)
    prefill = (time.perf_counter() - started) / context
    try:
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            engine.draft(session, context, (), k)
            times.append(time.perf_counter() - started)
        return min(times[1:]) / k, prefill
    finally:
        engine.close(session)


def describe(curve: dict[int, float]) -> str:
    """'1: 380 ms, 2: 2.10x, ...' for a log line."""
    if not curve:
        return "not measured"
    one = curve[min(curve)]
    return ", ".join(f"{n}: {1000 * s:.0f} ms" if n == min(curve) else f"{n}: {s / one:.2f}x"
                     for n, s in sorted(curve.items()))
