"""How a session speculates, in one record: SpeculationConfig, built with keywords.

The coordinator's flags make one (GenerationConfig.speculation). When a session opens, ``settled`` narrows it to
what that session will run: the request's window and decoding, the drafter's largest window, and what every
verifier of the pool and the drafter can do (Generations). The round loop reads the settled config (speculate,
Rounds), and the client receives it before the first token (GenerateResponse.plan, with ``notes`` saying what was
asked for and turned off, and why). Nothing is downgraded mid-session: the engines' own checks stay as guards.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from edgespec.control.policies import ADAPTIVE
from edgespec.verify.sampling import SamplingParams

AUTO_POLICIES = tuple(ADAPTIVE)   # the adaptive window policies a coordinator may run (edgespec.control.policies)
CLOUD_DRAFT_MODES = ("off", "fallback", "on")
ON_VERIFIER_LOSS = ("fail", "draft-only")
# Target-only windows of several steps (blocking rounds): the verifier commits up to this many of the target's own
# tokens in one round trip, so that the round trip, paid once per token otherwise, is paid once per TARGET_STEPS
# (measured at one thread: the verifier's model waited 12% of the time for the next window; with 4 steps, window 0
# decoded at 1.02x the engine alone). Between an adaptive policy's decisions too: a free draft or a probe is then at
# most 3 tokens late, and the default is as fast as window 0 where nothing is drafted.
TARGET_STEPS = 4
NOTED = ("pipeline", "tree_depth", "cloud_draft")   # what a settled config notes when it turns it off


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculationConfig:
    window: int = -1               # tokens: -1 = adaptive (auto_policy), 0 = target-only, k = a fixed window of k
    auto_policy: str = "goodput"   # adaptive policy: "goodput" | "heuristic" (+2 / -1) | "awc" (learned)
    auto_max_window: int = 4       # largest window the adaptive policy considers, tokens
    max_window: int = 16           # largest window a request may ask for, and the most one draft call asks for, tokens
    pipeline: bool = False         # draft the next window while one is in flight and send it as an optimistic window
    tree_depth: int = 0            # lossless, blocking rounds: token trees with runner-ups at this many depths
                                   # (0 = chains, -1 = auto)
    cloud_draft: str = "off"       # lossless, blocking rounds: the verifier drafts for itself (PTD): "off" |
                                   # "fallback" (while the edge drafter is down) | "on" (every round)
    free_drafts: bool = True       # lossless, blocking, adaptive rounds: free drafts (the suffix drafter at the
                                   # coordinator) asked every round, sent where they pay (where one runs)
    target_steps: int = TARGET_STEPS   # blocking rounds: a target-only window commits up to this many of the
                                   # target's own tokens in one round trip (1 = a token a round trip)
    first_token_alone: bool = True # the first token is a target-only step, whatever the policy or a free drafter
                                   # would send (a draft only delays it); False: drafts from the first round
    on_verifier_loss: str = "fail" # no verifier reachable: "fail" (Unavailable) | "draft-only" (unverified tokens)
    max_unverified: int = 256      # draft-only: unverified tokens allowed ahead of the verified ones, tokens
    notes: tuple[str, ...] = ()    # a settled config: what was asked for and is off for this session, and why

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """What is wrong with these settings, in words; None when nothing is."""
        if self.auto_policy not in AUTO_POLICIES:
            return f"auto_policy must be one of {', '.join(AUTO_POLICIES)}, got {self.auto_policy!r}"
        if self.cloud_draft not in CLOUD_DRAFT_MODES:
            return f"cloud_draft must be one of {', '.join(CLOUD_DRAFT_MODES)}, got {self.cloud_draft!r}"
        if not -1 <= self.tree_depth <= 4:
            return f"tree_depth must be in 0..4 or -1 (auto), got {self.tree_depth}"
        if self.on_verifier_loss not in ON_VERIFIER_LOSS:
            return f"on_verifier_loss must be one of {', '.join(ON_VERIFIER_LOSS)}, got {self.on_verifier_loss!r}"
        if self.max_window < 1 or not 1 <= self.auto_max_window:
            return f"max_window and auto_max_window must be >= 1, got {self.max_window} and {self.auto_max_window}"
        if not -1 <= self.window <= self.max_window:
            return f"window must be -1 (adaptive) or 0..max_window ({self.max_window}), got {self.window}"
        if self.target_steps < 1 or self.max_unverified < 0:
            return f"target_steps must be >= 1 and max_unverified >= 0, got {self.target_steps}, {self.max_unverified}"
        return None

    def settled(self, params: SamplingParams, *, window: int | None = None, max_draft: int | None = None,
                trees: str = "", drafter_trees: str = "", free: bool = True) -> "SpeculationConfig":
        """What one session runs of this config: the one place of the rules below, each turning off what the
        session cannot do (a note says why where the config asked for it). Settling a settled config changes
        nothing.

        window: the request's (-1 or None: this config's); max_draft: the largest window the verifier takes, by its
        Info (None: no limit of its own); trees: why the session cannot have token trees nor cloud drafting ("" = it can: every
        verifier of the pool scores trees); drafter_trees: why its drafter cannot draft token trees ("" = it
        can); free: whether a free drafter runs."""
        plan, notes = self, list(self.notes)

        def off(reason: str, **changes) -> None:
            nonlocal plan
            noted = [f"{name.replace('_', ' ')} {getattr(plan, name)}" for name, value in changes.items()
                     if name in NOTED and getattr(plan, name) != value]
            if noted:
                notes.append(f"{', '.join(noted)} off: {reason}")
            plan = replace(plan, **changes, notes=())

        if max_draft is not None and max_draft < plan.max_window:   # a fixed window too: the verifier takes no more
            limit = max(1, max_draft)
            plan = replace(plan, max_window=limit, window=min(plan.window, limit), notes=())
        if window is not None and window != -1:
            plan = replace(plan, window=min(window, plan.max_window), notes=())
        if plan.window == 0:   # asked for by the request: nothing to note
            plan = replace(plan, pipeline=False, tree_depth=0, cloud_draft="off", free_drafts=False)
        if plan.window > 0:
            off("a fixed window", free_drafts=False)
        if plan.pipeline:   # pipelined rounds send chains of the drafter's tokens only, one step per target-only window
            off("pipelined rounds", tree_depth=0, cloud_draft="off", free_drafts=False, target_steps=1)
        if params.relaxation.lossy:
            off("relaxed verification", tree_depth=0, cloud_draft="off", free_drafts=False)
        if params.sampler == "coupled":
            off("coupled sampling", free_drafts=False)
        if trees:
            off(trees, tree_depth=0, cloud_draft="off")
        if drafter_trees:
            off(drafter_trees, tree_depth=0)
        if not free:
            plan = replace(plan, free_drafts=False, notes=())
        return replace(plan, notes=tuple(notes))
