# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a GPU is when no driver can tell us: names by PCI device id.

Device ids are NVIDIA's public PCI ids (vendor 0x10de, as listed in the PCI ID
repository); names are the product strings NVML reports for those boards, so that
labels computed before and after the driver loads agree. Families follow GPU
Feature Discovery's mapping from CUDA compute capability.
"""

from __future__ import annotations

from typing import NamedTuple


class GpuModel(NamedTuple):
    name: str
    compute_major: int
    compute_minor: int
    memory_mib: int | None


MODELS: dict[int, GpuModel] = {
    # Volta
    0x1DB1: GpuModel("Tesla V100-SXM2-16GB", 7, 0, 16384),
    0x1DB4: GpuModel("Tesla V100-PCIE-16GB", 7, 0, 16384),
    0x1DB6: GpuModel("Tesla V100-PCIE-32GB", 7, 0, 32768),
    # Turing
    0x1EB8: GpuModel("Tesla T4", 7, 5, 15360),
    # Ampere
    0x20B0: GpuModel("NVIDIA A100-SXM4-40GB", 8, 0, 40960),
    0x20B2: GpuModel("NVIDIA A100-SXM4-80GB", 8, 0, 81920),
    0x20B5: GpuModel("NVIDIA A100 80GB PCIe", 8, 0, 81920),
    0x20F1: GpuModel("NVIDIA A100-PCIE-40GB", 8, 0, 40960),
    0x20B7: GpuModel("NVIDIA A30", 8, 0, 24576),
    0x2236: GpuModel("NVIDIA A10", 8, 6, 23028),
    # Ada Lovelace
    0x27B8: GpuModel("NVIDIA L4", 8, 9, 23034),
    0x26B5: GpuModel("NVIDIA L40", 8, 9, 46068),
    0x26B9: GpuModel("NVIDIA L40S", 8, 9, 46068),
    # Hopper
    0x2330: GpuModel("NVIDIA H100 80GB HBM3", 9, 0, 81559),
    0x2331: GpuModel("NVIDIA H100 PCIe", 9, 0, 81559),
    0x2335: GpuModel("NVIDIA H200", 9, 0, 143771),
    # Blackwell
    0x2901: GpuModel("NVIDIA B200", 10, 0, None),
}


def family(compute_major: int, compute_minor: int) -> str:
    """GPU family name as GPU Feature Discovery labels it (nvidia.com/gpu.family)."""
    if compute_major == 7:
        return "volta" if compute_minor < 5 else "turing"
    if compute_major == 8:
        return "ampere" if compute_minor < 9 else "ada-lovelace"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
    }.get(compute_major, "undefined")


def lookup(device_id: int) -> GpuModel | None:
    return MODELS.get(device_id)
