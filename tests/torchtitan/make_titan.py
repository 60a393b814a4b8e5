"""torchtitan fixtures for tests/torchtitan.rs, made with real torchtitan.

    python tests/torchtitan/make_titan.py make OUT [FAMILY]
        Builds a tiny torchtitan Llama 3 (FAMILY `llama3`, the default),
        Qwen3 (`qwen3`: query and key norms, its own head dimension) or
        Qwen3-MoE (`qwen3_moe`: grouped expert stacks; its converter's
        per-expert output goes through transformers' from_pretrained) or
        DeepSeek-V3 (`deepseek_v3`: multi-head latent attention with a
        query low rank, a dense first layer, shared experts, the routing
        bias transformers calls e_score_correction_bias; `deepseek_v3_mtp`
        with a multi-token-prediction module, whose Hugging Face side is
        the converter's files, as transformers does not save the module) with
        torchtitan's own model and parameter initialisation, shards it with
        FSDP2 on 2 gloo processes and saves its state dict with
        torch.distributed.checkpoint.save, as torchtitan's model-only
        checkpoints hold it (top-level names,
        `layers.N.attention.qkv_linear.wq.weight`): OUT/titan. Converts
        the same weights with torchtitan's own converter
        (Llama3StateDictAdapter / Qwen3StateDictAdapter /
        DeepSeekV3StateDictAdapter .to_hf) into the
        transformers model saved with save_pretrained: OUT/hf. The full
        state dict: OUT/original.pt.

    python tests/torchtitan/make_titan.py stages '[[PP, LAYERS], ...]'
        torchtitan's own split of the layers over pipeline stages.

    python tests/torchtitan/make_titan.py schedules '[[PP, LAYERS, SCHEDULE, LAYERS_PER_STAGE], ...]'
        torchtitan's own pipeline under a schedule (its
        _get_pipeline_metadata, _generate_llm_fqn_per_model_part and
        _get_pp_rank_to_stage_indices_mapping): each pp rank's layers, or
        the error torchtitan raises.

    python tests/torchtitan/make_titan.py coords '[[PP, DP_REPLICATE, DP_SHARD, CP, TP, EP], ...]'
        Each rank's coordinates on torchtitan's own device meshes
        (ParallelDims.build_mesh on a fake process group): pp,
        dp_replicate, fsdp (dp_shard and cp folded), tp, ep, efsdp.

    python tests/torchtitan/make_titan.py load ORIGINAL DCP_DIR [FAMILY]
        Loads DCP_DIR into the same torchtitan model's state dict with plain
        dcp.load (the default reader; every key asked for must be there) and
        compares every tensor with ORIGINAL, bit for bit.

    python tests/torchtitan/make_titan.py train FOLDER WORLD STEPS
        Trains the same model with torchtitan's own training components on
        WORLD gloo processes (FSDP2 over dp_shard=WORLD, torchtitan's
        OptimizersContainer with AdamW, its LRSchedulersContainer, its
        ParallelAwareDataloader over a fixed token set, a train state like
        its Trainer's) for STEPS steps and saves the job's whole state with
        torchtitan's CheckpointManager into FOLDER/step-STEPS.

    python tests/torchtitan/make_titan.py resume FOLDER STEP WORLD STEPS
        A job of WORLD processes resumes from FOLDER/step-STEP with
        torchtitan's CheckpointManager (the dataloader excluded from
        loading, as torchtitan requires when dp changes) and trains STEPS
        more steps; prints the losses, the restored train state and
        learning rate.

Prints one JSON object; exits 1 when a check fails.
"""

import json
import os
import shutil
import socket
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

DIM, HEADS, KV_HEADS, LAYERS, VOCAB, FFN = 64, 4, 2, 2, 256, 192
# Qwen3-MoE: routed experts of their own width, each token to TOP_K of them.
EXPERTS, TOP_K, MOE_FFN = 4, 2, 32
# Qwen3's head dimension is its own (not DIM / HEADS), as in Qwen3's configs.
QWEN3_HEAD_DIM = 32
# DeepSeek-V3's latent attention: low ranks and head parts of its own.
Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 16, 16, 8, 8, 8


def deepseek_config(mtp=0):
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.deepseek_v3 import DeepSeekV3Model
    from torchtitan.models.deepseek_v3 import _build_dsv3_layers, _build_mtp_layers

    layers = _build_dsv3_layers(
        n_layers=LAYERS,
        n_dense_layers=1,
        dim=DIM,
        n_heads=HEADS,
        q_lora_rank=Q_LORA,
        kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V_HEAD,
        mscale=1.0,
        dense_hidden_dim=FFN,
        moe_hidden_dim=MOE_FFN,
        num_experts=EXPERTS,
        num_shared_experts=1,
        router_top_k=TOP_K,
        router_score_func="sigmoid",
        attn_backend="flex",
        moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=ROPE, max_seq_len=256, theta=10000.0),
    )
    return DeepSeekV3Model.Config(
        vocab_size=VOCAB,
        dim=DIM,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM),
        norm=RMSNorm.Config(normalized_shape=DIM),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB),
        layers=layers,
        # Multi-token-prediction modules, built as torchtitan's own
        # DeepSeek-V3 configurations build them (after the last layer's).
        mtp_layers=_build_mtp_layers(layers[-1], dim=DIM, num_mtp_layers=mtp) if mtp else [],
    )


def titan_config(family="llama3"):
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    if family in ("deepseek_v3", "deepseek_v3_mtp"):
        return deepseek_config(mtp=int(family.endswith("_mtp")))
    if family in ("qwen3", "qwen3_moe"):
        from torchtitan.models.common.rope import CosSinRoPE
        from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_layers, _build_qwen3_moe_layers, _qwen3_norm

        attention = dict(
            n_layers=LAYERS,
            dim=DIM,
            n_heads=HEADS,
            n_kv_heads=KV_HEADS,
            head_dim=QWEN3_HEAD_DIM,
            fuse_qkv=False,
            attn_backend="flex",
            rope=CosSinRoPE.Config(dim=QWEN3_HEAD_DIM, max_seq_len=256, theta=1000000.0),
        )
        if family == "qwen3":
            layers = _build_qwen3_layers(hidden_dim=FFN, **attention)
        else:
            layers = _build_qwen3_moe_layers(
                moe_hidden_dim=MOE_FFN, num_experts=EXPERTS, top_k=TOP_K, moe_comm_backend="standard", **attention
            )
        return Qwen3Model.Config(
            vocab_size=VOCAB,
            dim=DIM,
            norm=_qwen3_norm(DIM),
            tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM),
            lm_head=Linear.Config(in_features=DIM, out_features=VOCAB),
            layers=layers,
        )
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    return Llama3Model.Config(
        dim=DIM,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM),
        norm=RMSNorm.Config(normalized_shape=DIM),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB),
        layers=_build_llama3_layers(
            n_layers=LAYERS,
            dim=DIM,
            n_heads=HEADS,
            n_kv_heads=KV_HEADS,
            hidden_dim=FFN,
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=256, theta=500000),
            attn_backend="flex",
            # torchtitan saves the fused form under these same names (its
            # state-dict hooks split it); the stock module lets DCP's
            # get_model_state_dict find each parameter.
            fuse_qkv=False,
        ),
    )


def titan_model(train=False, family="llama3"):
    torch.manual_seed(0)
    config = titan_config(family)
    if train:
        from torchtitan.models.common.attention import ScaledDotProductAttention

        # FlexAttention has no backward on CPU; plain causal SDPA trains the
        # same parameters (attention holds none).
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    model = config.build()
    model.init_states()
    return model


def shard_fsdp2(model, world):
    """FSDP2 over dp_shard=world, each transformer layer its own unit, as
    torchtitan applies it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    for layer in model.layers.values() if isinstance(model.layers, torch.nn.ModuleDict) else model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def save_worker(rank, world, port, out, family):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model = titan_model(family=family)
    shard_fsdp2(model, world)
    dcp.save(get_model_state_dict(model), checkpoint_id=out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


GLOBAL_BATCH, SEQ = 4, 16


class TokenSet(torch.utils.data.Dataset):
    """A fixed set of token sequences; dp rank r of n reads every n-th one
    (a torchtitan dataset shards itself by node the same way)."""

    def __init__(self, rank, world):
        generator = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, VOCAB, (64 * GLOBAL_BATCH, SEQ + 1), generator=generator)
        self.tokens = tokens[rank::world]

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i]


class TrainState:
    """What torchtitan's Trainer saves as `train_state`."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state):
        self.step, self.ntokens_seen = state["step"], state["ntokens_seen"]


def titan_job(rank, world, port, folder, load_step, steps, result):
    """torchtitan's training components on one rank: build, maybe resume,
    train, save (when not resuming). Rank 0 writes the result."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig

    model = titan_model(train=True)
    shard_fsdp2(model, world)
    adamw = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    optimizers = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs=adamw)],
        implementation="for-loop",
    ).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=20)
    dataloader = ParallelAwareDataloader(
        TokenSet(rank, world), dp_rank=rank, dp_world_size=world, batch_size=GLOBAL_BATCH // world
    )
    train_state = TrainState()
    checkpointer = CheckpointManager(
        CheckpointManager.Config(
            enable=True,
            folder=folder,
            interval=1,
            keep_latest_k=0,
            exclude_from_loading=["dataloader"] if load_step else [],
        ),
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
    )
    if load_step:
        checkpointer.load(step=load_step)
    restored = train_state.state_dict()
    lr = optimizers.optimizers[0].param_groups[0]["lr"]
    batches = iter(dataloader)
    losses = []
    for _ in range(steps):
        tokens = next(batches)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        global_loss = loss.detach().clone()
        torch.distributed.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
        train_state.step += 1
        train_state.ntokens_seen += GLOBAL_BATCH * SEQ
    if not load_step:
        checkpointer.save(train_state.step)
    checkpointer.close()
    if rank == 0:
        with open(result, "w") as f:
            json.dump({"losses": losses, "restored": restored, "lr": lr}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run_job(folder, load_step, world, steps):
    os.makedirs(folder, exist_ok=True)
    result = os.path.join(folder, f"result-{os.getpid()}.json")
    args = (world, free_port(), folder, load_step, steps, result)
    mp.start_processes(titan_job, args=args, nprocs=world, start_method="spawn")
    with open(result) as f:
        out = json.load(f)
    os.remove(result)
    return {"ok": True, **out}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make(out, family="llama3"):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    os.makedirs(out, exist_ok=True)
    model = titan_model(family=family)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, os.path.join(out, "original.pt"))
    for attempt in range(3):
        args = (2, free_port(), os.path.join(out, "titan"), family)
        try:
            mp.start_processes(save_worker, args=args, nprocs=2, start_method="spawn")
            break
        except mp.ProcessExitedException as e:
            # gloo on loopback now and then aborts a process of a 2-core
            # machine (SIGABRT, "terminate called without an active
            # exception", in torch alone); the save runs again from the start.
            if e.signal_name != "SIGABRT" or attempt == 2:
                raise
            print(f"gloo aborted process {e.error_index} of the save (attempt {attempt + 1})", file=sys.stderr)
            shutil.rmtree(os.path.join(out, "titan"), ignore_errors=True)
    # torchtitan's own conversion to Hugging Face names and row order.
    shape = dict(
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
    )
    if family in ("qwen3_moe", "deepseek_v3", "deepseek_v3_mtp"):
        # torchtitan's converter writes transformers 4's per-expert names;
        # transformers loads them into its 3-D stacks and saves those.
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, DeepseekV3Config, Qwen3MoeConfig

        if family == "qwen3_moe":
            from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

            hf_state = Qwen3StateDictAdapter(titan_config(family), None).to_hf(state)
            config = Qwen3MoeConfig(
                head_dim=QWEN3_HEAD_DIM,
                num_experts=EXPERTS,
                num_experts_per_tok=TOP_K,
                moe_intermediate_size=MOE_FFN,
                **shape,
            )
        else:
            from torchtitan.models.deepseek_v3.state_dict_adapter import DeepSeekV3StateDictAdapter

            hf_state = DeepSeekV3StateDictAdapter(titan_config(family), None).to_hf(state)
            config = DeepseekV3Config(
                n_routed_experts=EXPERTS,
                n_shared_experts=1,
                num_experts_per_tok=TOP_K,
                moe_intermediate_size=MOE_FFN,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
                q_lora_rank=Q_LORA,
                kv_lora_rank=KV_LORA,
                qk_nope_head_dim=NOPE,
                qk_rope_head_dim=ROPE,
                v_head_dim=V_HEAD,
                head_dim=ROPE,
                **shape,
                **({"num_nextn_predict_layers": 1} if family.endswith("_mtp") else {}),
            )
        per_expert = os.path.join(out, "per-expert")
        os.makedirs(per_expert, exist_ok=True)
        config.save_pretrained(per_expert)
        save_file({k: v.contiguous() for k, v in hf_state.items()}, os.path.join(per_expert, "model.safetensors"))
        hf, info = AutoModelForCausalLM.from_pretrained(per_expert, output_loading_info=True)
        missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
        if family.endswith("_mtp"):
            # transformers has no MTP module: it reports the module's layer
            # as unexpected and would not save it. The converter's files,
            # as DeepSeek lays out its MTP layer, are the Hugging Face side.
            mtp = f"model.layers.{LAYERS}."
            others = [k for k in unexpected if not k.startswith(mtp)]
            os.rename(per_expert, os.path.join(out, "hf"))
            return {"ok": not missing and not others and bool(unexpected), "tensors": len(state),
                    "missing": missing, "unexpected": others, "mtp_tensors": len(unexpected)}
        hf.save_pretrained(os.path.join(out, "hf"))
        return {"ok": not missing and not unexpected, "tensors": len(state), "missing": missing, "unexpected": unexpected}
    if family == "qwen3":
        from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

        hf_state = Qwen3StateDictAdapter(titan_config(family), None).to_hf(state)
        hf = Qwen3ForCausalLM(Qwen3Config(head_dim=QWEN3_HEAD_DIM, **shape))
    else:
        from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

        hf_state = Llama3StateDictAdapter(titan_config(family), None).to_hf(state)
        hf = LlamaForCausalLM(LlamaConfig(head_dim=DIM // HEADS, **shape))
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    hf.save_pretrained(os.path.join(out, "hf"))
    return {"ok": not missing and not unexpected, "tensors": len(state), "missing": missing, "unexpected": unexpected}


def load(original, directory, family="llama3"):
    want = torch.load(original)
    model = titan_model(family=family)
    state = model.state_dict()
    with torch.no_grad():
        for v in state.values():
            v.fill_(float("nan"))
    dcp.load(state, checkpoint_id=directory, no_dist=True)
    differ = sorted(k for k, v in want.items() if not torch.equal(state[k], v))
    metadata = dcp.FileSystemReader(directory).read_metadata()
    chunks = {k: len(v.chunks) for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks")}
    files = {}
    for index, info in metadata.storage_data.items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    files = {k: sorted(v) for k, v in files.items()}
    return {
        "ok": not differ and set(state) == set(want),
        "tensors": len(state),
        "differ": differ,
        "chunks": chunks,
        "files": files,
    }


def schedules(cases):
    """Each pp rank's layers under torchtitan's pipeline, per case; null
    where torchtitan refuses the configuration."""
    from types import SimpleNamespace

    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed import pipeline_parallel as pipeline

    out = []
    for pp, layers, schedule, per_stage in cases:
        try:
            parallelism = ParallelismConfig(
                pipeline_parallel_degree=pp,
                pipeline_parallel_schedule=schedule,
                pipeline_parallel_layers_per_stage=per_stage,
            )
            stages, *_ = pipeline._get_pipeline_metadata(
                SimpleNamespace(pp=pp), parallelism, SimpleNamespace(layers=[None] * layers)
            )
            parts = pipeline._generate_llm_fqn_per_model_part(stages, layers)
            ranks = []
            for rank in range(pp):
                held = pipeline._get_pp_rank_to_stage_indices_mapping(rank, pp, schedule, stages)
                ranks.append(sorted(int(m.split(".")[1]) for s in held for m in parts[s] if m.startswith("layers.")))
            out.append(ranks)
        except (ValueError, AssertionError):
            out.append(None)
    return {"ok": True, "schedules": out}


def coords(cases):
    """Each rank's coordinates on torchtitan's meshes, per case."""
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torch.testing._internal.distributed.fake_pg import FakeStore

    # torchtitan builds its meshes on the accelerator it finds; there is none.
    parallel_dims.device_type = "cpu"
    out = []
    for pp, dp_replicate, dp_shard, cp, tp, ep in cases:
        world = pp * dp_replicate * dp_shard * cp * tp
        ranks = []
        for rank in range(world):
            dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
            dims = parallel_dims.ParallelDims(
                dp_replicate=dp_replicate,
                dp_shard=dp_shard,
                cp=cp,
                tp=tp,
                pp=pp,
                ep=ep,
                world_size=world,
                spmd_backend="partial_dtensor",
            )
            dims.build_mesh()
            at = {}
            for name in ["pp", "dp_replicate", "fsdp", "tp", "ep", "efsdp"]:
                mesh = dims.get_optional_mesh(name)
                at[name] = mesh.get_local_rank() if mesh is not None else 0
            ranks.append(at)
            dist.destroy_process_group()
        out.append(ranks)
    return {"ok": True, "coords": out}


def stages(cases):
    """torchtitan's own split of layers over pipeline stages, per case
    (stages, layers): the layer indices of each stage."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    out = []
    for pp, layers in cases:
        parts = _generate_llm_fqn_per_model_part(pp, layers)
        out.append([[int(m.split(".")[1]) for m in part if m.startswith("layers.")] for part in parts])
    return {"ok": True, "stages": out}


def main():
    warnings.filterwarnings("ignore")
    what = sys.argv[1]
    if what == "make":
        result = make(*sys.argv[2:4])
    elif what == "train":
        result = run_job(sys.argv[2], 0, int(sys.argv[3]), int(sys.argv[4]))
    elif what == "resume":
        result = run_job(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif what == "stages":
        result = stages(json.loads(sys.argv[2]))
    elif what == "schedules":
        result = schedules(json.loads(sys.argv[2]))
    elif what == "coords":
        result = coords(json.loads(sys.argv[2]))
    else:
        result = load(*sys.argv[2:5])
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
