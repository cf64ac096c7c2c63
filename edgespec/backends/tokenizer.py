"""Text <-> token ids for the coordinator.

"bytes" is a built-in byte-level tokenizer (ids 0..255 are bytes, 256 is EOS)
that matches the tiny test models; anything else is a Hugging Face tokenizer
directory, or "target"/"draft" for the packaged pair's shared tokenizer.
"""
from __future__ import annotations

from typing import Protocol, Sequence


class Tokenizer(Protocol):
    def encode(self, prompt: str, chat: bool) -> list[int]: ...
    def decode(self, tokens: Sequence[int]) -> str: ...


class ByteTokenizer:
    EOS = 256

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return list(prompt.encode("utf-8"))

    def decode(self, tokens: Sequence[int]) -> str:
        return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path)

    @property
    def hf(self):
        """The underlying transformers tokenizer (for plain text <-> ids without templates)."""
        return self._tok

    def encode(self, prompt: str, chat: bool) -> list[int]:
        if chat and self._tok.chat_template:
            ids = self._tok.apply_chat_template([{"role": "user", "content": prompt}],
                                                add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self._tok.encode(prompt, add_special_tokens=False)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._tok.decode(list(tokens), skip_special_tokens=True)


def load_tokenizer(spec: str) -> Tokenizer:
    """"bytes", a packaged model's name ("target", "draft", "smollm2": its tokenizer, read from the GGUF
    when the model was never converted) or a Hugging Face tokenizer directory."""
    if spec == "bytes":
        return ByteTokenizer()
    from edgespec.backends.assets import PACKAGED
    from edgespec.backends.convert import ensure_tokenizer_dir

    return HFTokenizer(str(ensure_tokenizer_dir(spec) if spec in PACKAGED else spec))


class TextStream:
    """Incremental detokenization: the text each new chunk of tokens adds.

    Holds back a trailing U+FFFD (an incomplete multi-byte character) until the
    bytes that complete it arrive.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._emitted = 0

    def push(self, tokens: Sequence[int]) -> str:
        self._tokens.extend(tokens)
        text = self._tokenizer.decode(self._tokens)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        new = text[self._emitted:]
        self._emitted = max(self._emitted, len(text))
        return new

    def flush(self) -> str:
        text = self._tokenizer.decode(self._tokens)
        new = text[self._emitted:]
        self._emitted = len(text)
        return new
