"""vLLM's /tokenize and /detokenize as the coordinator answers them: the bodies parsed (edgespec.api.openai_compat)
and the coordinator's tokenizer adapter (services/coordinator/chat_template.py) on the byte tokenizer and on the
packaged pair's Hugging Face tokenizer with its chat template."""
import pytest

from edgespec.api.openai_compat import ApiError, parse_detokenize, parse_tokenize, tokenize_body
from edgespec.backends.tokenizer import ByteTokenizer, load_tokenizer
from edgespec.loop.chat import ChatMessage
from services.coordinator.chat_template import ChatTemplateTokenizer

TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def test_tokenize_bodies_take_vllms_defaults():
    prompt = parse_tokenize({"model": "m", "prompt": "hi"})
    assert (prompt.prompt, prompt.messages, prompt.add_special_tokens, prompt.return_token_strs) == ("hi", (), True,
                                                                                                     False)
    chat = parse_tokenize({"messages": TURNS})
    assert chat.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "2+2?"))
    assert (chat.add_special_tokens, chat.add_generation_prompt, chat.continue_final_message) == (False, True, False)
    final = parse_tokenize({"messages": TURNS, "continue_final_message": True})
    assert (final.add_generation_prompt, final.continue_final_message) == (False, True)
    assert parse_tokenize({"prompt": "", "add_special_tokens": False}).add_special_tokens is False
    assert parse_detokenize({"tokens": [104, 105]}, 320) == [104, 105]
    assert tokenize_body([1, 2], 8192) == {"count": 2, "max_model_len": 8192, "tokens": [1, 2], "token_strs": None}


@pytest.mark.parametrize("body,param", [
    ({"prompt": 5}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "hi", "add_special_tokens": "no"}, "add_special_tokens"),
    ({"prompt": "hi", "return_token_strs": 1}, "return_token_strs"),
    ({"prompt": "hi", "model": 3}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": TURNS, "add_generation_prompt": "yes"}, "add_generation_prompt"),
    ({"messages": TURNS, "continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_tokenize_bodies_are_a_400_naming_the_parameter(body, param):
    with pytest.raises(ApiError) as raised:
        parse_tokenize(body)
    assert (raised.value.status, raised.value.param) == (400, param)


@pytest.mark.parametrize("body", [{}, {"tokens": "1 2"}, {"tokens": [1, "2"]}, {"tokens": [1, True]},
                                  {"tokens": [-1]}, {"tokens": [320]}, {"tokens": [1.5]}])
def test_bad_detokenize_bodies_are_a_400_naming_tokens(body):
    with pytest.raises(ApiError) as raised:
        parse_detokenize(body, 320)
    assert (raised.value.status, raised.value.param) == (400, "tokens")


def test_byte_tokenizer_transcript_with_and_without_the_generation_prompt():
    tokenizer = ChatTemplateTokenizer(ByteTokenizer())
    turns = (ChatMessage("system", "s"), ChatMessage("user", "u"))
    assert bytes(tokenizer.encode_chat(turns)) == b"system: s\nuser: u\nassistant:"
    assert bytes(tokenizer.encode_chat(turns, add_generation_prompt=False)) == b"system: s\nuser: u"
    assert tokenizer.tokenize("hi", add_special_tokens=True) == [104, 105]
    assert tokenizer.token_strs([104, 105]) == ["h", "i"]


def test_hugging_face_tokenizer_with_its_chat_template():
    tokenizer = ChatTemplateTokenizer(load_tokenizer("draft"))
    hf = tokenizer.tokenizer.hf
    turns = (ChatMessage("system", "Be brief."), ChatMessage("user", "2+2?"))
    opened = tokenizer.encode_chat(turns)
    dicts = [{"role": m.role, "content": m.content} for m in turns]
    assert opened == hf.encode(hf.apply_chat_template(dicts, add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)
    closed = tokenizer.encode_chat(turns, add_generation_prompt=False)
    assert opened[:len(closed)] == closed and len(opened) > len(closed)
    assert tokenizer.encode_chat(turns, add_special_tokens=True)[-len(opened):] == opened
    assert tokenizer.tokenize("def f():") == hf.encode("def f():", add_special_tokens=False)
    assert tokenizer.token_strs(tokenizer.tokenize("def f")) == hf.convert_ids_to_tokens(hf.encode("def f"))
