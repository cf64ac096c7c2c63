"""Bytes on the wire per verify window: one-hot q vs sparse q (K ids) vs dense q.

    edgespec bench wire-bytes [--vocab 151936] [--windows 2,4]

Serialises real verifier.proto Window messages (token ids drawn from the upper
vocabulary, where varints are longest) and reports their size in bytes.
"""
from __future__ import annotations

import argparse

import numpy as np

from edgespec.verify.sampling import SamplingParams, truncate_to_sparse
from edgespec.v1 import verifier_pb2
from edgespec.net.wire import dists_to_pb


def window_bytes(k: int, q_ids: int | None, vocab: int, seed: int = 0) -> int:
    """Serialized Window size; q_ids None = one-hot (no q), 0 = dense q (every id)."""
    rng = np.random.default_rng(seed)
    draft = [int(t) for t in rng.integers(vocab // 2, vocab, size=k)]
    dists = None
    if q_ids is not None:
        dists = []
        for token in draft:
            probs = rng.dirichlet(np.full(vocab, 0.05))
            probs[token] = max(probs[token], probs.max())   # the sampled token is in the kept ids
            dists.append(truncate_to_sparse(probs / probs.sum(), q_ids))
    window = verifier_pb2.Window(session_id="0123456789abcdef0123456789abcdef", window_seq=1234, base_position=2048,
                                 draft_tokens=draft, params_fingerprint=SamplingParams(0.7, 0, 1.0, 7).fingerprint(),
                                 draft_probs=dists_to_pb(dists))
    return window.ByteSize()


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench wire-bytes", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size (default: Qwen2.5)")
    parser.add_argument("--windows", default="2,4", help="window sizes k")
    args = parser.parse_args()
    variants = [("one-hot q (ids only)", None), ("sparse q, K=8", 8), ("sparse q, K=16", 16),
                ("sparse q, K=32", 32), ("dense q (all ids)", 0)]
    windows = [int(k) for k in args.windows.split(",")]
    print("| q sent | " + " | ".join(f"bytes/window, k={k}" for k in windows) + " |")
    print("|---|" + "---|" * len(windows))
    for name, q_ids in variants:
        print(f"| {name} | " + " | ".join(f"{window_bytes(k, q_ids, args.vocab):,}" for k in windows) + " |")


if __name__ == "__main__":
    main()
