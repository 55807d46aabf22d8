"""The pieces of the bucketed decode path: buckets, the persistent buffers' fill and padding, the torch KV
store's padding rows, the address record, the config switches."""
import pytest
import torch

from gh200rt.config import EngineConfig, GraphConfig
from gh200rt.engine.decode_graphs import DecodeBuffers, GraphAddressChanged, bucket_for, graph_buckets
from gh200rt.engine.decode_graphs.addresses import check_addresses
from gh200rt.kv.attention import write_kv
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import ScheduledSequence, SchedulerOutput


def test_buckets_are_1_2_4_8_then_steps_of_8_up_to_the_largest():
    assert graph_buckets(1) == [1]
    assert graph_buckets(8) == [1, 2, 4, 8]
    assert graph_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert graph_buckets(256) == [1, 2, 4, 8] + list(range(16, 257, 8))
    buckets = graph_buckets(24)
    assert [bucket_for(b, buckets) for b in (1, 2, 3, 5, 8, 9, 16, 17, 24)] == [1, 2, 4, 8, 8, 16, 16, 24, 24]
    assert bucket_for(25, buckets) is None


def test_graph_config_defaults_and_errors():
    config = EngineConfig.from_kwargs(max_num_seqs=64)
    assert config.max_graph_batch == 64 and EngineConfig().max_graph_batch == 256
    assert EngineConfig.from_kwargs(max_num_seqs=512).max_graph_batch == 256
    assert EngineConfig.from_kwargs(max_graph_batch=40).max_graph_batch == 40
    assert config.use_graphs("cuda") and not config.use_graphs("cpu")
    assert EngineConfig.from_kwargs(enforce_eager=False).use_graphs("cpu")
    assert not EngineConfig.from_kwargs(enforce_eager=True).use_graphs("cuda")
    with pytest.raises(ValueError, match="--max-graph-batch must be at least 1"):
        GraphConfig(max_graph_batch=0)


def _decode_step(tables: list[list[int]], computed: list[int], block_size: int = 4) -> SchedulerOutput:
    scheduled = []
    for i, (table, done) in enumerate(zip(tables, computed)):
        seq = Sequence(f"s{i}", f"s{i}", 0, list(range(10, 10 + done + 1)), SamplingParams(max_tokens=4), i,
                       frozenset(), 64)
        seq.block_ids = list(table)
        seq.num_computed_tokens = done
        scheduled.append(ScheduledSequence(seq, 1))
    return SchedulerOutput(scheduled)


def test_fill_writes_real_rows_and_pads_the_bucket():
    buffers = DecodeBuffers(max_batch=8, max_blocks_per_seq=4, block_size=4, device="cpu")
    buffers.fill(_decode_step([[3, 5], [7], [2, 9, 4]], [5, 2, 9]), bucket=4)
    assert buffers.input_ids[:4].tolist() == [15, 12, 19, 0]
    assert buffers.positions[:4].tolist() == [5, 2, 9, 0]
    assert buffers.slot_mapping[:4].tolist() == [5 * 4 + 1, 7 * 4 + 2, 4 * 4 + 1, -1]
    assert buffers.seq_lens[:4].tolist() == [6, 3, 10, 1]
    assert buffers.block_tables[:4].tolist() == [[3, 5, 0, 0], [7, 0, 0, 0], [2, 9, 4, 0], [0, 0, 0, 0]]
    meta = buffers.meta(4)
    assert meta.query_lens_list == [1] * 4 and meta.seq_lens_list == [16] * 4 and meta.query_start_loc.tolist() == \
        [0, 1, 2, 3, 4]
    # a smaller, narrower step clears what the last one left in rows and columns it no longer uses
    buffers.fill(_decode_step([[6]], [1]), bucket=2)
    assert buffers.block_tables.tolist() == [[6, 0, 0, 0]] + [[0, 0, 0, 0]] * 7
    assert buffers.slot_mapping[:2].tolist() == [6 * 4 + 1, -1]


def test_fill_refuses_a_sequence_longer_than_the_buffers_hold():
    buffers = DecodeBuffers(max_batch=2, max_blocks_per_seq=2, block_size=4, device="cpu")
    with pytest.raises(ValueError, match="holds 3 KV blocks"):
        buffers.fill(_decode_step([[1, 2, 3]], [9]), bucket=1)


@pytest.mark.parametrize("strided", [False, True])
def test_torch_write_kv_skips_negative_slots(strided):
    pool = torch.randn(2, 5, 2, 4, 8, 2)[..., 0] if strided else torch.randn(2, 5, 2, 4, 8)
    before = pool.clone()
    k, v = torch.randn(3, 4, 8), torch.randn(3, 4, 8)
    write_kv(pool, k, v, torch.tensor([7, -1, 2]))
    expected = before.clone()
    expected[0, 3, 1], expected[1, 3, 1] = k[0], v[0]
    expected[0, 1, 0], expected[1, 1, 0] = k[2], v[2]
    assert torch.equal(pool, expected)


def test_address_check_names_what_moved():
    captured = {"kv_cache[0]": (0x1000, 64), "inputs.int64": (0x2000, 32)}
    check_addresses(4, captured, dict(captured))
    with pytest.raises(GraphAddressChanged, match=r"bucket 4 .*kv_cache\[0\]: 0x1000 \(64 B\) -> 0x3000 \(64 B\)"):
        check_addresses(4, captured, {"kv_cache[0]": (0x3000, 64), "inputs.int64": (0x2000, 32)})
    with pytest.raises(GraphAddressChanged, match="inputs.int64: 0x2000 .* -> gone"):
        check_addresses(4, captured, {"kv_cache[0]": (0x1000, 64)})


def test_the_graph_pool_is_booked_before_the_kv_cache_on_a_gpu_only():
    from gh200rt.engine.decode_graphs import reserve_graph_pool
    from gh200rt.memory.ledger import DeviceMemoryLedger
    from gh200rt.models.arch_config import ArchConfig
    from gh200rt.planner.cost_model import graph_pool_bytes
    arch = ArchConfig("llama", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=64, vocab_size=300)
    booked = {}
    for label, device, options in (("gpu", "cuda", {}), ("cpu", "cpu", {"enforce_eager": False}),
                                   ("eager gpu", "cuda", {"enforce_eager": True})):
        ledger = DeviceMemoryLedger(1 << 30)
        reserve_graph_pool(ledger, EngineConfig.from_kwargs(max_num_seqs=32, **options), arch, "bf16", device)
        booked[label] = ledger.by_kind["graph_pools"]
    assert booked == {"gpu": graph_pool_bytes(arch, graph_buckets(32), "bf16"), "cpu": 0, "eager gpu": 0}
    assert graph_pool_bytes(arch, [1, 2, 4], "bf16") <= graph_pool_bytes(arch, [1, 2, 4, 8], "bf16")
    # whole allocator segments: the 8B shape's graphs up to batch 32 needed 21.5 MiB on an H200 (3.7 MiB of tensors)
    llama8b = ArchConfig("llama", hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128, vocab_size=128256)
    assert graph_pool_bytes(llama8b, graph_buckets(32), "bf16") >= 21.5 * 2**20
    assert graph_pool_bytes(llama8b, graph_buckets(32), "bf16") < graph_pool_bytes(llama8b, graph_buckets(256), "bf16")


def test_what_a_gpu_setup_lacks_for_capture(monkeypatch):
    from gh200rt.backends.cuda.ops import TRITON_OPS
    from gh200rt.backends.interface import switch_hooks
    from gh200rt.engine.decode_graphs import graphs_missing, runner
    from tests.gpu.gpu_models import tiny_arch, tiny_model
    model = tiny_model(tiny_arch(num_layers=2), torch.float32, "cpu")
    assert graphs_missing(model, "cpu") is None
    assert "Triton KV store" in graphs_missing(model, "cuda")
    switch_hooks(model, TRITON_OPS)
    assert graphs_missing(model, "cuda") is None

    class Store:
        backend = object()
    monkeypatch.setattr(runner, "_has_cuda_bindings", lambda: False)
    assert "cuda-bindings" in graphs_missing(model, "cuda", Store())
    assert graphs_missing(model, "cuda", None) is None


class GrowingCapture:
    """A capture whose pool grows by the given bytes per capture and keeps them after its graphs are dropped."""

    def __init__(self, growth: list[int]):
        self.growth, self.pool_bytes, self.dropped = list(growth), 0, 0

    def capture(self, step, hooks):
        from gh200rt.backends.cuda.graph_capture import CapturedStep
        grown = self.growth.pop(0)
        self.pool_bytes += grown
        return CapturedStep(step, None, grown)

    def replay(self, captured, hooks):
        return captured.graph()

    def graphs_dropped(self):
        self.dropped += 1
        self.pool_bytes = 0      # a fresh pool, as CudaCapture's


def _runner_with(capture, booked: int, budget: int, plan_version):
    from gh200rt.engine.decode_graphs.runner import DecodeGraphRunner
    from gh200rt.memory.ledger import DeviceMemoryLedger
    ledger = DeviceMemoryLedger(budget)
    ledger.reserve("graph_pools", booked)
    hooks = type("Hooks", (), {"plan_version": property(lambda self: plan_version[0]),
                               "self_contained": lambda self: __import__("contextlib").nullcontext(),
                               "begin_step": lambda self, bucket: None})()
    buffers = DecodeBuffers(max_batch=4, max_blocks_per_seq=2, block_size=4, device="cpu")
    runner = DecodeGraphRunner(torch.nn.Module(), [], buffers, [1, 2, 4], hooks, ledger=ledger)
    runner.capture = capture
    runner._step = lambda bucket: (lambda: torch.zeros(bucket, 8))
    runner.addresses = dict
    return runner, ledger


def test_a_placement_change_tells_the_capture_its_graphs_are_gone_and_the_pool_stays_booked():
    plan_version = [0]
    capture = GrowingCapture([10, 5, 4, 0])
    runner, ledger = _runner_with(capture, booked=12, budget=100, plan_version=plan_version)
    runner.run(_decode_step([[1]], [1]))
    runner.run(_decode_step([[1], [2]], [1, 1]))
    assert runner.pool_bytes == 15 and ledger.by_kind["graph_pools"] == 15 and capture.dropped == 0
    plan_version[0] = 1                          # a tier move: the graphs go, the pool's blocks stay
    runner.run(_decode_step([[1]], [1]))
    assert capture.dropped == 1 and runner.graphs.keys() == {1} and runner.captures == 3
    assert runner.pool_bytes == 15 and ledger.by_kind["graph_pools"] == 15, "a high-water mark, not reset"
    assert capture.pool_bytes == 4, "the new generation's pool counts from zero"


def test_a_graph_dropped_for_not_fitting_alone_leaves_its_pool_and_later_captures_take_a_fresh_one():
    """The first H100 run: bucket 1 did not fit, was dropped, and the next capture into the same (now unused)
    pool aborted the process. With no graph left to hold the pool, the next capture must use a fresh one."""
    capture = GrowingCapture([30, 8])
    runner, ledger = _runner_with(capture, booked=10, budget=20, plan_version=[0])
    runner.run(_decode_step([[1]], [1]))          # grows the pool by 30: 20 more than booked, 10 free
    assert runner.eager_buckets == {1} and runner.graphs == {} and capture.dropped == 1
    runner.run(_decode_step([[1], [2]], [1, 1]))  # 8 bytes into a fresh pool: within the booking
    assert runner.eager_buckets == {1} and runner.graphs.keys() == {2}
    assert ledger.by_kind["graph_pools"] == 10


def test_a_graph_dropped_for_not_fitting_beside_others_keeps_their_pool_and_its_blocks_serve_later_captures():
    capture = GrowingCapture([6, 30, 0])
    runner, ledger = _runner_with(capture, booked=10, budget=20, plan_version=[0])
    runner.run(_decode_step([[1]], [1]))
    runner.run(_decode_step([[1], [2]], [1, 1]))  # 30 more: over the ledger, dropped beside bucket 1's graph
    assert runner.eager_buckets == {2} and runner.graphs.keys() == {1} and capture.dropped == 0
    runner.run(_decode_step([[1], [2], [3]], [1, 1, 1]))    # reuses the dropped graph's cached blocks
    assert runner.graphs.keys() == {1, 4} and ledger.by_kind["graph_pools"] == 10


def test_addresses_record_the_storage_a_wrapper_reads_not_the_wrapper():
    from types import SimpleNamespace

    from gh200rt.engine.decode_graphs.addresses import graph_addresses
    from gh200rt.weights.forms import UpcastWeight
    slot = torch.zeros(8, 4, dtype=torch.bfloat16)
    ref = SimpleNamespace(current=UpcastWeight(slot))
    model = torch.nn.Module()
    model.layers = [None]
    model.layer_weight_refs = lambda layer: {"mlp.down_proj": ref}
    captured = graph_addresses(model, [], {}, [])
    assert captured["layer 0 mlp.down_proj.tensor"] == (slot.data_ptr(), slot.nbytes)
    ref.current = UpcastWeight(slot)             # rebuilt over the same memory: nothing moved
    check_addresses(1, captured, graph_addresses(model, [], {}, []))
    ref.current = UpcastWeight(slot.clone())     # over other memory: a replay would read the wrong bytes
    with pytest.raises(GraphAddressChanged, match="layer 0 mlp.down_proj.tensor"):
        check_addresses(1, captured, graph_addresses(model, [], {}, []))


def test_an_moe_model_captures_only_with_every_layer_in_the_fused_kernels():
    """The grouped torch experts read each expert's token count on the host; the fused kernels do not, so
    capture needs them in every MoE layer, over weights they can read and no streamed experts."""
    from types import SimpleNamespace

    from gh200rt.backends.cuda.ops import TRITON_OPS
    from gh200rt.backends.interface import switch_hooks
    from gh200rt.engine.decode_graphs import graphs_missing, reserve_graph_pool
    from gh200rt.memory.ledger import DeviceMemoryLedger
    from gh200rt.models.arch_config import ArchConfig
    from gh200rt.models.layers.moe_experts import ExpertAccess
    from gh200rt.models.moe import SparseMoeBlock
    from gh200rt.planner.cost_model import graph_pool_bytes
    arch = ArchConfig("qwen3_moe", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, vocab_size=100, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    assert arch.is_moe
    block = SparseMoeBlock(arch, torch.float32, "cpu")
    model = SimpleNamespace(arch=arch, modules=lambda: [block])
    assert "fused MoE kernels" in graphs_missing(model, "cuda") and graphs_missing(model, "cpu") is None
    switch_hooks(block, TRITON_OPS)
    assert "weight is on cpu" in graphs_missing(model, "cuda")      # CPU weights: not what a GPU kernel reads
    assert block.fused_experts_fn.why_not(block, torch.device("cpu")) is None

    class Streamed(ExpertAccess):
        def stages_experts(self) -> bool:
            return True
    block.expert_access = Streamed()
    assert "streamed or cpu-tier experts" in graphs_missing(model, "cuda")
    ledger = DeviceMemoryLedger(1 << 30)
    reserve_graph_pool(ledger, EngineConfig.from_kwargs(max_num_seqs=32), arch, "bf16", "cuda")
    assert ledger.by_kind["graph_pools"] == graph_pool_bytes(arch, graph_buckets(32), "bf16")