"""DSD-Sim's model: cost profiles, acceptance, links, batching verifiers and edge devices, on SimPy.

One device runs generation requests; each request is rounds of

    draft k tokens (k * t_draft) -> uplink -> verifier queue -> batch forward -> downlink -> commit n + 1

exactly the blocking round of docs/architecture.md §2. The window policy and the telemetry are the real
ones (edgespec.control.window, edgespec.control.awc, edgespec.control.telemetry); the simulator only supplies time.
"""
from __future__ import annotations

import bisect
import math
import random
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import simpy

from edgespec.control.telemetry import RoundSample, Telemetry

WINDOW_BYTES = 52      # a Window message with one-hot q: 52 + 3 bytes per drafted token (tools/wire_bytes)
WINDOW_TOKEN_BYTES = 3
VERDICT_BYTES = 40
MIN_RTO = 0.2          # Linux TCP minimum retransmission timeout, seconds


@dataclass(slots=True, frozen=True)
class CostProfile:
    draft_seconds_per_token: float          # edge drafter, seconds per drafted token
    verify_points: tuple[tuple[int, float], ...]   # (tokens scored in one pass, seconds), ascending
    batch_seq_overhead_seconds: float = 0.0  # extra forward seconds per window in a batch beyond the first
    source: str = ""

    @classmethod
    def from_dict(cls, spec: dict) -> "CostProfile":
        points = tuple(sorted((int(t), float(s)) for t, s in spec["verify_seconds_by_tokens"].items()))
        return cls(float(spec["draft_seconds_per_token"]), points,
                   float(spec.get("batch_seq_overhead_seconds", 0.0)), spec.get("source", ""))

    def verify_seconds(self, tokens: float) -> float:
        """One forward pass over `tokens` tokens: piecewise linear, last slope beyond the last point."""
        pts = self.verify_points
        if tokens <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        i = bisect.bisect_left([t for t, _ in pts], tokens)
        (t0, s0), (t1, s1) = (pts[-2], pts[-1]) if i >= len(pts) else (pts[i - 1], pts[i])
        return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)

    def batch_seconds(self, window_tokens: list[int]) -> float:
        return self.verify_seconds(sum(window_tokens)) + self.batch_seq_overhead_seconds * (len(window_tokens) - 1)


REGIMES = {"code": 0.8, "chat": 0.5, "poor": 0.2}   # per-token agreement of draft and target


def position_alphas(spec: dict | str | float, max_k: int) -> list[float]:
    """Conditional acceptance per position [max_k] from a regime name, an alpha, or a dict
    {regime | alpha, decay} / {per_position: [...]} (the last value repeats)."""
    if isinstance(spec, str):
        spec = {"regime": spec}
    elif isinstance(spec, (int, float)):
        spec = {"alpha": spec}
    if "per_position" in spec:
        per = [float(a) for a in spec["per_position"]]
        return (per + [per[-1]] * max_k)[:max_k]
    alpha = float(spec["alpha"]) if "alpha" in spec else REGIMES[spec["regime"]]
    decay = float(spec.get("decay", 1.0))
    return [min(1.0, alpha * decay ** j) for j in range(max_k)]


@dataclass(slots=True)
class LinkModel:
    """One device's link to the cloud. One-way delay = rtt/2 + |N(0, jitter)| (jitter only adds: a TCP
    stream never delivers early), + bytes / rate, + a retransmission timeout with probability `loss`."""
    rtt: float            # seconds, base round trip
    jitter: float = 0.0   # seconds, std of the one-way extra delay
    rate: float = 0.0     # bytes per second; 0 = unlimited
    loss: float = 0.0     # probability a message needs one retransmission

    def expected_round_trip(self, rtt: float) -> float:
        """Mean seconds of a window up and a verdict down, sizes ignored."""
        extra = self.jitter * math.sqrt(2 / math.pi) + self.loss * max(MIN_RTO, rtt + 4 * self.jitter)
        return rtt + 2 * extra

    def one_way(self, rng: random.Random, nbytes: int, rtt: float | None = None) -> float:
        base = self.rtt if rtt is None else rtt
        delay = base / 2
        if self.jitter > 0:
            delay += abs(rng.gauss(0.0, self.jitter))
        if self.rate > 0:
            delay += nbytes / self.rate
        if self.loss > 0 and rng.random() < self.loss:
            delay += max(MIN_RTO, base + 4 * self.jitter)
        return delay


@dataclass(slots=True)
class Job:
    """One window at the verifier."""
    tokens: int                 # k + 1 tokens scored
    done: simpy.Event
    arrived: float = 0.0
    started: float = 0.0
    compute: float = 0.0        # forward seconds of the batch it rode in
    queue_depth: int = 0        # windows left waiting when its batch started
    batch_tokens: int = 0       # tokens of the whole batch


class Verifier:
    """Batches windows: a batch starts when `max_batch` windows wait or the oldest has waited
    `batch_wait` seconds, whichever is first; it costs the profile's batch_seconds."""

    def __init__(self, env: simpy.Environment, name: str, profile: CostProfile, max_batch: int = 1,
                 batch_wait: float = 0.0):
        self.env, self.name, self.profile = env, name, profile
        self.max_batch, self.batch_wait = max(1, max_batch), batch_wait
        self.queue: deque[Job] = deque()
        self.sessions = 0                 # devices currently pinned here (pool load)
        self.busy_seconds = 0.0
        self.batch_sizes = array("i")
        self.windows = 0
        self._wake: simpy.Event | None = None
        self._waiting_for = 0             # queue length that wakes the loop
        env.process(self._run())

    def submit(self, job: Job) -> None:
        job.arrived = self.env.now
        self.queue.append(job)
        wake = self._wake
        if wake is not None and len(self.queue) >= self._waiting_for and not wake.triggered:
            wake.succeed()

    def _sleep(self, until_len: int, timeout: float | None):
        self._wake = self.env.event()
        self._waiting_for = until_len
        if timeout is not None:
            wake = self._wake
            self.env.timeout(timeout).callbacks.append(lambda _e: wake.triggered or wake.succeed())
        return self._wake

    def _run(self):
        env, queue = self.env, self.queue
        while True:
            if not queue:
                yield self._sleep(1, None)
            if self.batch_wait > 0 and len(queue) < self.max_batch:
                left = queue[0].arrived + self.batch_wait - env.now
                if left > 0:
                    yield self._sleep(self.max_batch, left)
            self._wake = None
            batch = [queue.popleft() for _ in range(min(self.max_batch, len(queue)))]
            tokens = [j.tokens for j in batch]
            cost = self.profile.batch_seconds(tokens)
            now, depth, total = env.now, len(queue), sum(tokens)
            for j in batch:
                j.started, j.compute, j.queue_depth, j.batch_tokens = now, cost, depth, total
            self.busy_seconds += cost
            self.batch_sizes.append(len(batch))
            self.windows += len(batch)
            yield env.timeout(cost)
            for j in batch:
                j.done.succeed()


class VerifierPool:
    def __init__(self, verifiers: list[Verifier]):
        self.verifiers = verifiers

    def pick(self) -> Verifier:
        """The least loaded verifier: fewest pinned sessions, then shortest queue, then first."""
        return min(self.verifiers, key=lambda v: (v.sessions, len(v.queue)))


@dataclass(slots=True)
class Truth:
    """What the simulator knows and a policy cannot: the scenario's true parameters this round."""
    alphas: list[float]       # conditional acceptance per position
    draft_per_token: float    # seconds
    rtt: float                # link base RTT, seconds
    wire: float               # expected round-trip wire seconds: rtt + jitter's and loss's mean extra delay
    queue_wait: float         # seconds this window waited at the verifier
    other_tokens: int         # tokens other windows added to its batch
    profile: CostProfile


@dataclass(slots=True)
class Rounds:
    """Per-round records of one run, as columns."""
    end: array = field(default_factory=lambda: array("d"))       # sim time the round committed, s
    device: array = field(default_factory=lambda: array("i"))
    k: array = field(default_factory=lambda: array("i"))
    accepted: array = field(default_factory=lambda: array("i"))
    seconds: array = field(default_factory=lambda: array("d"))   # round wall, s
    request_seconds: array = field(default_factory=lambda: array("d"))   # per finished request
    request_tokens: array = field(default_factory=lambda: array("i"))


@dataclass(slots=True)
class DeviceSpec:
    link: LinkModel
    acceptance: Callable[[random.Random, float], list[float]]   # (rng, now) -> alphas for a new request
    requests: int
    tokens: int                 # new tokens per request
    think: float = 0.0          # mean exponential pause between requests, s
    start: float = 0.0          # first request time, s
    prefill: float = 0.0        # seconds before the first round of a request
    draft_scale: float = 1.0    # this device's drafter speed relative to the profile


class Simulation:
    """Devices, pool and records for one policy. `make_policy(telemetry)` builds a device's policy;
    `observer(device, sample, truth)` (optional) sees every round, for training traces."""

    def __init__(self, profile: CostProfile, pool_spec: dict, devices: list[DeviceSpec],
                 make_policy: Callable[[Telemetry], object], max_k: int, seed: int,
                 rtt_schedule: list[tuple[float, float]] | None = None,
                 alpha_schedule: list[tuple[float, list[float]]] | None = None,
                 observer: Callable[[int, RoundSample, Truth], None] | None = None):
        self.env = simpy.Environment()
        self.profile, self.max_k, self.seed = profile, max_k, seed
        count = int(pool_spec.get("count", 1))
        self.pool = VerifierPool([
            Verifier(self.env, f"verifier-{i}", profile, int(pool_spec.get("max_batch", 1)),
                     float(pool_spec.get("batch_wait_ms", 0.0)) / 1000) for i in range(count)])
        self.rtt_schedule = sorted(rtt_schedule or [])
        self.alpha_schedule = sorted(alpha_schedule or [], key=lambda e: e[0])
        self.observer = observer
        self.rounds = Rounds()
        self.telemetries: list[Telemetry] = []
        for i, spec in enumerate(devices):
            telemetry = Telemetry(max_k=max_k, queue_capacity=float(max(1, self.pool.verifiers[0].max_batch)))
            self.telemetries.append(telemetry)
            policy = make_policy(telemetry)
            self.env.process(self._device(i, spec, policy, telemetry, random.Random(seed * 1_000_003 + i)))

    def _scheduled(self, schedule: list, now: float, default):
        value = default
        for t, v in schedule:
            if t > now:
                break
            value = v
        return value

    def _device(self, index: int, spec: DeviceSpec, policy, telemetry: Telemetry, rng: random.Random):
        env, rec, max_k = self.env, self.rounds, self.max_k
        draft_per_token = self.profile.draft_seconds_per_token * spec.draft_scale
        link, observer = spec.link, self.observer
        observe_sample = getattr(policy, "observe_sample", None)
        if spec.start > 0:
            yield env.timeout(spec.start)
        for r in range(spec.requests):
            if r and spec.think > 0:
                yield env.timeout(rng.expovariate(1 / spec.think))
            verifier = self.pool.pick()
            verifier.sessions += 1
            started = env.now
            base_alphas = spec.acceptance(rng, started)
            if spec.prefill > 0:
                yield env.timeout(spec.prefill)
            committed = 0
            while committed < spec.tokens:
                now = env.now
                k = max(0, min(int(policy.choose()), max_k, spec.tokens - committed - 1))
                rtt = self._scheduled(self.rtt_schedule, now, link.rtt) if self.rtt_schedule else link.rtt
                alphas = self._scheduled(self.alpha_schedule, now, base_alphas) if self.alpha_schedule else base_alphas
                n = 0
                while n < k and rng.random() < alphas[n]:   # per-position Bernoulli, longest matching prefix
                    n += 1
                draft = k * draft_per_token
                up = link.one_way(rng, WINDOW_BYTES + WINDOW_TOKEN_BYTES * k, rtt)
                yield env.timeout(draft + up)
                sent = env.now
                job = Job(k + 1, env.event())
                verifier.submit(job)
                yield job.done
                yield env.timeout(link.one_way(rng, VERDICT_BYTES, rtt))
                verify_wall = env.now - sent
                seconds = env.now - now
                sample = RoundSample(k, n, draft, verify_wall, job.compute, job.queue_depth, verifier.name,
                                     n + 1, seconds)
                telemetry.record(sample)
                if observe_sample is not None:
                    observe_sample(sample)
                else:
                    policy.observe(k, n, draft, verify_wall)
                if observer is not None:
                    observer(index, sample, Truth(alphas, draft_per_token, rtt, link.expected_round_trip(rtt),
                                                  job.started - job.arrived,
                                                  job.batch_tokens - job.tokens, self.profile))
                committed += n + 1
                rec.end.append(env.now)
                rec.device.append(index)
                rec.k.append(k)
                rec.accepted.append(n)
                rec.seconds.append(seconds)
            verifier.sessions -= 1
            rec.request_seconds.append(env.now - started)
            rec.request_tokens.append(committed)

    def run(self, until: float | None = None) -> None:
        self.env.run(until=until)
