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
the same model; a job training under tensor parallel 2, data parallel 2
(4 processes) with Megatron's distributed optimizer (Adam) for two steps,
its model and optimizer saved as Megatron-LM saves them
(`{"model": ..., "optimizer": optimizer.sharded_state_dict(...)}`) in the
`fully_reshardable` format as WORKDIR/tp2dp2-adam and in the default
`dp_reshardable` one as WORKDIR/tp2dp2-adam-dp-reshardable; and a Mixtral-shaped MoE (4 experts, 2 routed per token)
under expert parallel 2 (2 processes) as WORKDIR/moe-ep2, its
MixtralConfig in WORKDIR/mixtral/config.json; and a Qwen3-MoE-shaped one
whose first layer is dense (`moe_layer_freq=[0, 1]`, query and key norms),
which Megatron saves layer by layer, under pipeline parallel 2 and expert
parallel 2 (4 processes) as WORKDIR/hetero-pp2ep2, its Qwen3MoeConfig in
WORKDIR/qwen3_moe/config.json; and a DeepSeek-V3-shaped one (multi-latent
attention, layer 0 dense, layer 1 MoE with sigmoid routing, an expert bias
and a shared expert) under expert parallel 2 as WORKDIR/mla-ep2, its
DeepseekV3Config in WORKDIR/deepseek_v3/config.json; and the same with a
multi-token-prediction module (`mtp_num_layers=1`) under pipeline parallel
2 as WORKDIR/mla-mtp-pp2 (its config in WORKDIR/deepseek_v3_mtp). megatron-core
0.16.1's own attention does not take MLA's widths (only Transformer
Engine's does): this harness gives its layer spec a plain softmax
attention (`CpuLatentAttention`), which holds no parameters. It then records what Megatron itself makes of each
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
# A Qwen3-MoE-shaped one whose blocks differ: layer 0 dense (a SwiGLU of
# FFN), layer 1 MoE, query and key norms. Megatron saves such a block
# layer by layer (`decoder.layers.<i>.…`), not stacked.
TINY_HETERO = {**TINY_MOE, "dense_layers": [0], "qk_norm": True}
# A DeepSeek-V3-shaped one: multi-latent attention (query and key-value
# low-rank projections with their norms), layer 0 dense, layer 1 four
# routed experts (sigmoid scores with an expert bias) and a shared expert.
TINY_MLA = {
    **TINY_MOE,
    "heads": 4,
    "groups": 4,
    "dense_layers": [0],
    "mla": {"q_lora_rank": 16, "kv_lora_rank": 16, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4, "v_head_dim": 8},
    "shared_ffn": 40,
}
# The same with a multi-token-prediction module (DeepSeek-V3's MTP:
# Megatron-Core's `mtp.layers.0`, on the last pipeline stage).
TINY_MLA_MTP = {**TINY_MLA, "mtp": 1}
SIZES = {"dense": TINY, "moe": TINY_MOE, "hetero": TINY_HETERO, "mla": TINY_MLA, "mla-mtp": TINY_MLA_MTP}


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


def cpu_only_optimizer_patches():
    """What megatron-core's distributed optimizer needs on a machine
    without CUDA: the forward patches, tensors it makes `device="cuda"`
    (overflow flags, norms) made on the CPU, `.cuda()` a no-op, and CPU
    float tensors answering `type()` as the CUDA ones its parameter check
    accepts. Apex and Transformer Engine absent, it runs torch's AdamW,
    whose per-parameter `step` 0.16.1's loader also tries to copy from a
    checkpoint that keeps it in `param_groups` (a KeyError, whatever the
    device): the copy leaves `step` to `load_state_dict`, which sets it."""
    import functools

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    cpu_only_forward_patches()

    def on_cpu(make):
        @functools.wraps(make)
        def made(*a, **k):
            d = k.get("device")
            if d == "cuda" or isinstance(d, int) or (isinstance(d, torch.device) and d.type == "cuda"):
                k["device"] = "cpu"
            return make(*a, **k)

        return made

    for name in ["tensor", "zeros", "empty", "ones", "full"]:
        setattr(torch, name, on_cpu(getattr(torch, name)))
    tensor_type = torch.Tensor.type

    def type_as_on_gpu(self, *a, **k):
        t = tensor_type(self, *a, **k)
        return t.replace("torch.", "torch.cuda.", 1) if not a and not k and self.device.type == "cpu" else t

    torch.Tensor.type = type_as_on_gpu
    torch.Tensor.cuda = lambda self, *a, **k: self
    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    def set_states_but_step(self, model_param, tensors):
        group, order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group]["params"][order]]
        step = state.pop("step", None)
        try:
            set_states(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    DistributedOptimizer._set_main_param_and_optimizer_states = set_states_but_step


def with_optimizer(model):
    """`model` under Megatron's DDP with the distributed optimizer (Adam);
    a bf16 model's optimizer keeps fp32 main parameters, as Megatron-LM's
    --bf16 does."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    bf16 = model.config.bf16
    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(use_distributed_optimizer=True), model
    )
    optim = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-2,
            use_distributed_optimizer=True,
            bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
        ),
        [ddp],
    )
    return ddp, optim


def train_steps(ddp, optim, first, steps):
    """`steps` Adam steps on fixed global batches (this data-parallel
    rank's share of each); the global mean loss of each."""
    from megatron.core import parallel_state

    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    losses = []
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(100 + step)
        t = torch.randint(0, VOCAB, (4, SEQ), generator=g)[dp_rank * 4 // dp : (dp_rank + 1) * 4 // dp]
        pos = torch.arange(SEQ).unsqueeze(0).expand_as(t)
        mask = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).triu(1)
        ddp.zero_grad_buffer()
        optim.zero_grad()
        loss = ddp(t, pos, mask, labels=t).mean()
        loss.backward()
        ddp.finish_grad_sync()
        optim.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total, group=parallel_state.get_data_parallel_group())
        losses.append(total.item() / dp)
    return losses


# How Megatron-LM names the distributed optimizer's checkpoint formats.
FULLY_RESHARDABLE = {"distrib_optim_sharding_type": "fully_reshardable"}
DP_RESHARDABLE = {"distrib_optim_sharding_type": "dp_reshardable"}


def optimizer_parts(optim):
    """The DistributedOptimizers behind what get_megatron_optimizer gave."""
    return getattr(optim, "chained_optimizers", [optim])


def make_optimizer_state(optim):
    """torch's AdamW keeps no state before its first step, which Megatron's
    load needs (with Apex or TE it would not): one step of zero gradients
    makes it, as Megatron does for its FSDP format."""
    for part in optimizer_parts(optim):
        part._init_optimizer_states_with_dummy_values()


def job_sharded_state(ddp, optim, metadata=FULLY_RESHARDABLE, is_loading=False):
    """A job's model and optimizer as Megatron-LM checkpoints them."""
    model = ddp.module.sharded_state_dict()
    return {"model": model, "optimizer": optim.sharded_state_dict(model, is_loading=is_loading, metadata=metadata)}


def job_state(ddp, optim):
    """A job's weights and every optimizer state tensor (main parameters,
    moments, steps), cloned, under names that compare across jobs of one
    configuration."""
    out = {f"model.{k}": v.clone() for k, v in ddp.module.state_dict().items() if isinstance(v, torch.Tensor)}
    for j, part in enumerate(optimizer_parts(optim)):
        for i, per_param in part.optimizer.state_dict()["state"].items():
            for k, v in per_param.items():
                out[f"optimizer.{j}.{i}.{k}"] = v.clone()
        # The main parameters the optimizer steps (fp32 copies of a bf16
        # model's shards; views of an fp32 model's).
        for g, group in enumerate(part.optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                out[f"optimizer.{j}.main.{g}.{i}"] = p.detach().clone()
    return out


def optimizer_save_worker(rank, world, port, tp, out, out_dp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    cpu_only_optimizer_patches()
    ddp, optim = with_optimizer(build(tp, 1))
    train_steps(ddp, optim, 0, 2)
    for directory, metadata in [(out, FULLY_RESHARDABLE), (out_dp, DP_RESHARDABLE)]:
        dist_checkpointing.save(job_sharded_state(ddp, optim, metadata), directory)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


class CpuLatentAttention(torch.nn.Module):
    """Softmax attention for multi-latent attention on a CPU: megatron-core
    0.16.1's own `DotProductAttention` does not take MLA's key width
    (`k_channels`), which only Transformer Engine's attention does. Causal,
    no dropout, MLA's softmax scale; no parameters, so the checkpoint is
    the same whichever attention the layer spec names."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, **_):
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None):
        import torch.nn.functional as F

        # [s, b, heads, dim] -> [b, heads, s, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def build(tp, pp, size=None, ep=1, dtype=torch.float32):
    """The model of this rank under (tp, pp, ep), weights from a fixed
    seed; `size` as TINY (the default) or TINY_MOE; its parameters of
    `dtype` (float32, or bfloat16 as Megatron-LM's --bf16 keeps them)."""
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
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
        if "dense_layers" in size:
            moe["moe_layer_freq"] = [int(i not in size["dense_layers"]) for i in range(size["layers"])]
        if "shared_ffn" in size:
            moe.update(
                moe_shared_expert_intermediate_size=size["shared_ffn"],
                moe_router_score_function="sigmoid",
                moe_router_enable_expert_bias=True,
                moe_router_topk_scaling_factor=2.5,
            )
    config_class = TransformerConfig
    if "mla" in size:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config_class = MLATransformerConfig
        moe.update(size["mla"], rope_type="rope", qk_layernorm=True)
    cfg = config_class(
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
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        **({} if "mla" in size else {"qk_layernorm": size.get("qk_norm", False)}),
        **({"mtp_num_layers": size["mtp"]} if size.get("mtp") else {}),
    )
    torch.manual_seed(1234)
    if "dense_layers" in size:
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
        if "mla" in size:
            from megatron.core.transformer import multi_latent_attention

            # Without Transformer Engine, 0.16.1 still takes it as present
            # here (its extension module imports; its classes are None).
            if not isinstance(multi_latent_attention.TELinear, type):
                multi_latent_attention.HAVE_TE = False
            # Its rotary embedding asks for the current CUDA device.
            cpu_only_save_patches()
            for layer in spec.layer_specs:
                layer.submodules.self_attention.submodules.core_attention = CpuLatentAttention
    else:
        spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False, normalization="RMSNorm")
    mtp = None
    if size.get("mtp"):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False)
    # With MTP modules on a later stage than the embedding, 0.16.1 copies
    # the embedding there through `.cuda()` and an all-reduce at build time:
    # on CPU the copy stays where it is.
    cuda = torch.Tensor.cuda
    if size.get("mtp") and pp > 1:
        torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=spec,
            vocab_size=size["vocab"],
            max_sequence_length=64,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope",
            rotary_base=10000,
            mtp_block_spec=mtp,
        )
    finally:
        torch.Tensor.cuda = cuda
    if mtp is not None and parallel_state.is_pipeline_last_stage():
        # That build-time copy also lands in the untied output layer: give
        # it values of its own again, so that a swap with the embedding shows.
        rows = model.output_layer.weight.shape[0]
        k = parallel_state.get_tensor_model_parallel_rank()
        g = torch.Generator().manual_seed(4321)
        with torch.no_grad():
            full = torch.randn(rows * tp, size["hidden"], generator=g).to(dtype)
            model.output_layer.weight.copy_(full[k * rows:(k + 1) * rows])
    # Norms start at one; give every replicated tensor values of its own
    # (the same on every rank: seeded by its name) so that a misplaced
    # norm shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name.split(".")[-2] in ("enorm", "hnorm"):
                g = torch.Generator().manual_seed(sum(map(ord, name)))
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    return model


def model_sharded_state(model, size):
    """`model.sharded_state_dict()`; a model with MTP modules on a later
    stage than the embedding needs the data-parallel group for the
    embedding's copy there (Megatron-LM passes it as metadata)."""
    from megatron.core import parallel_state

    if not size.get("mtp"):
        return model.sharded_state_dict()
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    return model.sharded_state_dict(metadata={"dp_cp_group": group})


def save_worker(rank, world, port, tp, pp, ep, size, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    cpu_only_save_patches()
    model = build(tp, pp, size, ep)
    dist_checkpointing.save(model_sharded_state(model, size), out)
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
    logits = None
    # 0.16.1's forward with MTP modules computes their loss and needs labels:
    # such a reference holds the state only.
    if not size.get("mtp"):
        with torch.no_grad():
            logits = model(t, pos, mask)
    state = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    torch.save({"tokens": t, "logits": logits, "state": state}, out)
    torch.distributed.destroy_process_group()


def hf_config(path, size):
    """The Hugging Face config of the same model: Llama, Mixtral for a MoE,
    Qwen3-MoE for one whose blocks differ."""
    from transformers import DeepseekV3Config, LlamaConfig, MixtralConfig, Qwen3MoeConfig

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
    if size.get("mla"):
        mla = size["mla"]
        cfg = DeepseekV3Config(
            **{**common, "num_key_value_heads": size["heads"]},
            intermediate_size=size["ffn"],
            moe_intermediate_size=size["moe_ffn"],
            n_routed_experts=size["experts"],
            n_shared_experts=size["shared_ffn"] // size["moe_ffn"],
            num_experts_per_tok=size["topk"],
            first_k_dense_replace=len(size["dense_layers"]),
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            q_lora_rank=mla["q_lora_rank"],
            kv_lora_rank=mla["kv_lora_rank"],
            qk_nope_head_dim=mla["qk_head_dim"],
            qk_rope_head_dim=mla["qk_pos_emb_head_dim"],
            v_head_dim=mla["v_head_dim"],
            # Megatron's MLA de-interleaves the rotary half before
            # rotating, as transformers' DeepSeek-V3 does with this set.
            rope_interleave=True,
            **({"num_nextn_predict_layers": size["mtp"]} if size.get("mtp") else {}),
        )
    elif size.get("dense_layers"):
        cfg = Qwen3MoeConfig(
            **common,
            head_dim=size["hidden"] // size["heads"],
            intermediate_size=size["ffn"],
            moe_intermediate_size=size["moe_ffn"],
            num_experts=size["experts"],
            num_experts_per_tok=size["topk"],
            norm_topk_prob=True,
            mlp_only_layers=size["dense_layers"],
            decoder_sparse_step=1,
            router_aux_loss_coef=0.0,
        )
    elif size.get("experts"):
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
    ("hetero-pp2ep2", 1, 2, 2, TINY_HETERO, "qwen3_moe"),
    ("mla-ep2", 1, 1, 2, TINY_MLA, "deepseek_v3"),
    ("mla-mtp-pp2", 1, 2, 1, TINY_MLA_MTP, "deepseek_v3_mtp"),
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
    # A job with Megatron's distributed optimizer: tp=2, dp=2.
    out, out_dp = os.path.join(work, "tp2dp2-adam"), os.path.join(work, "tp2dp2-adam-dp-reshardable")
    for d in (out, out_dp):
        os.makedirs(d, exist_ok=True)
    mp.start_processes(optimizer_save_worker, args=(4, free_port(), 2, out, out_dp), nprocs=4, start_method="spawn")
    made["tp2dp2-adam"] = {"dir": out, "tp": 2, "pp": 1, "dp": 2, "dp_reshardable": out_dp}
    print(json.dumps({"config": os.path.join(work, "config.json"), "checkpoints": made}))


if __name__ == "__main__":
    main()
