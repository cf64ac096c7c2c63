"""The OpenAI API's vLLM-style parameters as parsed (edgespec.api.openai_compat): what each becomes, and every bad
value a 400 naming its parameter."""
import pytest

from edgespec.api.openai_compat import ApiError, parse_chat, parse_completion

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
TEXT = {"model": "m", "prompt": "hi", "max_tokens": 8}


@pytest.mark.parametrize("parse,base", [(parse_chat, CHAT), (parse_completion, TEXT)], ids=["chat", "completions"])
def test_ignore_eos_and_min_tokens_parse(parse, base):
    parsed = parse({**base, "ignore_eos": True, "min_tokens": 8})
    assert (parsed.ignore_eos, parsed.min_tokens) == (True, 8)
    parsed = parse(base)
    assert (parsed.ignore_eos, parsed.min_tokens) == (False, 0)
    parsed = parse({**base, "max_tokens": None, "min_tokens": 500})   # checked against the server's budget later
    assert parsed.min_tokens == 500
    assert parse({**base, "repetition_penalty": 1.0}).min_tokens == 0   # vllm bench serve sends 1.0


@pytest.mark.parametrize("extra,param", [
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": "3"}, "min_tokens"),
    ({"min_tokens": 1.5}, "min_tokens"),
    ({"min_tokens": True}, "min_tokens"),
    ({"min_tokens": 9}, "min_tokens"),            # above max_tokens (8)
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"repetition_penalty": "1"}, "repetition_penalty"),
], ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("parse,base", [(parse_chat, CHAT), (parse_completion, TEXT)], ids=["chat", "completions"])
def test_bad_values_are_a_400_naming_the_parameter(parse, base, extra, param):
    with pytest.raises(ApiError) as raised:
        parse({**base, **extra})
    assert (raised.value.status, raised.value.param, raised.value.type) == (400, param, "invalid_request_error")
    assert param in raised.value.message
