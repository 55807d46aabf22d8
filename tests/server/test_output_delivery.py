"""The engine thread hands a step's outputs to the asyncio side in one wake-up per event loop: each
``call_soon_threadsafe`` writes to the loop's self-pipe, so a step of 64 sequences would otherwise make 64
system calls on the engine thread. Every output still reaches its own request's queue, in step order."""
import asyncio

from gh200rt.engine.outputs import CompletionOutput, RequestOutput
from gh200rt.sampling_params import SamplingParams
from gh200rt.serve.async_engine import AsyncEngine


class _TwoStepEngine:
    """Once five requests are in, each gets one output per step for two steps, then finishes."""

    def __init__(self):
        self.steps: dict[str, int] = {}
        self.started = False

    def add_request(self, request_id, prompt, params, prompt_token_ids=None):
        self.steps[request_id] = 0

    def abort(self, request_id):
        self.steps.pop(request_id, None)

    def has_unfinished_requests(self):
        return len(self.steps) == 5 or (self.started and bool(self.steps))

    def step(self):
        self.started = True
        outputs = []
        for rid in sorted(self.steps):
            self.steps[rid] += 1
            done = self.steps[rid] == 2
            outputs.append(RequestOutput(rid, None, [1], [CompletionOutput(0, delta_token_ids=[self.steps[rid]])],
                                         finished=done))
        self.steps = {rid: n for rid, n in self.steps.items() if n < 2}
        return outputs


def test_a_steps_outputs_reach_every_queue_in_one_wake_up_per_loop():
    async def run():
        loop = asyncio.get_running_loop()
        wake_ups = []
        real = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            wake_ups.append(callback.__name__)
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        engine = AsyncEngine(_TwoStepEngine)
        engine.start()
        assert engine.ready.wait(10)
        sinks = {f"r{i}": engine.add(f"r{i}", None, [1], SamplingParams()) for i in range(5)}
        got = {}
        for rid, sink in sinks.items():
            items = [await asyncio.wait_for(sink.get(), 10) for _ in range(3)]
            got[rid] = [(kind, payload.outputs[0].delta_token_ids if kind == "output" else None)
                        for kind, _, payload in items]
        engine.shutdown()
        loop.call_soon_threadsafe = real
        return got, wake_ups

    got, wake_ups = asyncio.run(run())
    assert got == {f"r{i}": [("ok", None), ("output", [1]), ("output", [2])] for i in range(5)}
    # five "ok"s (one per accepted request) and one wake-up per step for the five outputs of each
    assert wake_ups.count("_put_each") == 2, wake_ups
