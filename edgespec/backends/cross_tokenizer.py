"""A draft model with another tokenizer, drafting in the target's token space.

The drafter and verifier speak target token ids; the draft LM reads and writes
its own. Each draft goes through text:

1. decode the committed target tokens to text (special tokens kept as text: the
   target's chat template is plain text to the draft, or its own special tokens
   where both tokenizers name them alike, e.g. ChatML ``<|im_start|>``);
2. encode that text with the draft tokenizer. Only the text after a frozen
   prefix is re-encoded (a cut at whitespace, frozen once the tail is long and
   the cut agrees with the full encoding), so the draft ids of old text never
   change and the draft KV cache — synced by longest common draft-token prefix,
   see TorchCausalLM.logits — is reused; a rollback is a shorter text;
3. draft greedily in draft tokens until the new text re-encodes into k stable
   target tokens — tokens before the last pre-token (word) of the text, which
   may still grow (" fi" + "b" is " fibonacci" two draft tokens later) — or the
   draft emits EOS, or a budget of draft tokens runs out;
4. re-encode the new text with the target tokenizer *in context*: the committed
   text's last target token may merge with the new text (" hel" + "lo"). Take the
   last r committed tokens (r = 1, 2, 3, further back past tails that start inside
   a character), encode their text + the new text, and if that starts with those r
   tokens, the rest is the continuation. This is the "target.encode(committed_text
   + new_text) starts with the committed tokens" check on a short tail, so its
   cost does not grow with the session. If no r reproduces them (the new text
   merges into the committed tail), encode the new text alone — the target has to
   continue its committed token anyway.

The result is exactly k valid target ids, padded by repeating the last non-EOS
token when the draft stops early. Every guess goes through the verifier, so a
bad conversion costs acceptance, never output: greedy output stays the target's.

Sampling sessions see a deterministic drafter: ``logits_rows`` is one-hot (0 on
the proposal, NOT_PROPOSED elsewhere), so DrafterEngine drafts with q_ids = 0
and the verifier's one-hot-q rule (accept x with probability p(x), else resample
from p without x) keeps the output exactly the target's distribution
(docs/architecture.md §3).

When the committed target tokens end inside a multi-byte character (byte-level
BPE splits rare characters), the draft reads the text before that character and
step 4 re-encodes the character's committed tokens with the new text.

Limitations: meant for byte-level BPE tokenizers (Qwen, GPT-2, Llama 3, SmolLM),
whose decode is concatenation; with SentencePiece the boundary check fails more
often and acceptance drops. Drafting costs one draft forward per draft token plus
the rest of the word after the k-th target token (SmolLM2 for Qwen: 1.3-1.9
forwards per drafted target token). How old text is split into draft tokens
depends on where the prefix froze, so a long session's draft can differ slightly
from a fresh drafter's on the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

NOT_PROPOSED = -1e9    # logit of every token but the proposal: finite, so warp() never meets inf - inf
CONTEXT_TOKENS = 4     # draft tokens decoded before the new ones, so a new token's text is decoded in context
BOUNDARY_TOKENS = 3    # most committed target tokens re-encoded with the new text (step 4)
WORD_BUDGET = 8        # draft tokens allowed per call beyond 2 per target token (finishing the last word)
FREEZE_CHARS = 256     # text kept re-encodable after the frozen prefix, characters
REPLACEMENT = "\ufffd"  # what decode gives for an incomplete UTF-8 character


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


class HFCodec:
    """A transformers tokenizer (or edgespec.backends.tokenizer.HFTokenizer) as plain text <-> ids:
    no BOS added, special tokens kept as text both ways, no space clean-up."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = getattr(tokenizer, "hf", tokenizer)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def last_word_start(self, text: str) -> int | None:
        """Where the last pre-token of ``text`` starts, in characters (None: no pre-tokenizer)."""
        pre = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
        if pre is None:
            return None
        pieces = pre.pre_tokenize_str(text)
        return pieces[-1][1][0] if pieces else 0


class DraftLM(Protocol):
    """What the wrapped model must do (TorchCausalLM and OnnxCausalLM do)."""
    def new_state(self) -> Any: ...
    def prefill(self, state: Any, tokens: Sequence[int]) -> None: ...
    def next_tokens(self, state: Any, seq: Sequence[int], last: int) -> list[int]: ...


@dataclass(slots=True)
class CrossState:
    kv: Any                                                  # the draft LM's state, keyed by draft-token prefix
    frozen_text: str = ""                                    # committed text whose draft ids never change
    frozen_ids: list[int] = field(default_factory=list)      # draft ids of frozen_text
    # Sampling sessions ask one position at a time (logits_rows); these serve them from one draft.
    base: list[int] = field(default_factory=list)            # target tokens the last proposal follows
    proposal: list[int] = field(default_factory=list)        # target tokens converted from the last draft
    stable: int = 0                                          # how many of them further drafting would not change
    anchor: list[int] = field(default_factory=list)          # the prefix the current window started from
    asked: int = 0                                           # positions asked since the anchor, tokens
    window: int = 1                                          # positions the previous window asked, tokens


class CrossTokenizerDrafter:
    """The DraftModel protocol over a draft LM with its own tokenizer; one call at a time."""

    def __init__(self, lm: DraftLM, draft_codec: TextCodec, target_codec: TextCodec, vocab_size: int,
                 draft_eos: Sequence[int] = (), name: str | None = None):
        self.lm = lm
        self.draft_codec = draft_codec
        self.target_codec = target_codec
        self.vocab_size = vocab_size      # the target's: ids on the wire are target ids
        # A draft EOS carries over only when its text is one target token (ChatML <|im_end|>
        # in both); otherwise it just ends the draft.
        self.eos_map: dict[int, int | None] = {}
        for eos in draft_eos:
            ids = target_codec.encode(draft_codec.decode([eos]))
            self.eos_map[eos] = ids[0] if len(ids) == 1 and ids[0] < vocab_size else None
        self.name = name or f"{getattr(lm, 'name', 'draft')} (cross-tokenizer)"
        self.device = getattr(lm, "device", "cpu")
        self.placement = getattr(lm, "placement", str(self.device))

    def new_state(self) -> CrossState:
        return CrossState(self.lm.new_state())

    def prefill(self, state: CrossState, tokens: Sequence[int]) -> None:
        self.lm.prefill(state.kv, self._draft_ids(state, self.target_codec.decode(tokens)))

    def greedy_draft(self, state: CrossState, committed: Sequence[int], k: int) -> list[int]:
        """Exactly k target ids after ``committed`` (non-empty)."""
        return self._pad(committed, self._propose(state, committed, k)[0], k)

    def logits_rows(self, state: CrossState, seq: Sequence[int], last: int) -> np.ndarray:
        """float32 [last, vocab]: 0 on the greedy proposal after each of the last ``last``
        prefixes of ``seq``, NOT_PROPOSED elsewhere."""
        if not 1 <= last <= len(seq):
            raise ValueError(f"asked for {last} positions of a {len(seq)}-token sequence")
        rows = np.full((last, self.vocab_size), NOT_PROPOSED, dtype=np.float32)
        for row, end in enumerate(range(len(seq) - last + 1, len(seq) + 1)):
            rows[row, self._next_token(state, seq[:end])] = 0.0
        return rows

    def _next_token(self, state: CrossState, prefix: Sequence[int]) -> int:
        """The proposal after ``prefix``. A sampling session asks one position at a time,
        each prefix extending the last by our guess: the stable part of one draft serves
        them, and a new window drafts as many tokens as the previous window asked for."""
        if len(prefix) >= len(state.anchor) and list(prefix[:len(state.anchor)]) == state.anchor:
            state.asked = max(state.asked, len(prefix) - len(state.anchor) + 1)
        else:
            state.window, state.anchor, state.asked = max(1, state.asked), list(prefix), 1
        done = len(prefix) - len(state.base)
        if not (0 <= done < state.stable and list(prefix[:len(state.base)]) == state.base
                and list(prefix[len(state.base):]) == state.proposal[:done]):
            want = max(1, state.window - (len(prefix) - len(state.anchor)))
            state.proposal, state.stable = self._propose(state, prefix, want)
            state.base, done = list(prefix), 0
        return self._pad(prefix, state.proposal, done + 1)[done]

    def _propose(self, state: CrossState, committed: Sequence[int], k: int) -> tuple[list[int], int]:
        """Target tokens drafted after ``committed``, and how many are stable: at least k
        unless the draft ran out of budget."""
        pending = self._pending(committed)
        ids = self._draft_ids(state, self.target_codec.decode(committed[:len(committed) - pending]))
        if not ids:
            return [], 0
        seq, new, text = list(ids), [], ""
        for _ in range(2 * k + WORD_BUDGET):   # draft tokens per target token: ~1.1 for SmolLM2 vs Qwen
            token = self.lm.next_tokens(state.kv, seq, 1)[0]
            if token in self.eos_map:
                proposal, _ = self._to_target(committed, pending, text.rstrip(REPLACEMENT))
                proposal += [] if self.eos_map[token] is None else [self.eos_map[token]]
                return proposal, len(proposal)   # the draft's text is final
            seq.append(token)
            new.append(token)
            text = self._new_text(ids, new)
            if text.endswith(REPLACEMENT):
                continue   # a character still incomplete: its target tokens are not known yet
            proposal, stable = self._to_target(committed, pending, text)
            if stable >= k:
                return proposal, stable
        return self._to_target(committed, pending, text.rstrip(REPLACEMENT))

    def _pending(self, committed: Sequence[int]) -> int:
        """How many trailing target tokens hold an incomplete UTF-8 character (0..3).

        The draft then reads the text before them and writes the whole character,
        and step 4 re-encodes it together with them."""
        for pending in range(min(4, len(committed))):
            end = len(committed) - pending
            if not self.target_codec.decode(committed[max(0, end - CONTEXT_TOKENS):end]).endswith(REPLACEMENT):
                return pending
        return 0

    def _draft_ids(self, state: CrossState, text: str) -> list[int]:
        """Draft ids of ``text``: the frozen prefix's, then the rest encoded afresh."""
        if not text.startswith(state.frozen_text):
            state.frozen_text, state.frozen_ids = "", []
        tail = text[len(state.frozen_text):]
        tail_ids = self.draft_codec.encode(tail)
        ids = state.frozen_ids + tail_ids
        if len(tail) > 2 * FREEZE_CHARS:
            cut = max(tail.rfind(" ", 0, len(tail) - FREEZE_CHARS), tail.rfind("\n", 0, len(tail) - FREEZE_CHARS))
            head_ids = self.draft_codec.encode(tail[:cut]) if cut > 0 else []
            if head_ids and tail_ids[:len(head_ids)] == head_ids:   # the cut is a token boundary: freeze
                state.frozen_text += tail[:cut]
                state.frozen_ids = state.frozen_ids + head_ids
        return ids

    def _new_text(self, ids: list[int], new: list[int]) -> str:
        """The text ``new`` adds after ``ids``, decoded with a little context before it."""
        context = ids[-CONTEXT_TOKENS:]
        before, after = self.draft_codec.decode(context), self.draft_codec.decode(context + new)
        if not after.startswith(before):
            before, after = self.draft_codec.decode(ids), self.draft_codec.decode(ids + new)
        return after[len(before):] if after.startswith(before) else after

    def _to_target(self, committed: Sequence[int], pending: int, text: str) -> tuple[list[int], int]:
        """Target tokens for ``text`` appended to the committed tokens but their last
        ``pending`` (an incomplete character, which ``text`` completes): module doc, step 4.

        Also how many of them are stable: more text can change only the tokens of the
        last pre-token (a word still growing: " fi" + "b" becomes " fibonacci")."""
        if not text:
            return [], 0
        tail, head = [], ""
        # r runs 3 further back over tails that start inside a character (byte tokens).
        for r in range(pending + 1, min(pending + BOUNDARY_TOKENS + 3, len(committed)) + 1):
            context = list(committed[-r - CONTEXT_TOKENS:-r])
            clean = list(committed[-r:len(committed) - pending])
            before, after = self.target_codec.decode(context), self.target_codec.decode(context + clean)
            if before.endswith(REPLACEMENT) or not after.startswith(before):
                continue
            if self.target_codec.encode(after[len(before):] + text)[:r] == committed[-r:]:
                tail, head = list(committed[-r:]), after[len(before):]
                break
        ids = self.target_codec.encode(head + text)[len(tail):]
        valid = next((i for i, t in enumerate(ids) if not 0 <= t < self.vocab_size), len(ids))
        return ids[:valid], min(valid, self._stable(head + text, tail, ids))

    def _stable(self, text: str, tail: list[int], ids: list[int]) -> int:
        """How many of ``ids`` (``text``'s encoding after ``tail``) end before ``text``'s last
        pre-token; all but the last when the tokenizer has no pre-tokenizer to ask."""
        start = getattr(self.target_codec, "last_word_start", lambda _: None)(text)
        if start is None:
            return len(ids) - 1
        stable = self.target_codec.encode(text[:start])
        if stable[:len(tail)] != tail or ids[:len(stable) - len(tail)] != stable[len(tail):]:
            return 0
        return len(stable) - len(tail)

    def _pad(self, committed: Sequence[int], proposal: list[int], k: int) -> list[int]:
        """proposal[:k], padded to k by repeating the last token that is not an EOS."""
        eos = {t for t in self.eos_map.values() if t is not None}
        fill = next((t for t in reversed([*committed, *proposal]) if t not in eos), committed[-1])
        return (proposal + [fill] * k)[:k]


def wrap_for_target(lm: Any, draft_spec: str, target_spec: str) -> CrossTokenizerDrafter:
    """``lm`` (a TorchCausalLM loaded from ``draft_spec``) drafting for the target whose
    tokenizer ``target_spec`` names ("target", "draft", or a model directory). Loads
    tokenizers only; the vocab size is the target model's config's when it has one."""
    import json

    from edgespec.backends.registry import eos_ids, model_path
    from edgespec.backends.tokenizer import load_tokenizer

    target = HFCodec(load_tokenizer(target_spec))
    config = model_path(target_spec) / "config.json"
    vocab_size = json.loads(config.read_text())["vocab_size"] if config.exists() else len(target)
    return CrossTokenizerDrafter(lm, HFCodec(load_tokenizer(draft_spec)), target, vocab_size, eos_ids(lm))
