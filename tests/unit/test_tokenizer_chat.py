"""Tokenizer built from an HF directory: special ids, eos from generation_config, chat template rendering/errors."""
import json

import pytest

from gh200rt.tokenizer.hf_dir import tokenizer_from_hf_dir
from tests.model.tiny_checkpoints import write_tokenizer


@pytest.fixture
def tokenizer_dir(tmp_path):
    write_tokenizer(str(tmp_path))
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [2, 7]}, f)
    return tmp_path


def test_ids_and_round_trip(tokenizer_dir):
    tok = tokenizer_from_hf_dir(str(tokenizer_dir))
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.eos_token_ids == (2, 7)
    ids = tok.encode("w5 w9 w200")
    assert ids == [5, 9, 200] and tok.decode(ids) == "w5 w9 w200"
    assert tok.convert_ids_to_tokens([5, 2]) == ["w5", "</s>"] and tok.vocab_size == 256


def test_chat_template_from_tokenizer_config(tokenizer_dir):
    tok = tokenizer_from_hf_dir(str(tokenizer_dir))
    messages = [{"role": "user", "content": "w3 w4"}]
    assert tok.apply_chat_template(messages) == "user: w3 w4\n"
    assert tok.apply_chat_template(messages, tokenize=True) == tok.encode("user: w3 w4\n", add_special_tokens=False)


def test_chat_template_jinja_file_wins_and_sees_special_tokens(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ extra }}")
    tok = tokenizer_from_hf_dir(str(tokenizer_dir))
    out = tok.apply_chat_template([{"role": "user", "content": "é<b>"}], extra="!")
    assert out == '<s>"é<b>">!'


def test_template_errors_and_bad_messages(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}ok")
    tok = tokenizer_from_hf_dir(str(tokenizer_dir))
    with pytest.raises(ValueError, match="first message must be user"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match="non-empty list"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match="message 0 must be a dict with a 'role'"):
        tok.apply_chat_template(["hello"])


def test_invalid_template_syntax(tokenizer_dir):
    (tokenizer_dir / "chat_template.jinja").write_text("{% for m in messages %}")
    tok = tokenizer_from_hf_dir(str(tokenizer_dir))
    with pytest.raises(ValueError, match="chat template is not valid jinja"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        tokenizer_from_hf_dir(str(tmp_path))


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_continue_final_message_ends_inside_the_assistant_turn():
    from gh200rt.tokenizer.chat_template import render_chat
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, wor "}]
    text = render_chat(CHATML, messages, False, {}, continue_final_message=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello, wor"
    assert render_chat(CHATML, messages, False, {}).endswith("<|im_end|>\n")
    with pytest.raises(ValueError, match="exclude"):
        render_chat(CHATML, messages, True, {}, continue_final_message=True)
    with pytest.raises(ValueError, match="text to continue"):
        render_chat(CHATML, messages[:1] + [{"role": "assistant", "content": ""}], False, {},
                    continue_final_message=True)
