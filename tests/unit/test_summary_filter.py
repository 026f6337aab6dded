"""The report's one-line node summary."""

from __future__ import annotations

from ansible_collections.gpufleet.nvidia.plugins.filter.summary import node_summary


def test_cpu_node():
    assert node_summary({"gpu_count": 0}) == "not a GPU node (no NVIDIA device on the PCI bus)"


def test_hgx_node_with_loaded_open_driver():
    facts = {
        "gpu_count": 8,
        "gpus": [{"name": "NVIDIA H100 80GB HBM3"}],
        "nvswitch_count": 4,
        "driver": {"state": "loaded", "version": "550.127.05", "module_type": "open"},
        "nouveau_loaded": False,
    }
    assert node_summary(facts) == (
        "8x NVIDIA H100 80GB HBM3 + 4 NVSwitch; driver loaded 550.127.05 (open)"
    )


def test_fresh_node_still_on_nouveau():
    facts = {
        "gpu_count": 1,
        "gpus": [{"name": None}],
        "driver": {"state": "absent"},
        "nouveau_loaded": True,
    }
    assert node_summary(facts) == "1x unknown NVIDIA GPU; driver absent; nouveau loaded"
