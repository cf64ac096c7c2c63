"""One generation over the coordinator's public gRPC API, as tests read it: the tokens and the final stats."""
from __future__ import annotations

import asyncio

from edge_client.client import generate


def generated(address: str, prompt: str, max_new_tokens: int, window: int, **options) -> tuple[list[int], object]:
    """(token ids streamed, the stats event) of one Generate call; ``options`` go to edge_client's generate
    (chat, timeout_seconds, temperature, seed, ...)."""
    async def go():
        tokens, stats = [], None
        async for event in generate(address, prompt, max_new_tokens, window, **options):
            if event.HasField("chunk"):
                tokens.extend(event.chunk.token_ids)
            else:
                stats = event.stats
        return tokens, stats
    return asyncio.run(go())
