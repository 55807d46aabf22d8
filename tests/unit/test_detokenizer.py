from gh200rt.engine.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """Token i is the byte string VOCAB[i]; decoding joins the bytes (multi-byte chars may split)."""
    VOCAB = [b"<s>", b"Hello", b" wor", b"ld", b"\xe2\x82", b"\xac", b" ST", b"OP", b"!", b" S"]

    def decode(self, ids, skip_special_tokens=True):
        parts = [self.VOCAB[i] for i in ids if not (skip_special_tokens and i == 0)]
        return b"".join(parts).decode("utf-8", errors="replace")


def stream(tokens, **kw):
    d = IncrementalDetokenizer(ByteTokenizer(), [0], **kw)
    deltas = []
    for t in tokens:
        d.add_token(t)
        deltas.append(d.delta(final=False))
        if d.stopped_by:
            break
    deltas.append(d.delta(final=True))
    return d, deltas


def test_plain_text_streams_token_by_token():
    d, deltas = stream([1, 2, 3])
    assert deltas == ["Hello", " wor", "ld", ""]
    assert d.text == "Hello world"


def test_split_utf8_character_is_never_emitted_half():
    d, deltas = stream([1, 4, 5, 8])
    assert deltas == ["Hello", "", "\u20ac", "!", ""]
    assert all("\ufffd" not in x for x in deltas)


def test_stop_string_is_cut_and_its_prefix_held_back():
    d, deltas = stream([1, 6, 7, 8], stop=[" STOP"])
    assert deltas == ["Hello", "", "", ""]
    assert d.text == "Hello" and d.stopped_by == " STOP"


def test_held_back_prefix_is_released_when_it_stops_matching():
    d, deltas = stream([1, 9, 2, 3], stop=[" STOP"])
    assert deltas == ["Hello", "", " S wor", "ld", ""]


def test_include_stop_string_in_output():
    d, deltas = stream([1, 6, 7, 8], stop=[" STOP"], include_stop_str_in_output=True)
    assert "".join(deltas) == "Hello STOP"


def test_final_flush_releases_held_text():
    d, deltas = stream([1, 9], stop=[" STOP"])
    assert deltas == ["Hello", "", " S"]
