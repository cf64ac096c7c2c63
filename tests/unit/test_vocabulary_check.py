"""The coordinator's startup check that its drafters draft in the verifier's token ids
(services/coordinator/readiness.py): what counts as a mismatch, and that it waits for peers that are not up."""
from __future__ import annotations

import asyncio
import logging

from edgespec.v1 import drafter_pb2, verifier_pb2
from services.coordinator import readiness
from services.coordinator.readiness import check_vocabularies, vocabulary_mismatch

QWEN = verifier_pb2.InfoResponse(model="Qwen2.5-7B", vocab_size=152064, eos_token_ids=[151643, 151645])


def draft(model="Qwen2.5-0.5B", vocab_size=151936, eos=(151643, 151645)):
    return drafter_pb2.DrafterInfoResponse(model=model, vocab_size=vocab_size, eos_token_ids=list(eos))


def test_a_draft_of_the_targets_family_passes_even_with_a_smaller_padded_vocabulary():
    assert vocabulary_mismatch(QWEN, draft()) == []
    assert vocabulary_mismatch(QWEN, draft(eos=[151643])) == []           # a base model's EOS, one in common
    assert vocabulary_mismatch(QWEN, draft(model="ngram:1-3", eos=[])) == []   # no EOS ids: nothing to compare


def test_another_tokenizer_is_named_with_the_fix():
    smollm = draft(model="SmolLM2-135M", vocab_size=49152, eos=[2])
    problems = vocabulary_mismatch(QWEN, smollm, "small")
    assert len(problems) == 2 and "drafter small (SmolLM2-135M)" in problems[0] and "[2]" in problems[0]
    assert "--cross-tokenizer" in problems[-1]
    bigger = vocabulary_mismatch(verifier_pb2.InfoResponse(model="tiny", vocab_size=320, eos_token_ids=[256]),
                                 draft(model="ngram:1-3", eos=[]))
    assert "151936" in bigger[0] and "320" in bigger[0] and "--cross-tokenizer" in bigger[-1]


class FakeVerifier:
    def __init__(self, info, failures: int):
        self.address, self.info_, self.failures, self.calls = "v:1", info, failures, 0

    async def info(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("not up yet")
        return self.info_


class FakeDrafter:
    """The drafter client's surface the check uses: its Info."""

    def __init__(self, info, failures: int = 0):
        self.info_, self.failures, self.calls = info, failures, 0

    async def info(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("not up yet")
        return self.info_


def test_the_check_waits_for_peers_and_logs_each_drafter_once(monkeypatch, caplog):
    monkeypatch.setattr(readiness, "VOCAB_CHECK_RETRY_SECONDS", (0.001, 0.004))
    verifier = FakeVerifier(QWEN, failures=2)
    good, bad = FakeDrafter(draft(), failures=3), FakeDrafter(draft(model="SmolLM2", vocab_size=49152, eos=[2]))
    with caplog.at_level(logging.INFO, logger="edgespec.coordinator"):
        seen = {}
        problems = asyncio.run(asyncio.wait_for(check_vocabularies({"v:1": verifier}, {"good": good, "bad": bad},
                                                                   seen.__setitem__), 5))
    assert verifier.calls == 3 and good.calls == 4 and bad.calls == 1
    assert seen == {"good": good.info_, "bad": bad.info_}   # each drafter's Info handed on once (its cost)
    assert problems and all("good" not in p for p in problems)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "drafter bad" in errors[0].getMessage()
    assert "--cross-tokenizer" in errors[0].getMessage()
    assert any("drafter good" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
