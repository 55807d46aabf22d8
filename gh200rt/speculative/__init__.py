"""Speculative decoding (docs/SPECULATIVE.md): a proposer drafts tokens on the host (``ngram.py``), the scheduler
gives each drafting sequence 1 + k positions in a step, the model computes them in one pass, and ``verify.py`` keeps
the drafted tokens the target model would have produced (greedy: exactly; sampled: by rejection sampling, so the
output is drawn from the target's distribution) plus one token of its own."""
