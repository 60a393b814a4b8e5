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
the same model; and a Mixtral-shaped MoE (4 experts, 2 routed per token)
under expert parallel 2 (2 processes) as WORKDIR/moe-ep2, its
MixtralConfig in WORKDIR/mixtral/config.json. It then records what Megatron itself makes of each
checkpoint: `dist_checkpointing.load` into a tp=1, pp=1 model (Megatron's
own load-time reshard) and that model's logits on a fixed batch
(WORKDIR/<name>.reference.pt: {"tokens", "logits", "state"}).

megatron-core's save calls `torch.cuda.synchronize()` and
`torch.cuda.current_device()` unconditionally; on a CPU-only machine this
harness replaces both, and what its forward needs besides
(`cpu_only_forward_patches`), never tenplan.
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
# A Mixtral-shaped MoE: every layer's MLP is 4 experts, 2 routed per token.
TINY_MOE = {**TINY, "layers": 2, "experts": 4, "topk": 2, "moe_ffn": 40}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_only_save_patches():
    """What megatron-core's torch_dist save needs on a machine without CUDA."""
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def cpu_only_forward_patches():
    """What megatron-core's forward needs on a machine without CUDA (and
    without Transformer Engine): the save patches (the rotary embedding
    asks for the current device too), a CUDA RNG tracker that attention
    forks for dropout (zero here), and the MoE router's optional TE GEMM,
    which 0.16.1 names without defining it when TE is absent."""
    import contextlib

    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import moe_utils

    cpu_only_save_patches()
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def build(tp, pp, size=None, ep=1):
    """The model of this rank under (tp, pp, ep), weights from a fixed
    seed; `size` as TINY (the default) or TINY_MOE."""
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    size = size or TINY
    experts = size.get("experts")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
    )
    moe = {}
    if experts:
        moe = dict(
            num_moe_experts=experts,
            moe_router_topk=size["topk"],
            moe_ffn_hidden_size=size["moe_ffn"],
            moe_grouped_gemm=False,
            moe_token_dispatcher_type="allgather",
            moe_aux_loss_coeff=0.0,
            expert_model_parallel_size=ep,
        )
    cfg = TransformerConfig(
        **moe,
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
        transformer_layer_spec=get_gpt_layer_local_spec(
            num_experts=experts, moe_grouped_gemm=False, normalization="RMSNorm"
        ),
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


def save_worker(rank, world, port, tp, pp, ep, size, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    cpu_only_save_patches()
    model = build(tp, pp, size, ep)
    dist_checkpointing.save(model.sharded_state_dict(), out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (2, SEQ), generator=g)


def reference_worker(rank, world, port, size, ckpt, out):
    """Megatron's own reshard of `ckpt` into tp=1, pp=1, and its logits."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    cpu_only_forward_patches()
    model = build(1, 1, size)
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


def hf_config(path, size):
    """The Hugging Face config of the same model: Llama, or Mixtral for a MoE."""
    from transformers import LlamaConfig, MixtralConfig

    common = dict(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["groups"],
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    if size.get("experts"):
        cfg = MixtralConfig(
            **common,
            intermediate_size=size["moe_ffn"],
            num_local_experts=size["experts"],
            num_experts_per_tok=size["topk"],
            router_aux_loss_coef=0.0,
        )
    else:
        cfg = LlamaConfig(**common, intermediate_size=size["ffn"])
    cfg.save_pretrained(path)


# name, tp, pp, ep, sizes, where its config.json goes
CHECKPOINTS = [
    ("tp2", 2, 1, 1, TINY, ""),
    ("tp2pp2", 2, 2, 1, TINY, ""),
    ("moe-ep2", 1, 1, 2, TINY_MOE, "mixtral"),
]


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    made = {}
    for name, tp, pp, ep, size, config_dir in CHECKPOINTS:
        hf_config(os.path.join(work, config_dir), size)
        out = os.path.join(work, name)
        os.makedirs(out, exist_ok=True)
        world = tp * pp * ep
        mp.start_processes(
            save_worker, args=(world, free_port(), tp, pp, ep, size, out), nprocs=world, start_method="spawn"
        )
        ref = os.path.join(work, f"{name}.reference.pt")
        mp.start_processes(reference_worker, args=(1, free_port(), size, out, ref), nprocs=1, start_method="spawn")
        made[name] = {"dir": out, "tp": tp, "pp": pp, "ep": ep, "reference": ref}
    print(json.dumps({"config": os.path.join(work, "config.json"), "checkpoints": made}))


if __name__ == "__main__":
    main()
