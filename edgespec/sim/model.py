"""DSD-Sim's model: cost profiles, acceptance, links, batching verifiers and edge devices.

Every device runs the library's own round loop — edgespec.loop.speculation.speculate, the blocking round of
docs/architecture.md §2 — with the coordinator's verifier port (edgespec.loop.failover.FailoverVerifier over
edgespec.loop.pool.VerifierPool, one pool shared by the fleet, as behind a load balancer) and the real window
policies and telemetry, on a virtual-time asyncio event loop (edgespec.sim.clock). The simulator supplies
only what the loop talks to, as ports that take modelled time:

    drafter port   k * t_draft; which of its k tokens the target will accept (per-position Bernoulli)
    link           uplink -> the verifier's queue -> its batch forward -> downlink, per device and verifier
    verifier       batches windows: one forward over the batch's tokens (the cost profile)

Each committed round's RoundSample (the loop's one record of a round) comes back through the loop's RoundSink
(Device.round) into the records, and to an optional observer with the round's true parameters (training).
"""
from __future__ import annotations

import asyncio
import bisect
import math
import random
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import Telemetry
from edgespec.engines.batching import GatherRule
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.pool import VerifierPool
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.sim.clock import VirtualTimeLoop
from edgespec.verify.greedy import Verdict
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window

WINDOW_BYTES = 52      # a Window message with one-hot q: 52 + 3 bytes per drafted token (tools/wire_bytes)
WINDOW_TOKEN_BYTES = 3
VERDICT_BYTES = 40
MIN_RTO = 0.2          # Linux TCP minimum retransmission timeout, seconds


@dataclass(slots=True, frozen=True)
class CostProfile:
    draft_seconds_per_token: float          # edge drafter, seconds per drafted token
    forward_points: tuple[tuple[int, float], ...]  # (tokens scored in one verifier forward pass, seconds), ascending
    batch_seq_overhead_seconds: float = 0.0  # extra forward seconds per window in a batch beyond the first
    source: str = ""

    @classmethod
    def from_dict(cls, spec: dict) -> "CostProfile":
        # "verify_seconds_by_tokens": the name profiles saved before 2026-12 use for the same forward times
        by_tokens = spec["forward_seconds_by_tokens"] if "forward_seconds_by_tokens" in spec \
            else spec["verify_seconds_by_tokens"]
        points = tuple(sorted((int(t), float(s)) for t, s in by_tokens.items()))
        return cls(float(spec["draft_seconds_per_token"]), points,
                   float(spec.get("batch_seq_overhead_seconds", 0.0)), spec.get("source", ""))

    def forward_seconds(self, tokens: float) -> float:
        """One verifier forward pass over `tokens` tokens: piecewise linear, last slope beyond the last point."""
        pts = self.forward_points
        if tokens <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        i = bisect.bisect_left([t for t, _ in pts], tokens)
        (t0, s0), (t1, s1) = (pts[-2], pts[-1]) if i >= len(pts) else (pts[i - 1], pts[i])
        return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)

    def batch_seconds(self, window_tokens: list[int]) -> float:
        return self.forward_seconds(sum(window_tokens)) + self.batch_seq_overhead_seconds * (len(window_tokens) - 1)


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


AGREE, DISAGREE = 1, 2   # draft token ids: one the target would also choose, one it would not
GREEDY = SamplingParams()


@dataclass(slots=True)
class Job:
    """One window at the verifier."""
    tokens: int                 # k + 1 tokens scored
    done: asyncio.Future
    arrived: float = 0.0
    started: float = 0.0
    compute: float = 0.0        # forward seconds of the batch it rode in
    queue_depth: int = 0        # windows left waiting when its batch started
    batch_tokens: int = 0       # tokens of the whole batch
    batch_windows: int = 0      # windows of the whole batch
    session: str = ""           # whose window (gather="verifier" learns each session's turnaround)


def _wake_up(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Verifier:
    """Batches windows. ``gather="oldest"``: a batch starts when `max_batch` windows wait or the oldest has
    waited `batch_wait` seconds, whichever is first. ``gather="verifier"``: the real verifier's rule
    (edgespec.engines.batching.VerifyScheduler): once it could start a forward it waits while fewer windows
    wait than min(max_batch, sessions open on it), for at most `batch_wait` seconds and at most
    `wait_fraction` of its forward time (EMA; 0 = no such cap), and for windows due within one forward by
    their sessions' turnarounds when that saves forward time (edgespec.engines.batching.GatherRule, the same
    code). A batch costs the profile's batch_seconds."""

    def __init__(self, name: str, profile: CostProfile, max_batch: int = 1, batch_wait: float = 0.0,
                 gather: str = "oldest", wait_fraction: float = 0.0):
        if gather not in ("oldest", "verifier"):
            raise ValueError(f"gather {gather!r}: expected 'oldest' or 'verifier'")
        self.name, self.profile = name, profile
        self.max_batch, self.batch_wait = max(1, max_batch), batch_wait
        self.gather, self.wait_fraction = gather, wait_fraction
        self.streams = 0                  # sessions open on this verifier (gather="verifier")
        self.queue: deque[Job] = deque()
        self.busy_seconds = 0.0
        self.batch_sizes = array("i")
        self.windows = 0
        self.rule = GatherRule(batch_wait, wait_fraction if wait_fraction > 0 else math.inf)
        self._wake: asyncio.Future | None = None
        self._waiting_for = 0             # queue length that wakes the loop

    def submit(self, job: Job) -> None:
        job.arrived = asyncio.get_running_loop().time()
        if self.gather == "verifier":
            self.rule.turnarounds.window_arrived(job.session, job.arrived, job.tokens)
        self.queue.append(job)
        wake = self._wake
        if wake is not None and len(self.queue) >= self._waiting_for and not wake.done():
            wake.set_result(None)

    def _sleep(self, until_len: int, timeout: float | None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        wake = self._wake = loop.create_future()
        self._waiting_for = until_len
        if timeout is not None:
            loop.call_later(timeout, _wake_up, wake)
        return wake

    def _gather_plan(self, now: float) -> tuple[int, float, float, list[str]]:
        """(windows to wait for, end of the plain budget, the time to stop waiting, sessions awaited by turnaround)."""
        if self.gather == "oldest":
            end = self.queue[0].arrived + self.batch_wait
            return self.max_batch, end, end, []
        return (min(self.max_batch, max(1, self.streams)),
                *self.rule.plan(now, [(job.session, job.tokens) for job in self.queue]))

    async def run(self) -> None:
        """Serve batches until cancelled."""
        loop, queue = asyncio.get_running_loop(), self.queue
        while True:
            if not queue:
                await self._sleep(1, None)
            if self.batch_wait > 0:
                target, budget_end, deadline, awaited = self._gather_plan(loop.time())
                while len(queue) < target:
                    now = loop.time()
                    if self.rule.done_waiting(now, budget_end, awaited) or deadline <= now:
                        break
                    await self._sleep(len(queue) + 1 if awaited else target, deadline - now)
            self._wake = None
            batch = [queue.popleft() for _ in range(min(self.max_batch, len(queue)))]
            tokens = [j.tokens for j in batch]
            cost = self.profile.batch_seconds(tokens)
            now, depth, total = loop.time(), len(queue), sum(tokens)
            for j in batch:
                j.started, j.compute, j.queue_depth, j.batch_tokens = now, cost, depth, total
                j.batch_windows = len(batch)
            self.busy_seconds += cost
            self.batch_sizes.append(len(batch))
            self.windows += len(batch)
            self.rule.forward_done(total, cost)   # as measured, the way the real scheduler learns it
            await asyncio.sleep(cost)
            for j in batch:
                if self.gather == "verifier":
                    self.rule.turnarounds.verdict_sent(j.session, loop.time())
                j.done.set_result(None)


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
class Records:
    """Per-round records of one run, as columns (from the rounds' RoundSamples)."""
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
    prefill: float = 0.0        # seconds the verifier takes to open a request's session
    draft_scale: float = 1.0    # this device's drafter speed relative to the profile
    matches: str = ""           # replayed acceptance: "1" where the draft's choice at that position of the
                                # generation equals the target's ("" = per-position Bernoulli of `acceptance`)


class ModelledDrafter:
    """The round loop's drafter port on one device: k tokens in k * t_draft. Acceptance is decided here,
    where the text is: the first n tokens are ones the target agrees with (n: per-position Bernoulli of
    the scenario's acceptance now, the longest successful prefix), the rest are not."""

    def __init__(self, device: "Device"):
        self.device = device

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        pass

    async def draft(self, session_id: str, base_position: int, append: Sequence[int],
                    k: int) -> tuple[list[int], None]:
        device = self.device
        k = min(k, device.max_k)                         # the drafter's max_window
        n = 0
        if device.spec.matches:   # a window accepted as far as the recorded draft agrees from its position on
            matches = device.spec.matches
            while n < k and base_position + n < len(matches) and matches[base_position + n] == "1":
                n += 1
        else:
            alphas, rng = device.alphas(), device.rng
            while n < k and rng.random() < alphas[n]:
                n += 1
        await asyncio.sleep(k * device.draft_per_token)
        return [AGREE] * n + [DISAGREE] * (k - n), None

    async def close(self, session_id: str) -> None:
        pass

    def observe(self, draft: Sequence[int], sample: RoundSample) -> None:
        pass


class VerifierLink:
    """One device's way to one verifier, as the failover port's endpoint: a window goes up the device's
    link, waits in the verifier's queue, rides a batch forward, and its verdict comes back down."""

    def __init__(self, device: "Device", verifier: Verifier):
        self.device, self.verifier, self.address = device, verifier, verifier.name

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        self.verifier.streams += 1
        if self.device.spec.prefill > 0:
            await asyncio.sleep(self.device.spec.prefill)

    async def verify(self, session_id: str, window: Window) -> Verdict:
        device, verifier = self.device, self.verifier
        link, rng, k = device.spec.link, device.rng, len(window.draft)
        rtt = device.rtt()
        await asyncio.sleep(link.one_way(rng, WINDOW_BYTES + WINDOW_TOKEN_BYTES * k, rtt))
        job = Job(k + 1, asyncio.get_running_loop().create_future(), session=str(device.index))
        verifier.submit(job)
        await job.done
        await asyncio.sleep(link.one_way(rng, VERDICT_BYTES, rtt))
        n = 0
        while n < k and window.draft[n] == AGREE:
            n += 1
        if device.observer is not None:
            device.truth = Truth(device.alphas(), device.draft_per_token, rtt, link.expected_round_trip(rtt),
                                 job.started - job.arrived, job.batch_tokens - job.tokens, verifier.profile)
        return Verdict(n, AGREE, verify_compute_seconds=job.compute, queue_depth=job.queue_depth,
                       verifier_seconds=job.started - job.arrived + job.compute,
                       batch_windows=job.batch_windows, batch_tokens=job.batch_tokens)

    async def close(self, session_id: str) -> None:
        self.verifier.streams -= 1

    async def discard(self, session_id: str) -> None:
        pass

    def forget(self, session_id: str) -> None:
        pass


class _Links(dict):
    """A device's endpoints by verifier address, made on first use."""

    def __init__(self, device: "Device"):
        super().__init__()
        self.device = device

    def __missing__(self, address: str) -> VerifierLink:
        link = self[address] = VerifierLink(self.device, self.device.sim.verifiers[address])
        return link


class Device:
    """One edge device: its requests, each a generation through the real round loop; the loop's RoundSink."""

    def __init__(self, sim: "Simulation", index: int, spec: DeviceSpec, policy, telemetry: Telemetry,
                 rng: random.Random):
        self.sim, self.index, self.spec, self.policy, self.telemetry, self.rng = sim, index, spec, policy, telemetry, rng
        self.max_k, self.observer = sim.max_k, sim.observer
        self.draft_per_token = sim.profile.draft_seconds_per_token * spec.draft_scale
        self.base_alphas: list[float] = []
        self.truth: Truth | None = None   # the last verified window's, for the observer

    def rtt(self) -> float:
        sim = self.sim
        return _scheduled(sim.rtt_schedule, sim.loop.time(), self.spec.link.rtt) if sim.rtt_schedule \
            else self.spec.link.rtt

    def alphas(self) -> list[float]:
        sim = self.sim
        return _scheduled(sim.alpha_schedule, sim.loop.time(), self.base_alphas) if sim.alpha_schedule \
            else self.base_alphas

    def round(self, sample: RoundSample) -> None:
        """RoundSink: the round loop hands over every committed round here."""
        rec = self.sim.records
        rec.end.append(self.sim.loop.time())
        rec.device.append(self.index)
        rec.k.append(sample.k)
        rec.accepted.append(sample.accepted)
        rec.seconds.append(sample.wall)
        if self.observer is not None:
            self.observer(self.index, sample, self.truth)

    async def run(self) -> None:
        sim, spec, rng = self.sim, self.spec, self.rng
        loop = sim.loop
        verifier = FailoverVerifier(sim.pool, _Links(self))
        drafter = ModelledDrafter(self)
        if spec.start > 0:
            await asyncio.sleep(spec.start)
        for r in range(spec.requests):
            if r and spec.think > 0:
                await asyncio.sleep(rng.expovariate(1 / spec.think))
            started = loop.time()
            self.base_alphas = spec.acceptance(rng, started)
            session_id = f"device-{self.index}-request-{r}"
            session = SessionLog([], spec.tokens, frozenset())
            await verifier.open(session_id, session.committed, GREEDY)
            # Drafts from the first round: the modelled verifier keeps no row from a prompt (it has none), so a
            # target-only first round would cost it a forward the real llama.cpp verifier does not pay.
            config = SpeculationConfig(max_window=self.max_k, first_token_alone=False)
            async for _ in speculate(session, session_id, drafter, verifier, self.policy, GREEDY, config,
                                     telemetry=self.telemetry, metrics=self):
                pass
            await verifier.close(session_id)
            sim.records.request_seconds.append(loop.time() - started)
            sim.records.request_tokens.append(len(session.generated))


def _scheduled(schedule: list, now: float, default):
    value = default
    for t, v in schedule:
        if t > now:
            break
        value = v
    return value


class Simulation:
    """Devices, verifiers, pool and records for one policy. `make_policy(telemetry)` builds a device's policy;
    `observer(device, sample, truth)` (optional) sees every round, for training traces."""

    def __init__(self, profile: CostProfile, pool_spec: dict, devices: list[DeviceSpec],
                 make_policy: Callable[[Telemetry], object], max_k: int, seed: int,
                 rtt_schedule: list[tuple[float, float]] | None = None,
                 alpha_schedule: list[tuple[float, list[float]]] | None = None,
                 observer: Callable[[int, RoundSample, Truth | None], None] | None = None):
        self.loop = VirtualTimeLoop()
        self.profile, self.max_k, self.seed = profile, max_k, seed
        count = int(pool_spec.get("count", 1))
        max_batch = int(pool_spec.get("max_batch", 1))
        self.verifiers = {f"verifier-{i}": Verifier(f"verifier-{i}", profile, max_batch,
                                                    float(pool_spec.get("batch_wait_ms", 0.0)) / 1000,
                                                    pool_spec.get("gather", "oldest"),
                                                    float(pool_spec.get("wait_fraction", 0.0)))
                          for i in range(count)}
        self.pool = VerifierPool(list(self.verifiers), clock=self.loop.time)
        self.rtt_schedule = sorted(rtt_schedule or [])
        self.alpha_schedule = sorted(alpha_schedule or [], key=lambda e: e[0])
        self.observer = observer
        self.records = Records()
        self.telemetries: list[Telemetry] = []
        self.devices: list[Device] = []
        for i, spec in enumerate(devices):
            telemetry = Telemetry(max_k=max_k, queue_capacity=float(max(1, max_batch)))
            self.telemetries.append(telemetry)
            self.devices.append(Device(self, i, spec, make_policy(telemetry), telemetry,
                                       random.Random(seed * 1_000_003 + i)))

    def run(self) -> None:
        """Run every device's requests to the end (simulated time; the loop is closed afterwards)."""
        async def main() -> None:
            serving = [asyncio.ensure_future(v.run()) for v in self.verifiers.values()]
            try:
                await asyncio.gather(*(device.run() for device in self.devices))
            finally:
                for task in serving:
                    task.cancel()
                await asyncio.gather(*serving, return_exceptions=True)

        try:
            self.loop.run_until_complete(main())
        finally:
            self.loop.close()
