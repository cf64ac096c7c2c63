"""Prefix caching on the verifier and drafter: sessions that share a prompt, with the cache off and on.

    edgespec bench prefix [--sessions 12] [--out docs/bench/prefix]

Real services on loopback (the default pair on PyTorch, float32), started twice: with ``--prefix-cache-mb 0``
on verifier and drafter, then with the default cache. Two workloads, run one session after another:

- repeated: the same chat prompt (~40 tokens through the template) sampled at temperature 0.7, 3 new tokens,
  window 2, one seed per session: the shape of the real-pair sampling test, which opens 243 such sessions.
- system: one long shared preamble (a system prompt, ~110 tokens) followed by a different question per
  session, greedy, window 4, 12 new tokens: the preamble's blocks are reused, the question is computed.

Per session: wall seconds from request to last token, at the client; the first session of each workload
fills the cache (a miss), the median is over the later ones. Greedy outputs are compared between the two runs
(a difference would be a near-tie flipped by the last bits of a partially matched prompt). Sampled outputs
are compared too, for information: speculative sampling is exact in distribution, but the text drawn for a
seed depends on the draft's proposals, and an int8 drafter's numbers depend on the rows in its forward (its
activations are quantised per forward), so a prompt computed after a stored prefix draws other proposals.
Writes OUT.json (with every session's tokens), OUT.md and OUT.png.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from harness.cluster import LocalCluster
from bench.prompts import PROMPTS
from bench.report import progress

SYSTEM = ("You are a careful senior software engineer who reviews code and answers questions for a small team. "
          "Answer in plain English, briefly, and show code only when it helps. Prefer the Python standard library. "
          "When a question is ambiguous, state the assumption you make and answer it. Never invent APIs: if you "
          "are not sure a function exists, say so. Keep answers under ten lines unless asked for more. Use "
          "type hints in Python code, and name variables plainly. Point out bugs, off-by-one errors and missing "
          "error handling when you see them, and say how to test the fix.\n\n")


async def one(address: str, prompt: str, chat: bool, max_new: int, window: int, **sampling) -> tuple[list[int], float]:
    from edge_client.client import collect

    run = await collect(address, prompt, max_new, window, chat=chat, timeout_seconds=600, **sampling)
    return run.tokens, run.seconds


def workloads(sessions: int) -> dict[str, list[tuple[str, bool, int, int, dict]]]:
    questions = [text for _, text in PROMPTS]
    return {
        "repeated": [(PROMPTS[8][1], True, 3, 2, dict(temperature=0.7, seed=seed)) for seed in range(sessions)],
        "system": [(f"{SYSTEM}Question: {questions[i % len(questions)]}\nAnswer:", False, 12, 4, {})
                   for i in range(sessions)],
    }


def run_cluster(cache_mb: float, sessions: int, log_dir: Path, progress) -> dict[str, list[tuple[list[int], float]]]:
    flags = ["--prefix-cache-mb", str(cache_mb)]
    with LocalCluster(log_dir, verifier_args=flags, drafter_args=flags) as cluster:
        address = cluster.coordinator.address
        asyncio.run(one(address, "Warm up.", False, 2, 2))    # first-call allocations (a prompt sharing no block)
        out = {}
        for name, runs in workloads(sessions).items():
            out[name] = []
            for prompt, chat, max_new, window, sampling in runs:
                out[name].append(asyncio.run(one(address, prompt, chat, max_new, window, **sampling)))
                progress.update(1)
        return out


def summary(results: dict[float, dict]) -> list[dict]:
    (off_mb, off), (on_mb, on) = results.items()
    rows = []
    for name in off:
        off_s = [s for _, s in off[name]][1:]   # the first session of each workload fills the cache: a miss
        on_s = [s for _, s in on[name]][1:]
        rows.append(dict(workload=name, sampled=name == "repeated", sessions=len(off[name]), off_p50_s=statistics.median(off_s),
                         on_p50_s=statistics.median(on_s), first_off_s=off[name][0][1], first_on_s=on[name][0][1],
                         speedup=statistics.median(off_s) / statistics.median(on_s),
                         mismatches=sum(a != b for (a, _), (b, _) in zip(off[name], on[name]))))
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | decoding | sessions | first session, off / on (s) | later sessions p50, off / on (s) | "
             "speedup | outputs differing off vs on |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {'sampled, T 0.7' if r['sampled'] else 'greedy'} | {r['sessions']} | "
                     f"{r['first_off_s']:.2f} / {r['first_on_s']:.2f} | {r['off_p50_s']:.2f} / {r['on_p50_s']:.2f} | "
                     f"{r['speedup']:.2f}x | {r['mismatches']} |")
    return "\n".join(lines)


def plot(results: dict[float, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, name in zip(axes, next(iter(results.values()))):
        for mb, by in results.items():
            ax.plot(range(1, len(by[name]) + 1), [s for _, s in by[name]], "o-",
                    label="cache off" if not mb else f"cache {mb:g} MiB")
        ax.set_title(f"{name}: seconds per session")
        ax.set_xlabel("session (one after another)")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench prefix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=12, help="sessions per workload (default %(default)s)")
    parser.add_argument("--cache-mb", type=float, default=256.0,
                        help="--prefix-cache-mb of the second run (default %(default)s)")
    parser.add_argument("--out", default="prefix", help="write OUT.json, OUT.md and OUT.png (default %(default)s)")
    args = parser.parse_args(argv)
    if args.sessions < 2 or args.cache_mb <= 0:
        parser.error("--sessions must be >= 2 and --cache-mb > 0")
    results = {}
    with tempfile.TemporaryDirectory(prefix="edgespec-prefix-") as logs, \
            progress(4 * args.sessions, "bench-prefix", unit="session") as bar:
        for mb in (0.0, args.cache_mb):
            results[mb] = run_cluster(mb, args.sessions, Path(logs) / f"cache-{mb:g}", bar)
    rows = summary(results)
    table = markdown(rows)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(args=vars(args), rows=rows, sessions={
        f"{mb:g}": {name: [dict(seconds=s, tokens=t) for t, s in by[name]] for name in by}
        for mb, by in results.items()}), indent=1))
    out.with_suffix(".md").write_text(table + "\n")
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
