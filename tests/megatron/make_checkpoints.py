"""Megatron-Core `torch_dist` checkpoints written by real megatron-core, for
tenplan's tests, with the references they are compared against.

    python tests/megatron/make_checkpoints.py WORKDIR

Builds a tiny Llama-shaped `GPTModel` (local layer spec: RMSNorm, SwiGLU,
grouped-query attention, rotary embeddings, no biases, untied output) on
gloo processes (CPU) and saves `model.sharded_state_dict()` with
`megatron.core.dist_checkpointing.save` (torch_dist) under two
configurations:

- WORKDIR/tp2      tensor parallel 2 (2 processes)
- WORKDIR/tp2pp2   tensor parallel 2, pipeline parallel 2 (4 processes)

and writes WORKDIR/config.json, the Hugging Face LlamaConfig that describes
the same model. It then records what Megatron itself makes of each
checkpoint: `dist_checkpointing.load` into a tp=1, pp=1 model (Megatron's
own load-time reshard) and that model's logits on a fixed batch
(WORKDIR/<name>.reference.pt: {"tokens", "logits", "state"}).

megatron-core's save calls `torch.cuda.synchronize()` and
`torch.cuda.current_device()` unconditionally; on a CPU-only machine this
harness replaces both (the rotary embedding's forward asks for the current
device too), never tenplan.
"""

import json
import os
import socket
import sys
import warnings

import torch
import torch.multiprocessing as mp

VOCAB = 128
HIDDEN = 32
HEADS = 4
GROUPS = 2
FFN = 48
LAYERS = 4
SEQ = 16
# The model's sizes; the benchmark (benches/megatron_reshard.py) builds
# larger ones with the same code.
TINY = {"vocab": VOCAB, "hidden": HIDDEN, "heads": HEADS, "groups": GROUPS, "ffn": FFN, "layers": LAYERS}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_only_save_patches():
    """What megatron-core's torch_dist save needs on a machine without CUDA."""
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def build(tp, pp, size=None):
    """The model of this rank under (tp, pp), weights from a fixed seed;
    `size` as TINY (the default)."""
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    size = size or TINY
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    cfg = TransformerConfig(
        num_layers=size["layers"],
        hidden_size=size["hidden"],
        num_attention_heads=size["heads"],
        num_query_groups=size["groups"],
        ffn_hidden_size=size["ffn"],
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        layernorm_epsilon=1e-5,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        params_dtype=torch.float32,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    torch.manual_seed(1234)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=size["vocab"],
        max_sequence_length=64,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=10000,
    )
    # Norms start at one; give every replicated tensor values of its own
    # (the same on every rank: seeded by its name) so that a misplaced
    # norm shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or "final_layernorm" in name:
                g = torch.Generator().manual_seed(sum(map(ord, name)))
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    return model


def save_worker(rank, world, port, tp, pp, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    cpu_only_save_patches()
    model = build(tp, pp)
    dist_checkpointing.save(model.sharded_state_dict(), out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (2, SEQ), generator=g)


def reference_worker(rank, world, port, ckpt, out):
    """Megatron's own reshard of `ckpt` into tp=1, pp=1, and its logits."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    cpu_only_save_patches()  # the rotary embedding asks for the current device too
    # Attention forks the CUDA RNG tracker for dropout (zero here).
    import contextlib

    from megatron.core.tensor_parallel import random as mrandom

    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    model = build(1, 1)
    loaded = dist_checkpointing.load(model.sharded_state_dict(), ckpt)
    model.load_state_dict(loaded)
    model.eval()
    t = tokens()
    pos = torch.arange(SEQ).unsqueeze(0).expand_as(t)
    mask = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)
    with torch.no_grad():
        logits = model(t, pos, mask)
    state = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    torch.save({"tokens": t, "logits": logits, "state": state}, out)
    torch.distributed.destroy_process_group()


def hf_config(path):
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=GROUPS,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ).save_pretrained(path)


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    hf_config(work)
    made = {}
    for name, tp, pp in [("tp2", 2, 1), ("tp2pp2", 2, 2)]:
        out = os.path.join(work, name)
        os.makedirs(out, exist_ok=True)
        world = tp * pp
        mp.start_processes(save_worker, args=(world, free_port(), tp, pp, out), nprocs=world, start_method="spawn")
        ref = os.path.join(work, f"{name}.reference.pt")
        mp.start_processes(reference_worker, args=(1, free_port(), out, ref), nprocs=1, start_method="spawn")
        made[name] = {"dir": out, "tp": tp, "pp": pp, "reference": ref}
    print(json.dumps({"config": os.path.join(work, "config.json"), "checkpoints": made}))


if __name__ == "__main__":
    main()
