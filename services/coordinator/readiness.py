"""The coordinator's own gRPC health follows its verifiers.

A coordinator without a serving verifier can only answer UNAVAILABLE (with the
default --on-verifier-loss fail), so it says NOT_SERVING — for its Coordinator
service and for "" — while no verifier of its pool is SERVING (per the health
watch it keeps on each), and SERVING again as soon as one is. Load balancers and
readiness probes then stop sending it work it cannot do. With --on-verifier-loss
draft-only it still serves (flagged unverified text), so it stays SERVING.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Sequence

from grpc_health.v1 import health_pb2

from edgespec.loop.pool import VerifierPool

log = logging.getLogger("edgespec.coordinator")

REASSERT_SECONDS = 1.0   # the status is set again this often (a repeated set changes nothing for watchers)


async def follow_verifier_health(health, names: Sequence[str], pool: VerifierPool, changed: asyncio.Event) -> None:
    """Keep ``health`` (the server's asyncio health servicer) NOT_SERVING for ``names`` while no verifier in
    ``pool`` is serving, SERVING otherwise. Wakes on ``changed`` (set on every health-watch report) and at
    least every REASSERT_SECONDS, so the status also holds over the server's own start (which sets every
    name SERVING). Runs until cancelled."""
    last: bool | None = None
    while True:
        changed.clear()
        serving = any(endpoint.serving for endpoint in pool.endpoints.values())
        if serving != last and last is not None:
            if serving:
                log.info("a verifier is serving again: coordinator health SERVING")
            else:
                log.warning("no verifier is serving (%s): coordinator health NOT_SERVING until one is",
                            ", ".join(pool.endpoints))
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in names:
            await health.set(name, status)    # the asyncio servicer: a coroutine; ignored once shutting down
        last = serving
        try:
            await asyncio.wait_for(changed.wait(), REASSERT_SECONDS)
        except asyncio.TimeoutError:
            pass


# ---- Do the drafters speak the verifier's tokens? ------------------------------------------------------------------

VOCAB_CHECK_RETRY_SECONDS = (1.0, 5.0)    # first and largest wait between Info attempts (doubling)


def vocabulary_mismatch(verifier, drafter, drafter_name: str = "draft") -> list[str]:
    """What says that a drafter (its Info) drafts in another token space than the verifier (its Info): [] when
    nothing does. Token ids are compared, not names: a draft model is usually another model of the target's
    family. A smaller draft vocabulary alone is no sign (models of one family pad their embedding tables to
    different sizes: Qwen2.5-7B 152064, Qwen2.5-0.5B 151936); a larger one, or no end-of-sequence id in common,
    is."""
    problems = []
    who = f"drafter {drafter_name} ({drafter.model or '?'})"
    target = f"verifier ({verifier.model or '?'})"
    if drafter.vocab_size > verifier.vocab_size:
        problems.append(f"{who} has a vocabulary of {drafter.vocab_size} ids but {target} accepts only "
                        f"{verifier.vocab_size}")
    draft_eos, target_eos = set(drafter.eos_token_ids), set(verifier.eos_token_ids)
    if draft_eos and target_eos and not draft_eos & target_eos:
        problems.append(f"{who} ends sequences with ids {sorted(draft_eos)}, {target} with {sorted(target_eos)}")
    if problems:
        problems.append("they do not share a tokenizer, so its drafts are mostly rejected (or refused as "
                        "INVALID_ARGUMENT): serve a draft model of the target's family, or run the drafter with "
                        "--cross-tokenizer TARGET_TOKENIZER (the verifier's model or 'target'), which drafts in the "
                        "target's ids through text")
    return problems


async def check_vocabularies(verifiers: dict, drafters: dict,
                             on_drafter_info: Callable[[str, object], None] | None = None,
                             on_verifier_info: Callable[[object], None] | None = None) -> list[str]:
    """Once a verifier and each drafter answer Info, log an error for every drafter whose token space is not
    the verifier's (vocabulary_mismatch), hand the verifier's Info to ``on_verifier_info`` (where it runs) and
    each drafter's to ``on_drafter_info`` (name, Info): its measured cost and where it runs. Peers that are not up yet are asked again, backing off; runs until every drafter has answered
    (or it is cancelled). Returns the problems found."""

    wait, found = VOCAB_CHECK_RETRY_SECONDS[0], []
    verifier_info = None
    pending = dict(drafters)
    while pending:
        if verifier_info is None:
            for endpoint in verifiers.values():
                try:
                    verifier_info = await endpoint.info()
                    if on_verifier_info is not None:
                        on_verifier_info(verifier_info)
                    break
                except Exception as error:    # down or refusing: ask again later
                    log.debug("vocabulary check: verifier %s: %s", endpoint.address, error)
        if verifier_info is not None:
            for name, drafter in list(pending.items()):
                try:
                    info = await drafter.info()
                except Exception as error:
                    log.debug("vocabulary check: drafter %s: %s", name, error)
                    continue
                del pending[name]
                if on_drafter_info is not None:
                    on_drafter_info(name, info)
                problems = vocabulary_mismatch(verifier_info, info, name)
                if problems:
                    log.error("drafter %s does not draft in the verifier's tokens: %s", name, "; ".join(problems))
                    found += problems
                else:
                    log.info("drafter %s (%s, %d ids) drafts in the tokens of the verifier (%s, %d ids)", name,
                             info.model, info.vocab_size, verifier_info.model, verifier_info.vocab_size)
        if pending:
            await asyncio.sleep(wait)
            wait = min(2 * wait, VOCAB_CHECK_RETRY_SECONDS[1])
    return found
