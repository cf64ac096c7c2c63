"""Chat turns as a request carries them, and how they become a prompt without a chat template.

A request may give its input as chat turns (system / user / assistant) instead of one
prompt string. A tokenizer with a chat template renders them itself (the coordinator's
tokenizer adapter, services/coordinator/chat_template.py); one without (the byte tokenizer
of the tiny test models, a base model) gets ``plain_transcript``: a single user turn is
its text as is — exactly what ``chat=True`` with that prompt gives on such a tokenizer —
and anything else a plain "role: text" transcript ending in "assistant:".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

ROLES = ("system", "user", "assistant")
ROLE_ALIASES = {"developer": "system"}   # OpenAI's newer name for the system turn
MAX_MESSAGES = 1024


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str                      # "system" | "user" | "assistant"
    content: str                   # the turn's text


def normalize_role(role: str) -> str:
    """A role as the chat template knows it ("developer" is "system"); unknown roles are returned as given."""
    return ROLE_ALIASES.get(role, role)


def check_messages(messages: Sequence[ChatMessage]) -> str | None:
    """What is wrong with ``messages`` as a request's chat turns (None: nothing)."""
    if not messages:
        return "must not be empty"
    if len(messages) > MAX_MESSAGES:
        return f"at most {MAX_MESSAGES} messages, got {len(messages)}"
    for i, message in enumerate(messages):
        if normalize_role(message.role) not in ROLES:
            return f"message {i}: unknown role {message.role!r} (expected one of {', '.join(ROLES)})"
    if not any(message.content.strip() for message in messages):
        return "every message is empty"
    return None


def plain_transcript(messages: Sequence[ChatMessage], generation_prompt: bool = True) -> str:
    """The prompt text for a tokenizer without a chat template (see the module doc); ``generation_prompt=False``:
    the turns alone, without the opened assistant turn."""
    if len(messages) == 1 and normalize_role(messages[0].role) == "user":
        return messages[0].content
    lines = [f"{normalize_role(m.role)}: {m.content}" for m in messages]
    return "\n".join(lines) + ("\nassistant:" if generation_prompt else "")


def as_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """The turns as chat templates take them: [{"role": ..., "content": ...}, ...]."""
    return [{"role": normalize_role(m.role), "content": m.content} for m in messages]


def prompt_text(prompt: str, messages: Sequence[ChatMessage]) -> str:
    """The request's text for what reads it as text (the router's features, the per-task weight):
    the prompt, or the last user turn."""
    if prompt or not messages:
        return prompt
    users = [m.content for m in messages if normalize_role(m.role) == "user"]
    return users[-1] if users else messages[-1].content
