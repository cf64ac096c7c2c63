"""Per-round telemetry, gathered where it happens, read by window control (docs/architecture.md §2, §4).

Pure: no grpc, torch or asyncio. The round loop records each round's RoundSample (edgespec.control.sample);
window policies read the estimates (the goodput policy through `goodput_window`), AWC reads `features()`.

All EMAs use the same weight `smoothing` for a new observation. The link RTT is estimated as the
coordinator-measured verify round trip minus the verifier-reported time the window spent inside it
(RoundSample.rtt): the wire and serialisation, not the window's wait behind other sessions' work. That
wait is load, which the goodput model charges through the shared forward (verify_estimate); counted
as link latency, which longer windows amortise, it made sessions draft more the busier the verifier
was (measured: 4 users on a 2-CPU host, the adaptive window at 0.57x window 0's throughput). A
verifier that reports only its forward time leaves the wait in the RTT; one that reports neither
makes the RTT the whole round trip.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from edgespec.control.goodput import (best_rate, best_tree_depth, best_window, curve_seconds, curve_slope,
                                      expected_tokens, goodput)
from edgespec.control.sample import RoundSample


def _ema(old: float | None, new: float, s: float) -> float:
    return new if old is None else (1 - s) * old + s * new


@dataclass(slots=True)
class LinkStats:
    """RTT of one verifier link: EMA mean, jitter (EMA of |x - mean|), trend (EMA of the change
    of the mean per round) and the last `window` samples for percentiles. Seconds."""
    smoothing: float = 0.3
    window: int = 64
    mean: float | None = None
    jitter: float = 0.0
    trend: float = 0.0
    count: int = 0
    recent: deque = field(default_factory=deque)

    def add(self, rtt: float) -> None:
        s = self.smoothing
        if self.mean is None:
            self.mean = rtt
        else:
            old = self.mean
            self.jitter = (1 - s) * self.jitter + s * abs(rtt - old)
            self.mean = (1 - s) * old + s * rtt
            self.trend = (1 - s) * self.trend + s * (self.mean - old)
        self.recent.append(rtt)
        if len(self.recent) > self.window:
            self.recent.popleft()
        self.count += 1

    def percentile(self, q: float) -> float:
        """q in [0, 100] over the last `window` samples (nearest rank); 0 before any sample."""
        if not self.recent:
            return 0.0
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, max(0, int(np.ceil(q / 100 * len(ordered))) - 1))]


# The AWC feature vector, in order. Times are divided by t_ref, the verifier's forward time for the
# smallest window measured (one target pass), so the same model serves a CPU verifier (~0.4 s) and a
# GPU one (~0.02 s): the best window depends only on the ratios of the costs, not their scale.
FEATURE_NAMES = (
    "queue_util",    # verifier queue-depth EMA / queue_capacity (windows waiting per batch slot), [0, 4]
    "acceptance",    # recent acceptance rate: EMA of n / k over rounds with k > 0, [0, 1]
    "alpha",         # per-token acceptance: EMA accepted / EMA judged positions (MLE for constant alpha), [0, 1]
    "rtt_mean",      # current link's RTT EMA / t_ref
    "rtt_jitter",    # current link's EMA |rtt - mean| / t_ref
    "rtt_trend",     # current link's EMA of the change of the mean per round / t_ref
    "tpot",          # EMA of round seconds per committed token / t_ref
    "draft_cost",    # drafter seconds per token EMA / t_ref
    "verify_slope",  # extra verifier forward seconds per extra window token / t_ref
    "prev_k",        # previous window / max_k, [0, 1]
    "goodput_k",     # the window maximising this telemetry's own goodput estimate (goodput_window) / max_k, [0, 1]
)
_RATIO_CLIP = 100.0


@dataclass(slots=True)
class Telemetry:
    max_k: int = 8                  # positions tracked for conditional acceptance, tokens
    smoothing: float = 0.3          # EMA weight of a new observation
    queue_capacity: float = 8.0     # windows the verifier scores per batch, for queue_util
    rtt_window: int = 64            # samples kept per link for percentiles
    prior_alpha: float = 0.7        # acceptance assumed before any observation
    prior_verify_slope: float = 0.1  # verify_slope (fraction of t_ref per token) before two k's are measured
    links: dict[str, LinkStats] = field(default_factory=dict)
    alpha: list[float] = field(default_factory=list)           # [max_k] conditional acceptance per position
    acceptance: float | None = None                            # EMA of n / k
    accepted_ema: float | None = None                          # EMA of n (rounds with k > 0)
    judged_ema: float | None = None                            # EMA of positions judged, min(n + 1, k)
    judged_depth: int = 0                                      # positions judged at least once
    known_depth: int = 0                                       # ... here or by the sessions this one started from
    draft_per_token: float | None = None                       # seconds
    draft_prefill_per_token: float = 0.0                       # seconds per token the drafter prefills (0: unknown)
    verify_wall: float | None = None                           # seconds, verify round trip EMA (any window)
    verify_compute: dict[int, float] = field(default_factory=dict)  # window k -> its forward seconds EMA, alone in it
    queue_last: int = 0                                        # windows
    queue_ema: float = 0.0                                     # windows
    tpot: float | None = None                                  # seconds per committed token
    rounds: int = 0
    last_link: str = ""
    batch_windows: float = 0.0                                 # EMA of windows per verifier forward (0 = unreported)
    drafter_shares_cpus: bool = False                          # the drafter runs on the verifier's CPUs (their Infos)
    verifier_wait: float = 0.0                                 # EMA of a window's wait in the verifier, seconds
    target_steps: int = 1                                      # tokens a target-only round commits (its steps)
    forward_curve: dict[int, float] = field(default_factory=dict)  # tokens fed -> verifier forward seconds EMA
    profile: dict[int, float] = field(default_factory=dict)   # tokens fed -> forward seconds, the verifier's own
                                                               # measurement at its start (Info.forward_seconds)
    # Where a verifier's costs change with the session's length (Info.far_positions: llama.cpp's exact mode decodes
    # every row alone from there, so a window costs a decode a row), the three cost curves above hold the
    # costs where the session is; `other_side` keeps the other side's (profile, verify_compute, forward_curve) until
    # the session crosses (at_position). 0: one set of costs.
    far_positions: int = 0
    far: bool = False                                          # the curves above are those past far_positions
    other_side: tuple[dict, dict, dict] = field(default_factory=lambda: ({}, {}, {}))
    sibling_chances: int = 0                                   # tree rounds whose chain stopped where a runner-up stood
    sibling_hits: int = 0                                      # ... and the target took the runner-up

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.prior_alpha] * self.max_k

    def record(self, sample: RoundSample) -> None:
        s = self.smoothing
        self.rounds += 1
        self.last_link = sample.link
        link = self.links.get(sample.link)
        if link is None:
            link = self.links[sample.link] = LinkStats(s, self.rtt_window)
        link.add(sample.rtt)
        self.verify_wall = _ema(self.verify_wall, sample.verify_wall_seconds, s)
        # a round's forward time is its window's cost, except the first round's: its first row may come from the
        # prompt's prefill (measured: 0.6 ms against 85 ms a step, which made target-only rounds look free)
        if sample.verify_compute_seconds > 0 and not sample.after_prompt:
            forward = sample.verify_compute_seconds / sample.steps   # a window of steps: its passes, one each
            # a window's own cost: not a forward it shared with other sessions, nor a tree's (more than k + 1 tokens)
            if sample.batch_windows <= 1 and not sample.siblings and not sample.self_drafted:
                self.verify_compute[sample.k] = _ema(self.verify_compute.get(sample.k), forward, s)
            if sample.batch_tokens > 0:
                self.forward_curve[sample.batch_tokens] = _ema(self.forward_curve.get(sample.batch_tokens), forward, s)
        if sample.batch_windows > 0:
            self.batch_windows = _ema(self.batch_windows or None, float(sample.batch_windows), s)
        self.queue_last = sample.queue_depth
        self.queue_ema = (1 - s) * self.queue_ema + s * sample.queue_depth
        # what a round waits for the forward in progress when it arrives; a wait longer than two of its own forwards
        # is a queue behind other sessions' prompts (a session's first window), which later rounds do not pay
        forward = sample.verify_compute_seconds / max(1, sample.steps)
        self.verifier_wait = (1 - s) * self.verifier_wait + s * min(sample.verifier_wait, 2 * forward)
        if sample.tokens > 0:
            self.tpot = _ema(self.tpot, sample.wall / sample.tokens, s)
        k, n = sample.k, sample.accepted
        if k == 0 or sample.free:   # acceptance and drafting cost are the drafter's: free drafts keep their own
            return
        if sample.siblings and (n < sample.siblings or sample.took_sibling):   # a runner-up stood where it stopped
            self.sibling_chances += 1
            self.sibling_hits += sample.took_sibling
            if sample.took_sibling:
                n -= 1   # the chain itself was rejected at the sibling's depth: its acceptance counts that
        self.acceptance = _ema(self.acceptance, n / k, s)
        self.accepted_ema = _ema(self.accepted_ema, float(n), s)
        self.judged_ema = _ema(self.judged_ema, float(min(n + 1, k)), s)
        if sample.draft_seconds > 0 and sample.draft_catchup <= 1:
            # a draft that first caught up on tokens committed while the drafter idled (a probe after
            # target-only rounds) says nothing about a drafted token's cost: it would price drafting out
            self.draft_per_token = _ema(self.draft_per_token, sample.draft_seconds / k, s)
        self.judged_depth = max(self.judged_depth, min(n + 1, k, self.max_k))
        for j in range(min(n + 1, k, self.max_k)):     # positions that were actually judged
            self.alpha[j] = (1 - s) * self.alpha[j] + s * (1.0 if j < n else 0.0)

    def inherit_costs(self, other: "Telemetry") -> None:
        """Take ``other``'s cost estimates (links, draft and verify costs, queue, TPOT), not its acceptance.

        Costs belong to the deployment, acceptance to the text: a coordinator keeps one Telemetry of what
        earlier sessions measured and starts each session from its costs, so a short generation does not
        begin blind (and windows measured once need not be measured again)."""
        self.links = {name: LinkStats(link.smoothing, link.window, link.mean, link.jitter, link.trend, link.count,
                                      deque(link.recent)) for name, link in other.links.items()}
        self.last_link = other.last_link
        self.draft_per_token, self.verify_wall = other.draft_per_token, other.verify_wall
        self.draft_prefill_per_token = other.draft_prefill_per_token
        self.verify_compute = dict(other.verify_compute)
        self.batch_windows, self.forward_curve = other.batch_windows, dict(other.forward_curve)
        self.drafter_shares_cpus, self.verifier_wait = other.drafter_shares_cpus, other.verifier_wait
        self.profile = dict(other.profile)
        self.far_positions, self.far = other.far_positions, other.far
        self.other_side = tuple(dict(curve) for curve in other.other_side)
        self.queue_last, self.queue_ema, self.tpot = other.queue_last, other.queue_ema, other.tpot

    def take_profiles(self, near: dict[int, float], far: dict[int, float], far_positions: int) -> None:
        """A verifier's profiles (its Info): ``near`` measured over a short context, ``far`` past ``far_positions``
        ({} and 0 where its costs do not change with the length)."""
        self.far_positions = far_positions if far else 0
        mine, others = (far, near) if self.far else (near, far)
        self.profile = dict(mine)
        self.other_side = (dict(others), *self.other_side[1:])

    def at_position(self, position: int) -> None:
        """The session holds ``position`` tokens: past far_positions the windows are costed by the far costs (the
        far profile, windows measured there), before it by the near ones. Without the switch, a one-token pass
        measured past it (1.8 times dearer here: one thread) scaled the near profile, which priced every window
        1.8 times dearer too, where a window of 3 rows costs the same on both sides (measured: 1.34 one-token
        passes past 240 positions against 2.47 before, default target, 2 threads)."""
        far = 0 < self.far_positions <= position
        if far != self.far:
            here = (self.profile, self.verify_compute, self.forward_curve)
            self.profile, self.verify_compute, self.forward_curve = self.other_side
            self.other_side, self.far = here, far

    def start_from(self, coordinator: "Telemetry") -> None:
        """A new session's telemetry: the coordinator's costs (inherit_costs) and, as the prior of its per-position
        acceptance, what the coordinator's earlier sessions accepted (``absorb``) instead of a fixed 0.7. The
        session's own rounds move it at the usual rate: acceptance still belongs to the text, but a session of
        32 tokens has too few rounds to find it from a prior far off."""
        self.inherit_costs(coordinator)
        self.alpha = list(coordinator.alpha)
        self.known_depth = max(coordinator.known_depth, coordinator.judged_depth)
        self.sibling_chances, self.sibling_hits = coordinator.sibling_chances, coordinator.sibling_hits

    def expect_company(self, others: int) -> None:
        """A session that starts while ``others`` sessions of its coordinator are under way: its forwards are taken to
        be shared by them all until its rounds say otherwise (batch_windows). The costs it inherited may come from a
        quieter time (one session after another); by them it would draft, and open its drafter, at a load where that
        cannot pay (measured: 4 sessions started together after single ones, on 2 CPUs)."""
        if others > 0:
            self.batch_windows = max(self.batch_windows, float(others + 1))

    def absorb(self, session: "Telemetry", weight: float = 0.3) -> None:
        """A finished session into the coordinator's telemetry: its costs replace the coordinator's (inherit_costs),
        and its per-position acceptance moves the coordinator's prior by ``weight`` (positions it drafted only)."""
        self.inherit_costs(session)
        for j in range(min(session.judged_depth, len(self.alpha))):
            self.alpha[j] = (1 - weight) * self.alpha[j] + weight * session.alpha[j]
        self.known_depth = max(self.known_depth, session.known_depth, session.judged_depth)
        self.sibling_chances, self.sibling_hits = session.sibling_chances, session.sibling_hits   # started from ours

    # -- estimates -------------------------------------------------------------------------------

    def tree_depth(self, k: int, max_depth: int) -> int:
        """How many runner-ups a window of k should carry (goodput.best_tree_depth): the tokens they add
        (acceptance per position, and how often the target took a runner-up where the chain stopped: a prior
        of 1 in 4) against the verifier's measured forward time by tokens fed (a size past the largest
        measured costed as the largest, so it gets tried). 0 while forwards are shared (a tree is scored alone,
        outside the batch), and 0 until the chain of k was measured alone: the window policy costs windows by
        their chains (verify_compute, which tree rounds do not feed), so a new k goes out once as a chain."""
        if k <= 0 or max_depth <= 0 or self.shared_forwards() or k not in self.verify_compute or not self.forward_curve:
            return 0
        beta = (self.sibling_hits + 1) / (self.sibling_chances + 4)
        return best_tree_depth(self._alphas(k), k, beta, self.draft_seconds(), self.round_overhead(),
                               self._forward_cost, max_depth)

    def _forward_cost(self, tokens: int) -> float:
        """One forward over ``tokens`` alone: as measured in rounds, else the verifier's profile (scaled to
        what rounds measured), else a lower bound from the rounds (a size never measured looks cheap)."""
        if tokens in self.forward_curve:
            return self.forward_curve[tokens]
        if tokens in self.profile:
            return self.profile[tokens] * self._profile_scale(self.forward_curve.items())
        return curve_seconds(self.forward_curve, tokens, low=True)

    def _profile_scale(self, measured) -> float:
        """Measured forward time over the profile's at the sizes both have (the profile was taken at start,
        alone, over a short context; rounds run later, maybe longer): the median ratio, 1 with none."""
        ratios = sorted(seconds / self.profile[n] for n, seconds in measured if self.profile.get(n, 0) > 0)
        return ratios[len(ratios) // 2] if ratios else 1.0

    def alpha_per_token(self) -> float:
        if not self.judged_ema:
            return self.prior_alpha
        return min(1.0, self.accepted_ema / self.judged_ema)

    def expected_tokens(self, k: int) -> float:
        """E(k) from the conditional acceptance EMAs."""
        return expected_tokens(self.alpha, min(k, self.max_k))

    def reference_seconds(self) -> float:
        """t_ref: forward time of the smallest window measured; else the mean round trip; else 1 s."""
        if self.verify_compute:
            return self.verify_compute[min(self.verify_compute)]
        link = self.links.get(self.last_link)
        return link.mean if link is not None and link.mean else 1.0

    def verify_slope_seconds(self) -> float:
        """Least-squares slope of verifier forward seconds against window size (seconds per token)."""
        if len(self.verify_compute) < 2:
            return self.prior_verify_slope * self.reference_seconds()
        return curve_slope(self.verify_compute)

    def forward_seconds(self, tokens: float) -> float | None:
        """The verifier's forward time for a forward that feeds ``tokens`` (all its windows), from the forwards
        verdicts reported (goodput.curve_seconds: interpolated, extrapolated along the last measured segment).
        None before any report."""
        return curve_seconds(self.forward_curve, tokens)

    def token_seconds(self) -> float:
        """What one more token fed adds to a verifier forward: the least-squares slope of the forwards measured by
        tokens fed (one size measured: in proportion to it), and no less than the slope of the verifier's own
        profile (scaled to what rounds measured). Not the local slope between two measured sizes: a size is
        measured by a few rounds, and two neighbours whose noise ran the wrong way made a forward of 16 more
        tokens look free (measured: 16 sessions on 2 CPUs, each token costing a forward 35 ms, free drafts of 8
        tokens sent at 25% acceptance, 0.84x window 0's throughput)."""
        own = curve_slope(self.profile) * self._profile_scale(self.forward_curve.items()) if len(self.profile) > 1 else 0.0
        return max(curve_slope(self.forward_curve), own)

    def round_overhead(self) -> float:
        """Seconds every round pays besides drafting and its forward: the link's round trip and the window's wait in
        the verifier behind other sessions' work (EMAs). Under load the wait is most of it: a window that arrives
        during another forward waits for its end. Longer rounds amortise it, a drafted window and a target-only
        window of steps alike (target_steps)."""
        return (self.link_stats().mean or 0.0) + self.verifier_wait

    def draft_seconds(self) -> float:
        """What a drafted token costs a round: the drafter's time per token (0 while unmeasured). With the drafter on
        the verifier's CPUs while W sessions share its forwards, W times that: the CPU time the drafter takes is
        taken from the forward every one of them waits for (measured, 2 CPUs, 4 users: the adaptive window's model
        drafts at 0.7x window 0's throughput while each session's own estimate said they paid)."""
        seconds = self.draft_per_token or 0.0
        return seconds * self.batch_windows if self.drafter_shares_cpus and self.shared_forwards() else seconds

    def shared_forwards(self) -> bool:
        """The verifier's forwards carry other sessions' windows too (1.5 or more per forward on average)."""
        return self.batch_windows >= 1.5

    def verify_estimate(self, k: int, optimistic: bool = False) -> float:
        """Verifier forward seconds for a window of k.

        Under load (forwards shared by other sessions' windows, W of them on average): the forward if every session
        sharing it drafted k as this one does, W (k+1) tokens: the measured forward over W tokens plus W k times
        what a token adds to a forward (token_seconds), so that a window's tokens are charged to everyone they slow
        down, and drafting backs off as the batch fills where the verifier's cost grows with the tokens it feeds,
        and returns when it drains.
        Otherwise the measured EMA; for a window not measured yet, the verifier's profile of a forward over
        k + 1 tokens (scaled by what the measured windows cost against it); without one, t_ref plus the slope, or
        (``optimistic``) the cost of the nearest smaller measured window (else the smallest measured one;
        0 while the verifier reports no forward time), so that it gets tried."""
        if self.shared_forwards() and self.forward_curve:
            return self.forward_seconds(self.batch_windows) + self.batch_windows * k * self.token_seconds()
        if k in self.verify_compute:
            return self.verify_compute[k]
        if k + 1 in self.profile:
            return self.profile[k + 1] * self._profile_scale((m + 1, s) for m, s in self.verify_compute.items())
        if optimistic:
            if not self.verify_compute:
                return 0.0
            below = [m for m in self.verify_compute if m <= k]
            return self.verify_compute[max(below) if below else min(self.verify_compute)]
        ref_k = min(self.verify_compute) if self.verify_compute else 0
        return self.reference_seconds() + self.verify_slope_seconds() * (k - ref_k)

    def goodput_window(self, max_k: int | None = None, optimistic: bool = False) -> int:
        """argmax_k E(k) / (k t_draft + RTT + t_verify(k)) over [0, max_k] (default: the positions tracked)
        from these estimates: the analytic answer of docs/architecture.md §4. AWC gets it as one feature
        among the others; the goodput policy follows it with ``optimistic`` costing of unmeasured windows.
        Past the positions tracked, acceptance is taken to stay at the last tracked position's."""
        max_k = self.max_k if max_k is None else max_k
        return best_window(self._alphas(max_k), self.draft_seconds(), self.round_overhead(),
                           lambda k: max(1e-6, self.verify_estimate(k, optimistic)), max_k, steps=self.target_steps)

    def probe_window(self, max_k: int) -> int:
        """The window a probe (a drafted round among target-only ones) should draft: the best one by the costs if
        every position accepted as the first does (the one a probe of one token measures), at least 1. A probe
        of one token finds only the first position's acceptance, and the deeper ones stay where they were
        (the prior, or earlier sessions'), so a drafter accepted 9 times in 10 stayed at target-only."""
        first = self._alphas(1)[0]
        return best_window([first] * max_k, self.draft_seconds(), self.round_overhead(),
                           lambda k: max(1e-6, self.verify_estimate(k, True)), max_k, min_k=1)

    def goodput_rate(self, k: int, optimistic: bool = False) -> float:
        """E(k) / (k t_draft + RTT + t_verify(k)) from these estimates: what goodput_window maximises."""
        return goodput(self._alphas(k), k, self.draft_seconds(), self.round_overhead(),
                       max(1e-6, self.verify_estimate(k, optimistic)), self.target_steps)

    def _alphas(self, max_k: int) -> list[float]:
        """Per-position acceptance for windows up to max_k: past the positions tracked, the last one's; past the
        positions ever judged (here or by earlier sessions), the deepest judged one's instead of the prior, so
        that a window deeper than any tried is tried when what was seen says it would pay (conditional
        acceptance changes little along a window; the prior 0.7 under a measured 0.9 kept windows at 1 for good),
        and measured from then on."""
        alpha = list(self.alpha)
        known = min(max(self.known_depth, self.judged_depth), len(alpha))
        if 0 < known < len(alpha):
            alpha[known:] = [alpha[known - 1]] * (len(alpha) - known)
        return alpha + alpha[-1:] * (max_k - len(alpha)) if max_k > len(alpha) else alpha

    def drafting_cannot_pay(self, max_k: int, margin: float = 1.1) -> bool:
        """True when, by the measured costs, no window of 1..max_k would beat target-only rounds by
        ``margin`` even if every drafted token were accepted (unmeasured windows costed by the fitted slope,
        not optimistically): a gain that small cannot repay what finding out costs (the drafter's session
        opened or caught up on the tokens it missed). False while the drafting cost is unmeasured."""
        rates = self._best_case_rates(max_k)
        return rates is not None and rates[1] < margin * rates[0]

    def best_case_saving(self, max_k: int) -> float:
        """Seconds a committed token would save drafted at the best window, every drafted token accepted, against
        target-only rounds, by the measured costs (<= 0: drafting cannot gain at all). 0 while drafting is
        unmeasured."""
        rates = self._best_case_rates(max_k)
        return 0.0 if rates is None else 1 / rates[0] - 1 / rates[1]

    def _best_case_rates(self, max_k: int) -> tuple[float, float] | None:
        """(tokens/s of target-only rounds, of the best window of 1..max_k with every drafted token accepted) by the
        measured costs (unmeasured windows by the fitted slope); None while the drafting cost is unmeasured."""
        if self.draft_per_token is None:
            return None
        overhead = self.round_overhead()
        verify = lambda k: max(1e-6, self.verify_estimate(k))   # noqa: E731
        _, drafting = best_rate([1.0] * max_k, self.draft_seconds(), overhead, verify, max_k, min_k=1)
        return goodput([], 0, 0.0, overhead, verify(0), self.target_steps), drafting

    def link_stats(self, link: str | None = None) -> LinkStats:
        return self.links.get(self.last_link if link is None else link) or LinkStats(self.smoothing)

    def features(self, prev_k: int, link: str | None = None) -> np.ndarray:
        """The AWC feature vector (FEATURE_NAMES order), float64 [len(FEATURE_NAMES)]."""
        ref = max(self.reference_seconds(), 1e-6)
        stats = self.link_stats(link)

        def ratio(seconds: float | None) -> float:
            return min(_RATIO_CLIP, max(-_RATIO_CLIP, (seconds or 0.0) / ref))

        return np.array([
            min(4.0, self.queue_ema / self.queue_capacity),
            self.prior_alpha if self.acceptance is None else self.acceptance,
            self.alpha_per_token(),
            ratio(stats.mean),
            ratio(stats.jitter),
            ratio(stats.trend),
            ratio(self.tpot),
            ratio(self.draft_per_token),
            ratio(self.verify_slope_seconds()),
            prev_k / self.max_k if self.max_k else 0.0,
            self.goodput_window() / self.max_k if self.max_k else 0.0,
        ])
