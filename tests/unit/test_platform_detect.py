"""Platform detection pieces that run without a GPU: the GPU's NUMA node from sysfs fixture trees of
other machines, CUDA's integer PCI ids as sysfs names, and device names to built-in profiles."""
import warnings
from pathlib import Path

import pytest

from gh200rt.platform.detect import gpu_numa_node, pci_address, profile_for_device

FIXTURES = Path(__file__).parents[1] / "numa" / "fixtures"


def test_pci_address_from_cuda_integer_ids():
    # torch reports pci_domain_id / pci_bus_id / pci_device_id as ints (0xca = 202)
    assert pci_address(0, 0xCA, 0) == "0000:ca:00.0"
    assert pci_address(9, 1, 0) == "0009:01:00.0"


@pytest.mark.parametrize("machine,bus_id,node", [
    ("x86-2socket", pci_address(0, 0x17, 0), 0),
    ("x86-2socket", pci_address(0, 0xCA, 0), 1),     # the second socket's GPU: its slabs go to node 1
    ("gh200", pci_address(9, 1, 0), 0),
    ("gh200-2x", pci_address(0x19, 1, 0), 1),
])
def test_gpu_node_comes_from_sysfs(machine, bus_id, node):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_numa_node(bus_id, FIXTURES / machine) == node


def test_unknown_node_on_several_sockets_warns():
    with pytest.warns(UserWarning, match="does not report the NUMA node"):
        assert gpu_numa_node("0000:99:00.0", FIXTURES / "x86-2socket") == 0


def test_unknown_node_on_one_socket_is_that_node():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_numa_node("0000:99:00.0", FIXTURES / "vm-1node") == 0


@pytest.mark.parametrize("name,total,aarch64,profile", [
    ("NVIDIA H100 80GB HBM3", 80 * 10**9, False, "h100-sxm"),
    ("NVIDIA H100 PCIe", 80 * 10**9, False, "h100-pcie"),
    ("NVIDIA H100 NVL", 94 * 10**9, False, "h100-nvl"),
    ("NVIDIA H200", 141 * 10**9, False, "h200"),
    ("NVIDIA H200 NVL", 141 * 10**9, False, "h200-nvl"),
    ("NVIDIA GH200 480GB", 96 * 10**9, True, "gh200-96g"),
    ("NVIDIA GH200 144G HBM3e", 144 * 10**9, True, "gh200-144g"),
])
def test_device_names_pick_their_profile(name, total, aarch64, profile):
    assert profile_for_device(name, total, aarch64) == profile


@pytest.mark.parametrize("measured", [False, True])
def test_a_detected_gpu_keeps_every_figure_of_its_profile(monkeypatch, tmp_path, measured):
    """The platform of a detected GPU carries its profile's figures, the host's cores' among them (an H200 run
    found them dropped: the cpu expert tier's limit came out 0 there, every expert computed on the device)."""
    import json
    from types import SimpleNamespace

    import torch

    import gh200rt.platform.detect as detect_module
    from gh200rt.platform.profiles import get_profile
    props = SimpleNamespace(name="NVIDIA H200", total_memory=150_754_820_096, pci_domain_id=0, pci_bus_id=6,
                            pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(detect_module, "_ats_supported", lambda index: False)
    monkeypatch.setattr(detect_module, "gpu_numa_node", lambda bus_id: 0)
    profile = None
    if measured:
        profile = tmp_path / "measured.json"
        profile.write_text(json.dumps({"base_profile": "h200", "link_h2d_gbps": 55.1, "direct_read_gbps": 51.1,
                                       "host_cpu_gbps": 94.8, "host_cpu_tflops": 2.75}))
    platform = detect_module.detect(measured_profile=profile)
    table = get_profile("h200")
    assert (platform.kind, platform.profile, platform.device_name) == ("x86-cuda", "h200", "NVIDIA H200")
    assert platform.device_memory_bytes == props.total_memory and platform.host_memory_bytes is None
    expected = (94.8, 2.75, 55.1) if measured else (table.host_cpu_gbps, table.host_cpu_tflops, table.link_h2d_gbps)
    assert (platform.host_cpu_gbps, platform.host_cpu_tflops, platform.link_h2d_gbps) == expected
