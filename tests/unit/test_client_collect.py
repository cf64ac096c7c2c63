"""edge_client.collect's record of one generation: its times, derived from when its chunks came."""
import math

from edge_client.client import Generated


def test_a_generation_read_whole_derives_its_times_from_its_chunks():
    run = Generated([1, 2, 3, 4, 5], None, started=10.0, first=10.5, last=12.5, first_tokens=1)
    assert (run.ttft, run.seconds, run.decode_tps) == (0.5, 2.5, 2.0)   # 4 tokens in the 2 s after the first
    nothing = Generated([], None, started=10.0)
    assert all(math.isnan(v) for v in (nothing.ttft, nothing.seconds, nothing.decode_tps))
    one_chunk = Generated([1, 2], None, started=10.0, first=10.5, last=10.5, first_tokens=2)
    assert math.isnan(one_chunk.decode_tps) and one_chunk.ttft == 0.5
