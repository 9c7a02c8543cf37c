"""GPUs people rent (issue 11): the new profiles hold their vendors' figures, the GPU strings users
type parse under one grammar, bf16 is refused where the silicon has none, and `hardware show` of an
unknown name lists GPUs and links. Expected values are the cited published figures."""

from __future__ import annotations

import json
import time

import pytest

from shardplan.cli.app import main
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import CAPACITY_DEFAULTS, MAX_GPUS, NOT_A_CAPACITY, cluster_notes, even_layout, get_gpu, get_link, gpu_profiles, parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.inputs.units import GiB
from shardplan.planning.fit import fit
from shardplan.support.errors import ShardplanError
from shardplan.support.names import normalize

NEW_GPUS = ("a10g", "l4", "l40", "rtx-a6000", "rtx6000-ada", "v100-16gb", "v100-32gb", "t4", "h20",
            "gh200-96gb", "gh200-144gb", "mi250x", "mi325x", "rtx5080")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- each profile holds its vendor's published figures (rel 1e-3 unless said) ------------------------

# (gpu, nominal GB, dense bf16 or fp16 TFLOP/s, memory TB/s, source of the figures)
DATASHEET = [
    ("l4", 24, 121, 0.300, "L4 datasheet: BF16 242 TFLOPS with sparsity, 300 GB/s"),
    ("l40", 48, 181.05, 0.864, "L40 datasheet: BF16 181.05 (362.1 sparse), 864 GB/s"),
    ("rtx-a6000", 48, 154.8, 0.768, "RTX A6000 datasheet: tensor 309.7 TFLOPS sparse, 768 GB/s"),
    ("rtx6000-ada", 48, 364.25, 0.960, "RTX 6000 Ada datasheet: 1,457 FP8 sparse -> 364.25 BF16 dense, 960 GB/s"),
    ("v100-16gb", 16, 125, 0.900, "Tesla V100 datasheet (SXM2): tensor 125 TFLOPS, 900 GB/s"),
    ("v100-32gb", 32, 125, 0.900, "Tesla V100 datasheet (SXM2): tensor 125 TFLOPS, 900 GB/s"),
    ("t4", 16, 65, 0.320, "T4 datasheet: mixed precision 65 TFLOPS, 320 GB/s"),
    ("h20", 96, 148, 4.0, "H20 product brief as reported: FP16 148 TFLOPS dense, 4.0 TB/s"),
    ("gh200-96gb", 96, 989.4, 4.0, "GH200 datasheet: 96 GB HBM3 at 4 TB/s; H100 whitepaper dense BF16 989.4"),
    ("gh200-144gb", 144, 989.4, 4.9, "GH200 datasheet: 144 GB HBM3e at 4.9 TB/s"),
    ("mi250x", 64, 191.5, 1.6384, "MI250X datasheet: BF16 383 TFLOPS, 3.2768 TB/s per package of 2 GCDs"),
    ("mi325x", 256, 1307.4, 6.0, "MI325X datasheet: BF16 1,307.4 TFLOPS dense, 6 TB/s"),
    ("rtx5080", 16, 112.6, 0.960, "RTX Blackwell whitepaper App. A: RTX 5080 FP16/BF16 FP32-acc 112.6 dense, 960 GB/s"),
    ("a10g", 24, 70.04, 0.600, "80 SMs x 1710 MHz x 512 FLOP/clk (GA102 whitepaper rates); 600 GB/s; MAMF 69.7"),
]


@pytest.mark.parametrize("name, gb, tflops, tbs, source", DATASHEET, ids=[d[0] for d in DATASHEET])
def test_new_gpu_matches_its_datasheet(name, gb, tflops, tbs, source):
    gpu = get_gpu(name)
    assert gpu.nominal_memory_gb == gb, source
    peak = gpu.peak_flops.get("bf16", gpu.peak_flops.get("fp16"))
    assert peak == pytest.approx(tflops * 1e12, rel=1e-3), source
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(tbs * 1e12, rel=1e-3), source
    # dense, not sparse: no listed peak may reach the datasheet's "with sparsity" (2x) figure
    assert peak < 1.5 * tflops * 1e12


def test_exposed_memory_is_the_cited_device_value():
    # deviceQuery / torch total_memory prints cited in each profile's sources (bytes, or MiB x 2^20)
    assert get_gpu("l4").memory_bytes == 23_570_219_008          # thamada/nvidia-smi L4 deviceQuery
    assert get_gpu("rtx6000-ada").memory_bytes == 51_002_867_712  # RTX 6000 Ada deviceQuery, ECC off
    assert get_gpu("a10g").memory_bytes == 22587 * 2**20          # torch total_memory=22587MB
    assert get_gpu("t4").memory_bytes == 15109 * 2**20            # torch total_memory=15109MB (Colab)
    assert get_gpu("v100-16gb").memory_bytes == 16160 * 2**20     # torch total_memory=16160MB
    assert get_gpu("h20").memory_bytes == 97285 * 2**20           # torch total_memory=97285MB
    assert get_gpu("mi250x").memory_bytes == 65520 * 2**20        # torch on ROCm, one GCD: 65520MB
    assert get_gpu("rtx5080").memory_bytes == 16302 * 2**20       # torch total_memory=16302MB


def test_no_bf16_where_the_silicon_has_none():
    # V100 (Volta) and T4 (Turing) datasheets list FP16 tensor rates only; CDNA 2 has no TF32/FP8.
    for name in ("v100-16gb", "v100-32gb", "t4"):
        gpu = get_gpu(name)
        assert not gpu.has_bf16 and "fp16" in gpu.peak_flops and "tf32" not in gpu.peak_flops
    assert get_gpu("mi250x").has_bf16 and "fp8" not in get_gpu("mi250x").peak_flops
    assert "fp8" not in get_gpu("a10g").peak_flops and "fp8" not in get_gpu("rtx-a6000").peak_flops


def test_new_links_hold_their_published_rates():
    # V100 datasheet: NVLink 300 GB/s = 6 links x 25 GB/s per direction; NCCL topo.h SM70 20 GB/s usable.
    assert get_link("nvlink2").bandwidth_bytes_per_s == pytest.approx(150e9)
    assert get_link("nvlink2").achievable_bytes_per_s == pytest.approx(120e9)
    assert get_link("ib-edr").bandwidth_bytes_per_s == pytest.approx(12.5e9)  # 100 Gb/s
    assert get_link("infinity-fabric-mi250x").bandwidth_bytes_per_s == pytest.approx(50e9)  # one xGMI link
    assert get_link("nvlink-c2c").bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 GB/s bidirectional
    assert get_gpu("gh200-96gb").host_link == "nvlink-c2c"


def test_generic_aliases_are_aliases_and_capacity_defaults_cover_the_new_sizes():
    for gpu in gpu_profiles():
        assert {normalize(a) for a in gpu.generic_aliases} <= {normalize(a) for a in gpu.aliases}, gpu.name
    for size in (10, 12, 16, 96, 144, 256):
        assert get_gpu(CAPACITY_DEFAULTS[size][0]).nominal_memory_gb == size
    for name in NEW_GPUS:  # a bare '64GB' no longer stands for an MI250X GCD (issue 22: NOT_A_CAPACITY)
        assert any(name in names for names in CAPACITY_DEFAULTS.values()) or name in NOT_A_CAPACITY, name


# --- GPU strings: one grammar ------------------------------------------------------------------------

FORMS = [
    ("8 h100", "8xh100-sxm", "h100-sxm"),
    ("8xh100", "8xh100-sxm", "h100-sxm"),
    ("8×H100", "8xh100-sxm", "h100-sxm"),
    ("8 x h100", "8xh100-sxm", "h100-sxm"),
    ("2x8xh100", "2x8xh100-sxm", "h100-sxm"),
    ("4x24 GB", "4x24GB", "rtx4090"),
    ("4 x 24GB", "4x24GB", "rtx4090"),
    ("16 x 80 GB", "2x8x80GB", "h100-sxm"),
    ("1xa10g", "1xa10g", "a10g"),
    ("2x 4090", "2xrtx4090", "rtx4090"),
    ("8 4090", "8xrtx4090", "rtx4090"),
]


@pytest.mark.parametrize("text, label, gpu", FORMS, ids=[f[0] for f in FORMS])
def test_gpu_forms_through_the_cli(capsys, text, label, gpu):
    code, out, err = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", text, "--method", "qlora",
                         "--strategy", "full_shard" if "x8x" in label or label.startswith(("8x", "4x", "2x")) else "single",
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["cluster"]["label"] == label and result["gpu"]["name"] == gpu


def test_a_family_name_is_noted_with_the_variant_it_took(capsys):
    code, out, _ = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", "8xh100", "--strategy", "full_shard",
                       "--json")
    assert code == 0
    notes = json.loads(out)["notes"]
    assert any("'h100' taken as h100-sxm" in n and "h100-pcie" in n for n in notes)
    # the full name needs no note
    code, out, _ = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--strategy", "full_shard",
                       "--json")
    assert not any("taken as" in n for n in json.loads(out)["notes"])


def test_mi250x_says_one_gpu_is_one_gcd():
    notes = cluster_notes(parse_gpus("8xmi250x"))
    assert any("one GCD" in n and "4 packages" in n for n in notes)


@pytest.mark.parametrize("text", ["99999999999999999999xh100", "8x99999999999999999999xh100",
                                  "1000001xh100", "1000x1001xh100", "9" * 5000 + "xh100"])
def test_absurd_counts_are_refused_at_once(capsys, text):
    start = time.perf_counter()
    code, out, err = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", text)
    assert time.perf_counter() - start < 2.0  # bounded: no loop over the count, no int() of 5000 digits
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{MAX_GPUS:,}" in err and "Traceback" not in err


def test_uneven_split_suggestion_is_not_a_linear_search():
    # 999,983 is prime: the only layout with equal nodes is 999,983 nodes of one GPU. The divisor search
    # runs over the node size (8 values), not over the count.
    start = time.perf_counter()
    with pytest.raises(ShardplanError) as err:
        parse_gpus("999983xh100-sxm")
    assert time.perf_counter() - start < 0.5
    assert "999983x1xh100-sxm" in str(err.value)
    assert even_layout(12, 8) == (2, 6) and even_layout(24, 8) == (3, 8) and even_layout(7, 8) == (1, 7)


@pytest.mark.parametrize("text, needle", [("4x24", "'24GB'"), ("8h100", "COUNTxGPU"), ("4xGB", "COUNTxGPU"),
                                          ("8xh1000", "unknown")])
def test_bad_forms_are_one_line_errors_naming_the_value(capsys, text, needle):
    code, out, err = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", text)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert needle in err


# --- bf16 where there is none --------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", ["2xv100", "1xt4", "2xv100-16gb"])
def test_stated_bf16_on_volta_or_turing_is_refused(capsys, gpus):
    code, out, err = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", gpus, "--method", "lora",
                         "--precision", "bf16-mixed")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "precision='bf16-mixed'" in err and "no bf16" in err and "fp16-mixed" in err


def test_default_precision_on_v100_becomes_fp16_mixed_and_says_so(capsys):
    code, out, err = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", "2xv100", "--method", "lora",
                         "--strategy", "full_shard", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["config"]["precision"] == "fp16-mixed"
    assert any("no bf16" in n and "fp16-mixed" in n for n in result["notes"])


def test_plan_refuses_bf16_and_adapts_the_default_on_t4(capsys):
    code, _, err = run(capsys, "plan", "opt-1.3b", "--gpus", "1xt4", "--method", "lora",
                       "--precision", "bf16-mixed")
    assert code == 2 and "no bf16" in err
    code, out, err = run(capsys, "plan", "opt-1.3b", "--gpus", "1xt4", "--method", "lora", "--json")
    assert code == 0, err
    assert "fp16-mixed" in out


def test_library_fit_refuses_bf16_on_v100():
    spec = resolve_model("llama-3.1-8b").spec
    with pytest.raises(ShardplanError) as err:
        fit(spec, parse_gpus("2xv100-32gb"), TrainingConfig(method="lora"), ["full_shard"])
    assert err.value.field == "precision"


# --- every new GPU answers a fit, and hardware show knows it --------------------------------------------


@pytest.mark.parametrize("name", NEW_GPUS)
def test_fit_runs_on_every_new_gpu(capsys, name):
    code, out, err = run(capsys, "fit", "--model", "llama-3.1-8b", "--gpus", f"1x{name}", "--method", "qlora",
                         "--json")
    assert code == 0, err
    result = json.loads(out)[0]
    assert result["gpu"]["name"] == name
    assert result["per_gpu"]["device_total_bytes"] > 0


def test_fit_query_on_a10g(capsys):
    code, out, err = run(capsys, "fit", "8b on 1xa10g lora")
    assert code == 0, err
    assert "1xa10g" in out


def test_hardware_show_new_gpu_and_unknown_name(capsys):
    code, out, _ = run(capsys, "hardware", "show", "a10g", "--json")
    assert code == 0 and json.loads(out)["name"] == "a10g"
    code, out, _ = run(capsys, "hardware", "show", "nvlink-c2c", "--json")
    assert code == 0 and json.loads(out)["kind"] == "nvlink"
    code, out, err = run(capsys, "hardware", "show", "h10")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "GPUs: " in err and "links: " in err
    assert "a10g" in err and "h100-sxm" in err and "nvlink4" in err
    assert "did you mean 'h100-sxm'" in err  # aliases ('H100') are named by their profile


def test_capacity_of_a_new_size_is_noted(capsys):
    code, out, err = run(capsys, "fit", "--model", "opt-1.3b", "--gpus", "2x16GB", "--method", "lora",
                         "--strategy", "full_shard", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["gpu"]["name"] == "t4" and result["gpu"]["memory_bytes"] < 16 * GiB
    assert any("names only a capacity" in n for n in result["notes"])
    assert any("fp16-mixed" in n for n in result["notes"])  # T4: no bf16


def test_sweep_marks_bf16_rows_on_v100_not_valid():
    from shardplan.planning.grid_sweep import sweep

    df = sweep(gpus=["v100-32gb", "h100-sxm"], precision=["bf16-mixed", "fp16-mixed", "bf16-pure"],
               method="lora", gpu_counts=8)
    valid = df.groupby(["gpu", "precision"], observed=True)["valid"].any()
    assert not valid[("v100-32gb", "bf16-mixed")] and not valid[("v100-32gb", "bf16-pure")]
    assert valid[("v100-32gb", "fp16-mixed")] and valid[("h100-sxm", "bf16-mixed")]
    assert not df[(df.gpu == "v100-32gb") & (df.precision == "bf16-mixed")]["fits"].any()
    assert any("v100-32gb: no bf16" in n for n in df.attrs["notes"])


def test_node_nics_follow_the_profile():
    # DGX-1: 4 EDR ports for 8 V100; AWS g5.48xlarge: one 100 Gbps interface for 8 A10G; Frontier: 4 NICs
    # per 8 GCDs; no profile value (H100 SXM): one ConnectX per GPU on an 8-GPU HGX node.
    assert parse_gpus("2x8xv100-32gb").nics_per_node == 4
    assert parse_gpus("2x8xa10g").nics_per_node == 1
    assert parse_gpus("2x8xmi250x").nics_per_node == 4
    assert parse_gpus("2x8xh100-sxm").nics_per_node == 8
    assert parse_gpus("2x2xv100-32gb").nics_per_node == 2  # never more NICs than GPUs
    assert parse_gpus("2x8xv100-32gb", nics_per_node=8).nics_per_node == 8  # a stated count wins
