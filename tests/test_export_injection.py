"""Hostile plan values never become code in an export.

A plan file (``fit --json`` / ``plan --json`` output, or anyone's JSON) reaches generated Python,
shell lines and YAML. Values that the generated code names (the block class, the hub id) are
refused unless they have the shape the format needs; free text (model and GPU names) may only be
shown inside comments. The Python exports are parsed with ``ast`` and must hold exactly the names
and calls the template holds for a benign plan of the same knobs.
"""

from __future__ import annotations

import ast
import json
import shlex

import pytest

from shardplan.export import FORMATS, export, plan_spec
from shardplan.support.errors import ShardplanError

PAYLOAD = '__import__("os").system("touch /tmp/pwned")'
HOSTILE = [
    f'X"; {PAYLOAD}; Y = "',
    f"X'; {PAYLOAD}; Y = '",
    f"X\n{PAYLOAD}\n",
    f"X\r{PAYLOAD}",
    f"X\u2028{PAYLOAD}",
    f"X $({PAYLOAD}) `id`",
    "X}} {{ __import__",
    "a" * 5000,
]
BENIGN = {"model_name": "llama-3.1-8b", "hf_id": "meta-llama/Llama-3.1-8B", "block_class": "LlamaDecoderLayer",
          "nodes": 1, "gpus_per_node": 4, "gpu": "h100-sxm", "strategy": "full_shard", "engine": "fsdp2",
          "method": "lora", "ac": "full"}
CODE_FORMATS = ("fsdp2", "fsdp1")
PLAN_SHAPES = ("spec", "fit_record")


def _plan(shape: str, **over):
    fields = {**BENIGN, **over}
    if shape == "spec":
        return fields
    model = {k: fields.pop(k) for k in ("model_name", "hf_id", "block_class")}
    return {"model": {"name": model["model_name"], "hf_id": model["hf_id"], "block_class": model["block_class"]},
            "cluster": {"nodes": fields.pop("nodes"), "gpus_per_node": fields.pop("gpus_per_node"),
                        "gpu": {"name": fields.pop("gpu")}},
            "config": fields}


def _names_and_calls(source: str) -> set[str]:
    tree = ast.parse(source)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add("." + node.attr)
        elif isinstance(node, ast.Call):
            out.add("call:" + ast.unparse(node.func))
    return out


@pytest.mark.parametrize("field", ["block_class", "hf_id"])
@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("shape", PLAN_SHAPES)
def test_a_value_that_generated_code_names_is_refused(field, value, shape):
    with pytest.raises(ShardplanError) as err:
        plan_spec(_plan(shape, **{field: value}))
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", HOSTILE)
def test_the_block_class_option_is_validated_too(value):
    spec = plan_spec(_plan("spec"))
    with pytest.raises(ShardplanError, match="^block_class"):
        plan_spec(spec, block_class=value)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("field", ["model_name", "gpu"])
@pytest.mark.parametrize("value", HOSTILE[:2] + [f"X {PAYLOAD} #"])
def test_free_text_stays_inside_comments(fmt, field, value):
    benign = export(plan_spec(_plan("spec")), fmt)
    hostile = export(plan_spec(_plan("spec", **{field: value})), fmt)
    assert len(hostile.splitlines()) == len(benign.splitlines())
    if fmt in CODE_FORMATS:
        assert _names_and_calls(hostile) == _names_and_calls(benign)
    for line in hostile.splitlines():
        if PAYLOAD in line and not line.startswith("#"):
            pytest.fail(f"{fmt}: the payload left the comments: {line!r}")
    if fmt == "deepspeed":
        assert json.loads(hostile) == json.loads(benign)


@pytest.mark.parametrize("field", ["model_name", "gpu"])
@pytest.mark.parametrize("value", [f"X\n{PAYLOAD}", f"X\x1b[2J{PAYLOAD}", "a" * 5000])
def test_free_text_on_several_lines_or_with_control_characters_is_refused(field, value):
    with pytest.raises(ShardplanError, match=f"^{field}"):
        plan_spec(_plan("spec", **{field: value}))


@pytest.mark.parametrize("key", [f"x\n{PAYLOAD}", "x\r\nimport os"])
def test_a_breakdown_key_cannot_end_a_comment(key):
    with pytest.raises(ShardplanError, match="^breakdown"):
        plan_spec(_plan("spec", breakdown={key: 1 << 30}))


@pytest.mark.parametrize("fmt", CODE_FORMATS)
@pytest.mark.parametrize("block", ["LlamaDecoderLayer", "transformers.models.llama.modeling_llama.LlamaDecoderLayer"])
@pytest.mark.parametrize("hf_id", ["meta-llama/Llama-3.1-8B", "gpt2", "Qwen/Qwen2.5-0.5B-Instruct"])
def test_valid_values_are_literals_in_the_code(fmt, block, hf_id):
    text = export(plan_spec(_plan("spec", block_class=block, hf_id=hf_id)), fmt)
    constants = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(text).body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and node.targets[0].id in ("BLOCK_CLASS", "MODEL_ID")}
    assert constants == {"BLOCK_CLASS": block, "MODEL_ID": hf_id}


def test_the_shell_exports_split_into_the_same_words_with_a_hostile_model_name():
    for fmt in ("torchrun", "trainer"):
        benign = export(plan_spec(_plan("spec")), fmt)
        hostile = export(plan_spec(_plan("spec", model_name=f"X $({PAYLOAD}); rm -rf ~")), fmt)
        assert shlex.split(hostile, comments=True) == shlex.split(benign, comments=True)


def test_cli_export_refuses_a_hostile_plan_file(tmp_path):
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan("fit_record", block_class=HOSTILE[0])))
    out = tmp_path / "train.py"
    run = subprocess.run([sys.executable, "-m", "shardplan", "export", str(plan), "--to", "fsdp2", "-o", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "block_class" in run.stderr
    assert "Traceback" not in run.stderr and not out.exists()
