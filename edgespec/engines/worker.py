"""One model worker thread per service: forwards run one at a time, off the event loop."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class ModelWorker:
    """Runs blocking model calls on a single thread, in arrival order.

    ``queue_depth`` counts calls submitted but not yet started, which the
    verifier reports in every verdict.
    """

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._waiting = 0

    @property
    def queue_depth(self) -> int:
        return self._waiting

    async def call(self, fn: Callable[..., T], *args) -> tuple[T, int]:
        """Run fn(*args) on the worker; returns (result, queue depth when it started)."""
        self._waiting += 1
        depth_at_start = [0]

        def job() -> T:
            self._waiting -= 1
            depth_at_start[0] = self._waiting
            return fn(*args)

        result = await asyncio.get_running_loop().run_in_executor(self._pool, job)
        return result, depth_at_start[0]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
