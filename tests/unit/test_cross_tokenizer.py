"""Cross-tokenizer drafting: a draft with its own tokenizer proposes target tokens through text.

Fast tests build two tokenizers in-process: the tiny models' byte tokenizer as a
Hugging Face tokenizer (ids are UTF-8 bytes, <|eos|> = 256 = TINY_EOS) and byte-level
BPEs trained on a few strings. Scripted fakes make a perfect draft in another
tokenizer, so the text <-> token conversion is checked exactly; the random tiny
models check that the output stays the target's whatever the draft says.
"""
import asyncio
import functools

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, trainers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast


from edgespec.backends.incremental import IncrementalLM
from edgespec.backends.cross_tokenizer import FREEZE_CHARS, NOT_PROPOSED, CrossTokenizerDrafter, HFCodec
from edgespec.backends.registry import TINY_EOS, TINY_VOCAB, tiny_config
from edgespec.backends.torch_lm import TorchCausalLM
from edgespec.engines.drafter import DrafterEngine
from edgespec.verify.sampling import SamplingParams
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny

CORPUS = ["def hello():\n    return 'world'\n", "The capital of France is Paris.",
          "for i in range(10):\n    print(i)\n",
          "Speculative decoding drafts with a small model and verifies with a large one."]
SCRIPT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
          "The capital of France is Paris. Café naïve — 東京 😀🤖 done!!   spaces\t\ttabs")
PROMPTS = ["def hello():", "The capital of France is", "café 東京 ", "x"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by ByteLevel pre-tokenizers."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {b: chr(c) for b, c in zip(keep + extra, keep + [256 + i for i in range(len(extra))])}


@functools.lru_cache(maxsize=None)
def byte_codec() -> HFCodec:
    """The tiny models' tokenizer as a Hugging Face one: id b is byte b, <|eos|> is 256."""
    tok = Tokenizer(models.BPE({char: b for b, char in _bytes_to_unicode().items()}, []))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|eos|>"])
    return HFCodec(PreTrainedTokenizerFast(tokenizer_object=tok))


@functools.lru_cache(maxsize=None)
def bpe_codec(vocab_size: int, corpus: tuple[str, ...] = tuple(CORPUS)) -> HFCodec:
    """A byte-level BPE trained on ``corpus``: <|eos|> is 0, then the 256 byte symbols, then merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(corpus) * 3, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|eos|>"], initial_alphabet=ByteLevel.alphabet(), show_progress=False))
    return HFCodec(PreTrainedTokenizerFast(tokenizer_object=tok))


def draft_codec() -> HFCodec:
    return bpe_codec(330)


def target_bpe_codec() -> HFCodec:
    return bpe_codec(420, tuple(CORPUS[::-1] + [SCRIPT[:60]]))


@functools.lru_cache(maxsize=None)
def tiny_draft(seed: int) -> TorchCausalLM:
    """A random tiny model over draft_codec()'s vocabulary (EOS 0)."""
    config = tiny_config()
    config.vocab_size, config.eos_token_id = len(draft_codec()), 0
    return TorchCausalLM.from_config(config, seed=seed, name=f"tiny-bpe:{seed}")


def cross(lm, draft=None, target=None, vocab_size=TINY_VOCAB, eos=(0,)) -> CrossTokenizerDrafter:
    return CrossTokenizerDrafter(lm, draft or draft_codec(), target or byte_codec(), vocab_size, eos)


class ScriptTarget(IncrementalLM):
    """A target whose greedy choice writes ``script`` (then EOS): the verifier's model."""

    def __init__(self, script: list[int], vocab_size: int, eos: int):
        self.script, self.vocab_size, self.eos = script, vocab_size, eos

    def new_state(self):
        return None

    def prefill(self, state, tokens):
        pass

    def crop(self, state, length):
        pass

    def cached_length(self, state):
        return 0

    def logits_rows(self, state, seq, last):
        rows = np.full((last, self.vocab_size), NOT_PROPOSED, dtype=np.float32)
        for row, end in enumerate(range(len(seq) - last + 1, len(seq) + 1)):
            on_script = end < len(self.script) and list(seq[:end]) == self.script[:end]
            rows[row, self.script[end] if on_script else self.eos] = 0.0
        return rows


class TextOracle:
    """A draft LM that writes ``text`` in its own tokens: a perfect draft with another tokenizer.

    From the longest clean prefix of what it was given that ``text`` starts with, it
    continues the canonical encoding of the rest (so it also finishes a character
    whose first bytes it was given)."""

    def __init__(self, codec: HFCodec, text: str, eos: int = 0):
        self.codec, self.text, self.eos = codec, text, eos
        self.calls = 0

    def new_state(self):
        return None

    def prefill(self, state, tokens):
        pass

    def next_tokens(self, state, seq, last):
        self.calls += 1
        for clean in range(len(seq), -1, -1):
            head = self.codec.decode(seq[:clean])
            if head.endswith("\ufffd") or not self.text.startswith(head):
                continue
            rest = self.codec.encode(self.text[len(head):])
            if rest[:len(seq) - clean] == list(seq[clean:]):
                return [rest[len(seq) - clean] if len(rest) > len(seq) - clean else self.eos]
        return [self.eos]


def run_speculation(verifier: VerifierEngine, drafter: DrafterEngine, prompt: list[int], max_new: int, policy,
                    eos: list[int], params: SamplingParams = SamplingParams()) -> SessionLog:
    log = SessionLog(prompt, max_new, frozenset(eos))

    async def go():
        verifier.open("s", prompt, params)
        drafter.open("s", prompt, params)
        telemetry = policy.telemetry if isinstance(policy, GoodputWindow) else None   # the policy reads it
        async for _ in speculate(log, "s", InProcessDrafter(drafter), InProcessVerifier(verifier), policy, params,
                                 telemetry=telemetry):
            pass

    asyncio.run(go())
    return log


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("window", [1, 3, -1], ids=["k1", "k3", "goodput"])
def test_greedy_output_identical_to_target_only(seed, window):
    target = f"tiny:{seed}"
    drafter = DrafterEngine(cross(tiny_draft(seed + 10)))
    for prompt in PROMPTS:
        ids = list(prompt.encode())
        log = run_speculation(VerifierEngine(tiny(target), [TINY_EOS]), drafter, ids, 40,
                              GoodputWindow(Telemetry(), max_k=4) if window < 0 else FixedWindow(window), [TINY_EOS])
        assert log.generated == target_only_greedy(target, ids, 40), (seed, window, prompt)
        drafter.close("s")


@pytest.fixture(params=["tiny-bpe", "qwen-smollm2"])
def codecs(request) -> tuple[HFCodec, HFCodec, int, int]:
    """(target codec, draft codec, target EOS id, draft EOS id): both EOS are <|eos|> / <|im_end|>."""
    if request.param == "tiny-bpe":
        return target_bpe_codec(), draft_codec(), 0, 0
    return (*real_codecs(), QWEN_IM_END, SMOLLM2_IM_END)


QWEN_IM_END, SMOLLM2_IM_END = 151645, 2


def real_codecs() -> tuple[HFCodec, HFCodec]:
    """The Qwen tokenizer (target) and SmolLM2's (draft), read from their packaged GGUF files (tokenizers only:
    no model is converted; the packages are installed by scripts/install.sh)."""
    from transformers import AutoTokenizer

    from edgespec.backends.convert import ensure_tokenizer_dir
    return tuple(HFCodec(AutoTokenizer.from_pretrained(str(ensure_tokenizer_dir(which)))) for which in ("draft", "smollm2"))


def test_perfect_draft_proposes_the_targets_tokens_at_every_split(codecs):
    """Every split of the script: mid-word, mid-indent, inside a multi-byte character."""
    target, draft, _, draft_eos = codecs
    script = target.encode(SCRIPT)
    assert len(script) > 40
    for m in range(1, len(script)):
        for k in (1, 2, 5):
            drafter = cross(TextOracle(draft, SCRIPT, draft_eos), draft, target, len(target), (draft_eos,))
            proposal = drafter.greedy_draft(drafter.new_state(), script[:m], k)
            assert len(proposal) == k
            want = script[m:m + k]
            assert proposal[:len(want)] == want, (m, k, target.decode(script[:m])[-12:])


@pytest.mark.parametrize("window", [2, 4])
def test_perfect_draft_is_accepted_and_output_is_the_targets(codecs, window):
    target, draft, eos, draft_eos = codecs
    script = target.encode(SCRIPT) + [eos]
    verifier = VerifierEngine(ScriptTarget(script, len(target), eos), [eos])
    drafter = DrafterEngine(cross(TextOracle(draft, SCRIPT, draft_eos), draft, target, len(target), (draft_eos,)))
    log = run_speculation(verifier, drafter, script[:3], len(script), FixedWindow(window), [eos])
    assert log.generated == script[3:]
    # Every token is accepted but in the last window (a drafted EOS is the verifier's next token).
    assert log.stats.drafted - log.stats.accepted <= window and log.stats.rounds <= len(script) // window + 2


def test_sampling_session_drafts_one_hot_and_output_is_the_targets(codecs):
    """The deterministic path (q_ids = 0): the verifier accepts x with probability p(x)."""
    target, draft, eos, draft_eos = codecs
    script = target.encode(SCRIPT) + [eos]
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7)
    verifier = VerifierEngine(ScriptTarget(script, len(target), eos), [eos])
    oracle = TextOracle(draft, SCRIPT, draft_eos)
    drafter = DrafterEngine(cross(oracle, draft, target, len(target), (draft_eos,)))
    log = run_speculation(verifier, drafter, script[:3], len(script), FixedWindow(4), [eos], params)
    assert log.generated == script[3:]   # p is one-hot on the script, so sampling is greedy here
    assert log.stats.drafted - log.stats.accepted <= 4
    # One draft per window, reused for the positions that follow: not one per target token.
    assert oracle.calls < 2 * len(script)


def test_logits_rows_are_one_hot_on_the_greedy_proposal():
    drafter = cross(tiny_draft(1))
    committed = list(b"def hello():")
    rows = drafter.logits_rows(drafter.new_state(), committed + [32, 32], 3)
    assert rows.shape == (3, TINY_VOCAB) and rows.dtype == np.float32
    assert set(np.unique(rows).tolist()) == {NOT_PROPOSED, 0.0}
    assert rows.argmax(axis=1).tolist()[0] == drafter.greedy_draft(drafter.new_state(), committed, 1)[0]
    engine = DrafterEngine(drafter)
    engine.open("s", committed, SamplingParams(temperature=0.7, seed=1))
    proposal = engine.draft("s", len(committed), [], 4)
    assert proposal.q is None and proposal.tokens == drafter.greedy_draft(drafter.new_state(), committed, 4)


@pytest.mark.parametrize("k", [1, 2, 5, 16])
def test_always_exactly_k_valid_tokens(k):
    rng = np.random.default_rng(k)
    drafter = cross(tiny_draft(2))
    state = drafter.new_state()
    for _ in range(15):
        committed = rng.integers(0, TINY_VOCAB, size=int(rng.integers(1, 30))).tolist()   # any ids, any bytes
        proposal = drafter.greedy_draft(state, committed, k)
        assert len(proposal) == k and all(0 <= t < TINY_VOCAB for t in proposal)


def test_rollback_equals_a_fresh_drafter():
    rng = np.random.default_rng(3)
    drafter = cross(tiny_draft(3))
    state = drafter.new_state()
    committed = list("naïve café: ".encode())
    for _ in range(30):
        proposal = drafter.greedy_draft(state, committed, 4)
        assert proposal == drafter.greedy_draft(drafter.new_state(), committed, 4)
        if rng.random() < 0.3:
            committed = committed[:int(rng.integers(1, len(committed) + 1))]      # rollback
        else:
            committed = committed + proposal[:int(rng.integers(0, 5))] + [int(rng.integers(32, 127))]


class Scripted:
    """A draft LM that emits a fixed list of draft tokens, then repeats the last."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.base = None

    def new_state(self):
        return None

    def prefill(self, state, tokens):
        pass

    def next_tokens(self, state, seq, last):
        self.base = len(seq) if self.base is None else self.base
        return [self.tokens[min(len(seq) - self.base, len(self.tokens) - 1)]]


def test_draft_eos_at_once_proposes_the_targets_eos_then_pads_without_eos():
    drafter = cross(Scripted([0]))
    assert drafter.greedy_draft(drafter.new_state(), list(b"abc"), 4) == [TINY_EOS, *b"ccc"]


def test_draft_eos_the_target_cannot_spell_pads_with_the_last_committed_token():
    word = next(t for t in range(len(draft_codec())) if len(draft_codec().decode([t]).encode()) == 3)
    drafter = cross(Scripted([word]), eos=(word,))
    assert drafter.eos_map == {word: None}
    assert drafter.greedy_draft(drafter.new_state(), list(b"abc"), 4) == list(b"cccc")


def test_draft_eos_becomes_the_targets_eos_then_padding_without_eos():
    draft = draft_codec()
    drafter = cross(Scripted(draft.encode(" ok") + [0]))
    # The byte target knows <|eos|> too: the draft's EOS is proposed as TINY_EOS, never repeated.
    assert drafter.greedy_draft(drafter.new_state(), list(b"say"), 6) == [*b" ok", TINY_EOS, *b"kk"]


def test_committed_text_that_decodes_to_nothing_still_gives_k_tokens():
    drafter = cross(tiny_draft(4))
    assert drafter.greedy_draft(drafter.new_state(), [300, 301], 3) == [301, 301, 301]   # ids past the bytes


def test_draft_tokens_without_text_run_out_of_budget_and_pad():
    drafter = cross(Scripted([len(draft_codec()) + 5]))   # an id the draft tokenizer cannot decode
    assert drafter.greedy_draft(drafter.new_state(), list(b"xy"), 3) == list(b"yyy")


def test_incomplete_character_in_the_draft_waits_for_its_last_byte():
    draft = draft_codec()
    pieces = draft.encode(" 東京")
    assert len(pieces) > 2   # byte tokens: the first ones decode to U+FFFD
    drafter = cross(Scripted(pieces + [0]))
    assert drafter.greedy_draft(drafter.new_state(), list(b"at"), 8) == [*" 東京".encode(), TINY_EOS]


def test_committed_tokens_ending_inside_a_character_are_completed():
    text = "café 東京 done"
    drafter = cross(TextOracle(draft_codec(), text))
    utf8 = list(text.encode())
    split = text.encode().index("東".encode()) + 1   # one byte of 東 committed
    assert drafter.greedy_draft(drafter.new_state(), utf8[:split], 4) == utf8[split:split + 4]


def test_long_text_freezes_a_prefix_that_keeps_its_draft_ids():
    draft = draft_codec()
    drafter = cross(Scripted([0]))
    state = drafter.new_state()
    text = ""
    previous: list[int] = []
    while len(text) < 6 * FREEZE_CHARS:
        text += CORPUS[len(text) % len(CORPUS)]
        ids = drafter._draft_ids(state, text)
        assert draft.decode(ids) == text
        frozen = len(state.frozen_ids)
        assert ids[:frozen] == previous[:frozen] or not previous
        previous = ids
    assert len(state.frozen_text) > 3 * FREEZE_CHARS   # the re-encoded tail stays short
    assert drafter._draft_ids(state, text[:100]) == draft.encode(text[:100])   # rollback past the frozen text


def test_service_flag_wraps_the_draft():
    from services.drafter.__main__ import parse_args

    config = parse_args(["--model", "smollm2", "--cross-tokenizer", "target"])
    assert config.cross_tokenizer == "target" and config.service.model == "smollm2"
    assert parse_args([]).cross_tokenizer is None
    with pytest.raises(SystemExit):
        parse_args(["--backend", "ngram", "--cross-tokenizer", "target"])


@pytest.mark.real_models
def test_smollm2_drafts_for_qwen_and_output_is_the_targets():
    """SmolLM2-135M (vocab 49152) drafting for Qwen2.5-Coder-0.5B as a stand-in target."""
    from edgespec.backends.registry import eos_ids, load_lm
    from edgespec.backends.tokenizer import load_tokenizer
    from services.drafter.__main__ import load_model, parse_args

    target = load_lm("draft")
    drafter = load_model(parse_args(["--model", "smollm2", "--cross-tokenizer", "draft", "--quantize", "none"]))
    assert drafter.vocab_size == target.vocab_size == 151936
    assert isinstance(drafter, CrossTokenizerDrafter) and drafter.eos_map == {2: QWEN_IM_END}
    tokenizer, eos = load_tokenizer("draft"), eos_ids(target)
    engine = DrafterEngine(drafter)
    prompts = [("def is_prime(n):\n", False), ("What is the capital of France? Answer in one sentence.", True)]
    for prompt, chat in prompts:
        ids = tokenizer.encode(prompt, chat)
        out = target.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos[0])
        reference = out[0, len(ids):].tolist()
        log = run_speculation(VerifierEngine(target, eos), engine, ids, 24, FixedWindow(3), eos)
        engine.close("s")
        assert log.generated == reference, (prompt, tokenizer.decode(log.generated), tokenizer.decode(reference))
        assert log.stats.acceptance_rate > 0.2, (prompt, log.stats.acceptance_rate)
