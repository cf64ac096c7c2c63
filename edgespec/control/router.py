"""Which drafter serves a request: DASD-style context-aware draft selection. Pure numpy.

Per drafter (an *arm*), a ridge regression predicts the per-token acceptance α
from request features (the prompt's category signals, its length, whether it
carries code to edit). The router picks the arm with the best expected goodput,

    rate(arm) = E(k, α) / (k · t_draft(arm) + t_verify)      maximised over k ≥ 1,

(edgespec.control.goodput: the formula and the argmax the window policies use; t_verify is one
verify round trip as the coordinator measures it, wire included),
with an optimism bonus (LinUCB: α + β·sqrt(xᵀA⁻¹x)) so an arm it knows little
about still gets tried. A session then learns online: after a few rounds it
compares the acceptance it *observes* from its drafter with what the others
are predicted to reach, and switches once when another is clearly better
(``SessionRouting``). When the session ends its observed acceptance updates the
arm's regression — the contextual bandit's feedback. Decisions and outcomes are
returned as plain records for telemetry and logs.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Sequence

import numpy as np

from edgespec.control.categories import categorize
from edgespec.control.goodput import best_rate

FEATURES = ("bias", "code", "qa", "chat", "log_prompt_chars", "code_block")
WEIGHTS_FILE = "router_weights.json"
_CODE_LINE = re.compile(r"^( {2,}|\t)\S|[;{}]\s*$|^\s*(def|class|function|return|import)\b", re.MULTILINE)


def request_features(prompt: str) -> np.ndarray:
    """What the router knows about a request before any round: [len(FEATURES)]."""
    category = categorize(prompt)
    code_lines = len(_CODE_LINE.findall(prompt))
    return np.array([1.0, category == "code", category == "qa", category == "chat",
                     math.log1p(len(prompt)) / 8.0, min(code_lines, 10) / 10.0], dtype=np.float64)


@dataclass(slots=True)
class Arm:
    """One drafter: a ridge regression of acceptance on features, and its measured cost."""
    name: str
    draft_seconds_per_token: float          # EMA of measured drafting cost
    a: np.ndarray = field(default_factory=lambda: np.eye(len(FEATURES)))    # A = λI + Σ w·x·xᵀ
    b: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))  # Σ w·x·α
    prior_alpha: float = 0.5                # acceptance assumed where the regression knows nothing

    def predict(self, x: np.ndarray, explore: float = 0.0) -> float:
        # Ridge regression shrunk toward the prior (α = prior_alpha everywhere): θ = A⁻¹(b + θ₀).
        inverse = np.linalg.inv(self.a)
        prior = np.zeros(len(FEATURES))
        prior[0] = self.prior_alpha
        theta = inverse @ (self.b + prior)
        alpha = float(x @ theta) + explore * math.sqrt(max(0.0, float(x @ inverse @ x)))
        return min(0.99, max(0.0, alpha))

    def update(self, x: np.ndarray, alpha: float, weight: float = 1.0) -> None:
        self.a += weight * np.outer(x, x)
        self.b += weight * x * alpha


@dataclass(frozen=True, slots=True)
class Decision:
    drafter: str
    predicted_alpha: dict[str, float]   # per arm, with the exploration bonus
    rates: dict[str, float]             # per arm, expected tokens/s at its best window
    reason: str                         # "request" (first choice) or "switch: ..." (online)


class Router:
    def __init__(self, arms: Sequence[Arm], verify_wall_seconds: float = 0.5, max_k: int = 8, explore: float = 0.1):
        if not arms:
            raise ValueError("a router needs at least one drafter")
        self.arms = {arm.name: arm for arm in arms}
        self.verify_wall_seconds = verify_wall_seconds   # one verify round trip, seconds (the coordinator updates it)
        self.max_k = max_k
        self.explore = explore

    def rate(self, arm: Arm, alpha: float) -> float:
        """Expected tokens/s of ``arm`` at acceptance ``alpha``, at its best window (k >= 1: an arm drafts)."""
        return best_rate([alpha] * self.max_k, arm.draft_seconds_per_token, self.verify_wall_seconds,
                         lambda k: 0.0, self.max_k, min_k=1)[1]

    def choose(self, x: np.ndarray) -> Decision:
        alphas = {name: arm.predict(x, self.explore) for name, arm in self.arms.items()}
        rates = {name: self.rate(self.arms[name], alpha) for name, alpha in alphas.items()}
        return Decision(max(rates, key=rates.get), alphas, rates, "request")

    def observe_cost(self, name: str, seconds_per_token: float, smoothing: float = 0.2) -> None:
        arm = self.arms[name]
        arm.draft_seconds_per_token += smoothing * (seconds_per_token - arm.draft_seconds_per_token)

    def to_json(self) -> dict:
        return {"features": list(FEATURES), "arms": {
            name: {"draft_seconds_per_token": arm.draft_seconds_per_token, "prior_alpha": arm.prior_alpha,
                   "a": arm.a.tolist(), "b": arm.b.tolist()} for name, arm in self.arms.items()}}

    @staticmethod
    def arms_from_json(data: dict, names: Sequence[str]) -> list[Arm]:
        """Arms for ``names``: trained ones from ``data``, the rest with priors (learned online)."""
        if tuple(data.get("features", FEATURES)) != FEATURES:
            raise ValueError(f"router weights use features {data.get('features')}, this build computes {FEATURES}")
        trained = data.get("arms", {})
        arms = []
        for name in names:
            t = trained.get(name)
            arms.append(Arm(name, t["draft_seconds_per_token"], np.array(t["a"]), np.array(t["b"]), t["prior_alpha"])
                        if t else Arm(name, 0.05))
        return arms


def load_router_weights(path: str | None = None) -> dict:
    if path:
        with open(path) as f:
            return json.load(f)
    return json.loads(resources.files("edgespec.control").joinpath(WEIGHTS_FILE).read_text())


@dataclass(slots=True)
class SessionRouting:
    """One session's drafter choice, learned online from the acceptance it observes."""
    router: Router
    x: np.ndarray
    current: str
    min_rounds: int = 4          # rounds observed before a switch is considered
    margin: float = 1.15         # switch only to an arm predicted this much faster
    max_switches: int = 1
    accepted: dict[str, int] = field(default_factory=dict)
    judged: dict[str, int] = field(default_factory=dict)     # positions judged: min(n + 1, k) per round
    rounds: dict[str, int] = field(default_factory=dict)
    switches: list[Decision] = field(default_factory=list)

    def observe(self, drafter: str, k: int, accepted: int, draft_seconds: float) -> None:
        if k <= 0:
            return
        self.accepted[drafter] = self.accepted.get(drafter, 0) + accepted
        self.judged[drafter] = self.judged.get(drafter, 0) + min(accepted + 1, k)
        self.rounds[drafter] = self.rounds.get(drafter, 0) + 1
        self.router.observe_cost(drafter, draft_seconds / k)

    def observed_alpha(self, drafter: str) -> float | None:
        judged = self.judged.get(drafter, 0)
        return self.accepted.get(drafter, 0) / judged if judged else None

    def maybe_switch(self) -> Decision | None:
        """A better drafter for the rest of this session, or None to keep the current one."""
        if len(self.switches) >= self.max_switches or self.rounds.get(self.current, 0) < self.min_rounds:
            return None
        router = self.router
        alphas = {name: arm.predict(self.x) for name, arm in router.arms.items()}
        alphas[self.current] = self.observed_alpha(self.current)
        rates = {name: router.rate(router.arms[name], alpha) for name, alpha in alphas.items()}
        best = max(rates, key=rates.get)
        if best == self.current or rates[best] < self.margin * rates[self.current]:
            return None
        decision = Decision(best, alphas, rates, f"switch: {self.current} observed α={alphas[self.current]:.2f}")
        self.switches.append(decision)
        self.current = best
        return decision

    def finish(self) -> None:
        """Feed what this session observed back into the router (weight: positions judged, capped)."""
        for name, judged in self.judged.items():
            self.router.arms[name].update(self.x, self.accepted[name] / judged, weight=min(1.0, judged / 32))
