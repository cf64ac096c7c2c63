"""Retry waits for the library, services and edge client alike: stdlib only, top-level like errors.py."""
from __future__ import annotations

import random
from typing import Callable


def backoff_seconds(attempt: int, first: float, cap: float, jitter: float = 0.0, hint: float | None = None,
                    at_least: float = 0.0, rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry ``attempt`` (1 = after the first failure): ``first`` doubled per further
    attempt, at most ``cap``; or a server's retry ``hint`` instead, when given; never under ``at_least``;
    then stretched by a random fraction of up to ``jitter`` (0.25: up to 25% longer), drawn from ``rng``."""
    exponent = min(max(1, attempt) - 1, 1000)   # 2.0 ** 1024 would raise; far past any cap anyway
    seconds = max(at_least, hint if hint is not None else min(cap, first * 2.0 ** exponent))
    return seconds * (1 + jitter * rng()) if jitter else seconds
