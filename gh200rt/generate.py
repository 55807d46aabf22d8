"""Command line generation: ``python -m gh200rt.generate --prompt "..."`` (or ``--chat``).

Sampling options map one to one onto ``SamplingParams``; engine flags are generated from the
config dataclasses (``gh200rt.cli_args``). Text is streamed to stdout as it is produced.
"""
from __future__ import annotations

import argparse
import sys

from gh200rt.cli_args import add_engine_arguments, engine_config_from_args
from gh200rt.sampling_params import SamplingParams


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gh200rt.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", action="append", required=True,
                        help="prompt text; repeat the flag for several prompts")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    parser.add_argument("--system", default=None, help="system message for --chat")
    s = parser.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repetition-penalty", type=float, default=1.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--sample-seed", type=int, default=None, help="per-request sampling seed")
    s.add_argument("--stop", action="append", default=[], help="stop string; repeatable")
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("-n", type=int, default=1, help="completions per prompt")
    add_engine_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = engine_config_from_args(parser, args)
    try:
        params = SamplingParams(
            n=args.n, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            min_p=args.min_p, repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty, seed=args.sample_seed, stop=args.stop,
            ignore_eos=args.ignore_eos)
    except ValueError as e:
        parser.error(str(e))
    from gh200rt.engine.engine import LLMEngine
    try:
        engine = LLMEngine.from_config(config)
    except ValueError as e:
        parser.error(str(e))
    prompts = args.prompt
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        prompts = [engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": p}],
                                                        add_generation_prompt=True) for p in prompts]
    for i, prompt in enumerate(prompts):
        try:
            engine.add_request(str(i), prompt, params)
        except ValueError as e:
            parser.error(f"prompt {i}: {e}")
    single = len(prompts) == 1 and params.n == 1
    while engine.has_unfinished_requests():
        for out in engine.step():
            if single:
                sys.stdout.write(out.outputs[0].delta_text)
                sys.stdout.flush()
            elif out.finished:
                for c in out.outputs:
                    print(f"[{out.request_id}.{c.index}] {c.text}")
    if single:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
