"""`edgespec bench speed`: edgespec over gRPC vs target-only and HF assisted generation, one run.

    edgespec bench speed --json bench-results/bench.json --md bench-results/bench.md

1. Baselines in a child process (the target is never loaded twice at once):
   target-only greedy with transformers generate() and its KV cache, and HF
   assisted generation (assistant_model=draft) at each window of --hf-windows.
2. The three services on loopback with the default pair, for each drafter
   quantization and each window of --windows, over the same prompts; with
   --tree-depths, also token-tree windows (a second coordinator with
   --tree-depth D on the same drafter and verifier: the window's chain plus the
   draft's runner-up at its first D positions, scored in one target pass); with
   --cloud-draft, also rows where the verifier drafts for itself (a coordinator
   with --cloud-draft on: Progressive Tree Drafting, no edge drafter).
Every edgespec row records whether its tokens equal target-only's exactly.
Speed is reported as ratios of aggregate tokens/s within this run. The child
process also times one target forward over n = 1..--cost-curve tokens: c(n),
the cost of a window or tree of n - 1 tokens over one step (OUT.cost.png).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from edge_client.client import collect
from harness.cluster import REPO_ROOT, LocalCluster, start_service
from bench.prompts import PROMPTS
from edgespec.engines.self_draft import SelfDraftConfig
from edgespec.loop.session import RoundStats
from bench.report import track, write_report

log = logging.getLogger("edgespec.bench")


async def run_edgespec(address: str, prompt: str, max_new_tokens: int, window: int, temperature: float = 0.0,
                       seed: int | None = None) -> tuple[list[int], float, object]:
    run = await collect(address, prompt, max_new_tokens, window, chat=True, timeout_seconds=900,
                        temperature=temperature, seed=seed)
    return run.tokens, run.seconds, run.stats


def summarize(rows: list[dict]) -> dict:
    """Aggregate tokens/s per (system, window, quantize) overall and per category."""
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for scope in ("all", row["category"]):
            groups[row["config"]][scope].append(row)
    out = {}
    for key, scopes in groups.items():
        out[key] = {}
        for scope, group in scopes.items():
            tokens, seconds = sum(r["new_tokens"] for r in group), sum(r["seconds"] for r in group)
            pooled = RoundStats.merged(RoundStats.of(r) for r in group)
            out[key][scope] = dict(
                tokens=tokens, seconds=round(seconds, 3), tokens_per_second=round(tokens / seconds, 3),
                acceptance_rate=round(pooled.acceptance_rate, 3) if pooled.drafted else None,
                mean_accepted_length=round(pooled.mean_accepted_length, 3) if pooled.rounds else None,
                mismatches=sum(r["identical_to_target"] is False for r in group))
    return out


def markdown(summary: dict, ratios: dict, categories: list[str]) -> str:
    header = "| system | " + " | ".join(f"{c} tok/s" for c in categories) + " | all tok/s | acceptance | tokens/round | identical |"
    lines = [header, "|" + "---|" * (len(categories) + 5)]
    for key, scopes in sorted(summary.items()):
        cells = [f"{scopes[c]['tokens_per_second']:.2f}" if c in scopes else "-" for c in categories]
        a = scopes["all"]
        acc = f"{a['acceptance_rate']:.1%}" if a["acceptance_rate"] is not None else "-"
        mal = f"{a['mean_accepted_length']:.2f}" if a["mean_accepted_length"] is not None else "-"
        same = "n/a (sampled)" if "sampling" in key else "yes" if a["mismatches"] == 0 else f"{a['mismatches']} differ"
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {a['tokens_per_second']:.2f} | {acc} | {mal} | {same} |")
    lines.append("")
    for name, value in ratios.items():
        lines.append(f"- **{name}**: {value}")
    return "\n".join(lines) + "\n"


def depth_table(rows: list[dict]) -> str:
    """Per edgespec config: the window the policy chose (mean chain k and runner-ups per round) and the
    acceptance at each depth (rounds whose accepted path reached it / rounds whose window offered it; for
    cloud drafting, whose window is the verifier's own, reached / rounds)."""
    configs: dict[str, list[RoundStats]] = defaultdict(list)
    for row in rows:
        if "accepted_at_depth" in row:
            configs[row["config"]].append(RoundStats.of(row))
    if not configs:
        return ""
    lines = ["", "| system | mean k | runner-ups / round | acceptance by depth (1, 2, ...) |", "|---|---|---|---|"]
    for config, many in sorted(configs.items()):
        pooled = RoundStats.merged(many)
        rounds, chain = max(1, pooled.rounds), sum(pooled.offered_at_depth)
        lines.append(f"| {config} | {chain / rounds:.2f} | {(pooled.drafted - chain) / rounds:.2f} | "
                     + ", ".join(f"{r:.2f}" for r in pooled.acceptance_by_depth[:8]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "bench-results" / "bench.json", help="JSON output path")
    parser.add_argument("--md", type=Path, default=None, help="markdown table path (default: next to --json)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default %(default)s)")
    parser.add_argument("--windows", default="auto,1,2,3", help="edgespec windows; auto = goodput policy (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="sampling rows: target-only vs edgespec (auto window, first quantization) at this "
                             "temperature; 0 = none (default %(default)s)")
    parser.add_argument("--hf-windows", default="1,2,3", help="HF assisted windows (default %(default)s)")
    parser.add_argument("--quantize", default="none,int8", help="drafter quantizations to run (default %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all %d)" % len(PROMPTS))
    parser.add_argument("--tree-depths", default="0,2,auto",
                        help="token-tree rows: runner-ups at this many positions per window, or auto (the "
                             "coordinator's --tree-depth auto); 0 = chains (default %(default)s)")
    parser.add_argument("--cloud-draft", default="on", choices=["on", "off"],
                        help="rows where the verifier drafts for itself (coordinator --cloud-draft on; the "
                             "verifier's --self-draft-nodes budget) beside the edge drafter's (default %(default)s)")
    parser.add_argument("--self-draft-nodes", type=int, default=SelfDraftConfig().nodes,
                        help="the verifier's cloud-drafting budget per pass, tokens (default %(default)s)")
    parser.add_argument("--cost-curve", type=int, default=16,
                        help="time one target forward over n = 1..N tokens (0 = skip; default %(default)s)")
    args = parser.parse_args()
    try:
        asked = [-1 if d.strip() == "auto" else int(d) for d in args.tree_depths.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--tree-depths: expected comma-separated depths 0..4 or auto, got {args.tree_depths!r}")
    depths = [0] + [d for d in dict.fromkeys(asked) if d != 0]
    if not all(-1 <= d <= 4 for d in depths) or args.cost_curve < 0:
        parser.error("--tree-depths must be in 0..4 or auto, and --cost-curve >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prompts = PROMPTS[: args.limit] if args.limit else PROMPTS
    args.json.parent.mkdir(parents=True, exist_ok=True)

    subprocess.run([sys.executable, "-m", "edgespec.ops.prepare"], cwd=REPO_ROOT, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        baseline_path = Path(tmp) / "baselines.json"
        log.info("phase 1/2: target-only and HF assisted baselines (child process)")
        subprocess.run([sys.executable, "-m", "bench.baselines", "--out", str(baseline_path),
                        "--max-new-tokens", str(args.max_new_tokens), "--hf-windows", args.hf_windows,
                        "--limit", str(args.limit), "--temperature", str(args.temperature),
                        "--cost-curve", str(args.cost_curve)], cwd=REPO_ROOT, check=True)
        baseline = json.loads(baseline_path.read_text())
    reference = {r["prompt"]: r["tokens"] for r in baseline["rows"] if r["system"] == "target-only"}
    rows = []
    names = {"target-only": "target-only (HF generate)", "target-only-sampling": f"target-only sampling T={args.temperature}"}
    for r in baseline["rows"]:
        config = names.get(r["system"], f"hf-assisted k={r['window']}")
        sampled = r["system"] == "target-only-sampling"
        rows.append(dict(r, config=config, tokens_per_second=r["new_tokens"] / r["seconds"], acceptance_rate=None,
                         mean_accepted_length=None,
                         identical_to_target=None if sampled else r["tokens"] == reference[r["prompt"]]))

    log.info("phase 2/2: edgespec over gRPC on loopback")
    for quantize in args.quantize.split(","):
        with LocalCluster(Path(tempfile.mkdtemp(prefix="edgespec-bench-")),
                          verifier_args=["--self-draft-nodes", str(args.self_draft_nodes)],
                          drafter_args=["--quantize", quantize], coordinator_args=["--max-window", "16"]) as cluster:
            coordinators = {0: cluster.coordinator.address}
            cloud = None
            if args.cloud_draft == "on" and quantize == args.quantize.split(",")[0]:   # no edge drafter: once
                cloud = start_service("services.coordinator", [
                    "--verifier", cluster.verifier.address, "--drafter", cluster.drafter.address, "--max-window", "16",
                    "--cloud-draft", "on"], cluster.log_dir, "coordinator-cloud-draft")
                cluster.services.append(cloud)
            for depth in depths[1:]:
                tree = start_service("services.coordinator", [
                    "--verifier", cluster.verifier.address, "--drafter", cluster.drafter.address, "--max-window", "16",
                    "--tree-depth", "auto" if depth < 0 else str(depth)], cluster.log_dir,
                    f"coordinator-tree{'auto' if depth < 0 else depth}")
                cluster.services.append(tree)
                coordinators[depth] = tree.address
            for address in [*coordinators.values(), *([cloud.address] if cloud else [])]:
                asyncio.run(run_edgespec(address, "warm up", 8, 2))
            draft_name = "fp32" if quantize == "none" else quantize
            for index, (category, text) in enumerate(track(prompts, f"bench draft={draft_name}")):
                if args.temperature > 0 and quantize == args.quantize.split(",")[0]:
                    tokens, seconds, stats = asyncio.run(run_edgespec(cluster.coordinator.address, text,
                                                                      args.max_new_tokens, -1, args.temperature, index))
                    rows.append(dict(system="edgespec-sampling", config=f"edgespec sampling T={args.temperature} "
                                     f"k=auto draft={draft_name}", category=category, prompt=index, window=-1,
                                     quantize=quantize, new_tokens=len(tokens), seconds=seconds,
                                     tokens_per_second=len(tokens) / seconds, **RoundStats.of(stats).reported(),
                                     identical_to_target=None, tokens=tokens))
                for window, depth in ((w, d) for w in (-1 if w == "auto" else int(w) for w in args.windows.split(","))
                                      for d in depths if w != 0 or d == 0):
                    tokens, seconds, stats = asyncio.run(run_edgespec(coordinators[depth], text,
                                                                      args.max_new_tokens, window))
                    tree = f" tree={'auto' if depth < 0 else depth}" if depth else ""
                    config = f"edgespec k={'auto' if window < 0 else window}{tree} draft={draft_name}"
                    rows.append(dict(system="edgespec", config=config, category=category, prompt=index, window=window,
                                     tree_depth=depth,
                                     quantize=quantize, new_tokens=len(tokens), seconds=seconds,
                                     tokens_per_second=len(tokens) / seconds, **RoundStats.of(stats).reported(),
                                     identical_to_target=tokens == reference[index], tokens=tokens))
                    log.info("%s prompt %d (%s): %.2f tok/s, acceptance %.2f, identical %s", config, index, category,
                             len(tokens) / seconds, stats.acceptance_rate, tokens == reference[index])
                if cloud is not None:
                    tokens, seconds, stats = asyncio.run(run_edgespec(cloud.address, text, args.max_new_tokens, -1))
                    config = f"edgespec cloud-draft (PTD, {args.self_draft_nodes} tokens/pass)"
                    rows.append(dict(system="edgespec-cloud-draft", config=config, category=category, prompt=index,
                                     window=-1, quantize="-", new_tokens=len(tokens), seconds=seconds,
                                     tokens_per_second=len(tokens) / seconds, **RoundStats.of(stats).reported(),
                                     identical_to_target=tokens == reference[index], tokens=tokens))
                    log.info("%s prompt %d (%s): %.2f tok/s, %.2f tokens/round, identical %s", config, index, category,
                             len(tokens) / seconds, stats.mean_accepted_length, tokens == reference[index])

    summary = summarize(rows)
    target_tps = summary["target-only (HF generate)"]["all"]["tokens_per_second"]
    greedy = {k: v for k, v in summary.items() if k.startswith("edgespec k=")}
    exact = {k: v for k, v in greedy.items() if v["all"]["mismatches"] == 0}
    best_es = max(exact or greedy,
                  key=lambda k: summary[k]["all"]["tokens_per_second"])
    best_hf = max((k for k in summary if k.startswith("hf-assisted")), key=lambda k: summary[k]["all"]["tokens_per_second"],
                  default=None)
    categories = sorted({c for c, _ in prompts})
    ratios = {
        "best_edgespec": best_es,
        "edgespec_vs_target": round(summary[best_es]["all"]["tokens_per_second"] / target_tps, 3),
    }
    if best_hf is not None:   # --hf-windows "" runs none
        ratios |= {"best_hf_assisted": best_hf,
                   "edgespec_vs_hf_assisted": round(summary[best_es]["all"]["tokens_per_second"]
                                                    / summary[best_hf]["all"]["tokens_per_second"], 3),
                   "hf_assisted_vs_target": round(summary[best_hf]["all"]["tokens_per_second"] / target_tps, 3)}
    for key in (k for k in summary if k.startswith("edgespec cloud-draft")):
        ratios["cloud_draft_vs_target"] = round(summary[key]["all"]["tokens_per_second"] / target_tps, 3)
    sampled = [k for k in summary if k.startswith("edgespec sampling")]
    if sampled:
        ratios["edgespec_sampling_vs_target_sampling"] = round(
            summary[sampled[0]]["all"]["tokens_per_second"]
            / summary[f"target-only sampling T={args.temperature}"]["all"]["tokens_per_second"], 3)
    for category in categories:
        ratios[f"edgespec_vs_target[{category}]"] = round(
            summary[best_es][category]["tokens_per_second"] / summary["target-only (HF generate)"][category]["tokens_per_second"], 3)
    machine = dict(platform=platform.platform(), python=platform.python_version(), cpus=__import__("os").cpu_count())
    curve = {int(n): s for n, s in baseline.get("cost_curve", {}).items()}
    table = markdown(summary, ratios, categories) + depth_table(rows)
    if curve:
        table += ("\nc(n), one target forward over n tokens over one over 1 token (the cost of a window or tree of "
                  "n - 1 tokens): " + ", ".join(f"{n}: {s / curve[1]:.2f}" for n, s in sorted(curve.items())) +
                  f" (1 token: {1000 * curve[1]:.0f} ms)\n")
        plot_cost_curve(curve, args.json.with_suffix(".cost.png"))
    write_report(dict(machine=machine, max_new_tokens=args.max_new_tokens, ratios=ratios, summary=summary,
                      cost_curve=curve, rows=rows), table, args.json, args.md)


def plot_cost_curve(curve: dict[int, float], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(curve)
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(sizes, [curve[n] / curve[1] for n in sizes], "o-", label="measured c(n)")
    axis.plot(sizes, sizes, ":", color="grey", label="n (no batching gain)")
    axis.set_xlabel("tokens fed in one target forward (window or tree + 1)")
    axis.set_ylabel("forward time / one-token forward")
    axis.set_title(f"c(n) of the target (1 token = {1000 * curve[1]:.0f} ms)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
