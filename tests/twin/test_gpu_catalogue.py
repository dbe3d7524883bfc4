"""The GPU catalogue beyond the benchmark's four types: common types a provider runs (an H100-SXM, an L4,
an A100 of 40 GB) known by the names its tools print, with their data sheet's memory and power and a speed
scaled from a measured type. Before, each was an unknown GPU, modelled as an A100-PCIe of 80 GB and 400 W."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED_REFERENCE
from twin.cluster import gpu_tdp_watts
from twin.domain import (
    GPU_TYPES,
    UNKNOWN_GPU,
    data_sheet_speed,
    gpu_or_unknown,
    gpu_type,
    unknown_gpu_message,
)


def test_the_data_sheet_rule_gives_the_speeds_the_paper_measured() -> None:
    """The rule a type the benchmark never ran gets its speed from, tried on types whose speed is known:
    from the A100-PCIe's data sheet to the L40S's and the H100-PCIe's."""
    a100 = GPU_TYPES["NVIDIA-A100-80GB-PCIe"]
    l40s, h100 = GPU_TYPES["L40S"], GPU_TYPES["NVIDIA-H100-PCIe"]
    measured = json.loads((SHARED_REFERENCE / "paper_figures.json").read_text())["gpu_type_pairs"][
        "l40s_vs_a100_pcie_median_throughput_ratio"
    ]
    assert data_sheet_speed(a100, l40s.dense_tflops, l40s.memory_tbs) == pytest.approx(measured, rel=0.1)
    assert data_sheet_speed(a100, h100.dense_tflops, h100.memory_tbs) == pytest.approx(
        h100.relative_speed, rel=0.05
    )


@pytest.mark.parametrize(
    ("printed", "memory_gb", "tdp_watts"),
    [
        ("NVIDIA H100 80GB HBM3", 80.0, 700.0),  # nvidia-smi on an H100-SXM
        ("NVIDIA-H100-80GB-HBM3", 80.0, 700.0),  # GPU feature discovery
        ("H100-SXM", 80.0, 700.0),
        ("NVIDIA H200", 141.0, 700.0),
        ("NVIDIA A100-SXM4-40GB", 40.0, 400.0),
        ("NVIDIA A100-PCIE-40GB", 40.0, 250.0),
        ("NVIDIA L40", 48.0, 300.0),
        ("NVIDIA L4", 24.0, 72.0),
        ("NVIDIA A10", 24.0, 150.0),
    ],
)
def test_gpus_the_benchmark_never_ran_are_their_own_types(
    printed: str, memory_gb: float, tdp_watts: float
) -> None:
    known = gpu_type(printed)
    assert (known.memory_gb, known.tdp_watts, known.benchmarked) == (memory_gb, tdp_watts, False)
    assert gpu_or_unknown(printed) is known and gpu_tdp_watts(printed) == tdp_watts
    assert known.relative_speed != UNKNOWN_GPU.relative_speed


def test_the_benchmarks_types_keep_their_measured_speeds() -> None:
    benchmarked = {g.short: g.relative_speed for g in GPU_TYPES.values() if g.benchmarked}
    assert benchmarked == {"A100-SXM": 1.18, "A100-PCIe": 1.0, "L40S": 0.68, "H100-PCIe": 1.6}


def test_a_family_name_is_refused_with_every_member_and_not_with_names_spelled_alike() -> None:
    with pytest.raises(KeyError):
        gpu_type("H100")
    message = unknown_gpu_message("H100")
    assert "did you mean 'NVIDIA-H100-PCIe' or 'NVIDIA-H100-80GB-HBM3'?" in message, message
    assert "did you mean 'L40S'" in unknown_gpu_message("L40SS")  # a misspelling: the closest names
