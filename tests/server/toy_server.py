"""Runs the real server (gh200rt.serve.run_server, real LLMEngine) over the one-layer toy model of
tests/engine, so HTTP behaviour can be tested in seconds. Same flags as ``python -m gh200rt.serve``."""
import os
import sys
import threading
import time

from gh200rt.engine.engine import LLMEngine
from gh200rt.serve.__main__ import run_server
from gh200rt.serve.args import parse_args
from gh200rt.tokenizer.chat_template import render_chat
from tests.engine.toy_model import ToyArch, ToyModel, ToyTokenizer


class ChatToyTokenizer(ToyTokenizer):
    """The toy tokenizer with the interface of gh200rt.tokenizer.Tokenizer the server uses.
    TOY_TOKENIZE_SECONDS makes chat tokenization slow and serialised, as on a saturated CPU."""
    _busy = threading.Lock()

    def encode(self, text, add_special_tokens=True):
        return super().encode(text)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, continue_final_message=False,
                            chat_template=None, **extra):
        """The toy's own rendering, or a request's ``chat_template`` rendered as gh200rt's Tokenizer renders it
        (with ``extra``: the request's chat_template_kwargs)."""
        with self._busy:
            time.sleep(float(os.environ.get("TOY_TOKENIZE_SECONDS", "0")))
        if chat_template is not None:
            text = render_chat(chat_template, messages, add_generation_prompt, {}, continue_final_message, **extra)
            return self.encode(text) if tokenize else text
        text = "".join(f"<{m['role']}>{m['content'] or ''}" for m in messages)
        text += "<assistant>" if add_generation_prompt and not continue_final_message else ""
        return self.encode(text) if tokenize else text


class SlowToyModel(ToyModel):
    """Each forward sleeps a little so streams overlap with disconnects and signals, as on a real model."""
    def forward(self, *args):
        time.sleep(0.01)
        return super().forward(*args)


def main(argv):
    server_config, engine_config = parse_args(argv)
    arch = ToyArch(max_position_embeddings=engine_config.model.max_model_len or 256)

    def build():
        gate = os.environ.get("TOY_LOAD_GATE")      # tests hold the load here to see the server while it loads
        while gate and not os.path.exists(gate):
            time.sleep(0.02)
        return LLMEngine(SlowToyModel(arch), ChatToyTokenizer(), arch, engine_config)

    return run_server(server_config, engine_config, build)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
