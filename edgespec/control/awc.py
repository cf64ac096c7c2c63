"""AWC, Adaptive Window Control (the DSD paper's WC-DNN): a small MLP picks the window from telemetry.

Pure: numpy only. The network reads Telemetry.features() (FEATURE_NAMES), predicts the best window
as a real number, and the policy turns that into a stable integer window:

    clamp to [0, max_k] -> EMA (weight 0.4 on the new prediction) -> hysteresis

Hysteresis: the window moves to round(smoothed) only after the smoothed value has been past the
midpoint between the current window and its neighbour by `margin` for `hold_rounds` consecutive
rounds. Entering or leaving k = 0 (target-only mode) needs `mode_margin` for `mode_hold_rounds`.
In target-only mode the drafter is silent, so acceptance is never re-measured by itself: every
`probe_every` rounds one round drafts a single token.

Weights come from edgespec/control/awc_weights.json, written by `python -m training.train_awc`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import FEATURE_NAMES, Telemetry

WEIGHTS = Path(__file__).with_name("awc_weights.json")


def signed_log1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


@dataclass(slots=True, frozen=True)
class Mlp:
    """features [F] -> signed_log1p -> standardise -> (Linear, ReLU)* -> Linear -> window (float)."""
    mean: np.ndarray                                  # [F]
    std: np.ndarray                                   # [F]
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # (W [in, out], b [out]) per layer

    def __call__(self, features: np.ndarray) -> float:
        h = (signed_log1p(features) - self.mean) / self.std
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return float(h[0])

    def batch(self, features: np.ndarray) -> np.ndarray:
        """[N, F] -> [N]."""
        h = (signed_log1p(features) - self.mean) / self.std
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    @classmethod
    def from_dict(cls, spec: dict) -> "Mlp":
        if tuple(spec["features"]) != FEATURE_NAMES:
            raise ValueError(f"AWC weights expect features {spec['features']}, telemetry gives {FEATURE_NAMES}; "
                             "retrain with python -m training.train_awc")
        layers = tuple((np.asarray(l["w"], float), np.asarray(l["b"], float)) for l in spec["layers"])
        return cls(np.asarray(spec["mean"], float), np.asarray(spec["std"], float), layers)


@lru_cache(maxsize=4)
def load_model(path: str | Path = WEIGHTS) -> Mlp:
    return Mlp.from_dict(json.loads(Path(path).read_text()))


@dataclass(slots=True)
class AwcWindow:
    """WindowPolicy over the session's Telemetry, which the round loop records every round into
    before it calls observe()."""
    telemetry: Telemetry
    model: Callable[[np.ndarray], float] = field(default_factory=load_model)
    max_k: int = 8                 # largest window, tokens
    k: int = 2                     # current window, tokens
    smoothing: float = 0.4         # EMA weight of a new prediction
    margin: float = 0.15           # beyond the midpoint to the neighbour, windows
    hold_rounds: int = 3           # consecutive rounds past the margin before switching
    mode_margin: float = 0.25      # margin to enter or leave k = 0
    mode_hold_rounds: int = 6      # rounds to enter or leave k = 0
    probe_every: int = 16          # target-only rounds between single-token probes
    explore: bool = True           # try each window never measured once (see _unmeasured)
    explore_min_alpha: float = 0.3 # ... only while drafts are accepted at least this often per token
    smoothed: float | None = None  # EMA of the clamped prediction
    raw: float = 0.0               # last clamped prediction
    _streak: int = 0               # consecutive rounds the switch condition held
    _direction: int = 0            # +1 / -1: direction of the pending switch
    _idle_rounds: int = 0          # consecutive k = 0 rounds

    def choose(self) -> int:
        if self.k == 0 and self._idle_rounds >= self.probe_every and self.max_k > 0:
            return 1
        unmeasured = self._unmeasured()
        if unmeasured is not None:
            return unmeasured
        return min(self.k, self.max_k)

    def _unmeasured(self) -> int | None:
        """Exploration: while speculating and drafts are being accepted, try once each window whose
        verifier cost was never measured. A verifier's cost by window need not grow with the window
        (measured on a 2-core CPU: 3 tokens slower than 4), so a slope fitted to small windows can keep
        the model from ever trying the window that is fastest. With costs inherited across sessions
        (Telemetry.inherit_costs) this costs a few rounds once per coordinator."""
        measured = self.telemetry.verify_compute
        if (not self.explore or not measured or self.k == 0     # no costs reported: nothing to learn by trying
                or self.telemetry.alpha_per_token() < self.explore_min_alpha):
            return None
        for k in range(1, self.max_k + 1):
            if k not in measured:
                return k
        return None

    def observe(self, sample: RoundSample) -> None:
        k = sample.k
        self._idle_rounds = self._idle_rounds + 1 if k == 0 else 0
        self.raw = min(float(self.max_k), max(0.0, self.model(self.telemetry.features(k))))
        s = self.smoothing
        self.smoothed = self.raw if self.smoothed is None else (1 - s) * self.smoothed + s * self.raw
        self._hysteresis(self.smoothed)

    def _hysteresis(self, smoothed: float) -> None:
        target = int(min(self.max_k, max(0, round(smoothed))))
        if target == self.k:
            self._streak, self._direction = 0, 0
            return
        mode = target == 0 or self.k == 0
        margin = self.mode_margin if mode else self.margin
        hold = self.mode_hold_rounds if mode else self.hold_rounds
        direction = 1 if target > self.k else -1
        if abs(smoothed - self.k) < 0.5 + margin:
            self._streak, self._direction = 0, 0
            return
        self._streak = self._streak + 1 if direction == self._direction else 1
        self._direction = direction
        if self._streak >= hold:
            self.k, self._streak, self._direction = target, 0, 0
            if target == 0:
                self._idle_rounds = 0
