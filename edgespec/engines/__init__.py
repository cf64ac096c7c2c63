"""Engines: the model side of the verifier and the drafter, without the wire.

Per-session state over a model backend (committed tokens, KV caches, idempotent windows, idle eviction),
the verifier's cross-session batching scheduler, the model worker thread, and input limits.
"""
