"""Exact parameter counts of a Hugging Face config by building the model on the meta device
(``transformers.AutoModelForCausalLM.from_config`` under ``torch.device("meta")``: no weights, no
network), where torch and transformers are installed; ``None`` where they are not, or where
transformers cannot build the config. The hand-written readers (``hf_config.py``) stay the
no-extra path; this is how a config they only approximate (an unknown ``model_type`` read with
the Llama layout) is checked against the real module tree.

``accelerate.init_empty_weights`` is not used: it un-ties tied embeddings in transformers 5
(tests/data/README.md); the meta device keeps them tied, and ``parameters()`` counts a shared
tensor once.
"""

from __future__ import annotations

from typing import Any


def meta_param_count(config: dict[str, Any]) -> int | None:
    """The parameter count of the causal LM ``config`` describes, built on the meta device; None
    where torch/transformers are missing or cannot build it (the caller keeps its own count)."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    model_type = config.get("model_type")
    kwargs = {k: v for k, v in config.items() if k != "model_type" and not k.startswith("_")}
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its config warnings are not the answer's
    try:
        built = transformers.AutoConfig.for_model(model_type, **kwargs)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(built)
    except Exception:  # an architecture transformers has no causal-LM class for, or rejects: no check
        return None
    finally:
        transformers.logging.set_verbosity(verbosity)
    return int(sum(p.numel() for p in model.parameters()))
