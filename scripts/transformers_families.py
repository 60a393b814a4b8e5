"""Read, from transformers itself, what tenplan needs to know of every
causal-LM family it lays out by the family's own description: each config
class's tensor-parallel plan (`base_model_tp_plan`, and the causal-LM
class's own `_tp_plan` for the output layer), its pipeline plan, and the
defaults of the fields tenplan reads when `config.json` leaves them out.
Writes models/data/transformers-families.json, which the models crate
embeds; rerun it when transformers changes:

    python scripts/transformers_families.py models/data/transformers-families.json
"""

import inspect
import json
import sys

import transformers
from transformers import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

# The fields whose defaults matter: what sizes the attention heads and the
# layers, and whether the output layer is the embedding.
FIELDS = [
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "n_layer",
    "n_head",
    "n_embd",
]


def defaults(cls):
    """The defaults `cls.__init__` gives the fields (None where it derives
    them: transformers sets num_key_value_heads to num_attention_heads and
    head_dim to hidden_size / num_attention_heads then)."""
    out = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for name, p in inspect.signature(init).parameters.items():
            if name in FIELDS and name not in out and p.default is not inspect.Parameter.empty:
                out[name] = p.default
    # Dataclass-style configs (transformers 5) declare fields as class attributes.
    for name in FIELDS:
        if name not in out and hasattr(cls, name):
            v = getattr(cls, name)
            if isinstance(v, (int, float, bool)) or v is None:
                out[name] = v
    return {k: v for k, v in out.items() if isinstance(v, (int, float, bool)) or v is None}


def causal_lm_tp_plan(model_type):
    """The causal-LM class's own plan entries (the output layer's)."""
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if not name:
        return {}
    cls = getattr(transformers, name, None)
    plan = getattr(cls, "_tp_plan", None) or {}
    return dict(plan)


def main():
    out_path = sys.argv[1]
    families = {}
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type not in CONFIG_MAPPING:
            continue
        cls = CONFIG_MAPPING[model_type]
        families[model_type] = {
            "config_class": cls.__name__,
            "tp_plan": dict(getattr(cls, "base_model_tp_plan", None) or {}),
            "causal_lm_tp_plan": causal_lm_tp_plan(model_type),
            "pp_plan": {k: [list(a) for a in v] for k, v in (getattr(cls, "base_model_pp_plan", None) or {}).items()},
            "defaults": defaults(cls),
        }
    doc = {"transformers": transformers.__version__, "families": families}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(families)} families from transformers {transformers.__version__} -> {out_path}")


if __name__ == "__main__":
    main()
