"""Names users type for models, through the CLI: hub ids of fine-tunes, folders, bare sizes, near misses.

Expected profiles are the built-ins (shardplan/data/model_profiles); parameter counts are the ones
pinned against transformers in tests/data/hf_model_counts.csv (exact, tolerance 0).
"""

import json

import pandas as pd
import pytest

from shardplan.cli.app import main
from shardplan.inputs.model_names import VARIANT_WORDS, name_forms
from shardplan.inputs.models import SIZE_REFERENCES, SIZE_TOLERANCE, get_model, nearest_for_size

MISTRAL_CONFIG = {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
MISTRAL_7B_PARAMS = 7_241_732_096  # mistral-7b-v0.1 in tests/data/hf_model_counts.csv


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in out + err and len(lines) == 1, (code, out, err)
    return lines[0]


# --- hub ids and spellings -> the base profile, and the answer says what was matched --------------
FORMS = [
    # (typed, profile, the answer's model line)
    ("llama 3.1 70b", "llama-3.1-70b", "Llama-3.1-70B"),
    ("Meta Llama 3.1 8B", "llama-3.1-8b", "'Meta Llama 3.1 8B' -> Llama-3.1-8B"),
    ("Llama-3.1-70B-Instruct", "llama-3.1-70b", "'Llama-3.1-70B-Instruct' -> Llama-3.1-70B (instruct variant: same architecture)"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b",
     "'meta-llama/Meta-Llama-3.1-8B-Instruct' -> Llama-3.1-8B (instruct variant: same architecture)"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", "'Qwen/Qwen2.5-7B-Instruct' -> Qwen2.5-7B (instruct variant: same architecture)"),
    ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b-v0.1",
     "'mistralai/Mistral-7B-Instruct-v0.1' -> Mistral-7B-v0.1 (instruct variant: same architecture)"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b",
     "'meta-llama/Llama-2-7b-chat-hf' -> Llama-2-7B (chat variant, transformers-format upload: same architecture)"),
    ("google/gemma-2-9b-it", "gemma-2-9b", "'google/gemma-2-9b-it' -> Gemma-2-9B (instruction-tuned variant: same architecture)"),
    ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b",
     "'Qwen/Qwen2.5-72B-Instruct' -> Qwen2.5-72B (instruct variant: same architecture)"),
    ("unsloth/Llama-3.1-8B", "llama-3.1-8b", "'unsloth/Llama-3.1-8B' -> Llama-3.1-8B"),
    ("Llama-3-70B-Instruct", "llama-3-70b",
     "'Llama-3-70B-Instruct' -> Meta-Llama-3-70B (instruct variant: same architecture)"),
    ("llama 3 70b", "llama-3-70b", "Meta-Llama-3-70B"),
    ("google/gemma-3-12b-it", "gemma-3-12b", "Gemma-3-12B"),   # the hub id is the profile's alias
    ("Qwen/Qwen3-8B-Base", "qwen3-8b", "Qwen3-8B"),
]


@pytest.mark.parametrize("typed,profile,said", FORMS)
def test_fit_resolves_hub_ids_and_says_what_matched(capsys, typed, profile, said):
    code, out, err = run(capsys, "fit", f"{typed} on 8xh100-sxm", "--strategy", "full_shard", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["name"] == profile
    assert data["model"]["params"] == get_model(profile).total_params
    assert [n for n in data["notes"] if n.startswith("model: ")] == [f"model: {said}"]


@pytest.mark.parametrize("typed,profile,said", FORMS[2:5])
def test_models_show_plan_and_sweep_take_the_same_forms(tmp_path, capsys, typed, profile, said):
    code, out, _ = run(capsys, "models", "show", typed, "--json")
    assert code == 0 and json.loads(out)["name"] == profile
    code, out, _ = run(capsys, "plan", typed, "--gpus", "8xh100-sxm", "--json", "--top", "1")
    assert code == 0 and json.loads(out)["model"]["name"] == profile
    out_csv = tmp_path / "sweep.csv"
    code, _, err = run(capsys, "sweep", "--models", typed, "--gpus", "h100-sxm", "--gpu-counts", "8",
                       "--strategies", "full_shard", "--output", str(out_csv))
    assert code == 0, err
    assert set(pd.read_csv(out_csv)["model"]) == {profile}


def test_a_fine_tune_word_never_stands_in_for_a_different_architecture(capsys):
    # Mistral-7B-Instruct-v0.2 has a 32k context (v0.1: 8k sliding window): dropping "Instruct" gives
    # "Mistral-7B-v0.2", which no profile names, so it is an error that points at a profile, not an answer
    # (v0.3, a 32768-token vocabulary, has its own profile since issue 22).
    err = one_line_error(capsys, "fit", "mistralai/Mistral-7B-Instruct-v0.2 on 8xh100-sxm")
    assert "Mistral-7B-Instruct-v0.2" in err and "did you mean 'mistral-7b-v0.3' or 'mistral-7b-v0.1'" in err
    assert get_model("mistral-7b-v0.3").vocab_size == 32768
    # a fine-tune word alone, or as the first word, is a name, not a variant
    assert [f.text for f in name_forms("Instruct")] == ["Instruct"]
    assert all(not f.dropped_variants for f in name_forms("chat-7b"))


def test_every_variant_word_is_dropped_and_labelled():
    for word, label in VARIANT_WORDS:
        forms = name_forms(f"org/Llama-3.1-8B-{word.capitalize()}")
        assert forms[-1].text == "Llama-3.1-8B" and forms[-1].dropped_variants == (label,), word


# --- near misses: "did you mean" wherever a model name is resolved -----------------------------------
@pytest.mark.parametrize("argv", [
    ["fit", "llama-3.1-7b on 8xh100-sxm"],
    ["fit", "--model", "meta-llama/Llama-3.1-7B-Instruct", "--gpus", "8xh100-sxm"],
    ["plan", "llama-3.1-7b", "--gpus", "8xh100-sxm"],
    ["models", "show", "llama-3.1-7b"],
    ["sweep", "--models", "llama-3.1-8b,llama-3.1-7b", "--gpus", "h100-sxm", "--gpu-counts", "8", "-o", "unused.csv"],
])
def test_near_misses_get_did_you_mean_everywhere(capsys, argv):
    err = one_line_error(capsys, *argv)
    assert "7" in err and "did you mean" in err and "'llama-3.1-8b'" in err


def test_did_you_mean_reaches_profiles_through_their_aliases(capsys):
    # "gpt-2-x1" is nearest to the alias "gpt-2-xl": the suggestion is the profile's name, once
    err = one_line_error(capsys, "models", "show", "gpt-2-x1")
    assert "did you mean 'gpt2-xl'" in err and err.count("'gpt2-xl'") == 1


# --- --model DIR ----------------------------------------------------------------------------------
def test_model_folder_with_config_json(tmp_path, capsys, monkeypatch):
    snapshot = tmp_path / "Mistral-7B-v0.1"
    snapshot.mkdir()
    (snapshot / "config.json").write_text(json.dumps(MISTRAL_CONFIG))
    (snapshot / "model.safetensors.index.json").write_text("{}")  # a snapshot holds other JSON too
    code, out, err = run(capsys, "fit", "--model", str(snapshot), "--gpus", "8xh100-sxm", "--strategy", "full_shard",
                         "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["params"] == MISTRAL_7B_PARAMS
    # a folder's config says what it left out, as a config.json path does
    note = [n for n in data["notes"] if n.startswith(f"model: Hugging Face config {snapshot / 'config.json'}")]
    assert len(note) == 1 and "ASSUMED" in note[0] and "head_dim=128" in note[0]
    monkeypatch.setenv("HOME", str(tmp_path))
    code, out, _ = run(capsys, "models", "show", "~/Mistral-7B-v0.1", "--json")
    assert code == 0 and json.loads(out)["hidden_size"] == 4096


def test_model_hub_cache_folder_reads_the_snapshot_refs_main_names(tmp_path, capsys):
    repo = tmp_path / "models--mistralai--Mistral-7B-v0.1"
    for commit, layers in (("aaa111", 2), ("bbb222", 32)):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text(json.dumps({**MISTRAL_CONFIG, "num_hidden_layers": layers}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("bbb222\n")
    code, out, err = run(capsys, "fit", "--model", str(repo), "--gpus", "8xh100-sxm", "--strategy", "full_shard", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["params"] == MISTRAL_7B_PARAMS  # the 32-layer snapshot refs/main names
    assert data["model"]["name"] == "mistralai/Mistral-7B-v0.1"  # not the commit hash
    (repo / "refs" / "main").unlink()
    err = one_line_error(capsys, "models", "show", str(repo))
    assert "several snapshots" in err and "aaa111" in err and "bbb222" in err


def test_model_folder_without_config_json_names_the_folder(tmp_path, capsys):
    empty = tmp_path / "weights-only"
    empty.mkdir()
    err = one_line_error(capsys, "fit", "--model", str(empty), "--gpus", "8xh100-sxm")
    assert str(empty) in err and "no config.json" in err
    err = one_line_error(capsys, "models", "show", "~/no/such/folder")
    assert "~/no/such/folder" in err and "no such file or folder" in err


# --- bare sizes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("size,profile", [("70B", "llama-3.1-70b"), ("7B", "mistral-7b-v0.1"), ("8b", "llama-3.1-8b"),
                                          ("13B", "llama-2-13b"), ("30B", "opt-30b"), ("72B", "qwen2.5-72b"),
                                          ("125M", "opt-125m"), ("65B", "llama-2-70b")])
def test_a_bare_size_close_to_a_built_in_answers_for_it(capsys, size, profile):
    code, out, err = run(capsys, "fit", f"{size} on 8xh100-sxm", "--strategy", "full_shard", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["name"] == profile
    target = float(size[:-1]) * {"m": 1e6, "b": 1e9}[size[-1].lower()]
    assert abs(data["model"]["params"] / target - 1) <= SIZE_TOLERANCE
    assert any("the nearest built-in reference architecture" in n for n in data["notes"])


@pytest.mark.parametrize("size,nearest", [
    # nearest two dense built-ins by log-size, counts from hf_model_counts.csv (printed to 2 decimals)
    ("20B", ("mistral-small-24b 23.57B", "gemma-3-27b 27.01B")),
    ("50B", ("llama-2-70b 68.98B", "llama-3.1-70b 70.55B")),  # sizes no planned profile comes within 10 % of
    ("1T", ("llama-3.1-405b 405.85B", "gpt3-175b 174.60B")),
])
def test_a_bare_size_far_from_every_built_in_is_an_error_naming_the_two_nearest(capsys, size, nearest):
    err = one_line_error(capsys, "fit", f"{size} on 8xh100-sxm")
    assert f"model='{size}'" in err and f"within {SIZE_TOLERANCE:.0%}" in err
    assert f"(nearest: {nearest[0]}, {nearest[1]})" in err and "config.json" in err


def test_size_references_are_dense_built_ins():
    for name in SIZE_REFERENCES:
        assert get_model(name).moe is None, name


def _write_profile(folder, spec, **update):
    data = spec.model_copy(update=update).model_dump(mode="json", exclude_none=True)
    (folder / f"{update['name']}.json").write_text(json.dumps(data))


def test_a_size_no_reference_covers_uses_any_dense_profile_longest_context_first(tmp_path, monkeypatch, capsys):
    # Two user profiles of one architecture (equal counts) near 5B, a size no reference (nor any
    # planned built-in) covers, with different contexts: a bare "5B" answers for the one with the
    # longer context (a bare size states none), whatever the name.
    base = get_model("llama-3.1-8b")
    folder = tmp_path / "model_profiles"
    folder.mkdir()
    _write_profile(folder, base, name="aaa-5b-short", aliases=(), num_layers=18, max_position_embeddings=8192)
    _write_profile(folder, base, name="zzz-5b-long", aliases=(), num_layers=18, max_position_embeddings=131072)
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(tmp_path))
    chosen = nearest_for_size(5e9)
    assert chosen is not None and chosen.name == "zzz-5b-long"
    assert abs(chosen.total_params / 5e9 - 1) <= SIZE_TOLERANCE  # 18 Llama-3.1-8B blocks + embeddings: 4.98B
    code, out, _ = run(capsys, "models", "show", "5B", "--json")
    assert code == 0 and json.loads(out)["name"] == "zzz-5b-long"
    assert nearest_for_size(70e9).name == "llama-3.1-70b"  # a reference still wins where one is close


def test_docs_size_table_is_what_resolve_model_answers():
    """docs/model-names.md's bare-size table, row by row: profile, and the signed offset to 0.1 % (as printed)."""
    import re
    from pathlib import Path

    from shardplan.inputs.models import resolve_model
    from shardplan.support.errors import ShardplanError

    doc = (Path(__file__).parent.parent / "docs" / "model-names.md").read_text()
    rows = re.findall(r"^\| `([\d.]+[MBT])` \| (\S+) \| [\d.]+[MB] \| ([+−-][\d.]+) % \|$", doc, re.MULTILINE)
    assert len(rows) >= 10
    for size, profile, off in rows:
        spec = resolve_model(size).spec
        target = float(size[:-1]) * {"M": 1e6, "B": 1e9, "T": 1e12}[size[-1]]
        assert spec.name == profile, size
        assert f"{(spec.total_params / target - 1) * 100:+.1f}" == off.replace("−", "-"), size
    far = re.search(r"^\| ((?:`[\d.]+[MBT]`,? ?)+) \| error: nearest two named", doc, re.MULTILINE).group(1)
    for size in re.findall(r"`([\d.]+[MBT])`", far):
        with pytest.raises(ShardplanError, match="nearest: "):
            resolve_model(size)


def test_llama_3_names_reach_a_llama_3_profile(tmp_path, monkeypatch, capsys):
    # Issue 11's forms "llama 3 70b" and "Llama-3-70B-Instruct" need a llama-3-70b profile (the
    # built-in one arrives with the new families); a user profile of that name (Llama-3-70B's
    # config: Llama-3.1-70B's dimensions with an 8192-token context) shows the rule reaching it.
    folder = tmp_path / "model_profiles"
    folder.mkdir()
    _write_profile(folder, get_model("llama-3.1-70b"), name="llama-3-70b", display_name="Llama-3-70B",
                   aliases=("meta-llama/Meta-Llama-3-70B",), max_position_embeddings=8192)
    monkeypatch.setenv("SHARDPLAN_PROFILE_PATH", str(tmp_path))
    for typed in ("llama 3 70b", "Llama-3-70B-Instruct", "meta-llama/Meta-Llama-3-70B-Instruct"):
        code, out, err = run(capsys, "fit", f"{typed} on 8xh100-sxm", "--strategy", "full_shard", "--json")
        assert code == 0 and json.loads(out)["model"]["name"] == "llama-3-70b", (typed, err)
    # a bare size keeps its preferred stand-in: equal counts, and llama-3.1-70b is a SIZE_REFERENCE
    assert nearest_for_size(70e9).name == "llama-3.1-70b"


def test_exports_load_the_repository_the_user_named(tmp_path, capsys):
    # the instruct id resolves to the base profile (same architecture), but the exported script must
    # load the instruct weights the user named, not the base profile's repository
    out_py = tmp_path / "train.py"
    code, _, err = run(capsys, "fit", "meta-llama/Meta-Llama-3.1-8B-Instruct on 8xh100-sxm", "--strategy", "full_shard",
                       "--export", f"fsdp2={out_py}")
    assert code == 0, err
    assert 'MODEL_ID = "meta-llama/Meta-Llama-3.1-8B-Instruct"' in out_py.read_text()
    code, _, err = run(capsys, "fit", "Llama 3.1 8B on 8xh100-sxm", "--strategy", "full_shard", "--export", f"fsdp2={out_py}")
    assert code == 0, err
    assert 'MODEL_ID = "meta-llama/Llama-3.1-8B"' in out_py.read_text()  # a plain name: the profile's repository
    code, out, _ = run(capsys, "plan", "Qwen/Qwen2.5-7B-Instruct", "--gpus", "8xh100-sxm", "--json", "--top", "1")
    assert code == 0 and json.loads(out)["model"]["hf_id"] == "Qwen/Qwen2.5-7B-Instruct"
