import json

from gh200rt.serve.tokenizer_info import token_strings, tokenizer_info
from gh200rt.tokenizer.hf_dir import tokenizer_from_hf_dir
from tests.server.byte_llama import CHAT_TEMPLATE, write_byte_tokenizer


def test_tokenizer_info_is_the_config_with_class_and_template_and_token_strs_are_vocab_entries(tmp_path):
    write_byte_tokenizer(str(tmp_path))
    with open(tmp_path / "tokenizer_config.json") as f:
        config = json.load(f)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "vocab_file": "/somewhere/vocab.json"}))
    tok = tokenizer_from_hf_dir(str(tmp_path))
    info = tokenizer_info(tok)
    assert "vocab_file" not in info and info["chat_template"] == CHAT_TEMPLATE
    assert info["tokenizer_class"] == config.get("tokenizer_class", "Tokenizer")
    assert info["eos_token"] == tok.eos_token
    json.dumps(info)
    ids = tok.encode("hi there", add_special_tokens=False)
    assert token_strings(tok, ids) == [tok.backend.id_to_token(i) for i in ids] and "Ġ" in "".join(token_strings(tok, ids))
