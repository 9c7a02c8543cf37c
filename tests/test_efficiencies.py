"""``fit --global-batch-tokens`` names the efficiencies its step time used and their status."""

import json

from shardplan.cli.app import main


def _fit_json(query, capsys):
    assert main(["fit", query, "--global-batch-tokens", "4M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return (out[0] if isinstance(out, list) else out)["efficiencies"]


def test_h100_gemm_is_measured_the_rest_nameplate(capsys):
    eff = {e["name"]: e for e in _fit_json("llama-3.1-8b on 8xh100-sxm seq 8192 ac full full_shard", capsys)}
    assert eff["gemm"]["status"] == "measured" and 0.5 < eff["gemm"]["value"] <= 0.81
    assert eff["attention"]["status"] == eff["hbm"]["status"] == eff["intra_node_link"]["status"] == "nameplate"
    assert "inter_node_link" not in eff
    assert all(e["source"] for e in eff.values())


def test_unmeasured_gpu_says_nameplate_and_names_both_link_tiers(capsys):
    eff = {e["name"]: e for e in _fit_json("llama-3.1-8b on 2x8xa100-80gb seq 4096 full_shard", capsys)}
    assert eff["gemm"]["status"] == "nameplate"
    assert {"intra_node_link", "inter_node_link"} <= set(eff)


def test_text_answer_lists_them(capsys):
    assert main(["fit", "llama-3.1-8b on 8xh100-sxm seq 8192 ac full full_shard", "--global-batch-tokens", "4M"]) == 0
    out = capsys.readouterr().out
    assert "efficiencies: gemm" in out and "(measured)" in out and "(nameplate)" in out
