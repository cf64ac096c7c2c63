"""Stop sequences over streamed text (edgespec.loop.stops) and the OpenAI request checks (edgespec.api)."""
import itertools
import random

import pytest

from edgespec import errors
from edgespec.api.openai_compat import ApiError, finish_reason, parse_chat, parse_completion
from edgespec.loop.chat import ChatMessage, check_messages, plain_transcript
from edgespec.loop.stops import MAX_STOPS, StopCutter, check_stops, find_stop, held_tail


def cut(pieces, stops):
    cutter = StopCutter(stops)
    out = "".join(cutter.push(p) for p in pieces) + cutter.flush()
    return out, cutter.matched


def reference(text, stops):
    """Character by character: the first point where some stop sequence has just completed."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return text[:end - len(stop)], stop
    return text, None


def splits(text, cuts):
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("stops", [["\nUser:"], ["abc", "bcd"], ["xx"], ["a", "aa"], ["é!", "ü"]])
def test_every_split_of_the_text_cuts_where_a_character_reader_stops(stops):
    text = "Hello\nUs\nUser: abcd xxé! üa tail"
    expected = reference(text, stops)
    for n in range(1, 4):
        for cuts in itertools.combinations(range(1, len(text)), n):
            assert cut(splits(text, cuts), stops) == expected, (cuts, stops)


def test_random_texts_and_splits_agree_with_the_reference():
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice("ab\n:") for _ in range(rng.randint(0, 25)))
        stops = ["".join(rng.choice("ab\n:") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        cuts = sorted(rng.sample(range(1, max(2, len(text))), min(len(text) - 1, rng.randint(0, 6)))) if text else []
        assert cut(splits(text, cuts), stops) == reference(text, stops), (text, stops, cuts)


def test_a_stop_spanning_two_chunks_is_cut_exactly_and_never_shown():
    cutter = StopCutter(["\nUser:"])
    assert cutter.push("Sure.\nUs") == "Sure."          # "\nUs" may begin the stop: held back
    assert not cutter.stopped
    assert cutter.push("er: next") == ""                # the stop completed: nothing of it, nothing after it
    assert cutter.matched == "\nUser:"
    assert cutter.push("more") == "" and cutter.flush() == ""


def test_held_text_is_released_when_it_cannot_be_a_stop_or_the_text_ends():
    cutter = StopCutter(["STOP"])
    assert cutter.push("a ST") == "a "
    assert cutter.push("AR") == "STAR"
    assert cutter.push(" S") == " "
    assert cutter.flush() == "S" and cutter.matched is None


def test_no_stops_pass_everything_through():
    cutter = StopCutter([])
    assert cutter.push("abc") == "abc" and cutter.flush() == "" and not cutter.stopped


def test_helpers():
    assert find_stop("xxabcd", ["bcd", "abcd"]) == (2, "abcd")   # same end: the longer
    assert find_stop("abcd", ["abcd", "bc"]) == (1, "bc")         # ends first
    assert held_tail("hello wor", ["world", "or"]) == 3
    assert check_stops(["a"] * (MAX_STOPS + 1)).startswith("at most")
    assert "empty" in check_stops([""])
    assert check_stops(["ok", "\n"]) is None


def test_messages_and_transcript():
    assert check_messages([]) == "must not be empty"
    assert "unknown role" in check_messages([ChatMessage("tool", "x")])
    assert check_messages([ChatMessage("developer", "be brief"), ChatMessage("user", "hi")]) is None
    assert plain_transcript([ChatMessage("user", "just this")]) == "just this"
    assert plain_transcript([ChatMessage("developer", "s"), ChatMessage("user", "u")]) == "system: s\nuser: u\nassistant:"


def test_openai_requests_parse_and_refuse():
    parsed = parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                  {"type": "text", "text": "b"}]}],
                         "stop": "x", "seed": -1, "temperature": 0, "user": "u", "unknown": [1],
                         "edgespec": {"window": 2, "coupled": True}})
    assert parsed.messages == (ChatMessage("user", "ab"),) and parsed.stop == ("x",)
    assert (parsed.seed, parsed.temperature, parsed.window, parsed.coupled) == (2**64 - 1, 0.0, 2, True)
    assert parse_chat({"messages": [{"role": "user", "content": "a"}]}).temperature == 1.0   # OpenAI's default
    assert parse_completion({"prompt": ["p"], "max_tokens": 3}).prompt == "p"
    for body, param in [({"messages": [{"role": "user", "content": "a"}], "n": 3}, "n"),
                        ({"messages": [{"role": "user", "content": "a"}], "max_tokens": True}, "max_tokens"),
                        ({"messages": [{"role": "user", "content": "a"}], "presence_penalty": 1}, "presence_penalty"),
                        ({"messages": [{"role": "user", "content": "a"}], "tools": [{}]}, "tools"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content")]:
        with pytest.raises(ApiError) as raised:
            parse_chat(body)
        assert raised.value.param == param and raised.value.status == 400
    with pytest.raises(ApiError):
        parse_completion({"prompt": "p", "logprobs": 99})
    with pytest.raises(ApiError):
        parse_chat([1, 2])
    assert [finish_reason(r) for r in ("eos", "stop", "length")] == ["stop", "stop", "length"]


def test_grpc_statuses_map_to_http():
    http_api = pytest.importorskip("services.coordinator.http_api")
    cases = [(errors.InvalidArgument("max_new_tokens", "too many"), 400, "max_tokens"),
             (errors.Unauthenticated("who?"), 401, None), (errors.PermissionDenied("no"), 403, None),
             (errors.ResourceExhausted("busy", retry_after_seconds=2.5), 429, None),
             (errors.Unavailable("down"), 503, None), (errors.NotFound("gone"), 500, None)]
    for error, status, param in cases:
        problem = http_api.api_error(error)
        assert (problem.status, problem.param) == (status, param)
        assert set(problem.body()["error"]) == {"message", "type", "param", "code"}
    assert http_api.api_error(cases[3][0]).retry_after == 2.5
