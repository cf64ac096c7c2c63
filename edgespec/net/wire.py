"""Protobuf <-> core conversions shared by the servicers and the coordinator's clients.

Protobuf types stop here: everything past this module sees core dataclasses.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Iterable, Sequence

from edgespec.control.capabilities import Capabilities
from edgespec.verify.logprobs import TokenLogprob
from edgespec.verify.sampling import RELAXED_METHODS, Relaxation, SamplingParams, SparseDist
from edgespec.verify.sampling import float32_decimal as meant
from edgespec.verify.window import Window
from edgespec.v1 import common_pb2, verifier_pb2


def params_from_pb(msg: common_pb2.SamplingParams, default_seed: int = 0) -> SamplingParams:
    """top_p 0 (unset) means 1.0 (a negative one is kept, for check_params to refuse); an absent seed
    takes ``default_seed``. Float fields are read as the decimals they were set from
    (``meant``: edgespec.verify.sampling.float32_decimal)."""
    return SamplingParams(temperature=meant(msg.temperature), top_k=int(msg.top_k),
                          top_p=meant(msg.top_p) if msg.top_p != 0 else 1.0,
                          seed=int(msg.seed) if msg.HasField("seed") else default_seed,
                          relaxation=relaxation_from_pb(msg.relaxation), coupled=bool(msg.coupled),
                          ignore_eos=bool(msg.ignore_eos), min_length=int(msg.min_length),
                          logprobs=int(msg.logprobs) if msg.HasField("logprobs") else None)


def params_to_pb(params: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                     seed=params.seed, relaxation=relaxation_to_pb(params.relaxation),
                                     coupled=params.coupled, ignore_eos=params.ignore_eos,
                                     min_length=params.min_length, logprobs=params.logprobs)


def relaxation_from_pb(msg: common_pb2.Relaxation) -> Relaxation:
    """An unknown method number becomes a name check_params rejects with a clear message."""
    number = int(msg.method)
    method = RELAXED_METHODS[number] if 0 <= number < len(RELAXED_METHODS) else f"method #{number}"
    return Relaxation(method=method, weight=meant(msg.weight), learned=bool(msg.learned),
                      margin=meant(msg.margin), task=msg.task)


def relaxation_to_pb(relax: Relaxation) -> common_pb2.Relaxation:
    return common_pb2.Relaxation(method=RELAXED_METHODS.index(relax.method), weight=relax.weight,
                                 learned=relax.learned, margin=relax.margin, task=relax.task)


def logprobs_to_pb(entries: Sequence[TokenLogprob]) -> list[common_pb2.TokenLogprob]:
    return [common_pb2.TokenLogprob(token=e.token, logprob=e.logprob, top_ids=[t for t, _ in e.top],
                                    top_logprobs=[lp for _, lp in e.top]) for e in entries]


def logprobs_from_pb(msgs: Iterable[common_pb2.TokenLogprob]) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(m.token, m.logprob, tuple(zip(m.top_ids, m.top_logprobs))) for m in msgs)


def dists_from_pb(msgs: Iterable[common_pb2.SparseDistribution]) -> list[SparseDist]:
    return [SparseDist(tuple(m.ids), tuple(m.weights)) for m in msgs]


def dists_to_pb(dists: Sequence[SparseDist] | None) -> list[common_pb2.SparseDistribution]:
    return [common_pb2.SparseDistribution(ids=d.ids, weights=d.weights) for d in dists or ()]


def window_to_pb(session_id: str, window: Window) -> verifier_pb2.Window:
    return verifier_pb2.Window(
        session_id=session_id, window_seq=window.seq, base_position=window.base_position,
        draft_tokens=window.draft, params_fingerprint=window.params_fingerprint, draft_probs=dists_to_pb(window.q),
        optimistic=window.parent is not None, parent_token=window.parent or 0, draft_parents=window.parents,
        self_draft=window.self_draft, steps=window.steps)


def window_from_pb(msg: verifier_pb2.Window) -> Window:
    return Window(msg.window_seq, msg.base_position, tuple(msg.draft_tokens), tuple(dists_from_pb(msg.draft_probs)),
                  msg.params_fingerprint, msg.parent_token if msg.optimistic else None, tuple(msg.draft_parents),
                  msg.self_draft, msg.steps)


def capabilities_to_pb(capabilities: Capabilities) -> common_pb2.Capabilities:
    return common_pb2.Capabilities(**{f.name: getattr(capabilities, f.name) for f in fields(capabilities)})
