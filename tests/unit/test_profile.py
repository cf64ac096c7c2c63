"""The verifier's start-up profile c(n) measures warm forwards of every window size."""
import time

from edgespec.engines.profile import forward_profile
from tests.tiny import tiny

COLD_SECONDS = 1.0   # what the first forward of each new shape costs here, as a GPU's kernel selection does (a tiny
                     # forward takes milliseconds, and over 0.1 s on a busy 2-CPU machine: half of this is a wide margin)


class FirstShapeIsSlow:
    """A real tiny model whose first forward of each width pays a one-time cost."""

    def __init__(self, lm):
        self.lm, self.seen = lm, set()

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def logits_rows_batch(self, states, seqs, lasts):
        if max(lasts) not in self.seen:
            self.seen.add(max(lasts))
            time.sleep(COLD_SECONDS)
        return self.lm.logits_rows_batch(states, seqs, lasts)


def test_every_window_size_is_timed_warm_as_the_verifier_times_it():
    lm = FirstShapeIsSlow(tiny("tiny:7"))
    curve = forward_profile(lm, 9, 32, 1)    # the verifier's call: one timed forward per size
    assert sorted(curve) == list(range(1, 10))
    assert all(seconds < COLD_SECONDS / 2 for seconds in curve.values()), curve
