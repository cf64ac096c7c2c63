"""The OpenAI HTTP API's shapes, without HTTP: request bodies checked and translated, response bodies built.

The coordinator's FastAPI app (services/coordinator/http_api.py) parses the JSON, hands
the object here, runs the GenerationRequest this returns through the same generation
path as the gRPC Generate, and sends back what the builders here make. As OpenAI does,
fields it does not know are ignored; fields it knows but cannot honour (n > 1,
penalties, tools, echo...) and values of the wrong type or out of range are an
``ApiError`` (HTTP 400 with OpenAI's error object naming the parameter), so nothing is
silently answered differently from what was asked. vLLM's ``ignore_eos`` and
``min_tokens`` are taken too, and its /tokenize and /detokenize bodies.

Log-probabilities (chat ``logprobs`` / ``top_logprobs``, completions ``logprobs: n``)
are the target's own at each committed token (edgespec.verify.logprobs), in OpenAI's
shapes; a token's text is what the caller's ``token_text`` makes of its id.

edgespec's own settings ride in an ``edgespec`` object of the request (window, relaxed,
coupled, top_k); its statistics come back in an ``edgespec`` object of the response (the
last chunk when streaming), with the fields of the gRPC GenerationStats.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from edgespec.loop.chat import ChatMessage, check_messages
from edgespec.loop.stops import check_stops
from edgespec.verify.logprobs import MAX_LOGPROBS, TokenLogprob

MAX_SEED = 2**64        # seeds are uint64 on the wire; any int is taken modulo this


class ApiError(Exception):
    """An error answered with HTTP ``status`` and OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type_
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """A checked request of either endpoint, in edgespec's terms."""
    kind: str                      # "chat" (chat.completions) | "text" (completions)
    model: str                     # as sent ("" if absent); responses name the coordinator's model
    prompt: str                    # completions: the prompt (sent as is, no chat template)
    messages: tuple[ChatMessage, ...]  # chat: the turns
    max_tokens: int | None         # None: the coordinator's limit
    temperature: float             # 0 = greedy
    top_p: float
    seed: int | None               # None: the coordinator picks one (reported in the edgespec stats)
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool            # stream_options.include_usage: a last chunk with the usage
    user: str
    window: int = -1               # edgespec.window: -1 = the coordinator's default, 0 = target-only
    relaxed: str = ""              # edgespec.relaxed: the CLI's --relaxed spec ("" = lossless)
    coupled: bool = False          # edgespec.coupled: the coupled sampler
    top_k: int = 0                 # edgespec.top_k (also read at the top level, as vLLM does)
    ignore_eos: bool = False       # vLLM's: an EOS token does not end the generation (it runs to max_tokens)
    min_tokens: int = 0            # vLLM's: tokens before an EOS or a stop sequence may end the text
    logprobs: int | None = None    # per token, its log-probability and this many most likely tokens'; None = none


def parse_chat(body: Any) -> OpenAIRequest:
    """A POST /v1/chat/completions body (raises ApiError)."""
    body = _object(body)
    _unsupported_common(body)
    logprobs = _optional_bool(body, "logprobs") or False
    top = _optional_int(body, "top_logprobs", 0)
    if top is not None and top > MAX_LOGPROBS:
        raise ApiError(f"top_logprobs must be in 0..{MAX_LOGPROBS}, got {top}", "top_logprobs")
    if top and not logprobs:
        raise ApiError("top_logprobs needs logprobs: true", "top_logprobs")
    for name in ("tools", "functions"):
        if body.get(name):
            raise ApiError(f"{name} are not supported", name, code="unsupported_parameter")
    if body.get("tool_choice") not in (None, "none"):
        raise ApiError("tool_choice is not supported", "tool_choice", code="unsupported_parameter")
    messages = _messages(body.get("messages"))
    max_tokens = _optional_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens", 1)
    return _request(body, "chat", "", messages, max_tokens, (top or 0) if logprobs else None)


def parse_completion(body: Any) -> OpenAIRequest:
    """A POST /v1/completions body (raises ApiError)."""
    body = _object(body)
    _unsupported_common(body)
    logprobs = _optional_int(body, "logprobs", 0)
    if logprobs is not None and logprobs > MAX_LOGPROBS:
        raise ApiError(f"logprobs must be in 0..{MAX_LOGPROBS}, got {logprobs}", "logprobs")
    if body.get("echo"):
        raise ApiError("echo is not supported", "echo", code="unsupported_parameter")
    if body.get("suffix"):
        raise ApiError("suffix is not supported", "suffix", code="unsupported_parameter")
    best_of = _optional_int(body, "best_of", 1)
    if best_of not in (None, 1):
        raise ApiError("best_of must be 1: one completion per request", "best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError("prompt must be a string (or a list of one string)", "prompt")
    if not prompt.strip():
        raise ApiError("prompt must not be empty", "prompt")
    return _request(body, "text", prompt, (), _optional_int(body, "max_tokens", 1), logprobs)


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """A checked POST /tokenize body (vLLM's): a prompt, or chat turns through the chat template."""
    prompt: str                         # "" with messages
    messages: tuple[ChatMessage, ...]   # () with a prompt
    add_special_tokens: bool            # the tokenizer's special tokens (a BOS): prompt default true, messages false
    add_generation_prompt: bool         # messages: open the assistant's turn (default true)
    continue_final_message: bool        # messages: leave the last turn open (not with add_generation_prompt)
    return_token_strs: bool             # also each token's name in the vocabulary


def parse_tokenize(body: Any) -> TokenizeRequest:
    """A POST /tokenize body, as vLLM takes it (raises ApiError)."""
    body = _object(body)
    if body.get("model") is not None and not isinstance(body.get("model"), str):
        raise ApiError("model must be a string", "model")
    strs = _optional_bool(body, "return_token_strs") or False
    if "messages" in body:
        messages = _messages(body.get("messages"))
        generation = _optional_bool(body, "add_generation_prompt")
        final = _optional_bool(body, "continue_final_message") or False
        if final and generation:
            raise ApiError("continue_final_message and add_generation_prompt cannot both be true",
                           "continue_final_message")
        return TokenizeRequest("", messages, _optional_bool(body, "add_special_tokens") or False,
                               not final if generation is None else generation, final, strs)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError("prompt must be a string (or give messages)", "prompt")
    special = _optional_bool(body, "add_special_tokens")
    return TokenizeRequest(prompt, (), True if special is None else special, False, False, strs)


def parse_detokenize(body: Any, vocab_size: int | None = None) -> list[int]:
    """A POST /detokenize body's token ids, each in [0, vocab_size) when that is known (raises ApiError)."""
    body = _object(body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError("tokens must be a list of token ids (integers)", "tokens")
    for i, token in enumerate(tokens):
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise ApiError(f"tokens[{i}] = {token} is outside the vocabulary [0, {vocab_size or '...'})", "tokens")
    return tokens


def tokenize_body(tokens: list[int], max_model_len: int, token_strs: list[str] | None = None) -> dict[str, Any]:
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}


def detokenize_body(text: str) -> dict[str, Any]:
    return {"prompt": text}


def _request(body: Mapping[str, Any], kind: str, prompt: str, messages: tuple[ChatMessage, ...],
             max_tokens: int | None, logprobs: int | None) -> OpenAIRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("model must be a string", "model")
    n = _optional_int(body, "n", 1)
    if n not in (None, 1):
        raise ApiError(f"n must be 1: this server returns one choice per request, got {n}", "n")
    temperature = _optional_number(body, "temperature", 0.0, 2.0)
    top_p = _optional_number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p == 0:
        raise ApiError("top_p must be in (0, 1]", "top_p")
    seed = _optional_int(body, "seed")
    stream = _optional_bool(body, "stream") or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError("stream_options must be an object", "stream_options")
    include_usage = _optional_bool(options or {}, "include_usage", "stream_options.include_usage") or False
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError("user must be a string", "user")
    extension = body.get("edgespec")
    if extension is not None and not isinstance(extension, dict):
        raise ApiError("edgespec must be an object", "edgespec")
    extension = extension or {}
    unknown = sorted(set(extension) - {"window", "relaxed", "coupled", "top_k"})
    if unknown:
        raise ApiError(f"edgespec: unknown setting {unknown[0]!r} (known: window, relaxed, coupled, top_k)",
                       f"edgespec.{unknown[0]}")
    window = _optional_int(extension, "window", -1, param="edgespec.window")
    relaxed = extension.get("relaxed")
    if relaxed is not None and not isinstance(relaxed, str):
        raise ApiError("edgespec.relaxed must be a string such as 'diversed:0.5'", "edgespec.relaxed")
    top_k = _optional_int(extension, "top_k", 0, param="edgespec.top_k")
    if top_k is None:
        top_k = _optional_int(body, "top_k", 0)
    min_tokens = _optional_int(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(f"min_tokens must be <= max_tokens ({max_tokens}), got {min_tokens}", "min_tokens")
    return OpenAIRequest(
        kind=kind, model=model or "", prompt=prompt, messages=messages, max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature, top_p=1.0 if top_p is None else top_p,
        seed=None if seed is None else seed % MAX_SEED, stop=_stop(body.get("stop")), stream=stream,
        include_usage=include_usage, user=user or "", window=-1 if window is None else window,
        relaxed=relaxed or "", coupled=_optional_bool(extension, "coupled", "edgespec.coupled") or False,
        top_k=top_k or 0, ignore_eos=_optional_bool(body, "ignore_eos") or False, min_tokens=min_tokens,
        logprobs=logprobs)


def _unsupported_common(body: Mapping[str, Any]) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = _optional_number(body, name, -2.0, 2.0)
        if value:
            raise ApiError(f"{name} is not supported (only 0): speculative decoding here is exact or explicitly "
                           f"relaxed sampling from the target", name, code="unsupported_parameter")
    repetition = _optional_number(body, "repetition_penalty", 0.0, math.inf)
    if repetition is not None and repetition != 1.0:
        raise ApiError("repetition_penalty is not supported (only 1)", "repetition_penalty",
                       code="unsupported_parameter")
    if body.get("logit_bias"):
        raise ApiError("logit_bias is not supported", "logit_bias", code="unsupported_parameter")
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict)
                                        or response_format.get("type", "text") != "text"):
        raise ApiError("response_format: only {\"type\": \"text\"} is supported", "response_format",
                       code="unsupported_parameter")


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list):
        raise ApiError("messages must be a list of {role, content} objects", "messages")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ApiError(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
        role = item.get("role")
        if not isinstance(role, str):
            raise ApiError(f"messages[{i}].role must be a string", f"messages[{i}].role")
        messages.append(ChatMessage(role, _content(item.get("content"), i, role)))
    problem = check_messages(messages)
    if problem:
        raise ApiError(f"messages: {problem}", "messages")
    return tuple(messages)


def _content(value: Any, i: int, role: str) -> str:
    """A message's content: a string, a list of text parts, or null (an assistant turn without text)."""
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":
        return ""
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(f"messages[{i}].content[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                               f"are supported", f"messages[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("stop must be a string or a list of strings", "stop")
    problem = check_stops(stops)
    if problem:
        raise ApiError(f"stop: {problem}", "stop")
    return tuple(stops)


def _optional_int(body: Mapping[str, Any], name: str, minimum: int | None = None, param: str | None = None
                  ) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{param or name} must be an integer, got {value!r}", param or name)
    if minimum is not None and value < minimum:
        raise ApiError(f"{param or name} must be >= {minimum}, got {value}", param or name)
    return value


def _optional_number(body: Mapping[str, Any], name: str, minimum: float, maximum: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(f"{name} must be a number, got {value!r}", name)
    if not minimum <= value <= maximum:
        raise ApiError(f"{name} must be in [{minimum:g}, {maximum:g}], got {value}", name)
    return float(value)


def _optional_bool(body: Mapping[str, Any], name: str, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ApiError(f"{param or name} must be a boolean, got {value!r}", param or name)
    return value


# ---- responses -------------------------------------------------------------------------------------------

def finish_reason(reason: str) -> str:
    """edgespec's finish reason as OpenAI's: EOS and stop sequences are "stop", the budget "length";
    "unverified" (degraded mode: drafter text no verifier checked) is passed on as it is."""
    return {"eos": "stop", "stop": "stop", "length": "length"}.get(reason, reason or "stop")


def usage(stats: Any) -> dict[str, int]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


def edgespec_stats(stats: Any) -> dict[str, Any]:
    """The generation's statistics (GenerationStats, the gRPC stats' fields) as a JSON object."""
    return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)


TokenText = Callable[[int], str]   # a token id's text (the tokenizer's decoding of it alone)


def logprobs_body(request: OpenAIRequest, entries: Sequence[TokenLogprob], token_text: TokenText,
                  text_offset: int = 0) -> dict[str, Any] | None:
    """A choice's ``logprobs`` for ``entries`` (None where the request asked for none): chat's ``content`` list
    with ``top_logprobs`` most likely tokens each; completions' parallel lists, each position's top dict holding
    its token and the ``logprobs`` most likely ones, text offsets counted from ``text_offset`` (the text of the
    tokens before these, as each token's text has it)."""
    if request.logprobs is None:
        return None
    top = request.logprobs
    if request.kind == "chat":
        return {"content": [{**_chat_logprob(e.token, e.logprob, token_text),
                             "top_logprobs": [_chat_logprob(t, lp, token_text) for t, lp in e.top[:top]]}
                            for e in entries]}
    tokens = [token_text(e.token) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{token: _finite(e.logprob), **{token_text(t): _finite(lp) for t, lp in e.top[:top]}}
                             for token, e in zip(tokens, entries)],
            "text_offset": offsets}


def _chat_logprob(token: int, logprob: float, token_text: TokenText) -> dict[str, Any]:
    text = token_text(token)
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8", errors="replace"))}


def _finite(logprob: float) -> float:
    """As vLLM sends them: JSON has no -inf (a token of probability 0 is -9999)."""
    return max(logprob, -9999.0)


def completion_body(request: OpenAIRequest, response_id: str, created: int, model: str, text: str,
                    stats: Any, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole (non-streamed) response of either endpoint; ``logprobs`` from logprobs_body."""
    reason = finish_reason(stats.finish_reason)
    if request.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                  "finish_reason": reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}
        kind = "text_completion"
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": [choice],
            "usage": usage(stats), "edgespec": edgespec_stats(stats)}


def chunk_body(request: OpenAIRequest, response_id: str, created: int, model: str, text: str | None = None,
               stats: Any = None, first: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed chunk: ``text`` (chat: the first chunk also names the role) and the ``logprobs`` of its
    tokens (logprobs_body), or with ``stats`` the last chunk of the choice (its finish reason and the edgespec
    statistics)."""
    reason = finish_reason(stats.finish_reason) if stats is not None else None
    if request.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        kind = "text_completion"
    body = {"id": response_id, "object": kind, "created": created, "model": model, "choices": [choice]}
    if stats is not None:
        body["edgespec"] = edgespec_stats(stats)
    return body


def usage_chunk_body(request: OpenAIRequest, response_id: str, created: int, model: str,
                     stats: Any) -> dict[str, Any]:
    """stream_options.include_usage: the chunk after the last one, with no choices and the usage."""
    kind = "chat.completion.chunk" if request.kind == "chat" else "text_completion"
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": [],
            "usage": usage(stats)}
