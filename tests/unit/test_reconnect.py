"""The edge client's reconnect schedule and what it tells the user while it waits (no server needed)."""
import asyncio
import random
import time

import grpc
import pytest

from edge_client import client
from edge_client.cli import WaitNotice
from edge_client.client import RECONNECT_SECONDS, Waiting, reconnect_delay


def test_reconnect_delay_grows_exponentially_is_jittered_and_capped():
    lows = [reconnect_delay(n, rng=lambda: 0.0) for n in range(1, 12)]
    highs = [reconnect_delay(n, rng=lambda: 1.0) for n in range(1, 12)]
    assert lows == sorted(lows) and highs == sorted(highs)            # grows ...
    assert highs[3] >= 4 * highs[1] and lows[0] < 0.5                 # ... exponentially, from well under 1 s
    assert max(highs) <= 8.0 and highs[-1] == highs[-2]               # ... up to a cap
    for n in (1, 4, 10):
        draws = {reconnect_delay(n, rng=random.Random(n * 7 + i).random) for i in range(50)}
        assert len(draws) > 40                                        # jittered: clients spread out
        assert all(lows[n - 1] <= d <= highs[n - 1] for d in draws)
        assert lows[n - 1] >= highs[n - 1] / 2                        # never near zero: no retry storm
    assert RECONNECT_SECONDS < 60                                     # gives up within a minute


def test_the_wait_notice_speaks_once_then_only_occasionally():
    lines = []
    notice = WaitNotice("127.0.0.1:50051", write=lines.append, every_seconds=10)
    error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                 details="no verifier answered Info")
    for waited in (0.0, 0.3, 1.0, 3.0, 7.0, 10.5, 12.0, 21.0, 30.0):
        notice(Waiting(attempt=1, waited_seconds=waited, delay_seconds=1.0, give_up_in_seconds=45 - waited,
                       error=error))
    assert len(lines) == 3                                            # at 0, ~10 and ~21 s
    assert "UNAVAILABLE" in lines[0] and "no verifier answered Info" in lines[0] and "45" in lines[0]
    assert "still" in lines[1]
    notice.recovered()
    assert len(lines) == 4 and "back" in lines[3]


def test_generate_resilient_backs_off_and_gives_up_in_time(monkeypatch):
    """Against a coordinator that always answers UNAVAILABLE at once: tries spread out (not every 0.2 s),
    every wait is reported, and the last error comes out when the window closes."""
    calls, waits = [], []

    async def always_unavailable(*args, **kwargs):
        calls.append(time.monotonic())
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   details="no verifier answered Info")
        yield   # an async generator, like generate()

    monkeypatch.setattr(client, "generate", always_unavailable)

    async def go():
        async for _ in client.generate_resilient("x:1", "hi", 4, reconnect_seconds=3.0, on_wait=waits.append):
            pass
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        asyncio.run(go())
    seconds = time.monotonic() - started
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert 2.9 <= seconds < 4.5
    assert 4 <= len(calls) <= 10                     # 0.2 s polling would be 15
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps[-2] > gaps[0]
    assert len(waits) == len(calls) - 1 and waits[0].attempt == 1 and waits[-1].give_up_in_seconds < 3.0


def test_the_coordinator_logs_a_repeated_failure_once_per_interval(caplog):
    """The other side of a client retrying: the coordinator's warning for it is not repeated every try."""
    import logging

    from edgespec.observe.logs import LogThrottle
    now = [0.0]
    throttle = LogThrottle(30, clock=lambda: now[0])
    logger = logging.getLogger("test.throttle")
    with caplog.at_level(logging.DEBUG, logger="test.throttle"):
        for second in range(0, 65, 1):       # a failure every second for 65 s
            now[0] = second
            throttle.log(logger, logging.WARNING, "unavailable", "session %d failed", second)
        throttle.log(logger, logging.WARNING, "other", "another problem")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["session 0 failed", "session 30 failed (29 more like it in the last 30s)",
                        "session 60 failed (29 more like it in the last 30s)", "another problem"]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 62    # the rest, for --log-level debug
