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


def test_an_answer_that_ends_inside_a_character_ends_before_it():
    """max_tokens reached after the first half of a multi-byte character: the half is held back at the end too, not
    released as U+FFFD (as vLLM's answers end; issue 48)."""
    d, deltas = stream([1, 4])
    assert deltas == ["Hello", "", ""] and d.text == "Hello"


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


class PlainDetokenizer:
    """The detokenizer's rules on one growing string (what IncrementalDetokenizer computes over its pieces)."""

    def __init__(self, tokenizer, prompt, stop, include_stop):
        self.tokenizer, self.stop, self.include_stop = tokenizer, stop, include_stop
        self.tokens, self.prefix, self.read = list(prompt[-5:]), 0, len(prompt[-5:])
        self.text, self.emitted, self.stopped_by = "", 0, None

    def add_token(self, token):
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self.prefix:self.read])
        after = self.tokenizer.decode(self.tokens[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None
        old = len(self.text)
        self.text += after[len(before):]
        self.prefix, self.read = self.read, len(self.tokens)
        if not self.stop or self.stopped_by:
            return None
        found = [(i, s) for s in self.stop if (i := self.text.find(s, max(0, old - len(s) + 1))) >= 0]
        if not found:
            return None
        i, s = min(found, key=lambda f: f[0])
        self.text, self.stopped_by = self.text[:i + len(s) if self.include_stop else i], s
        return s

    def delta(self, final):
        held = max([k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])], default=0)
        end = max(len(self.text) if final or self.stopped_by else len(self.text) - held, self.emitted)
        out, self.emitted = self.text[self.emitted:end], end
        return out


def test_random_streams_give_the_plain_strings_deltas_text_and_stops():
    # the pieces, the tail windows and the stop search must give what one growing string gives, token by token
    import random
    rng = random.Random(7)
    tok = ByteTokenizer()
    for trial in range(400):
        stop = rng.sample([" STOP", "ld!", "\u20ac", " S wor", "Hello Hello", "o"], rng.randrange(0, 3))
        include = rng.random() < 0.3
        tokens = [rng.randrange(1, len(tok.VOCAB)) for _ in range(rng.randrange(1, 30))]
        fast = IncrementalDetokenizer(tok, [0], stop=stop, include_stop_str_in_output=include)
        plain = PlainDetokenizer(tok, [0], stop, include)
        for t in tokens:
            assert fast.add_token(t) == plain.add_token(t), (trial, tokens)
            assert fast.delta(final=False) == plain.delta(final=False), (trial, tokens)
            assert fast.length == len(plain.text), (trial, tokens)
            if rng.random() < 0.2:        # reading the text joins the pieces: mostly let them pile up
                assert fast.text == plain.text, (trial, tokens)
            if plain.stopped_by:
                break
        assert fast.delta(final=True) == plain.delta(final=True) and fast.stopped_by == plain.stopped_by
        assert fast.text == plain.text


def test_long_streams_join_their_pieces_and_keep_every_snapshot():
    # past _MAX_PIECES pieces the text is joined into one; an earlier snapshot (the pieces list and a length, as
    # outputs hold it) must keep reading its own prefix
    import random
    from gh200rt.engine import detokenizer
    rng = random.Random(3)
    tok = ByteTokenizer()
    for stop in ([], ["zzz", "ld!"], [" STOP"]):
        fast = IncrementalDetokenizer(tok, [0], stop=stop)
        plain = PlainDetokenizer(tok, [0], stop, False)
        snapshots = []
        for i in range(3 * detokenizer._MAX_PIECES):
            t = rng.choice([1, 2, 3, 8, 9])
            assert fast.add_token(t) == plain.add_token(t)
            assert fast.delta(final=False) == plain.delta(final=False)
            if i % 97 == 0:
                snapshots.append((fast.pieces, len(fast.pieces), fast.emitted, plain.text[:plain.emitted]))
            if plain.stopped_by:
                break
        assert len(fast.pieces) <= detokenizer._MAX_PIECES
        assert fast.delta(final=True) == plain.delta(final=True) and fast.text == plain.text
        for pieces, count, length, want in snapshots:
            assert "".join(pieces[:count])[:length] == want
