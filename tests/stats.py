"""Goodness-of-fit helpers for the distribution tests (no scipy needed)."""
from __future__ import annotations

import numpy as np

Z_999 = 3.0902   # standard normal quantile for alpha = 0.001


def chi2_critical(df: int, z: float = Z_999) -> float:
    """Upper quantile of chi-square(df) by the Wilson-Hilferty approximation (within ~1% for df >= 1)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * np.sqrt(h)) ** 3


def chi_square_gof(counts: np.ndarray, p: np.ndarray, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson statistic of ``counts`` against probabilities ``p``; cells with expected < min_expected
    are pooled into one. Fails outright if a token with p = 0 was observed."""
    n = counts.sum()
    impossible = (p <= 0) & (counts > 0)
    assert not impossible.any(), f"observed tokens with p = 0: {np.flatnonzero(impossible)}"
    expected = p * n
    big = expected >= min_expected
    obs = list(counts[big]) + ([counts[~big & (p > 0)].sum()] if (~big & (p > 0)).any() else [])
    exp = list(expected[big]) + ([expected[~big & (p > 0)].sum()] if (~big & (p > 0)).any() else [])
    obs, exp = np.array(obs, dtype=float), np.array(exp, dtype=float)
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1
