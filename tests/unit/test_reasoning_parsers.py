"""Reasoning parsers (vLLM's --reasoning-parser names): where the <think> block ends, what is reasoning and what is
answer, whole and streamed in any split of the text (a tag cut across deltas is held back, never sent as text)."""
import pytest

from gh200rt.serve.reasoning import PARSERS, ReasoningStream

R1, QWEN3 = PARSERS["deepseek_r1"], PARSERS["qwen3"]


@pytest.mark.parametrize("parser,text,want", [
    (R1, "Let me see. 2+2=4.</think>\n\nIt is 4.", ("Let me see. 2+2=4.", "\n\nIt is 4.")),
    (R1, "<think>hmm</think>yes", ("hmm", "yes")),           # a block the model opened itself
    (R1, "still thinking when max_tokens", ("still thinking when max_tokens", None)),
    (R1, "</think>", ("", None)),
    (QWEN3, "<think>\nplan\n</think>\n\nAnswer.", ("\nplan\n", "\n\nAnswer.")),
    (QWEN3, "Answer without thinking.", (None, "Answer without thinking.")),
    (QWEN3, "<think>cut short", ("cut short", None)),
    (QWEN3, "<thi", (None, "<thi")),                         # a tag that never completed is text
    (PARSERS["glm45"], "\n<think>x</think>y", ("x", "y")),
])
def test_whole_answers(parser, text, want):
    assert parser.split(text) == want


@pytest.mark.parametrize("parser", [R1, QWEN3])
@pytest.mark.parametrize("text", ["<think>a</think>b", "abc</think>def", "plain answer", "<think>open", "x</thi",
                                  "<think></think>", "a</think>b</think>c"])
def test_every_split_of_a_stream_gives_the_whole_answers_parts(parser, text):
    """Fed in two pieces at every cut (and character by character), the deltas add up to split()'s parts (a tag
    cut across pieces is held back, not sent as reasoning or content) and no reasoning delta carries a tag."""
    want_reasoning, want_content = parser.split(text)
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in cuts:
        stream = ReasoningStream(parser)
        reasoning = content = ""
        for piece in pieces:
            r, c = stream.feed(piece)
            assert "</think>" not in r and "<think>" not in r           # the tags never reach the reasoning
            reasoning, content = reasoning + r, content + c
        r, c = stream.finish()
        reasoning, content = reasoning + r, content + c
        assert (reasoning if stream.reasoned else None, content or None) == (want_reasoning, want_content), pieces
