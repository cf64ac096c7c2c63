"""`edgespec bench sim-capacity CAPACITY.json`: DSD-Sim, calibrated from a bench-capacity run, predicts that run.

    edgespec bench capacity --json capacity.json ...          # measure (writes what calibration needs)
    edgespec bench sim-capacity capacity.json --json sim.json --plot sim.png

Calibration takes only what the run measured:
  - the verifier's cost of one forward over T tokens in W windows, c(T, W) = f(T) + o (W - 1), f piecewise
    linear between the sizes the run fed (llama.cpp's is not smooth: on this CPU about 30 ms per token up to
    10 tokens, then flat to 16, where its kernels change): a least-squares fit to every forward the run's
    verdicts reported (each forward once, from its rows' "forwards"), ar and fixed-k rows alike;
  - the edge device's draft time per token;
  - per prompt, where the draft model's choice equals the target's greedy token: the simulator replays it, so
    a simulated window is accepted exactly as far as the bench's emulated device's;
  - the verifier's batching settings (its rule: edgespec.engines.batching, modelled by gather="verifier").
Then it simulates every (RTT, N, mode) row of the run: the same devices (session i on prompt i mod the
prompts, one generation each, all starting together), the link's RTT, the library's own round loop and
window policies (ar = a fixed window of 0, k=K fixed, auto = the goodput policy starting from the costs
earlier sessions at that RTT measured, as the bench's auto does; awc the learned controller). auto-blind
is not simulated (its verdicts would have to hide their batch reports). Reported per row: predicted and
measured tokens/s, the error, windows per forward; and how many rows land within --tolerance.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from edgespec.control.awc import AwcWindow
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow
from edgespec.sim.model import CostProfile, DeviceSpec, LinkModel, Simulation

MAX_K = 8            # as bench-capacity
SIMULATED = ("ar", "auto", "awc")


def fit_costs(rows: list[dict], draft_seconds: float) -> tuple[CostProfile, float]:
    """The verifier's cost profile fitted to the rows' forwards, and the fit's RMS error relative to the
    forwards' times (weighted by how many forwards each (W, T) point averages)."""
    points = []   # (windows, tokens, forwards, mean seconds)
    for row in rows:
        for key, (count, ms) in (row.get("forwards") or {}).items():
            w, t = (int(x) for x in key.split(","))
            points.append((w, t, count, ms / 1000))
    if not points:
        raise ValueError("no forwards recorded: the run predates `forwards` in its rows (rerun bench-capacity)")
    knots = sorted({1} | {t for _, t, _, _ in points})   # every size fed: llama.cpp's curve is not smooth
    w, t, count, seconds = (np.array(column, dtype=float) for column in zip(*points))

    def hats(tokens: np.ndarray) -> np.ndarray:   # piecewise-linear basis: f(T) = sum_j value_j hat_j(T)
        return np.stack([np.interp(tokens, knots, np.eye(len(knots))[j]) for j in range(len(knots))], axis=1)

    weight = np.sqrt(count)
    # A light penalty on the per-window overhead: where the data cannot tell it from f (a size fed only with one
    # number of windows), it stays 0 instead of taking an arbitrary share of f.
    design = np.vstack([np.column_stack([hats(t), w - 1]) * weight[:, None],
                        np.append(np.zeros(len(knots)), 1e-3 * np.sqrt(count.sum()))])
    solution = np.linalg.lstsq(design, np.append(seconds * weight, 0.0), rcond=None)[0]
    if solution[-1] < 0:    # a negative per-window overhead is not physical: fit f alone
        design = hats(t)
        solution = np.append(np.linalg.lstsq(design * weight[:, None], seconds * weight, rcond=None)[0], 0.0)
    values, overhead = solution[:-1], float(solution[-1])
    supported = hats(t).sum(axis=0) > 0      # a knot no forward came near has no data: interpolate it
    values = np.interp(knots, np.array(knots)[supported], values[supported])
    profile = CostProfile(draft_seconds, tuple((k, max(1e-6, float(v))) for k, v in zip(knots, values)), overhead,
                          "fitted to a bench-capacity run")
    predicted = np.array([profile.batch_seconds([1] * (int(wi) - 1) + [int(ti) - int(wi) + 1])
                          for wi, ti in zip(w, t)])
    error = float(np.sqrt(np.sum(count * ((predicted - seconds) / seconds) ** 2) / np.sum(count)))
    return profile, error


def policy_maker(mode: str, warm: Telemetry, awc_model=None):
    """telemetry -> the window policy of ``mode`` (auto and awc start from ``warm``'s costs; awc with
    ``awc_model``'s weights, default the shipped ones)."""
    if mode == "ar":
        return lambda telemetry: FixedWindow(0)
    if mode.startswith("k="):
        k = int(mode[2:])
        return lambda telemetry: FixedWindow(k)

    def adaptive(telemetry: Telemetry):
        telemetry.start_from(warm)
        if mode == "awc":
            return AwcWindow(telemetry, awc_model, max_k=MAX_K) if awc_model else AwcWindow(telemetry, max_k=MAX_K)
        return GoodputWindow(telemetry, max_k=MAX_K)
    return adaptive


def simulate(profile: CostProfile, prompts: list[dict], batch: dict, rtt_ms: float, sessions: int, mode: str,
             warm: Telemetry, awc_model=None) -> dict:
    """One row of the run in the simulator: tokens/s over all sessions, windows per forward; ``warm`` absorbs
    the sessions as they finished (as the bench's coordinator-wide telemetry does)."""
    devices = [DeviceSpec(link=LinkModel(rtt_ms / 1000), acceptance=lambda rng, now: [0.0] * MAX_K, requests=1,
                          tokens=prompts[i % len(prompts)]["tokens"], matches=prompts[i % len(prompts)]["matches"])
               for i in range(sessions)]
    pool = {"count": 1, "max_batch": batch["max_batch"], "batch_wait_ms": batch["batch_wait_ms"],
            "gather": "verifier", "wait_fraction": batch["wait_fraction"]}
    sim = Simulation(profile, pool, devices, policy_maker(mode, warm, awc_model), MAX_K, seed=1)
    sim.run()
    records = sim.records
    end, device = np.frombuffer(records.end, dtype=np.float64), np.frombuffer(records.device, dtype=np.int32)
    if mode in ("auto", "awc"):
        finished = {int(d): float(e) for d, e in zip(device, end)}      # each device's last round
        for index in sorted(finished, key=finished.get):
            warm.absorb(sim.telemetries[index])
    verifier = next(iter(sim.verifiers.values()))
    horizon = float(end.max()) if len(end) else 0.0
    tokens = int(np.frombuffer(records.request_tokens, dtype=np.int32).sum())
    return {"tokens_per_second": tokens / horizon if horizon else 0.0,
            "batch_windows_mean": verifier.windows / max(1, len(verifier.batch_sizes))}


def predict(run: dict, tolerance: float) -> tuple[CostProfile, float, list[dict]]:
    """The fitted profile, its fit error, and every simulable row of a bench-capacity result, measured beside
    predicted."""
    for key in ("prompts", "verifier_batch", "draft_ms_per_token", "rows"):
        if key not in run:
            raise ValueError(f"the run has no {key!r}: it predates calibration data (rerun bench-capacity)")
    rows = [r for r in run["rows"] if not r.get("error")]
    profile, fit_error = fit_costs(rows, run["draft_ms_per_token"] / 1000)
    out = []
    for rtt in sorted({r["rtt_ms"] for r in rows}):
        warm = {mode: Telemetry(max_k=MAX_K) for mode in ("auto", "awc")}
        for mode in warm:    # the bench's warm-up: one session on the first prompt
            if any(r["mode"] == mode for r in rows):
                simulate(profile, run["prompts"], run["verifier_batch"], rtt, 1, mode, warm[mode])
        for row in [r for r in rows if r["rtt_ms"] == rtt]:
            if row["mode"] not in SIMULATED and not row["mode"].startswith("k="):
                continue
            got = simulate(profile, run["prompts"], run["verifier_batch"], rtt, row["sessions"], row["mode"],
                           warm.get(row["mode"], Telemetry(max_k=MAX_K)))
            error = got["tokens_per_second"] / row["tokens_per_second"] - 1
            out.append({"rtt_ms": rtt, "sessions": row["sessions"], "mode": row["mode"],
                        "measured_tokens_per_second": row["tokens_per_second"],
                        "simulated_tokens_per_second": round(got["tokens_per_second"], 3), "error": round(error, 4),
                        "within_tolerance": abs(error) <= tolerance,
                        "measured_batch_windows": row.get("batch_windows_mean"),
                        "simulated_batch_windows": round(got["batch_windows_mean"], 2)})
    return profile, fit_error, out


COMPARED = ("ar", "k=1", "k=2", "k=4", "auto", "awc")


def compare_policies(run: dict, profile: CostProfile, awc_model=None) -> tuple[list[dict], str]:
    """Every mode of COMPARED simulated at every (RTT, N) of the run, measured or not: each adaptive policy's
    tokens/s over the better of ar and the best fixed window, per cell and as a geometric mean."""
    rows = [r for r in run["rows"] if not r.get("error")]
    cells = []
    for rtt in sorted({r["rtt_ms"] for r in rows}):
        warm = {mode: Telemetry(max_k=MAX_K) for mode in ("auto", "awc")}
        for mode, telemetry in warm.items():
            simulate(profile, run["prompts"], run["verifier_batch"], rtt, 1, mode, telemetry, awc_model)
        for n in sorted({r["sessions"] for r in rows}):
            speed = {mode: simulate(profile, run["prompts"], run["verifier_batch"], rtt, n, mode,
                                    warm.get(mode, Telemetry(max_k=MAX_K)), awc_model)["tokens_per_second"]
                     for mode in COMPARED}
            best = max(v for m, v in speed.items() if m not in ("auto", "awc"))
            cells.append({"rtt_ms": rtt, "sessions": n, **{m: round(v, 3) for m, v in speed.items()},
                          **{f"{m}_vs_best": round(speed[m] / best, 3) for m in ("auto", "awc")}})
    lines = ["| RTT ms | N | " + " | ".join(COMPARED) + " | auto / best | awc / best |",
             "|---" * (len(COMPARED) + 4) + "|"]
    for c in cells:
        lines.append(f"| {c['rtt_ms']:g} | {c['sessions']} | " + " | ".join(f"{c[m]:.2f}" for m in COMPARED) +
                     f" | {c['auto_vs_best']:.2f} | {c['awc_vs_best']:.2f} |")
    for mode in ("auto", "awc"):
        ratios = np.array([c[f"{mode}_vs_best"] for c in cells])
        lines.append(f"\n{mode}: geometric mean {np.exp(np.log(ratios).mean()):.3f} of the better of ar and the "
                     f"best fixed window; {int((ratios >= 0.97).sum())}/{len(ratios)} cells at 0.97 or more")
    return cells, "\n".join(lines)


def markdown(profile: CostProfile, fit_error: float, rows: list[dict], tolerance: float) -> str:
    shown = [(t, s) for t, s in profile.forward_points if t in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)]
    curve = ", ".join(f"{t}: {1000 * s:.0f}" for t, s in shown)
    lines = [f"Fitted forward ms by tokens fed ({len(profile.forward_points)} sizes; some): {curve}; per extra window {1000 * profile.batch_seq_overhead_seconds:.1f} "
             f"ms; fit RMS error {fit_error:.1%} of a forward.", "",
             "| RTT ms | N | mode | measured tok/s | simulated tok/s | error | windows / forward measured / simulated |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        measured = r["measured_batch_windows"]
        lines.append(f"| {r['rtt_ms']:g} | {r['sessions']} | {r['mode']} | {r['measured_tokens_per_second']:.2f} | "
                     f"{r['simulated_tokens_per_second']:.2f} | {r['error']:+.1%} | "
                     f"{'' if measured is None else f'{measured:.1f}'} / {r['simulated_batch_windows']:.1f} |")
    lines += ["", summary(rows, tolerance)]
    return "\n".join(lines)


def summary(rows: list[dict], tolerance: float) -> str:
    parts = []
    for name, chosen in (("fixed windows and ar", [r for r in rows if r["mode"] == "ar" or r["mode"].startswith("k=")]),
                         ("adaptive", [r for r in rows if r["mode"] in ("auto", "awc")]), ("all", rows)):
        if chosen:
            errors = np.abs([r["error"] for r in chosen])
            parts.append(f"{name}: {sum(r['within_tolerance'] for r in chosen)}/{len(chosen)} rows within "
                         f"{tolerance:.0%}, mean |error| {errors.mean():.1%}, max {errors.max():.1%}")
    return "; ".join(parts)


def plot(rows: list[dict], tolerance: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 6))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        chosen = [r for r in rows if r["mode"] == mode]
        axis.scatter([r["measured_tokens_per_second"] for r in chosen],
                     [r["simulated_tokens_per_second"] for r in chosen], label=mode, s=25)
    top = 1.1 * max(max(r["measured_tokens_per_second"], r["simulated_tokens_per_second"]) for r in rows)
    line = np.array([0, top])
    axis.plot(line, line, color="black", linewidth=1)
    axis.fill_between(line, line * (1 - tolerance), line * (1 + tolerance), color="grey", alpha=0.2,
                      label=f"±{tolerance:.0%}")
    axis.set_xlabel("measured tokens/s (bench-capacity)")
    axis.set_ylabel("DSD-Sim tokens/s (calibrated from the same run)")
    axis.set_xlim(0, top)
    axis.set_ylim(0, top)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec bench sim-capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a bench-capacity --json result")
    parser.add_argument("--tolerance", type=float, default=0.10, help="relative error counted as a hit "
                        "(default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and the fitted profile here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    parser.add_argument("--plot", type=Path, default=None, help="draw simulated against measured tokens/s here (PNG)")
    parser.add_argument("--compare", action="store_true",
                        help="also simulate ar, k=1, k=2, k=4, auto and awc at every (RTT, N) of the run, measured "
                             "or not, and report the adaptive policies against the better of ar and the best fixed "
                             "window")
    parser.add_argument("--awc-weights", type=Path, default=None,
                        help="with --compare: the learned controller's weights (edgespec train awc --out); default "
                             "the shipped ones")
    args = parser.parse_args(argv)
    if not 0 < args.tolerance < 1:
        parser.error("--tolerance must be between 0 and 1")
    try:
        run = json.loads(args.run.read_text())
    except OSError as error:
        parser.error(f"cannot read {args.run}: {error.strerror}")
    except json.JSONDecodeError as error:
        parser.error(f"{args.run} is not JSON: {error}")
    try:
        profile, fit_error, rows = predict(run, args.tolerance)
    except (ValueError, KeyError, TypeError) as error:
        print(f"edgespec bench sim-capacity: {args.run}: {error}", file=sys.stderr)
        return 2
    text = markdown(profile, fit_error, rows, args.tolerance)
    compared = None
    if args.compare:
        from edgespec.control.awc import Mlp
        try:
            model = Mlp.from_dict(json.loads(args.awc_weights.read_text())) if args.awc_weights else None
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"--awc-weights {args.awc_weights}: {error}")
        compared, table = compare_policies(run, profile, model)
        text += "\n\nAll modes simulated at every cell (calibrated from this run):\n\n" + table
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")
    if args.plot and rows:
        plot(rows, args.tolerance, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "source": str(args.run), "tolerance": args.tolerance, "fit_rms_error": round(fit_error, 4),
            "profile": {"draft_seconds_per_token": profile.draft_seconds_per_token,
                        "forward_seconds_by_tokens": {str(t): round(s, 5) for t, s in profile.forward_points},
                        "batch_seq_overhead_seconds": round(profile.batch_seq_overhead_seconds, 5)},
            "rows": rows, "compared": compared}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
