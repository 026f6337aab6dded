# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""MIG layouts in mig-parted's config format: our checks against NVIDIA's own.

`nvidia-mig-parted assert --valid-config -f FILE -c NAME` (the real tool, built by
tests/sim/migparted/build.sh) reads a config and selects a layout without touching a
GPU: for every file of the corpus, it and `mig_config` must agree on whether the
layout is valid, except where a case names the reason we are stricter.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.filter import mig as mig_filters
from ansible_collections.gpufleet.nvidia.plugins.module_utils import mig_config, mig_profiles
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_config import Gpu
from conftest import PROJECT

BALANCED = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-balanced:
    - device-filter: ["0x20B010DE", "0x20F110DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    - device-filter: "0x233010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
  first-two:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1c.3g.20gb": 3, "1g.10gb+me": 1}
"""


def entry(body: str) -> str:
    return "version: v1\nmig-configs:\n  x:\n" + textwrap.indent(textwrap.dedent(body), "    ")


# (case, file, layout, why we differ or None)
CORPUS = [
    ("every layout of a usual file", BALANCED, "all-balanced", None),
    ("MIG off", BALANCED, "all-disabled", None),
    ("MIG on with no devices", BALANCED, "all-enabled", None),
    ("compute-instance and attribute profiles", BALANCED, "first-two", None),
    ("a layout the file does not have", BALANCED, "all-1g.5gb", None),
    ("no version", "mig-configs:\n  x:\n    - devices: all\n      mig-enabled: false\n", "x", None),
    ("another version", BALANCED.replace("v1", "v2"), "all-disabled", None),
    ("a key mig-parted does not know", BALANCED + "extra: 1\n", "all-disabled", None),
    ("an empty layout", "version: v1\nmig-configs:\n  x: []\n", "x", None),
    ("devices missing", entry("- mig-enabled: false\n"), "x", None),
    ("mig-enabled missing", entry("- devices: all\n"), "x", None),
    ("devices a word other than all", entry("- devices: some\n  mig-enabled: false\n"), "x", None),
    ("MIG on without mig-devices", entry("- devices: all\n  mig-enabled: true\n"), "x", None),
    (
        "MIG off with devices",
        entry("- devices: all\n  mig-enabled: false\n  mig-devices: {1g.5gb: 1}\n"),
        "x",
        None,
    ),
    (
        "a profile name with a typo",
        entry("- devices: all\n  mig-enabled: true\n  mig-devices: {1g.5gbx: 1}\n"),
        "x",
        None,
    ),
    (
        "a profile name without memory",
        entry("- devices: all\n  mig-enabled: true\n  mig-devices: {3g: 1}\n"),
        "x",
        None,
    ),
    (
        "a repeated attribute",
        entry("- devices: all\n  mig-enabled: true\n  mig-devices: {1g.5gb+me,me: 1}\n"),
        "x",
        None,
    ),
    (
        "a negative count",
        entry("- devices: all\n  mig-enabled: true\n  mig-devices: {1g.5gb: -1}\n"),
        "x",
        None,
    ),
    (
        "every count zero",
        entry("- devices: all\n  mig-enabled: true\n  mig-devices: {1g.5gb: 0}\n"),
        "x",
        None,
    ),
    (
        "an unknown entry key",
        entry("- devices: all\n  mig-enabled: false\n  gpus: 2\n"),
        "x",
        None,
    ),
    (
        "mig-enabled not a boolean",
        entry("- devices: all\n  mig-enabled: 3\n"),
        "x",
        None,
    ),
    (
        "a negative GPU index",
        entry("- devices: [-1]\n  mig-enabled: false\n"),
        "x",
        "mig-parted takes it and matches no GPU; a typo there would silently do nothing",
    ),
    (
        "a device filter that is no PCI id",
        entry("- device-filter: A100\n  devices: all\n  mig-enabled: false\n"),
        "x",
        "mig-parted takes it and matches no GPU; a typo there would silently do nothing",
    ),
    (
        "a signed number in a profile name",
        entry("- devices: all\n  mig-enabled: true\n  mig-devices: {-1g.5gb: 1}\n"),
        "x",
        "mig-parted's number parsing takes a sign; no MIG profile has one",
    ),
]


def ours(text: str, name: str) -> str | None:
    """None when we take the layout, else our message."""
    try:
        mig_config.select(mig_config.parse_config(yaml.safe_load(text)), name)
    except mig_config.MigConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(("case", "text", "name", "why"), CORPUS, ids=[c[0] for c in CORPUS])
def test_we_judge_a_layout_as_mig_parted_does(case, text, name, why, mig_parted, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    theirs = subprocess.run(
        [str(mig_parted), "assert", "--valid-config", "-f", str(config), "-c", name],
        capture_output=True,
        text=True,
        check=False,
    )
    mine = ours(text, name)
    if why is None:
        assert (mine is None) == (theirs.returncode == 0), (case, mine, theirs.stderr)
    else:
        # Stricter on purpose: mig-parted takes it, we refuse, for the reason given.
        assert theirs.returncode == 0, theirs.stderr
        assert mine is not None


def test_messages_say_where_and_what():
    assert ours(BALANCED, "all-1g.5gb") == (
        "no layout named 'all-1g.5gb'; the file has: all-balanced, all-disabled, "
        "all-enabled, first-two"
    )
    text = entry("- devices: all\n  mig-enabled: true\n  mig-devices: {1g.5gbx: 1}\n")
    assert ours(text, "x") == "'1g.5gbx' is not a MIG profile name: expected '%dgb'"
    assert ours(entry("- devices: all\n"), "x") == "mig-configs.x[0]: missing mig-enabled"


A100, H100, T4 = 0x20B0, 0x2330, 0x1EB8


def layout(name: str) -> tuple[mig_config.Entry, ...]:
    return mig_config.select(mig_config.parse_config(yaml.safe_load(BALANCED)), name)


def test_each_gpu_gets_the_entry_its_model_matches():
    gpus = [Gpu(0, A100, True), Gpu(1, H100, True)]
    chosen = mig_config.per_gpu(layout("all-balanced"), gpus)
    assert chosen[0].mig_devices == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert chosen[1].mig_devices == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def test_a_later_entry_replaces_an_earlier_one_on_the_same_gpu():
    text = entry(
        """
        - devices: all
          mig-enabled: true
          mig-devices: {1g.5gb: 7}
        - devices: [1]
          mig-enabled: false
        """
    )
    entries = mig_config.select(mig_config.parse_config(yaml.safe_load(text)), "x")
    chosen = mig_config.per_gpu(entries, [Gpu(0, A100, True), Gpu(1, A100, True)])
    assert chosen[0].mig_enabled and not chosen[1].mig_enabled


def test_gpus_without_mig_are_passed_over_unless_named():
    mixed = [Gpu(0, T4, False), Gpu(1, A100, True)]
    assert set(mig_config.per_gpu(layout("all-balanced"), mixed)) == {1}
    with pytest.raises(mig_config.MigConfigError, match="GPU 0 does not support MIG"):
        mig_config.per_gpu(layout("first-two"), mixed)
    with pytest.raises(mig_config.MigConfigError, match="none of its entries reaches a GPU"):
        mig_config.per_gpu(layout("all-balanced"), [Gpu(0, T4, False)])
    # Turning MIG off asks nothing of a GPU without it.
    assert mig_config.per_gpu(layout("all-disabled"), [Gpu(0, T4, False)]) == {}


def test_an_index_the_host_does_not_have_is_refused():
    with pytest.raises(
        mig_config.MigConfigError, match=r"GPU index 1 does not exist here \(GPUs: \[0\]\)"
    ):
        mig_config.per_gpu(layout("first-two"), [Gpu(0, A100, True)])


def verdict(counts: dict[str, int], device: int = A100) -> mig_config.Verdict:
    entries = (mig_config.Entry(None, (), True, counts),)
    return mig_config.check(entries, [Gpu(0, device, True)])


# Layouts for one A100 40GB and whether they fit; test_mig_parted.py has NVIDIA's
# mig-parted apply each of them on a simulated A100 and checks it agrees.
FIT_CASES = [
    ({"1g.5gb": 7}, True),
    ({"1g.5gb": 8}, False),  # 7 compute slices
    ({"2g.10gb": 3, "1g.5gb": 1}, True),
    ({"3g.20gb": 2}, True),
    ({"4g.20gb": 1, "3g.20gb": 1}, True),
    ({"4g.20gb": 1, "2g.10gb": 2}, False),  # 8 compute slices
    ({"3g.20gb": 2, "1g.5gb": 1}, False),  # the two 3g take all memory
    ({"1g.10gb": 4}, True),
    ({"1g.10gb": 3, "1g.5gb": 2}, True),  # 1g.10gb at 2, 4, 6; 1g.5gb at 0 and 1
    ({"1g.10gb": 4, "1g.5gb": 1}, False),  # memory: 4 x 2 slices is all of it
    ({"1g.5gb+me": 2}, False),  # one media-extension instance per GPU
    ({"7g.40gb": 1}, True),
]


@pytest.mark.parametrize(("counts", "fits"), FIT_CASES)
def test_fit_on_an_a100_40gb(counts, fits):
    result = verdict(counts)
    assert (result.errors == ()) == fits, result.errors
    if not fits:
        assert "do not fit on one GPU" in result.errors[0]


def test_a_profile_of_another_model_is_named_with_the_models_own():
    result = verdict({"1g.10gb": 1, "3g.40gb": 1})
    assert result.errors == (
        "GPU 0 (A100 40GB) offers no '3g.40gb'; its profiles: 1g.5gb, 1g.5gb+me, "
        "1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb",
    )
    assert verdict({"3g.40gb": 2}, H100).errors == ()


def test_models_we_do_not_know_and_compute_instances_are_left_to_mig_parted():
    b200 = verdict({"1g.23gb": 7}, 0x2901)
    assert b200.errors == () and b200.unchecked == ("GPU 0 (PCI device 0x2901)",)
    nested = verdict({"1c.3g.20gb": 3})
    assert nested.errors == () and "compute instance profiles" in nested.unchecked[0]
    assert verdict({"1c.3g.40gb": 3}).errors  # still a profile the A100 40GB lacks


@pytest.mark.parametrize("model", ["a100-sxm4-40gb", "a100-pcie-40gb", "h100-sxm5-80gb"])
def test_our_table_and_the_simulated_boards_agree(model):
    """Two encodings of NVIDIA's tables: the product's (mig_profiles) and the simulated
    boards' (tests/sim/kit/profiles/models.yaml, which the mock NVML serves)."""
    data = yaml.safe_load((PROJECT / "tests/sim/kit/profiles/models.yaml").read_text())
    board = data["mig_profiles"][model]
    ours = mig_profiles.MODELS[data["gpus"][model]["device_id"]]
    assert set(ours.profiles) == set(board)
    for name, spec in board.items():
        shape = ours.geometry.shapes[ours.profiles[name]]
        assert (shape.compute, shape.memory, list(shape.starts), shape.instances) == (
            spec["slices"],
            spec["size"],
            spec["starts"],
            spec["instances"],
        ), name


def test_the_filter_takes_mig_from_the_driver_for_models_we_do_not_know():
    """gpu_facts' mig_mode is true/false on a GPU with MIG, none without."""
    layouts = yaml.safe_load(BALANCED)
    unknown = [{"device_id": "0x2901", "mig_mode": False}]
    verdict = mig_filters.mig_layout_check(unknown, layouts, "all-enabled")
    assert verdict["errors"] == []
    no_mig = [{"device_id": "0x2901", "mig_mode": None}]
    verdict = mig_filters.mig_layout_check(no_mig, layouts, "all-enabled")
    assert verdict["errors"] and "reaches a GPU" in verdict["errors"][0]


def test_a_gpu_waits_for_a_reset_when_its_pending_mode_differs():
    gpus = [
        {"mig_mode": False, "mig_mode_pending": True},
        {"mig_mode": True, "mig_mode_pending": True},
        {"mig_mode": None, "mig_mode_pending": None},
        {"mig_mode": True, "mig_mode_pending": False},
    ]
    assert mig_filters.mig_reset_pending(gpus) == [0, 3]
    assert mig_filters.mig_reset_pending([]) == []
