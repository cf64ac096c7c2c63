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

    def encode_chat(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, add_special_tokens: bool = False) -> list[int]:
        """The turns' token ids: through the chat template with the assistant's turn opened (as a generation uses
        them), or, as vLLM's /tokenize may ask, without it, with the last turn left open, or with the tokenizer's
        special tokens added to the rendered text."""
        if self._template is None:
            return self.tokenize(plain_transcript(messages, add_generation_prompt and not continue_final_message),
                                 add_special_tokens)
        try:
            # tokenize=True tokenizes the rendered text without special tokens; with them, render and encode here
            ids = self._template.apply_chat_template(as_dicts(messages), add_generation_prompt=add_generation_prompt,
                                                     continue_final_message=continue_final_message,
                                                     tokenize=not add_special_tokens)
        except Exception as error:   # noqa: BLE001 - jinja's TemplateError and friends: the turns do not fit it
            raise InvalidArgument("messages", f"the model's chat template refused them: {error}") from None
        if add_special_tokens:
            return self._template.encode(ids, add_special_tokens=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def tokenize(self, prompt: str, add_special_tokens: bool = False) -> list[int]:
        """Plain text's token ids (no chat template); ``add_special_tokens``: with the tokenizer's own (a BOS)."""
        hf = getattr(self.tokenizer, "hf", None)
        if hf is None:
            return self.tokenizer.encode(prompt, False)
        return hf.encode(prompt, add_special_tokens=add_special_tokens)

    def token_text(self, token: int) -> str:
        """One token's text, decoded alone (special tokens as their text): a log-probability entry's token."""
        hf = getattr(self.tokenizer, "hf", None)
        return self.tokenizer.decode([token]) if hf is None else hf.decode([token])

    def token_strs(self, tokens: Sequence[int]) -> list[str]:
        """Each token as the tokenizer names it (a Hugging Face tokenizer's vocabulary entry; else its text)."""
        hf = getattr(self.tokenizer, "hf", None)
        if hf is None:
            return [self.tokenizer.decode([token]) for token in tokens]
        return [str(name) for name in hf.convert_ids_to_tokens(list(tokens))]
