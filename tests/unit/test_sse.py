"""SSE chunks stay one line for every reader: text holding U+0085, U+2028 or U+2029 (a model can generate them)
is escaped, so httpx's ``aiter_lines`` (``str.splitlines`` rules) reads one ``data:`` line that decodes to the
same text; control characters are escaped by JSON itself."""
import json

from gh200rt.serve.sse import sse_event


def test_a_chunk_with_unicode_line_breaks_is_one_line_for_splitlines_readers():
    text = "a\x85b\u2028c\u2029d\x0be\x0cf\x1cg\rh\ni é"
    event = sse_event({"choices": [{"text": text}]})
    lines = [line for line in event.decode().splitlines() if line]      # what httpx's aiter_lines splits on
    assert len(lines) == 1 and lines[0].startswith("data: ")
    assert json.loads(lines[0][6:])["choices"][0]["text"] == text
    assert "é".encode() in event                      # other text stays UTF-8, not \\u escapes
