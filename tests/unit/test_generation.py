"""The coordinator's generation as a library: no gRPC, in-process engines as its ports."""
import random

from edgespec.net.wire import params_from_pb, params_to_pb
from edgespec.verify.sampling import Relaxation, SamplingParams, as_float32, float32_decimal


def test_as_float32_is_what_a_peer_reads_from_the_wire():
    """The coordinator normalises its own params in core types exactly as a protobuf round trip would."""
    rng = random.Random(5)
    for _ in range(200):
        relax = rng.choice([Relaxation(), Relaxation("diversed", weight=round(rng.uniform(0, 0.95), rng.randint(1, 9))),
                            Relaxation("diversed", weight=rng.uniform(0, 0.95), task="code"),
                            Relaxation("cospec", margin=rng.uniform(0, 20))])
        params = SamplingParams(temperature=rng.choice([0.0, 0.8, rng.uniform(0, 3)]), top_k=rng.randint(0, 50),
                                top_p=rng.choice([1.0, 0.9, rng.uniform(0.01, 1)]), seed=rng.getrandbits(63),
                                relaxation=relax, coupled=rng.random() < 0.2)
        assert as_float32(params) == params_from_pb(params_to_pb(params))
        assert as_float32(as_float32(params)) == as_float32(params)
        assert as_float32(params).fingerprint() == params_from_pb(params_to_pb(params)).fingerprint()
    assert float32_decimal(0.8) == 0.8 and float32_decimal(0.123456789) == 0.12345679
