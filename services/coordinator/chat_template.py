"""The coordinator's tokenizer, with chat turns rendered through the model's chat template.

``encode_chat`` is what edgespec.loop.generation uses for a request's ``messages``: a
Hugging Face tokenizer with a chat template renders them itself (the assistant's turn
opened, as ``encode(prompt, chat=True)`` does for one user turn, so a single user message
gives exactly the tokens of that prompt with ``chat``); any other tokenizer (the byte
tokenizer of the tiny test models, a base model without a template) gets the plain
transcript of edgespec.loop.chat.
"""
from __future__ import annotations

from typing import Sequence

from edgespec.backends.tokenizer import Tokenizer
from edgespec.errors import InvalidArgument
from edgespec.loop.chat import ChatMessage, as_dicts, plain_transcript


class ChatTemplateTokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        hf = getattr(tokenizer, "hf", None)
        self._template = hf if hf is not None and getattr(hf, "chat_template", None) else None

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return self.tokenizer.encode(prompt, chat)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens)

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        if self._template is None:
            return self.tokenizer.encode(plain_transcript(messages), False)
        try:
            ids = self._template.apply_chat_template(as_dicts(messages), add_generation_prompt=True, tokenize=True)
        except Exception as error:   # noqa: BLE001 - jinja's TemplateError and friends: the turns do not fit it
            raise InvalidArgument("messages", f"the model's chat template refused them: {error}") from None
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
