"""One generation over the coordinator's public gRPC API, as tests read it: its plan, tokens and final stats."""
from __future__ import annotations

import asyncio

from edge_client.client import generate


def planned(address: str, prompt: str, max_new_tokens: int, window: int, **options) -> tuple[object, list[int], object]:
    """(the plan, token ids streamed, the stats) of one Generate call, checking the order of its events: the plan
    first, the chunks, the stats last. ``options`` go to edge_client's generate (chat, timeout_seconds,
    temperature, seed, ...)."""
    async def go():
        kinds, tokens, plan, stats = [], [], None, None
        async for event in generate(address, prompt, max_new_tokens, window, **options):
            kinds.append(event.WhichOneof("event"))
            if event.HasField("chunk"):
                tokens.extend(event.chunk.token_ids)
            elif event.HasField("plan"):
                plan = event.plan
            else:
                stats = event.stats
        assert kinds[0] == "plan" and kinds[-1] == "stats" and kinds.count("plan") == kinds.count("stats") == 1, kinds
        return plan, tokens, stats
    return asyncio.run(go())


def generated(address: str, prompt: str, max_new_tokens: int, window: int, **options) -> tuple[list[int], object]:
    """(token ids streamed, the stats) of one Generate call (planned's)."""
    return planned(address, prompt, max_new_tokens, window, **options)[1:]
