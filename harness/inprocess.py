"""Engines as the round loop's ports, in one process: no wire, no services.

For tests and for tools that run edgespec's own round loop against models loaded
in process (edgespec bench drafters' references).
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from edgespec.engines.drafter import DrafterEngine
from edgespec.engines.verifier import VerifierEngine
from edgespec.verify.greedy import Verdict
from edgespec.verify.window import Window


class InProcessDrafter:
    def __init__(self, engine: DrafterEngine, q_ids: int = 0):
        self.engine = engine
        self.q_ids = q_ids

    async def info(self) -> SimpleNamespace:
        """What the engine's Info says through the drafter service: its largest window and capabilities."""
        return SimpleNamespace(max_window=self.engine.limits.max_window, capabilities=self.engine.capabilities())

    async def open(self, session_id, tokens, params=None):
        self.engine.open(session_id, tokens, *([params, self.q_ids] if params else []))

    async def draft(self, session_id, base_position, append, k):
        proposal = self.engine.draft(session_id, base_position, append, k)
        return proposal.tokens, proposal.q

    async def draft_tree(self, session_id, base_position, append, k, depth):
        proposal = self.engine.draft(session_id, base_position, append, k, depth)
        return proposal.tokens, proposal.q, proposal.parents or list(range(-1, len(proposal.tokens) - 1))

    async def close(self, session_id):
        self.engine.close(session_id)

    def observe(self, draft, sample):
        pass   # the engine learns nothing from verdicts


class InProcessVerifier:
    """A verifier engine as the round loop's port (and as a failover endpoint)."""

    def __init__(self, engine: VerifierEngine, address: str = "in-process"):
        self.engine = engine
        self.address = address

    async def info(self) -> SimpleNamespace:
        """What the engine's Info says through the verifier service: its vocabulary, EOS ids and capabilities."""
        return SimpleNamespace(model=self.address, vocab_size=self.engine.target.vocab_size,
                               eos_token_ids=sorted(self.engine.eos_ids), capabilities=self.engine.capabilities())

    async def open(self, session_id, tokens, params=None):
        self.engine.open(session_id, tokens, *([params] if params else []))

    async def verify(self, session_id, window: Window) -> Verdict | None:
        await asyncio.sleep(0)   # a real port yields to the event loop; pipelining relies on it
        result = self.engine.verify(session_id, window.base_position, window.draft, window.q,
                                    window.params_fingerprint, window.parent, window.parents, window.self_draft)
        # what the gRPC verifier reports with a verdict: its compute time, and where it came from
        return None if result.verdict is None else replace(
            result.verdict, verify_compute_seconds=result.verify_compute_seconds, verifier=self.address)

    async def close(self, session_id):
        self.engine.close(session_id)

    async def discard(self, session_id):
        self.engine.close(session_id)

    def forget(self, session_id):
        pass
