from edgespec.backends.tokenizer import ByteTokenizer, TextStream


def test_text_stream_holds_back_a_split_multibyte_character():
    stream = TextStream(ByteTokenizer())
    first, second = "ü".encode()
    assert stream.push([ord("a"), first]) == "a"
    assert stream.push([second, ord("b")]) == "üb"
    assert stream.flush() == ""


def test_text_stream_flushes_an_unfinished_character_at_the_end():
    stream = TextStream(ByteTokenizer())
    assert stream.push(list("x€".encode())[:-1]) == "x"
    assert stream.flush() == "\ufffd"


def test_byte_tokenizer_skips_eos_when_decoding():
    tok = ByteTokenizer()
    assert tok.encode("hi", chat=True) == [104, 105]
    assert tok.decode([104, 105, ByteTokenizer.EOS]) == "hi"
