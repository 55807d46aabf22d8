"""The weight store makes a layer's resident forms side by side on the torch threads (fbgemm's fp16 packing and
oneDNN's reorder release the GIL): an engine built so gives the forms and the bits of one built on a single thread,
on every CPU route."""
import contextlib

import torch

from gh200rt.backends.cpu.prepack import cpu_route_form, linear_formats, run_route_probes, side_by_side
from gh200rt.formats.quantizers import torch_threads
from gh200rt.sampling_params import SamplingParams
from tests.engine.route_engines import describe_difference, first_step_logits, route_llm


def test_forms_made_side_by_side_give_one_threads_forms_and_bits(cpu_route, short_smollm2):
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompt = list(range(100, 137))
    results = []
    for threads in (1, max(2, torch.get_num_threads())):
        with contextlib.ExitStack() as engine:
            with torch_threads(threads):
                llm = engine.enter_context(route_llm(cpu_route, short_smollm2, enable_prefix_caching=False))
            # the forms are made; every engine steps on the same threads
            results.append((linear_formats(llm.engine.runner.model), *first_step_logits(llm, prompt, params)))
    (forms, tokens, logits), (forms_2, tokens_2, logits_2) = results
    assert forms_2 == forms
    assert torch.equal(logits_2, logits), f"{cpu_route.name}: {describe_difference(logits_2, logits)}"
    assert tokens_2 == tokens


def test_side_by_side_keeps_the_names_and_makes_each_form_once():
    gen = torch.Generator().manual_seed(3)
    weights = {name: torch.randn(rows, 64, generator=gen) for name, rows in (("a", 16), ("b", 640), ("c", 96))}
    made = []

    def make(name, weight):
        made.append(name)
        return weight * 2
    forms = side_by_side(weights, make, threads=3)
    assert list(forms) == ["a", "b", "c"] and sorted(made) == ["a", "b", "c"]
    assert all(torch.equal(forms[name], weights[name] * 2) for name in weights)


def test_route_forms_made_side_by_side_compute_what_one_by_one_computes(cpu_route):
    """Each route's form of a few weights (fbgemm's pieces, oneDNN's reordered copy, native tiles), made on two
    threads and on one: the same products, bit for bit."""
    from gh200rt.backends.cpu.routes import route_for
    route = route_for("auto", cpu_route.cpu_route)
    gen = torch.Generator().manual_seed(5)
    weights = {f"w{rows}": torch.randn(rows, 256, generator=gen).to(route.dtype) for rows in (64, 320, 1088)}
    run_route_probes(route.linear_format)
    with torch.inference_mode():
        alone = side_by_side(weights, lambda _, w: cpu_route_form(w, route.linear_format), threads=1)
        together = side_by_side(weights, lambda _, w: cpu_route_form(w, route.linear_format), threads=2)
        x = torch.randn(12, 256, generator=gen).to(route.dtype)
        for name in weights:
            a, b = alone[name], together[name]
            assert type(a) is type(b), name
            if not isinstance(a, torch.Tensor):
                assert torch.equal(a.linear(x), b.linear(x)), name
