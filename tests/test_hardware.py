"""Hardware profiles (GPUs, links) and ``parse_gpus``: the data loads, is sourced, and parses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardplan.inputs.hardware import (
    CAPACITY_DEFAULTS,
    GPUProfile,
    LinkProfile,
    get_gpu,
    get_link,
    gpu_profiles,
    link_profiles,
    parse_gpus,
)
from shardplan.inputs.profiles import DATA_DIR, PROFILE_PATH_ENV, load_profile, normalize_name
from shardplan.inputs.units import GiB
from shardplan.support.errors import ShardplanError

GPU_DIR = DATA_DIR / "hardware_profiles" / "gpus"
LINK_DIR = DATA_DIR / "hardware_profiles" / "links"

GPU_NAMES = {
    "rtx3090", "rtx4090", "rtx5090", "l40s", "a100-40gb", "a100-80gb", "a100-80gb-pcie",
    "h100-sxm", "h100-pcie", "h200", "b200", "mi300x",
    # GPUs people rent (issue 11): tests/test_gpu_profiles.py checks each against its datasheet
    "a10g", "l4", "l40", "rtx-a6000", "rtx6000-ada", "v100-16gb", "v100-32gb", "t4", "h20",
    "gh200-96gb", "gh200-144gb", "mi250x", "mi325x", "rtx5080",
    # consumer and workstation cards people fine-tune on (issue 22 item 8)
    "rtx3060", "rtx3080", "rtx3080-12gb", "rtx4060ti", "rtx4070", "rtx4070ti", "rtx4080", "rtx-a4000",
    "rtx-a5000", "rx7900xtx",
}
LINK_NAMES = {
    "pcie3", "pcie4", "pcie5", "pcie4-nop2p", "pcie5-nop2p", "nvlink3", "nvlink4", "nvlink5",
    "infinity-fabric", "ib-hdr", "ib-ndr", "ib-xdr", "eth-100g", "eth-200g", "eth-400g",
    "nvlink2", "ib-edr", "infinity-fabric-mi250x", "nvlink-c2c", "efa-v4",
}
# Fields that carry no number and need no citation.
UNSOURCED = {"name", "display_name", "aliases", "vendor", "sources", "kind", "scope", "generic_aliases", "note"}


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


# --- every profile loads ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", _files(GPU_DIR), ids=lambda p: p.stem)
def test_gpu_profile_file_validates(path):
    gpu = load_profile(path, GPUProfile)
    assert gpu.name == path.stem
    assert "bf16" in gpu.peak_flops or "fp16" in gpu.peak_flops
    missing = sorted(set(gpu.model_fields_set) - UNSOURCED - set(gpu.sources))
    assert not missing, f"{path.name}: fields without a source: {missing}"
    assert all(text.strip() for text in gpu.sources.values())


@pytest.mark.parametrize("path", _files(LINK_DIR), ids=lambda p: p.stem)
def test_link_profile_file_validates(path):
    link = load_profile(path, LinkProfile)
    assert link.name == path.stem
    missing = sorted(set(link.model_fields_set) - UNSOURCED - {"peer_to_peer"} - set(link.sources))
    assert not missing, f"{path.name}: fields without a source: {missing}"


def test_the_expected_profiles_ship():
    assert {g.name for g in gpu_profiles()} == GPU_NAMES
    assert {link.name for link in link_profiles()} == LINK_NAMES


def test_every_gpu_default_link_exists_with_the_right_scope():
    for gpu in gpu_profiles():
        intra = get_link(gpu.default_intra_link)
        inter = get_link(gpu.default_inter_link)
        assert intra.scope == "intra_node", gpu.name
        assert inter.scope == "inter_node", gpu.name


def test_names_and_aliases_are_unambiguous_across_files():
    for profiles in (gpu_profiles(), link_profiles()):
        owner: dict[str, str] = {}
        for profile in profiles:
            for key in {normalize_name(n) for n in (profile.name, *profile.aliases)}:
                assert key not in owner, f"{key!r} names both {owner[key]} and {profile.name}"
                owner[key] = profile.name


def test_no_gpu_alias_is_shadowed_by_the_capacity_syntax():
    # parse_gpus reads '<number>GB' as a capacity before looking up names.
    from shardplan.inputs.hardware import _CAPACITY_GPU

    for gpu in gpu_profiles():
        for alias in (gpu.name, *gpu.aliases):
            assert not _CAPACITY_GPU.match(alias), (gpu.name, alias)


def test_capacity_defaults_point_at_profiles_of_that_capacity():
    for size, names in CAPACITY_DEFAULTS.items():
        for name in names:
            assert get_gpu(name).nominal_memory_gb == size


def test_exposed_memory_is_just_under_the_nominal_capacity():
    # The driver keeps a little back (and ECC/reserved regions), so the exposed bytes sit a few percent
    # under nominal GiB -- never above it.
    for gpu in gpu_profiles():
        nominal = gpu.nominal_memory_gb * GiB
        assert 0.9 * nominal < gpu.memory_bytes <= nominal, gpu.name


def test_peaks_are_ordered_by_precision():
    order = ["fp32", "tf32", "bf16", "fp8"]
    for gpu in gpu_profiles():
        present = [gpu.peak_flops[d] for d in order if d in gpu.peak_flops]
        assert present == sorted(present), gpu.name
        if "bf16" in gpu.peak_flops and "fp16" in gpu.peak_flops:
            assert gpu.peak_flops["bf16"] == gpu.peak_flops["fp16"], gpu.name


@pytest.mark.parametrize("peaks,expected", [
    ({"fp16": 125e12, "fp32": 15.7e12}, (125e12, 125e12, 15.7e12)),   # Volta: no bf16 figure
    ({"bf16": 312e12}, (312e12, 312e12, 312e12 / 16)),                   # no fp16 or fp32 figure
    ({"bf16": 400e12, "fp16": 300e12, "fp32": 20e12}, (400e12, 300e12, 20e12)),
])
def test_one_dense_peak_per_precision_serves_the_time_model(peaks, expected):
    from shardplan.formulas.throughput import compute_rates

    gpu = get_gpu("a100-80gb").model_copy(update={"peak_flops": peaks})
    assert tuple(gpu.dense_peak(d) for d in ("bf16", "fp16", "fp32")) == expected
    cluster = parse_gpus("1xa100-80gb").model_copy(update={"gpu": gpu})
    bf16, fp16, fp32 = expected  # the precision codes: bf16-mixed, fp16-mixed, bf16-pure, fp32
    assert compute_rates(cluster).peak_flops_by_precision.tolist() == [bf16, fp16, bf16, fp32]


def test_links_are_sane():
    for link in link_profiles():
        assert 0.3 <= link.efficiency <= 1.0
        assert 1e-6 <= link.latency_s <= 1e-4
        assert link.achievable_bytes_per_s < link.bandwidth_bytes_per_s
    assert not get_link("pcie4-nop2p").peer_to_peer
    assert get_link("pcie4").peer_to_peer
    assert get_link("pcie4-nop2p").achievable_bytes_per_s < get_link("pcie4").achievable_bytes_per_s


# --- datasheet spot checks (expected value = the cited figure) ----------------------------------------


def test_datasheet_spot_checks():
    h100 = get_gpu("h100-sxm")
    # H100 whitepaper, SXM5: 989.4 TFLOP/s dense BF16 (1,979 with sparsity on the datasheet); FP8 1978.9.
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert h100.peak_flops["fp8"] == pytest.approx(1978.9e12)
    # H100 SXM datasheet: HBM3 3.35 TB/s.
    assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    # deviceQuery on an 8x H100 SXM node, CUDA 12.7 driver: 85045477376 bytes (79.2 GiB).
    assert h100.memory_bytes == 85_045_477_376
    a100 = get_gpu("a100-80gb")
    # A100 datasheet: 312 TFLOP/s BF16 dense (624 sparse), 156 TF32, 2,039 GB/s for 80GB SXM.
    assert a100.peak_flops["bf16"] == pytest.approx(312e12)
    assert a100.peak_flops["tf32"] == pytest.approx(156e12)
    assert a100.memory_bandwidth_bytes_per_s == pytest.approx(2039e9)
    assert "fp8" not in a100.peak_flops  # Ampere has no FP8 tensor cores
    # Ada whitepaper, RTX 4090: 165.2 TFLOP/s FP16/BF16 with FP32 accumulate (GeForce half rate).
    assert get_gpu("rtx4090").peak_flops["bf16"] == pytest.approx(165.2e12)
    # AMD MI300X datasheet: 1,307.4 TFLOP/s dense FP16/BF16, 5.3 TB/s.
    mi300x = get_gpu("mi300x")
    assert mi300x.peak_flops["bf16"] == pytest.approx(1307.4e12)
    assert mi300x.memory_bandwidth_bytes_per_s == pytest.approx(5.3e12)
    # DGX B200: 1,440 GB across 8 GPUs -> 180 GB nominal; 64 TB/s / 8 = 8 TB/s per GPU.
    b200 = get_gpu("b200")
    assert b200.nominal_memory_gb == 180
    assert b200.memory_bandwidth_bytes_per_s == pytest.approx(8e12)
    # DGX H100/H200: 2 TB host memory.
    assert h100.default_host_ram_bytes == 2 * 2**40


def test_link_spot_checks():
    # H100 datasheet: NVLink 900 GB/s bidirectional -> 450 GB/s per direction; NCCL models
    # 18 x 20.6 = 370.8 GB/s usable (SM90_NVLINK_BW), i.e. the ~370 GB/s ring busbw nccl-tests shows.
    nvl4 = get_link("nvlink4")
    assert nvl4.bandwidth_bytes_per_s == pytest.approx(450e9)
    assert nvl4.achievable_bytes_per_s == pytest.approx(370.8e9)
    assert get_link("nvlink3").bandwidth_bytes_per_s == pytest.approx(300e9)  # A100: 600 GB/s total
    assert get_link("nvlink5").bandwidth_bytes_per_s == pytest.approx(900e9)  # B200: 1.8 TB/s total
    # PCIe x16 per direction: 8/16/32 GT/s x 16 lanes x 128/130 / 8.
    assert get_link("pcie3").bandwidth_bytes_per_s == pytest.approx(15.75e9, rel=1e-3)
    assert get_link("pcie4").bandwidth_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)
    assert get_link("pcie5").bandwidth_bytes_per_s == pytest.approx(63.0e9, rel=1e-3)
    # 200/400/800 Gb/s NICs.
    assert get_link("ib-hdr").bandwidth_bytes_per_s == pytest.approx(25e9)
    assert get_link("ib-ndr").bandwidth_bytes_per_s == pytest.approx(50e9)
    assert get_link("ib-xdr").bandwidth_bytes_per_s == pytest.approx(100e9)
    # MI300X: 7 xGMI links x 64 GB/s per direction.
    assert get_link("infinity-fabric").bandwidth_bytes_per_s == pytest.approx(448e9)


# --- parse_gpus ---------------------------------------------------------------------------------------


def test_capacity_only():
    cluster = parse_gpus("4x24GB")
    assert cluster.capacity_only
    assert cluster.gpu.nominal_memory_gb == 24
    assert (cluster.world_size, cluster.nodes, cluster.gpus_per_node) == (4, 1, 4)
    assert cluster.label == "4x24GB"


def test_named_gpu_one_node():
    cluster = parse_gpus("8xh100-sxm")
    assert cluster.gpu.name == "h100-sxm" and not cluster.capacity_only
    assert (cluster.nodes, cluster.gpus_per_node) == (1, 8)
    assert cluster.intra_link.name == "nvlink4" and cluster.inter_link.name == "ib-ndr"
    assert cluster.host_ram_bytes_per_node == 2 * 2**40


def test_nodes_by_gpus_per_node():
    cluster = parse_gpus("2x8xa100-80gb")
    assert cluster.gpu.name == "a100-80gb"
    assert (cluster.nodes, cluster.gpus_per_node, cluster.world_size) == (2, 8, 16)
    assert cluster.label == "2x8xa100-80gb"


def test_consumer_cards():
    cluster = parse_gpus("4xrtx4090")
    assert cluster.gpu.name == "rtx4090"
    assert (cluster.nodes, cluster.gpus_per_node) == (1, 4)
    assert cluster.intra_link.name == "pcie4-nop2p" and not cluster.intra_link.peer_to_peer


def test_bare_count_above_node_size_is_split():
    cluster = parse_gpus("16xh100-sxm")
    assert (cluster.nodes, cluster.gpus_per_node, cluster.world_size) == (2, 8, 16)


@pytest.mark.parametrize(
    "text, value",
    [("0x24GB", "0x24GB"), ("4xNOSUCHGPU", "NOSUCHGPU"), ("banana", "banana"), ("4x23GB", "23GB")],
)
def test_bad_gpu_strings(text, value):
    with pytest.raises(ShardplanError) as err:
        parse_gpus(text)
    assert value in str(err.value)


def test_uneven_split_is_an_error_with_a_suggestion():
    with pytest.raises(ShardplanError) as err:
        parse_gpus("12xh100-sxm")
    assert "12xh100-sxm" in str(err.value) and "2x6xh100-sxm" in str(err.value)
    assert parse_gpus("1x12xh100-sxm").gpus_per_node == 12  # explicit node layout is taken as given


def test_fractional_capacity_does_not_round_down():
    with pytest.raises(ShardplanError) as err:
        parse_gpus("4x24.5GB")
    assert "24.5GB" in str(err.value)


def test_aliases_resolve():
    assert parse_gpus("8xH100").gpu.name == "h100-sxm"
    assert parse_gpus("2x RTX 4090").gpu.name == "rtx4090"
    assert parse_gpus("8xMI300X").gpu.name == "mi300x"
    assert parse_gpus("4x80GB").gpu.name == "h100-sxm"
    assert parse_gpus("8x192GB").gpu.name == "mi300x"
    assert parse_gpus("8x180GB").gpu.name == "b200"


def test_link_overrides():
    cluster = parse_gpus("4xrtx4090", intra_link="pcie4", inter_link="ib-hdr")
    assert cluster.intra_link.name == "pcie4" and cluster.inter_link.name == "ib-hdr"
    with pytest.raises(ShardplanError) as err:
        parse_gpus("4xrtx4090", intra_link="warp-drive")
    assert "warp-drive" in str(err.value) and "intra_link" in str(err.value)


# --- user profiles and malformed files --------------------------------------------------------------


def _valid_gpu(**changes) -> dict:
    data = json.loads((GPU_DIR / "h100-sxm.json").read_text())
    # a made-up 72 GB card: no built-in has that size
    data.update(name="my-h20", display_name="My H20", aliases=["my-h20-72"], nominal_memory_gb=72,
                memory_bytes=71 * GiB)
    data.update(changes)
    return data


def test_malformed_profile_names_the_field(tmp_path, monkeypatch):
    folder = tmp_path / "hardware_profiles" / "gpus"
    folder.mkdir(parents=True)
    bad = folder / "bad.json"
    bad.write_text(json.dumps(_valid_gpu(memory_bytes=-5)))
    monkeypatch.setenv(PROFILE_PATH_ENV, str(tmp_path))
    with pytest.raises(ShardplanError) as err:
        load_profile(bad, GPUProfile)
    assert "memory_bytes" in str(err.value) and "bad.json" in str(err.value)
    # A bad file in a user folder is skipped when listing, and the built-ins still load.
    assert {g.name for g in gpu_profiles()} == GPU_NAMES


@pytest.mark.parametrize(
    "changes, field",
    [({"flops": 1}, "flops"), ({"sources": {"memory_bytes": "x"}}, "sources"), ({"vendor": "intel"}, "vendor")],
)
def test_schema_rejects(tmp_path, changes, field):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(_valid_gpu(**changes)))
    with pytest.raises(ShardplanError) as err:
        load_profile(path, GPUProfile)
    assert field in str(err.value)


def test_not_json_is_a_one_line_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ShardplanError) as err:
        load_profile(path, GPUProfile)
    assert "not valid JSON" in str(err.value)


def test_user_profile_is_found_by_name_and_capacity(tmp_path, monkeypatch):
    folder = tmp_path / "hardware_profiles" / "gpus"
    folder.mkdir(parents=True)
    (folder / "my-h20.json").write_text(json.dumps(_valid_gpu()))
    monkeypatch.setenv(PROFILE_PATH_ENV, str(tmp_path))
    assert parse_gpus("8xmy-h20").gpu.name == "my-h20"
    # 72 GB is not in CAPACITY_DEFAULTS; the one profile of that size answers.
    cluster = parse_gpus("2x72GB")
    assert cluster.gpu.name == "my-h20" and cluster.capacity_only


def test_links_must_serve_their_tier():
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.support.errors import ShardplanError

    with pytest.raises(ShardplanError, match="intra_link='ib-ndr'"):
        parse_gpus("8xh100-sxm", intra_link="ib-ndr")
    with pytest.raises(ShardplanError, match="inter_link='nvlink4'"):
        parse_gpus("2x8xh100-sxm", inter_link="nvlink4")
    assert parse_gpus("2x8xh100-sxm", inter_link="eth-400g").inter_link.name == "eth-400g"


def test_renamed_gpu_profile_predicts_exactly_the_same(tmp_path, monkeypatch):
    """Per-GPU coefficients are profile data: a copy of h100-sxm.json under another name (found
    through SHARDPLAN_PROFILE_PATH) gives the same step time, tokens/s and memory, bit for bit."""
    import json

    import numpy as np

    from shardplan.formulas.columns import columns_for
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.models import resolve_model
    from shardplan.inputs.profiles import DATA_DIR
    from shardplan.planning.evaluate import evaluate_grid

    data = json.loads((DATA_DIR / "hardware_profiles/gpus/h100-sxm.json").read_text())
    data.update(name="my-lab-gpu", display_name="a lab's renamed copy", aliases=[])
    folder = tmp_path / "hardware_profiles" / "gpus"
    folder.mkdir(parents=True)
    (folder / "my-lab-gpu.json").write_text(json.dumps(data))
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(tmp_path))
    spec = resolve_model("llama-3.1-8b").spec
    keys = ("step_time_s", "tokens_per_s", "mfu", "compute_s", "comm_s", "offload_transfer_s",
            "device_total_bytes", "headroom_bytes")
    for layout in ("8x{}", "2x8x{}"):
        for config in (TrainingConfig(), TrainingConfig(offload="optimizer", ac="full", micro_batch=2)):
            a, b = (parse_gpus(layout.format(g)) for g in ("h100-sxm", "my-lab-gpu"))
            assert b.gpu.name == "my-lab-gpu"
            ra = evaluate_grid(columns_for(spec, a, config), True, a)
            rb = evaluate_grid(columns_for(spec, b, config), True, b)
            for k in keys:
                assert np.array_equal(ra[k], rb[k]), (layout, k)


def test_profile_coefficients_need_a_source(tmp_path):
    import json

    from shardplan.inputs.hardware import DEFAULT_GEMM_EFFICIENCY, GPUProfile, LinkProfile
    from shardplan.inputs.profiles import DATA_DIR

    data = json.loads((DATA_DIR / "hardware_profiles/gpus/rtx3090.json").read_text())
    assert GPUProfile.model_validate(data).gemm_efficiency == DEFAULT_GEMM_EFFICIENCY  # not set: the default
    with pytest.raises(ValueError, match="sources lacks gemm_efficiency"):
        GPUProfile.model_validate(dict(data, gemm_efficiency=0.7))
    link = json.loads((DATA_DIR / "hardware_profiles/links/nvlink4.json").read_text())
    assert LinkProfile.model_validate(link).nccl_channels == 32
    del link["sources"]["nccl_channels"]
    with pytest.raises(ValueError, match="sources lacks nccl_channels"):
        LinkProfile.model_validate(link)


def test_nccl_buffers_come_from_the_link_profile():
    from shardplan.formulas.overheads import NCCL_BYTES_PER_CHANNEL, nccl_bytes_for_link
    from shardplan.inputs.hardware import get_link

    assert nccl_bytes_for_link(get_link("nvlink4")) == 32 * NCCL_BYTES_PER_CHANNEL
    assert nccl_bytes_for_link("nvlink3") == 16 * NCCL_BYTES_PER_CHANNEL
    assert nccl_bytes_for_link(get_link("pcie4-nop2p")) == 4 * NCCL_BYTES_PER_CHANNEL
