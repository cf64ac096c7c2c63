"""Train AWC's window-control MLP on simulated traces: `python -m training.train_awc --out edgespec/control/awc_weights.json`.

1. Traces: DSD-Sim runs random scenarios (RTT 0-200 ms with jitter and jumps; acceptance regimes
   code 0.8 / chat 0.5 / poor 0.2 per token or anything between, with drops and recoveries; 1-24
   devices sharing a batching verifier; CPU-like and GPU-like verify cost curves; draft cost from 5%
   to 300% of a verifier pass) under behaviour policies that visit many windows (random walk, fixed,
   heuristic, goodput; with --dagger, also AWC itself).
2. Labels: for every round, the oracle window: the k in [0, max_k] maximising expected goodput
   E(k) / (k t_draft + RTT + queue wait + t_verify(k)) for the scenario's TRUE parameters at that
   moment (acceptance per position, link RTT, batch the window rode in), which the policy never sees.
3. Fit: features -> 32 -> 32 -> 1 (ReLU), L1 loss, AdamW, 100 epochs (torch, CPU).

With --calibration CAPACITY.json (a bench-capacity run; repeatable), half of the scenarios run on cost curves
measured rather than drawn: the verifier's forward time by tokens and per window that DSD-Sim fits to the
run (bench.sim_capacity.fit_costs), each scaled by 0.8-1.25 (the draft time separately), behind the run's own
batching rule (gather "verifier", its max batch, wait and wait fraction) with 1-32 devices. The drawn curves
are smooth; a measured one need not be (llama.cpp on this CPU: ~30 ms per token up to 10 tokens, then flat to
16), and a controller that never saw such a curve cannot learn where it pays.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from edgespec.control.awc import AwcWindow, Mlp, signed_log1p
from edgespec.control.goodput import best_window
from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import FEATURE_NAMES
from edgespec.control.window import FixedWindow, GoodputWindow, HeuristicWindow
from edgespec.sim.scenario import build

MAX_K = 8
CPU_CURVE = {1: 1.0, 2: 1.0, 4: 1.7, 8: 2.3}     # forward cost over tokens, x one pass (this machine)


class RandomWalk:
    """Behaviour policy: wanders over [0, max_k] so the traces cover every window in every state."""

    def __init__(self, rng: random.Random, max_k: int):
        self.rng, self.max_k, self.k = rng, max_k, rng.randint(0, max_k)

    def choose(self) -> int:
        if self.rng.random() < 0.15:
            self.k = min(self.max_k, max(0, self.k + self.rng.choice((-2, -1, 1, 2))))
        return self.k

    def observe(self, sample: RoundSample) -> None:
        pass


def calibrated_profiles(paths: list[Path]) -> list[tuple[dict, dict]]:
    """(profile, verifier settings) fitted to each bench-capacity run."""
    from bench.sim_capacity import fit_costs

    out = []
    for path in paths:
        run = json.loads(Path(path).read_text())
        if "verifier_batch" not in run or "draft_ms_per_token" not in run:
            raise ValueError(f"{path}: not a bench-capacity run with calibration data (rerun bench-capacity)")
        profile, error = fit_costs([r for r in run["rows"] if not r.get("error")], run["draft_ms_per_token"] / 1000)
        print(f"calibration {path}: forward fit RMS error {error:.1%}, {len(profile.forward_points)} sizes", flush=True)
        batch = run["verifier_batch"]
        out.append(({"draft_seconds_per_token": profile.draft_seconds_per_token,
                     "forward_seconds_by_tokens": {str(t): s for t, s in profile.forward_points},
                     "batch_seq_overhead_seconds": profile.batch_seq_overhead_seconds, "source": str(path)},
                    {"count": 1, "max_batch": batch["max_batch"], "batch_wait_ms": batch["batch_wait_ms"],
                     "gather": "verifier", "wait_fraction": batch["wait_fraction"]}))
    return out


def scaled(rng: random.Random, calibrated: tuple[dict, dict]) -> tuple[dict, dict]:
    profile, verifiers = calibrated
    scale, draft_scale = rng.uniform(0.8, 1.25), rng.uniform(0.8, 1.25)
    return ({**profile, "draft_seconds_per_token": profile["draft_seconds_per_token"] * draft_scale,
             "forward_seconds_by_tokens": {t: s * scale for t, s in profile["forward_seconds_by_tokens"].items()},
             "batch_seq_overhead_seconds": profile["batch_seq_overhead_seconds"] * scale}, verifiers)


def random_profile(rng: random.Random) -> dict:
    one_pass = 10 ** rng.uniform(-2, -0.3)               # 10 ms .. 500 ms
    kind = rng.choice(("cpu", "cpu", "mid", "gpu", "gpu"))
    if kind == "cpu":
        scale = rng.uniform(0.8, 1.25)
        points = {t: one_pass * (1 + (c - 1) * scale) for t, c in CPU_CURVE.items()}
    else:
        slope = rng.uniform(0.04, 0.15) if kind == "mid" else rng.uniform(0.0005, 0.02)   # per token, x one pass
        points = {t: one_pass * (1 + slope * (t - 1)) for t in (1, 8, 64, 256)}
    draft = one_pass * (rng.uniform(0.05, 0.4) if kind == "cpu" else rng.uniform(0.1, 2.0))
    return {"draft_seconds_per_token": draft, "forward_seconds_by_tokens": {str(t): s for t, s in points.items()},
            "batch_seq_overhead_seconds": 0.0}


def random_acceptance(rng: random.Random):
    if rng.random() < 0.6:
        return {"regime": rng.choice(("code", "chat", "poor"))}
    return {"alpha": rng.uniform(0.05, 0.97), "decay": rng.uniform(0.9, 1.0)}


def random_scenario(rng: random.Random, seed: int, calibrated: list[tuple[dict, dict]] = ()) -> dict:
    measured = bool(calibrated) and rng.random() < 0.5
    devices = 1 if rng.random() < (0.3 if measured else 0.6) else rng.randint(2, 32 if measured else 24)
    requests = 3 if devices == 1 else 2
    rtt = rng.uniform(0, 200)
    link = {"rtt_ms": rtt, "jitter_ms": rng.uniform(0, 0.3) * rtt}
    acceptance = random_acceptance(rng)
    if measured:
        profile, verifiers = scaled(rng, rng.choice(calibrated))
    else:
        profile = random_profile(rng)
        verifiers = {"count": 1, "max_batch": rng.choice((1, 4, 8)), "batch_wait_ms": rng.choice((0, 0, 2, 10))}
    # a typical request's duration, to place the drifts inside the trace
    span = requests * 128 * (float(profile["forward_seconds_by_tokens"]["1"]) + rtt / 1000) / 2
    if rng.random() < 0.3:
        link["rtt_schedule"] = [[rng.uniform(0.2, 0.8) * span, rng.uniform(0, 200)]]
    if rng.random() < 0.4:
        acceptance["schedule"] = [[rng.uniform(0.2, 0.8) * span, random_acceptance(rng)]]
    return {"name": f"train-{seed}", "seed": seed, "profile": profile, "devices": devices,
            "requests_per_device": requests, "tokens_per_request": 128, "link": link, "acceptance": acceptance,
            "start_spread_seconds": 2.0 if devices > 1 else 0.0, "verifiers": verifiers, "max_k": MAX_K}


def behaviour(rng: random.Random, model: Mlp | None):
    choices = ["walk", "walk", "fixed", "heuristic", "goodput"] + (["awc", "awc"] if model is not None else [])
    kind = rng.choice(choices)
    if kind == "walk":
        return lambda t: RandomWalk(random.Random(rng.random()), MAX_K)
    if kind == "fixed":
        k = rng.randint(0, MAX_K)
        return lambda t: FixedWindow(k)
    if kind == "heuristic":
        return lambda t: HeuristicWindow(k=2, min_k=1, max_k=MAX_K)
    if kind == "goodput":
        return lambda t: GoodputWindow(t, max_k=MAX_K)
    return lambda t: AwcWindow(t, model, max_k=MAX_K)


def traces(count: int, seed: int, model: Mlp | None = None,
           calibrated: list[tuple[dict, dict]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(features [N, F], oracle window [N]) from `count` random scenarios."""
    rng = random.Random(seed)
    xs, ys = [], []
    for i in range(count):
        scenario = random_scenario(rng, seed * 100_000 + i, calibrated)
        holder: dict = {}
        waits: dict[int, list[float]] = {}

        def observer(device, sample, truth, holder=holder, waits=waits):
            if device >= 4:           # a few devices per scenario are enough
                return
            w = waits.setdefault(device, [truth.queue_wait, float(truth.other_tokens)])
            w[0] = 0.7 * w[0] + 0.3 * truth.queue_wait
            w[1] = 0.7 * w[1] + 0.3 * truth.other_tokens
            profile = truth.profile
            label = best_window(truth.alphas, truth.draft_per_token, truth.wire + w[0],
                                lambda k: profile.forward_seconds(w[1] + k + 1), MAX_K)
            xs.append(holder["sim"].telemetries[device].features(sample.k))
            ys.append(label)

        sim = build(scenario, behaviour(rng, model), observer)
        holder["sim"] = sim
        sim.run()
    return np.asarray(xs), np.asarray(ys, dtype=np.float64)


def fit(x: np.ndarray, y: np.ndarray, epochs: int, seed: int) -> dict:
    torch.manual_seed(seed)
    torch.set_num_threads(1)   # tiny matmuls: a second thread only contends (20x slower on 2 shared cores)
    z = signed_log1p(x)
    mean, std = z.mean(0), z.std(0) + 1e-6
    xt = torch.tensor((z - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)[:, None]
    f = x.shape[1]
    net = torch.nn.Sequential(torch.nn.Linear(f, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    loss_fn = torch.nn.L1Loss()
    n = len(xt)
    cut = int(n * 0.9)
    perm = torch.randperm(n)
    train, val = perm[:cut], perm[cut:]
    for epoch in range(epochs):
        order = train[torch.randperm(len(train))]
        for start in range(0, len(order), 1024):
            idx = order[start:start + 1024]
            opt.zero_grad()
            loss = loss_fn(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
        sched.step()
        if epoch % 20 == 19 or epoch == epochs - 1:
            with torch.no_grad():
                val_loss = loss_fn(net(xt[val]), yt[val]).item()
                exact = (net(xt[val]).round().clamp(0, MAX_K) == yt[val]).float().mean().item()
            print(f"epoch {epoch + 1}: train L1 {loss.item():.3f}  val L1 {val_loss:.3f}  "
                  f"val exact {exact:.1%}", flush=True)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    return {
        "features": list(FEATURE_NAMES),
        "transform": "signed_log1p, then (x - mean) / std",
        "mean": [round(float(v), 6) for v in mean], "std": [round(float(v), 6) for v in std],
        "layers": [{"w": [[round(float(v), 6) for v in row] for row in m.weight.detach().numpy().T],
                    "b": [round(float(v), 6) for v in m.bias.detach().numpy()]} for m in linears],
        "activation": "relu",
        "validation": {"l1": round(val_loss, 4), "exact": round(exact, 4), "samples": int(n)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec train awc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "edgespec" / "control" / "awc_weights.json")
    parser.add_argument("--scenarios", type=int, default=1000, help="random scenarios per data round")
    parser.add_argument("--dagger", type=int, default=1, help="extra data rounds with the AWC being trained as behaviour")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--calibration", type=Path, action="append", default=[],
                        help="a bench-capacity JSON whose measured costs half of the scenarios run on (repeatable)")
    args = parser.parse_args(argv)
    try:
        calibrated = calibrated_profiles(args.calibration)
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"--calibration: {error}")
    started = time.perf_counter()
    x, y = traces(args.scenarios, args.seed, calibrated=calibrated)
    print(f"{len(x)} samples from {args.scenarios} scenarios in {time.perf_counter() - started:.0f} s", flush=True)
    spec = fit(x, y, args.epochs, args.seed)
    for round_ in range(args.dagger):
        x2, y2 = traces(args.scenarios // 2, args.seed + 1 + round_, Mlp.from_dict(spec), calibrated)
        x, y = np.concatenate([x, x2]), np.concatenate([y, y2])
        print(f"dagger round {round_ + 1}: {len(x)} samples ({time.perf_counter() - started:.0f} s)", flush=True)
        spec = fit(x, y, args.epochs, args.seed)
    xh, yh = traces(100, args.seed + 999, calibrated=calibrated)   # held-out scenarios, never trained on
    pred = np.clip(Mlp.from_dict(spec).batch(xh), 0, MAX_K)
    spec["held_out"] = {"scenarios": 100, "samples": int(len(xh)), "l1": round(float(np.abs(pred - yh).mean()), 4),
                        "exact": round(float((np.round(pred) == yh).mean()), 4),
                        "within_one": round(float((np.abs(np.round(pred) - yh) <= 1).mean()), 4),
                        "goodput_k_exact": round(float((np.round(xh[:, -1] * MAX_K) == yh).mean()), 4)}
    print(f"held out: {spec['held_out']}", flush=True)
    spec["trained"] = {"scenarios": args.scenarios, "dagger": args.dagger, "epochs": args.epochs, "seed": args.seed,
                       "loss": "L1", "optimizer": "AdamW lr 3e-3 wd 1e-4, cosine", "max_k": MAX_K,
                       "calibration": [str(p) for p in args.calibration],
                       "seconds": round(time.perf_counter() - started)}
    args.out.write_text(json.dumps(spec, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes) in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
