# Copyright: gpufleet developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which MIG profiles each GPU model offers, and whether a layout fits on one GPU.

Facts from NVIDIA's MIG user guide ("Supported MIG Profiles"): a GPU of the A100/H100
family has 8 memory slices and 7 compute slices, an A30 4 of each. A GPU instance
profile takes some compute slices and a run of memory slices that may only start at
certain slices; a few profiles allow fewer instances than would fit (the media
extensions, "+me", exist once per GPU). The names differ per model only in their
memory sizes, so each model lists its names by the shape they stand for.

Known to this table: A100 40GB and 80GB, A30, H100 80GB (SXM5, PCIe), H100 NVL, H200.
A MIG-capable model that is not here cannot be checked before an apply; mig-parted
still refuses what does not fit when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    compute: int  # compute slices
    memory: int  # memory slices, taken as one run
    starts: tuple[int, ...]  # memory slices a run may start at
    instances: int  # most instances of the profile on one GPU


@dataclass(frozen=True)
class Geometry:
    compute: int
    memory: int
    shapes: Mapping[str, Shape]


SEVEN = Geometry(
    compute=7,
    memory=8,
    shapes={
        "1g": Shape(1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        "1g+me": Shape(1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        "1g-2m": Shape(1, 2, (0, 2, 4, 6), 4),
        "2g": Shape(2, 2, (0, 2, 4), 3),
        "3g": Shape(3, 4, (0, 4), 2),
        "4g": Shape(4, 4, (0,), 1),
        "7g": Shape(7, 8, (0,), 1),
    },
)
FOUR = Geometry(
    compute=4,
    memory=4,
    shapes={
        "1g": Shape(1, 1, (0, 1, 2, 3), 4),
        "1g+me": Shape(1, 1, (0, 1, 2, 3), 1),
        "2g": Shape(2, 2, (0, 2), 2),
        "2g+me": Shape(2, 2, (0, 2), 1),
        "4g": Shape(4, 4, (0,), 1),
    },
)


@dataclass(frozen=True)
class Model:
    name: str
    geometry: Geometry
    profiles: Mapping[str, str]  # profile name -> shape


def _seven(name: str, gb: tuple[int, int, int, int]) -> Model:
    """Memory of a 1-slice, 2-slice, 4-slice and whole-GPU instance, in GB as named."""
    one, two, four, whole = gb
    return Model(
        name,
        SEVEN,
        {
            f"1g.{one}gb": "1g",
            f"1g.{one}gb+me": "1g+me",
            f"1g.{two}gb": "1g-2m",
            f"2g.{two}gb": "2g",
            f"3g.{four}gb": "3g",
            f"4g.{four}gb": "4g",
            f"7g.{whole}gb": "7g",
        },
    )


_A100_40GB = _seven("A100 40GB", (5, 10, 20, 40))
_A100_80GB = _seven("A100 80GB", (10, 20, 40, 80))
_H100_80GB = _seven("H100 80GB", (10, 20, 40, 80))
_A30 = Model(
    "A30",
    FOUR,
    {"1g.6gb": "1g", "1g.6gb+me": "1g+me", "2g.12gb": "2g", "2g.12gb+me": "2g+me", "4g.24gb": "4g"},
)

# By PCI device id (vendor 0x10de).
MODELS: dict[int, Model] = {
    0x20B0: _A100_40GB,  # A100-SXM4-40GB
    0x20F1: _A100_40GB,  # A100-PCIE-40GB
    0x20B2: _A100_80GB,  # A100-SXM4-80GB
    0x20B5: _A100_80GB,  # A100 80GB PCIe
    0x20B7: _A30,
    0x2330: _H100_80GB,  # H100 SXM5 80GB
    0x2331: _H100_80GB,  # H100 PCIe
    0x2321: _seven("H100 NVL", (12, 24, 47, 94)),
    0x2335: _seven("H200", (18, 35, 71, 141)),
}


def placement(model: Model, counts: Mapping[str, int]) -> dict[str, list[int]] | None:
    """Where each instance of `counts` (GPU instance profile -> count) can start on one
    GPU of `model`, or None when they cannot all be placed. Names must be the model's."""
    geometry = model.geometry
    wanted = [(name, geometry.shapes[model.profiles[name]]) for name, n in counts.items()]
    if any(counts[name] > shape.instances for name, shape in wanted):
        return None
    if sum(shape.compute * counts[name] for name, shape in wanted) > geometry.compute:
        return None
    # Largest runs first: they have the fewest places to go.
    queue = sorted(
        (item for name, shape in wanted for item in [(name, shape)] * counts[name]),
        key=lambda item: (-item[1].memory, item[0]),
    )
    used = [False] * geometry.memory
    starts: dict[str, list[int]] = {name: [] for name in counts}

    def place(i: int) -> bool:
        if i == len(queue):
            return True
        name, shape = queue[i]
        for start in shape.starts:
            run = range(start, start + shape.memory)
            if any(used[s] for s in run):
                continue
            for s in run:
                used[s] = True
            starts[name].append(start)
            if place(i + 1):
                return True
            starts[name].pop()
            for s in run:
                used[s] = False
        return False

    return starts if place(0) else None
