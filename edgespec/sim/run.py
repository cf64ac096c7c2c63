"""Run DSD-Sim scenarios: `python -m edgespec.sim.run SCENARIO.json [...] --out DIR`.

One scenario writes DIR/result.json and DIR/{window,acceptance,latency}.png; several write one
subfolder each (named after the scenario) and DIR/table.md comparing the policies.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edgespec.sim.plots import write_plots
from edgespec.sim.scenario import run_scenario


def table(results: list[dict]) -> str:
    """Markdown: per scenario, tokens/s and ITL (time between tokens) p50/p99 per policy; best fixed vs goodput vs AWC."""
    lines = ["| scenario | policy | tokens/s | ITL p50 / p99 ms | mean k | acceptance |", "|---|---|---|---|---|---|"]
    summary = ["| scenario | best fixed (k) tok/s | goodput tok/s (vs best fixed) | awc tok/s (vs best fixed) |",
               "|---|---|---|---|"]
    for result in results:
        policies = result["policies"]
        for name, s in policies.items():
            acc = "-" if s["acceptance"] is None else f"{s['acceptance']:.2f}"
            lines.append(f"| {result['name']} | {name} | {s['tokens_per_second']:.2f} | "
                         f"{s['itl_p50_ms']:.0f} / {s['itl_p99_ms']:.0f} | {s['mean_window']:.2f} | {acc} |")
        fixed = {n: s["tokens_per_second"] for n, s in policies.items() if n.startswith("fixed:")}
        if fixed:
            best = max(fixed, key=fixed.get)
            cells = []
            for name in ("goodput", "awc"):
                if name in policies:
                    tps = policies[name]["tokens_per_second"]
                    cells.append(f"{tps:.2f} ({tps / fixed[best] - 1:+.1%})")
                else:
                    cells.append("-")
            summary.append(f"| {result['name']} | {fixed[best]:.2f} ({best.split(':')[1]}) | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n\n" + "\n".join(summary) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policies", help="comma-separated, overrides the scenario's (fixed:K, heuristic, goodput, awc)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    policies = args.policies.split(",") if args.policies else None
    results = []
    for path in args.scenarios:
        out = args.out if len(args.scenarios) == 1 else args.out / path.stem
        out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        result = run_scenario(path, policies)
        result["wall_seconds"] = time.perf_counter() - started
        (out / "result.json").write_text(json.dumps(result, indent=1))
        if not args.no_plots:
            write_plots(result, out)
        results.append(result)
        best = max(result["policies"].items(), key=lambda item: item[1]["tokens_per_second"])
        print(f"{result['name']}: {result['wall_seconds']:.1f} s wall; best {best[0]} "
              f"{best[1]['tokens_per_second']:.2f} tok/s", flush=True)
    md = table(results)
    (args.out / "table.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
