"""GPU profiles whose ``gemm_efficiency`` is a published bf16 MAMF (maximum achievable matmul FLOPS)
of that card over the profile's own dense bf16 peak: the stored value re-derives from the measured
TFLOPS written here, and the profile's source names the table, the commit and the figure."""

import pytest

from shardplan.inputs.hardware import get_gpu

MAG = "mag-/gpu_benchmark README.md @2218e0a3"
STAS = "stas00/ml-engineering compute/accelerator/README.md @744d01e"
STAS_V1 = "stas00/ml-engineering compute/accelerator/README.md @f0cca2f"

# profile -> (measured bf16 MAMF in TFLOPS, the table that publishes it, the row's name for the card)
MEASURED = {
    # mag-/gpu_benchmark README.md @2218e0a33df689202cde34c794231c3f1acdeca3, 'Stats' table
    "h100-pcie": (499.5, MAG, "NVIDIA H100 PCIe"),
    "l40s": (252.0, MAG, "NVIDIA L40S"),
    "rtx-a5000": (93.9, MAG, "NVIDIA RTX A5000"),
    # above its 165.2 nameplate: a GeForce card boosts past the whitepaper's clock (test_rtx4090_gemm)
    "rtx4090": (178.8, MAG, "NVIDIA GeForce RTX 4090"),
    # stas00/ml-engineering compute/accelerator/README.md @744d01e, MAMF BF16 table (mamf-finder v2);
    # the H100 SXM row's note 'H200 is the same' is the H200's figure
    "h200": (794.5, STAS, "H200 is the same"),
    # the v2 rows supersede the v1 rows these profiles cited (A100 SXM 267.9, A100 PCIe 256.4,
    # H100 SXM 792.1): the v1 table did not reset the cache and its author replaced it row by row
    "h100-sxm": (794.5, STAS, "NVIDIA H100 SXM"),
    "a100-80gb": (271.2, STAS, "NVIDIA A100 SXM"),
    "a100-40gb": (271.2, STAS, "NVIDIA A100 SXM"),
    "a100-80gb-pcie": (252.9, STAS, "NVIDIA A100 PCIe"),
    # the same file @f0cca2f, the v1 table (the only MI250X row, one GCD)
    "mi250x": (147.0, STAS_V1, "AMD MI250X"),
}


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_gemm_efficiency_is_measured_over_own_peak(name):
    tflops, _, _ = MEASURED[name]
    gpu = get_gpu(name)
    # profiles store three decimals: within half a unit of the last one
    assert gpu.gemm_efficiency == pytest.approx(tflops * 1e12 / gpu.peak_flops["bf16"], abs=5e-4)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_source_names_table_row_and_figure(name):
    tflops, table, row = MEASURED[name]
    src = get_gpu(name).sources["gemm_efficiency"]
    assert table in src and row in src and f"{tflops:.1f}" in src


def test_h100_pcie_no_longer_borrows_the_sxm_fraction():
    """The PCIe board's own measurement is far below the SXM part's fraction it used to carry."""
    assert get_gpu("h100-pcie").gemm_efficiency < get_gpu("h100-sxm").gemm_efficiency - 0.1
