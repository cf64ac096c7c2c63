"""Is a llama.cpp batch of n rows what n one-row decodes compute? A probe, per setting, on the default pair.

    edgespec bench invariance [--models target,draft] [--json PATH] [--md PATH]

For each setting (flash attention, weight repacking, the tiled K-quant matmul, the threads of a one-token
decode, unified or per-sequence KV) it loads the model in a subprocess of its own (ggml reads
GGML_CPU_TILED_MM once per process) and measures, on a short and a long prompt (the long one past 512 KV cells,
where a one-row decode splits its attention over the threads):

- rows: the logits of one decode over n tokens (n = 2..9, 16) against the same tokens decoded one at a time
  after the same prefill: the largest |difference| and whether every row is bit-identical. n* is the largest n
  up to which every decode is identical;
- prefill: the logits after the prompt fed in one batch against the prompt less its last token in one batch and
  then that token alone (how the services feed a prompt);
- batch: four sessions' 3-token windows in one batch, and their one-token steps in one batch, against each
  session alone;
- cost: a one-token decode (ms, its tok/s) and c(n), a pass over n tokens relative to one.

The chosen exact setting is the one the services run; docs/llamacpp-exactness.md holds the table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.report import write_report

ROWS = (2, 3, 4, 5, 6, 7, 8, 9, 16)
LONG_PARAGRAPH = ("The verifier keeps one cache of keys and values per session and scores a whole window of drafted "
                  "tokens in one pass; the coordinator commits the accepted prefix and one token of the target's own. ")


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    flash_attn: bool = True
    repack: bool = True
    tiled: bool = True           # GGML_CPU_TILED_MM (the K-quant tiled matmul for batches of >= 8 rows)
    single_threads: int = 0      # threads of a one-token decode (0: as a batch's)
    unified: bool = True
    ubatch_tokens: int = 512
    window_rows: int = 0
    far_rows_alone: bool = False   # rows past llamacpp.ONE_CHUNK_POSITIONS decoded alone, on every thread


SETTINGS = (
    Setting("llama.cpp default (edgespec before)", single_threads=0),
    Setting("flash attention off", flash_attn=False),
    Setting("one-token decodes on 1 thread", single_threads=1),
    Setting("no repacking", repack=False),
    Setting("no repacking, no tiled matmul", repack=False, tiled=False),
    Setting("no repacking, 1-thread one-token decodes", repack=False, single_threads=1),
    Setting("no repacking, 1-thread one-token decodes, KV per sequence", repack=False, single_threads=1,
            unified=False),
    Setting("1-thread one-token decodes, KV per sequence", single_threads=1, unified=False),
    Setting("no repacking, no tiled matmul, 1-thread one-token decodes, ubatch 63", repack=False, tiled=False,
            single_threads=1, ubatch_tokens=63),
    Setting("no repacking, no tiled matmul, 1-thread one-token decodes, ubatch 63, KV per sequence", repack=False,
            tiled=False, single_threads=1, ubatch_tokens=63, unified=False),
    Setting("no repacking, no tiled matmul, 1-thread one-token decodes, windows in decodes of 63 rows",
            repack=False, tiled=False, single_threads=1, window_rows=63),
    Setting("no repacking, 1-thread one-token decodes, windows in decodes of 7 rows (exact before KV streams)",
            repack=False, single_threads=1, window_rows=7),
    Setting("no repacking, 1-thread one-token decodes, windows in decodes of 7 rows, KV per sequence (exact before "
            "repacked weights)", repack=False, single_threads=1, window_rows=7, unified=False),
    Setting("repacked weights, 1-thread one-token decodes, windows in decodes of 3 rows, KV per sequence (exact "
            "until 2026-12-07)", single_threads=1, window_rows=3, unified=False),
    Setting("exact (--exact on): repacked weights, windows in decodes of 3 rows, rows past 240 positions decoded "
            "alone, KV per sequence", window_rows=3, unified=False, far_rows_alone=True),
    Setting("exact, prompts in the verifier's parts (--prefill-chunk 64: ubatch 64)", window_rows=3, unified=False,
            ubatch_tokens=64, far_rows_alone=True),
)


def max_diff(a, b) -> float:
    import numpy as np
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def probe(model: str, setting: Setting, threads: int) -> dict:
    """One setting in this process: the measurements above, as a JSON-able dict."""
    import numpy as np

    from edgespec.backends import llamacpp
    from edgespec.backends.tokenizer import load_tokenizer

    exact = llamacpp.LlamaExact(flash_attn=setting.flash_attn, repack=setting.repack, tiled=setting.tiled,
                                single_threads=setting.single_threads, unified=setting.unified,
                                ubatch_tokens=setting.ubatch_tokens, window_rows=setting.window_rows,
                                far_rows_alone=setting.far_rows_alone)
    lm = llamacpp.load(model, threads=threads, ctx_tokens=8 * 1024, max_sequences=8, exact=exact)
    tokenizer = load_tokenizer("target" if model == "target" else model)
    prompts = {"short": tokenizer.encode("Write a Python function that checks whether a number is prime.", True),
               "long": tokenizer.encode("Summarise: " + LONG_PARAGRAPH * 24, True)}
    out: dict = {"model": model, "setting": asdict(setting), "describe": lm.exact.describe(), "threads": threads,
                 "prompt_tokens": {k: len(v) for k, v in prompts.items()}}
    for label, prompt in prompts.items():
        state = lm.new_state()
        started = time.perf_counter()
        ref = [lm.logits_rows(state, prompt, 1)[0]]
        prefill_seconds = time.perf_counter() - started
        cont: list[int] = []
        step_seconds = []
        for _ in range(max(ROWS)):
            cont.append(int(np.argmax(ref[-1])))
            started = time.perf_counter()
            ref.append(lm.logits_rows(state, prompt + cont, 1)[0])
            step_seconds.append(time.perf_counter() - started)
        rows = {}
        pass_seconds = {}
        for n in ROWS:
            times = []
            for _ in range(3):
                lm.crop(state, len(prompt))
                started = time.perf_counter()
                window = lm.logits_rows(state, prompt + cont[:n], n)
                times.append(time.perf_counter() - started)
            pass_seconds[n] = float(np.median(times))
            rows[n] = {"max_abs_diff": max_diff(window, ref[1:n + 1]),
                       "identical": bool(np.array_equal(window, np.stack(ref[1:n + 1])))}
        step = float(np.median(step_seconds))
        n_star = 1
        for n in ROWS:
            if not rows[n]["identical"]:
                break
            n_star = n
        split = lm.new_state()
        lm.logits_rows(split, prompt[:-1], 1)
        prefill = max_diff(lm.logits_rows(split, prompt, 1)[0], ref[0])
        out[label] = {"rows": rows, "n_star": n_star, "prefill_split_max_abs_diff": prefill,
                      "step_ms": 1000 * step, "decode_tok_s": 1 / step, "prefill_ms": 1000 * prefill_seconds,
                      "c": {n: pass_seconds[n] / step for n in ROWS}}
        del state, split
    # four sessions in one batch against each alone (short prompts of different lengths)
    texts = ["What is the capital of France?", "Explain recursion to a child in two sentences.",
             "def fibonacci(n):", "List three prime numbers and say why each is prime."]
    seqs = [tokenizer.encode(text, True) for text in texts]
    states = [lm.new_state() for _ in seqs]
    alone_windows, alone_steps, windows = [], [], []
    for state, seq in zip(states, seqs):
        first = int(np.argmax(lm.logits_rows(state, seq, 1)[0]))
        window = seq + [first, (first + 1) % lm.vocab_size, (first + 2) % lm.vocab_size]
        windows.append(window)
        alone_windows.append(lm.logits_rows(state, window, 3))
        lm.crop(state, len(seq))
        alone_steps.append(lm.logits_rows(state, seq + [first], 1))
        lm.crop(state, len(seq))
    together = lm.logits_rows_batch(states, windows, [3] * len(states))
    for state, seq in zip(states, seqs):
        lm.crop(state, len(seq))
    together_steps = lm.logits_rows_batch(states, [w[:len(s) + 1] for w, s in zip(windows, seqs)], [1] * len(states))
    out["rounds"] = rounds(lm, seqs)
    out["batch"] = {
        "windows_identical": all(np.array_equal(a, b) for a, b in zip(alone_windows, together)),
        "windows_max_abs_diff": max(max_diff(a, b) for a, b in zip(alone_windows, together)),
        "steps_identical": all(np.array_equal(a, b) for a, b in zip(alone_steps, together_steps)),
        "steps_max_abs_diff": max(max_diff(a, b) for a, b in zip(alone_steps, together_steps)),
    }
    lm.close()
    return out


def rounds(lm, seqs: list[list[int]], count: int = 8) -> dict:
    """Sessions speculating together, as a verifier serves them: every round each session's window of 1 to 4
    guessed tokens (the length varies by round and session) goes into one batch, then each cache is cropped to a
    varying accepted prefix and the target's token. The same operations replayed for each session alone, in a
    context of its own, must give the same rows. "seconds": the rounds together (what batching sessions costs
    in this setting)."""
    import numpy as np

    from edgespec.backends import llamacpp

    def play(model, indexes):
        states = {i: model.new_state() for i in indexes}
        committed = {i: list(seqs[i]) for i in indexes}
        for i in indexes:
            model.prefill(states[i], committed[i])
        out = {i: [] for i in indexes}
        for r in range(count):
            windows = {}
            for i in indexes:
                guess = [(committed[i][-1] * 31 + j + r) % model.vocab_size for j in range(1 + (r + i) % 4)]
                windows[i] = committed[i] + guess
            rows = model.logits_rows_batch([states[i] for i in indexes], [windows[i] for i in indexes],
                                           [len(windows[i]) - len(committed[i]) + 1 for i in indexes])
            for i, got in zip(indexes, rows):
                out[i].append(got)
                accepted = (r + 2 * i) % len(got)      # keep a varying prefix of the window, then the target's token
                committed[i] = windows[i][:len(committed[i]) + accepted] + [int(np.argmax(got[accepted]))]
                model.crop(states[i], len(committed[i]) - 1)
        return out

    started = time.perf_counter()
    together = play(lm, list(range(len(seqs))))
    seconds = time.perf_counter() - started
    alone = {}
    for i in range(len(seqs)):
        solo = llamacpp.LlamaCppLM(lm.name, threads=lm.threads, ctx_tokens=lm.ctx_tokens,
                                   max_sequences=lm.max_sequences, exact=lm.exact)
        alone.update(play(solo, [i]))
        solo.close()
    diffs = [max_diff(a, b) for i in together for a, b in zip(together[i], alone[i])]
    return {"identical": all(d == 0 for d in diffs), "max_abs_diff": max(diffs), "rounds": count, "seconds": seconds}


def run_setting(model: str, setting: Setting, threads: int) -> dict:
    result = subprocess.run([sys.executable, "-m", "bench.llama_invariance", "--one", json.dumps(asdict(setting)),
                             "--models", model, "--threads", str(threads)], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    if result.returncode != 0:
        raise RuntimeError(f"probe of {setting.name} on {model} failed ({result.returncode}): "
                           f"{result.stderr.strip().splitlines()[-1:] or ''}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def table(results: list[dict]) -> str:
    lines = ["| model | setting | n* short / long | max \\|Δ\\| at n=4 short / long | prefill split \\|Δ\\| long | "
             "4 sessions: windows / steps / 8 rounds identical | decode tok/s (long) | prefill ms (long) | "
             "c(2) c(4) c(8) (long) | 4 sessions x 8 rounds, s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s, l = r["short"], r["long"]
        c = l["c"]
        lines.append(
            f"| {r['model']} | {r['setting']['name']} | {s['n_star']} / {l['n_star']} | "
            f"{s['rows']['4']['max_abs_diff']:.3g} / {l['rows']['4']['max_abs_diff']:.3g} | "
            f"{l['prefill_split_max_abs_diff']:.3g} | "
            f"{yes(r['batch']['windows_identical'])} / {yes(r['batch']['steps_identical'])} / "
            f"{yes(r['rounds']['identical'])} | {l['decode_tok_s']:.2f} | {l['prefill_ms']:.0f} | "
            f"{c['2']:.2f} {c['4']:.2f} {c['8']:.2f} | {r['rounds']['seconds']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench invariance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="target,draft", help="packaged models or GGUF paths (default %(default)s)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="threads of a batch (default %(default)s)")
    parser.add_argument("--settings", default="", help="comma-separated indexes into the settings (default all)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/llama-invariance.json"))
    parser.add_argument("--md", type=Path, default=Path("bench-results/llama-invariance.md"))
    parser.add_argument("--one", help=argparse.SUPPRESS)   # a setting as JSON: run it in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(probe(args.models, Setting(**json.loads(args.one)), args.threads)))
        return
    chosen = [SETTINGS[int(i)] for i in args.settings.split(",")] if args.settings else list(SETTINGS)
    results = []
    for model in args.models.split(","):
        for setting in chosen:
            print(f"== {model}: {setting.name}", file=sys.stderr, flush=True)
            results.append(run_setting(model, setting, args.threads))
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    write_report({"machine": machine(), "threads": args.threads, "results": results},
                 f"Machine: {machine()}; {args.threads} threads a batch.\n\n{table(results)}", args.json, args.md)


def machine() -> str:
    from edgespec.ops.llama_build import chosen, this_cpu
    cpu, build = this_cpu(), chosen()
    return f"{cpu.model or cpu.machine}, {os.cpu_count()} CPUs, llama.cpp build {build.variant} ({' '.join(build.args)})"


if __name__ == "__main__":
    main()
