import pytest

from gh200rt.config import MemoryConfig
from gh200rt.memory.ledger import CPU_DEFAULT_KV_BYTES, DeviceMemoryLedger, LedgerOverCommit, ledger_capacity


def test_capacity_from_budget_else_utilization_else_cpu_all_resident_plus_kv():
    assert ledger_capacity(MemoryConfig(device_memory_budget="1GiB"), 10**12) == 1 << 30
    assert ledger_capacity(MemoryConfig(gpu_memory_utilization=0.5), 1000) == 500
    assert ledger_capacity(MemoryConfig(), None, 1000) == 1000 + CPU_DEFAULT_KV_BYTES
    assert ledger_capacity(MemoryConfig(), None, 1000, useful_kv_bytes=5000) == 6000  # never more KV than usable


def test_reserve_release_and_peak():
    ledger = DeviceMemoryLedger(capacity=1000)
    ledger.reserve("resident_weights", 600)
    ledger.reserve("kv_pool", 300)
    ledger.release("kv_pool", 300)
    ledger.reserve("staging_ring", 100)
    assert ledger.used == 700 and ledger.peak == 900 and ledger.free == 300


def test_overcommit_names_numbers_and_flag():
    ledger = DeviceMemoryLedger(capacity=1 << 30)
    ledger.reserve("resident_weights", 1 << 29)
    with pytest.raises(LedgerOverCommit, match="--device-memory-budget") as info:
        ledger.reserve("kv_pool", 1 << 30)
    assert "1.000 GiB" in str(info.value) and "0.500 GiB" in str(info.value)
    assert ledger.used == 1 << 29  # a failed reserve changes nothing


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="kv_pool"):
        DeviceMemoryLedger(capacity=10).reserve("weights", 1)
