"""Verification rules: pure functions from draft tokens and target scores to a verdict.

greedy (accept while the draft is the target's argmax), lossless speculative sampling and the coupled
(Gumbel) sampler, and the opt-in lossy relaxed rules. numpy only: no torch, grpc or I/O.
"""
