"""Measure the FSDP2 allocation facts the memory formulas rest on (fake PG, CPU, tiny Llama).

Prints JSON and writes data/calibration/fsdp2_facts.json. Each fact is derived from
FSDPMemTracker category maxima / per-module snapshots, comparing against sizes computed here.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_fsdp2_facts.py
"""

import json
import sys
from pathlib import Path

import torch

from shardplan.calibrate.config import RunConfig
from shardplan.calibrate.launch import run_fake
from shardplan.calibrate.results import write_json_atomic
from shardplan.calibrate.runner import environment, resolve_spec
from shardplan.calibrate.tiny_model import build_tiny_model

torch.set_num_threads(1)
OUT = Path(__file__).resolve().parents[1] / "data" / "calibration" / "fsdp2_facts.json"
TINY = {"hidden_size": 64, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 160,
        "vocab_size": 512}


def sizes(cfg):
    spec = resolve_spec(cfg)
    m = build_tiny_model(spec)
    g = cfg.resolved_shard_size
    block = list(m.layers[0].parameters())
    root = [p for n, p in m.named_parameters() if not n.startswith("layers.")]
    pad = lambda ps: sum(-(-p.shape[0] // g) * g * (p.numel() // p.shape[0]) for p in ps)
    return spec, {"block_elems": sum(p.numel() for p in block), "block_padded_elems": pad(block),
                  "root_elems": sum(p.numel() for p in root), "root_padded_elems": pad(root),
                  "n_param_tensors": len(list(m.parameters()))}


def run(**kw):
    base = dict(tiny=TINY, world_size=4, param_dtype="bfloat16", reduce_dtype="float32", micro_batch=2, seq_len=64)
    cfg = RunConfig(**{**base, **kw})
    return cfg, run_fake(cfg)


facts = {}
cfg, r = run()
spec, sz = sizes(cfg)
m, fw, bw = r["measured"], r["forward_peak_breakdown"]["cpu"], r["backward_peak_breakdown"]["cpu"]
ub = 2 * sz["block_elems"]  # one block's unsharded params in bf16
ur = 2 * sz["root_elems"]
facts["config"] = cfg.model_dump(mode="json")
facts["sizes"] = sz
facts["unsharded_param_max_bytes"] = m["params_unsharded_bytes"]
facts["unsharded_param_max_over_(root+k*block)"] = (m["params_unsharded_bytes"] - ur) / ub
facts["forward_peak_unsharded_param_bytes"] = fw["Unsharded Param"]
facts["forward_peak_units_unsharded_(excluding root)"] = (fw["Unsharded Param"] - ur) / ub
facts["backward_peak_unsharded_param_bytes"] = bw["Unsharded Param"]
facts["backward_peak_units_unsharded_(excluding root)"] = (bw["Unsharded Param"] - ur) / ub
facts["all_gather_max_bytes"] = m["all_gather_bytes"]
facts["all_gather_max_over_root_padded_bf16"] = m["all_gather_bytes"] / (2 * sz["root_padded_elems"])
facts["all_gather_at_forward_peak"] = fw["All Gather"]
facts["all_gather_at_forward_peak_over_block_padded_bf16"] = fw["All Gather"] / (2 * sz["block_padded_elems"])
facts["reduce_scatter_max_bytes"] = m["reduce_scatter_bytes"]
facts["reduce_scatter_max_over_root_padded_fp32"] = m["reduce_scatter_bytes"] / (4 * sz["root_padded_elems"])
facts["unsharded_grad_max_bytes"] = m["grads_unsharded_bytes"]
facts["unsharded_grad_max_over_root_bf16"] = m["grads_unsharded_bytes"] / (2 * sz["root_elems"])
facts["sharded_param_bytes"] = m["params_sharded_bytes"]
facts["sharded_param_over_padded_total_fp32_div_W"] = m["params_sharded_bytes"] / (
    4 * (sz["root_padded_elems"] + spec.num_layers * sz["block_padded_elems"]) / 4)
facts["optimizer_state_bytes"] = m["optimizer_state_bytes"]
facts["adam_state_minus_2x_sharded"] = m["optimizer_state_bytes"] - 2 * m["params_sharded_bytes"]
facts["collectives"] = r["collectives"]

# root stays unsharded from forward to backward? compare AG count with reshard on/off
cfg2, r2 = run(strategy="shard_grad_op")
facts["shard_grad_op_collectives"] = r2["collectives"]
facts["shard_grad_op_unsharded_param_max_over_all_params_bf16"] = r2["measured"]["params_unsharded_bytes"] / (
    2 * (sz["root_elems"] + spec.num_layers * sz["block_elems"]))

# activations per token per layer (AC none): difference between 4 and 2 layers at equal everything else
acts = {}
for L in (2, 4):
    c, rr = run(tiny={**TINY, "num_layers": L})
    acts[L] = rr["forward_peak_breakdown"]["cpu"]["Activation"]
tokens = 2 * 64
facts["activation_bytes_per_token_per_llama_layer_bf16"] = (acts[4] - acts[2]) / 2 / tokens
h, i, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_width, spec.kv_width
facts["activation_per_token_per_layer_in_units"] = {"h": h, "i": i, "q": q, "kv": kv}
# logits: vary vocab at 2 layers
lg = {}
for V in (512, 1024):
    c, rr = run(tiny={**TINY, "num_layers": 2, "vocab_size": V})
    lg[V] = rr["forward_peak_breakdown"]["cpu"]["Activation"] - 0
facts["forward_peak_activation_bytes_per_token_per_vocab_entry"] = (lg[1024] - lg[512]) / 512 / tokens
facts["env"] = environment()

if __name__ == "__main__":
    print(json.dumps(facts, indent=1))
    write_json_atomic(sys.argv[1] if len(sys.argv) > 1 else OUT, facts)
