"""Checks of tenplan's output against real megatron-core and transformers.

    python tests/megatron/verify.py hf HF_DIR REFERENCE
        transformers loads HF_DIR (AutoModelForCausalLM): no missing,
        unexpected or mismatched key; every weight bit-identical to the state
        Megatron itself loaded from the checkpoint (REFERENCE, made by
        make_checkpoints.py; Megatron's fused QKV and SwiGLU split here, as
        Megatron-Bridge does); its logits on REFERENCE's tokens equal
        Megatron's within float32 rounding.

    python tests/megatron/verify.py hf-mtp HF_DIR REFERENCE
        A DeepSeek-V3 export with its multi-token-prediction module:
        transformers loads HF_DIR reporting only that module's layer
        (`model.layers.<num_hidden_layers>.*`, as DeepSeek's files hold it)
        as unexpected; those tensors, with the embedding and output head
        copies, bit-identical to Megatron's `mtp.layers.0` of REFERENCE.

    python tests/megatron/verify.py megatron ORIGINAL NEW TP PP [EP [SIZE]]
        On TP*PP*EP gloo processes, megatron-core builds the model (SIZE:
        `dense`, the default, `moe` or `hetero`, as make_checkpoints.SIZES
        names them) under (TP, PP, EP) and loads NEW with dist_checkpointing.load, and the same
        model loads ORIGINAL (Megatron's own load-time reshard): every
        tensor of every rank's state must be bit-identical.

    python tests/megatron/verify.py megatron-optim ORIGINAL NEW TP PP DP
        On TP*PP*DP gloo processes, a job with Megatron's distributed
        optimizer (make_checkpoints.with_optimizer) loads model and
        optimizer state from NEW as Megatron-LM does (fully_reshardable),
        and the same job loads ORIGINAL: the model's state, and every
        parameter's Adam moments and step on every rank, must be
        bit-identical (and the moments not zero: they were loaded). With
        PP=1 both jobs then train two more steps: losses and weights equal,
        bit for bit.

    python tests/megatron/verify.py fsdp2 HF_DIR DCP_DIR WORLD
        On WORLD gloo processes, an FSDP2 job on the transformers model of
        HF_DIR (built from its config, every layer and the root sharded
        over dp_shard=WORLD) loads DCP_DIR with plain `dcp.load` of its
        `get_model_state_dict` (DCP's default reader, nothing missing or
        unexpected) and `set_model_state_dict`: the gathered weights must be
        bit-identical to `from_pretrained(HF_DIR)`'s, and its logits equal.

    python tests/megatron/verify.py fsdp2-adam CONFIG_DIR OUT
        A 2-process FSDP2 job on the transformers model of CONFIG_DIR
        (seeded, every layer and the root sharded) trains two AdamW steps
        on the batches Megatron's jobs here train on (make_checkpoints.
        train_steps: same global batches, same unshifted loss, gradients
        clipped at 1.0 as Megatron's default) and saves `get_state_dict(
        model, optim)` with `dcp.save` as OUT; then trains two more steps,
        whose losses it writes to OUT.losses.json. OUT-lr is the same saved
        state with another learning rate.

    python tests/megatron/verify.py megatron-adam FSDP2_DIR NEW TP DP
        NEW (tenplan's torch_dist output of FSDP2_DIR) holds the FSDP2
        job's Adam moments and weights, read with DCP and unfused here
        (Megatron's QKV and SwiGLU split as Megatron-Bridge does) bit for
        bit, and its step; then on TP*DP gloo processes a Megatron job
        with the distributed optimizer loads model and optimizer from NEW
        as Megatron-LM does (fully_reshardable) and trains the two steps
        the FSDP2 job trained after saving: its losses must follow the
        FSDP2 job's (within float32 rounding of two frameworks' kernels),
        far closer than the same job's with a fresh optimizer.

    python tests/megatron/verify.py fsdp2-resume-adam MEGATRON EXPORT CONFIG_DIR
        EXPORT (tenplan's DCP export of the Megatron-Core checkpoint
        MEGATRON, saved with Megatron's distributed optimizer) holds its
        weights and Adam moments bit for bit (Megatron's QKV and SwiGLU
        split here) and its step; a 2-process FSDP2 job on the transformers
        model of CONFIG_DIR loads model and AdamW state from it with
        `get_state_dict` + `dcp.load` + `set_state_dict` (DCP's default
        reader: nothing missing) and trains two steps: its losses must
        follow those of Megatron's own job resumed from MEGATRON at
        tp=2, dp=2 (within float32 rounding of two frameworks' kernels),
        far closer than the FSDP2 job's with a fresh optimizer.

    python tests/megatron/verify.py dcp HF_DIR OUT
        Saves the transformers model of HF_DIR with torch.distributed.
        checkpoint (one process, Hugging Face names): a DCP checkpoint as an
        FSDP2 job on that model writes one.

Prints one JSON object; exits 1 when a check fails.
"""

import json
import os
import sys
import warnings

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
import make_checkpoints as mk  # noqa: E402


def hf_weights_of_megatron(state, heads, groups):
    """The Hugging Face Llama weights of a tp=1 Megatron state dict."""
    out = {}
    hidden = state["embedding.word_embeddings.weight"].shape[1]
    hd = hidden // heads
    per_group = heads // groups
    out["model.embed_tokens.weight"] = state["embedding.word_embeddings.weight"]
    out["model.norm.weight"] = state["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = state["output_layer.weight"]
    layer = 0
    while f"decoder.layers.{layer}.self_attention.linear_qkv.weight" in state:
        p = f"decoder.layers.{layer}."
        h = f"model.layers.{layer}."
        qkv = state[p + "self_attention.linear_qkv.weight"].view(groups, per_group + 2, hd, hidden)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per_group].reshape(-1, hidden)
        out[h + "self_attn.k_proj.weight"] = qkv[:, per_group].reshape(-1, hidden)
        out[h + "self_attn.v_proj.weight"] = qkv[:, per_group + 1].reshape(-1, hidden)
        out[h + "self_attn.o_proj.weight"] = state[p + "self_attention.linear_proj.weight"]
        gate, up = state[p + "mlp.linear_fc1.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"] = gate
        out[h + "mlp.up_proj.weight"] = up
        out[h + "mlp.down_proj.weight"] = state[p + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = state[p + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = state[p + "pre_mlp_layernorm.weight"]
        layer += 1
    return out


def check_hf(hf_dir, reference):
    from transformers import AutoModelForCausalLM

    ref = torch.load(reference)
    model, info = AutoModelForCausalLM.from_pretrained(hf_dir, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    differ, extra = [], []
    if model.config.model_type == "llama":
        # Every weight against Megatron's own, unfused here. (A MoE's
        # experts are checked through the logits.)
        want = hf_weights_of_megatron(ref["state"], mk.HEADS, mk.GROUPS)
        have = model.state_dict()
        differ = sorted(k for k, v in want.items() if k not in have or not torch.equal(have[k], v))
        extra = sorted(set(have) - set(want) - {k for k in have if "rotary" in k})
    with torch.no_grad():
        logits = model(ref["tokens"]).logits
    err = (logits - ref["logits"]).abs().max().item()
    ok = not problems and not differ and not extra and err < 1e-4
    return {"ok": ok, "loading_info": problems, "weights_differ": differ, "extra": extra, "max_logit_error": err}


def check_hf_mtp(hf_dir, reference):
    """A DeepSeek-V3 export with its MTP module, against Megatron's own
    state of the checkpoint (REFERENCE): transformers loads the model and
    reports only the MTP layer's keys as unexpected (it has no MTP module,
    as with DeepSeek's published files); the files hold module 0 as layer
    `num_hidden_layers`, as DeepSeek's README_WEIGHTS.md lays it out,
    bit-identical to Megatron's `mtp.layers.0`, its embedding and output
    head copies of the model's."""
    import glob

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    state = torch.load(reference)["state"]
    model, info = AutoModelForCausalLM.from_pretrained(hf_dir, output_loading_info=True, dtype=torch.float32)
    layer = model.config.num_hidden_layers
    h = f"model.layers.{layer}."
    files = {}
    for path in glob.glob(os.path.join(hf_dir, "*.safetensors")):
        with safe_open(path, "pt") as f:
            files.update({k: f.get_tensor(k) for k in f.keys()})
    m = "mtp.layers.0."
    t = m + "transformer_layer."
    want = {
        h + "enorm.weight": state[m + "enorm.weight"],
        h + "hnorm.weight": state[m + "hnorm.weight"],
        h + "eh_proj.weight": state[m + "eh_proj.weight"],
        h + "shared_head.norm.weight": state[m + "final_layernorm.weight"],
        h + "embed_tokens.weight": state["embedding.word_embeddings.weight"],
        h + "shared_head.head.weight": state["output_layer.weight"],
        h + "input_layernorm.weight": state[t + "input_layernorm.weight"],
        h + "post_attention_layernorm.weight": state[t + "pre_mlp_layernorm.weight"],
        h + "self_attn.q_a_proj.weight": state[t + "self_attention.linear_q_down_proj.weight"],
        h + "self_attn.kv_a_layernorm.weight": state[t + "self_attention.kv_layernorm.weight"],
        h + "mlp.gate.weight": state[t + "mlp.router.weight"],
        h + "mlp.gate.e_score_correction_bias": state[t + "mlp.router.expert_bias"],
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "lm_head.weight": state["output_layer.weight"],
    }
    for e in range(mk.TINY_MLA_MTP["experts"]):
        x = f"{t}mlp.experts.local_experts.{e}."
        gate, up = state[x + "linear_fc1.weight"].chunk(2)
        want[f"{h}mlp.experts.{e}.gate_proj.weight"] = gate
        want[f"{h}mlp.experts.{e}.up_proj.weight"] = up
        want[f"{h}mlp.experts.{e}.down_proj.weight"] = state[x + "linear_fc2.weight"]
    differ = sorted(k for k, v in want.items() if k not in files or not torch.equal(files[k], v))
    unexpected = sorted(info["unexpected_keys"])
    others = [k for k in unexpected if not k.startswith(h)]
    problems = {k: v for k, v in info.items() if v and k != "unexpected_keys"}
    ok = not differ and not others and not problems and len(unexpected) > 0
    return {"ok": ok, "differ": differ, "unexpected_outside_mtp": others, "loading_info": problems,
            "mtp_tensors": sum(k.startswith(h) for k in files)}


def load_worker(rank, world, port, tp, pp, ep, size, original, new, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    states = {}
    for name, ckpt in [("original", original), ("new", new)]:
        model = mk.build(tp, pp, size, ep)
        # Garble what the load must overwrite.
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        wanted = mk.model_sharded_state(model, size)
        loaded = dist_checkpointing.load(wanted, ckpt)
        # The model's entries (common.pt may hold an optimizer's too).
        model.load_state_dict({k: v for k, v in loaded.items() if k in wanted})
        states[name] = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    a, b = states["original"], states["new"]
    differ = sorted(k for k in a if k not in b or not torch.equal(a[k], b[k]))
    torch.save({"tensors": len(a), "differ": differ, "missing": sorted(set(a) ^ set(b))}, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def optimizer_load_worker(rank, world, port, tp, pp, original, new, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing, parallel_state

    mk.cpu_only_optimizer_patches()
    runs = {}
    for name, ckpt in [("original", original), ("new", new)]:
        ddp, optim = mk.with_optimizer(mk.build(tp, pp))
        mk.make_optimizer_state(optim)
        loaded = dist_checkpointing.load(mk.job_sharded_state(ddp, optim, is_loading=True), ckpt)
        ddp.module.load_state_dict(loaded["model"])
        optim.load_state_dict(loaded["optimizer"])
        tensors = mk.job_state(ddp, optim)
        moments = sum(v.abs().sum().item() for k, v in tensors.items() if k.endswith(".exp_avg"))
        losses = mk.train_steps(ddp, optim, 2, 2) if pp == 1 else []
        after = {k: v.clone() for k, v in ddp.module.state_dict().items() if isinstance(v, torch.Tensor)}
        runs[name] = (tensors, moments, losses, after)
        parallel_state.destroy_model_parallel()
    (a, moments, losses_a, after_a), (b, _, losses_b, after_b) = runs["original"], runs["new"]
    differ = sorted(k for k in a if k not in b or not torch.equal(a[k], b[k]))
    differ += sorted(f"after training: {k}" for k in after_a if not torch.equal(after_a[k], after_b[k]))
    torch.save(
        {
            "tensors": len(a),
            "differ": differ,
            "missing": sorted(set(a) ^ set(b)),
            "moments_loaded": moments > 0,
            "losses": [losses_a, losses_b],
        },
        f"{out}.{rank}",
    )
    torch.distributed.destroy_process_group()


def fsdp2_load_worker(rank, world, port, hf_dir, dcp_dir, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from transformers import AutoModelForCausalLM

    model = fsdp2_model(hf_dir, world, 1)
    config = model.config
    state = get_model_state_dict(model)
    # What the job asks for; dcp.load raises on a key the checkpoint lacks.
    dcp.load(state, checkpoint_id=dcp_dir)
    set_model_state_dict(model, state)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    with torch.no_grad():
        tokens = torch.arange(12).reshape(2, 6) % config.vocab_size
        logits = model(tokens).logits
    if rank == 0:
        want = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        have_sd, want_sd = full, want.state_dict()
        differ = sorted(k for k in want_sd if "rotary" not in k and (k not in have_sd or not torch.equal(have_sd[k], want_sd[k])))
        with torch.no_grad():
            err = (logits - want(tokens).logits).abs().max().item()
        torch.save({"keys": len(state), "differ": differ, "max_logit_error": err}, f"{out}.{rank}")
    else:
        torch.save({}, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def check_fsdp2(hf_dir, dcp_dir, world):
    r = on_ranks(fsdp2_load_worker, world, hf_dir, dcp_dir)[0]
    ok = not r["differ"] and r["max_logit_error"] < 1e-4
    return {"ok": ok, **r}


def on_ranks(worker, world, *args):
    """Each rank's result of `worker(rank, world, port, *args, out)`,
    which saves it to `out.<rank>`, on `world` gloo processes."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.start_processes(worker, args=(world, mk.free_port(), *args, out), nprocs=world, start_method="spawn")
        return [torch.load(f"{out}.{r}") for r in range(world)]


def check_megatron_optimizer(original, new, tp, pp, dp):
    ranks = on_ranks(optimizer_load_worker, tp * pp * dp, tp, pp, original, new)
    ok = all(
        not r["differ"] and not r["missing"] and r["moments_loaded"] and r["losses"][0] == r["losses"][1] for r in ranks
    )
    return {"ok": ok, "tp": tp, "pp": pp, "dp": dp, "ranks": ranks}


def check_megatron(original, new, tp, pp, ep=1, size="dense"):
    size = mk.SIZES[size]
    ranks = on_ranks(load_worker, tp * pp * ep, tp, pp, ep, size, original, new)
    ok = all(not r["differ"] and not r["missing"] for r in ranks)
    return {"ok": ok, "tp": tp, "pp": pp, "ep": ep, "ranks": ranks}


def fsdp2_model(config_dir, world, seed):
    """The transformers model of CONFIG_DIR (seeded), every layer and the
    root sharded by FSDP2 over `world` gloo processes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_train(model, optim, first, steps, rank, world):
    """Megatron's training steps here (make_checkpoints.train_steps: the
    same global batches, every position against its own token, gradients
    clipped at 1.0 as Megatron's default) on an FSDP2 job; the global mean
    loss of each."""
    losses = []
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(100 + step)
        t = torch.randint(0, mk.VOCAB, (4, mk.SEQ), generator=g)[rank * 4 // world : (rank + 1) * 4 // world]
        logits = model(input_ids=t).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def fsdp2_adam_worker(rank, world, port, config_dir, ckpt, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = fsdp2_model(config_dir, world, 3)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    def train(first, steps):
        return fsdp2_train(model, optim, first, steps, rank, world)

    before = train(0, 2)
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    # The same state but for its learning rate, as CKPT-lr.
    for g in optim.param_groups:
        g["lr"] = 5e-3
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{ckpt}-lr")
    for g in optim.param_groups:
        g["lr"] = 1e-2
    after = train(2, 2)
    torch.save({"before": before, "after": after}, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def fsdp2_adam(config_dir, out, attempts=3):
    import shutil

    for attempt in range(attempts):
        try:
            r = on_ranks(fsdp2_adam_worker, 2, config_dir, out)[0]
            break
        except mp.ProcessExitedException as e:
            # gloo on some machines aborts a process of an FSDP2 job now
            # and then ("terminate called without an active exception");
            # the job is run again from the start, anything else fails.
            if e.signal_name != "SIGABRT" or attempt + 1 == attempts:
                raise
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(f"{out}-lr", ignore_errors=True)
    with open(f"{out}.losses.json", "w") as f:
        json.dump(r, f)
    return {"ok": True, **r}


def dcp_tensors(directory):
    """Every tensor of a DCP checkpoint, read in this one process, by its
    flattened name."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(directory, os.path.join(tmp, "all.pt"))
        nested = torch.load(os.path.join(tmp, "all.pt"), weights_only=False)
    flat = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}{k}.", x)
        elif isinstance(v, torch.Tensor):
            flat[prefix[:-1]] = v

    walk("", nested)
    return flat


def megatron_saved_as_hf(saved, prefix):
    """The tensors of a torch_dist checkpoint saved under `prefix` (a
    dense model, layers stacked, norms under their fused names) as
    Hugging Face Llama tensors."""
    state = {}
    for k, v in saved.items():
        if not k.startswith(prefix):
            continue
        name = k[len(prefix) :]
        name = name.replace("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight")
        name = name.replace("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight")
        if name.startswith("decoder.layers."):
            for i in range(v.shape[0]):
                state[name.replace("decoder.layers.", f"decoder.layers.{i}.", 1)] = v[i]
        else:
            state[name] = v
    return hf_weights_of_megatron(state, mk.HEADS, mk.GROUPS)


def resume_megatron(ddp, optim, ckpt):
    """Load a Megatron job's model and distributed optimizer from CKPT as
    Megatron-LM resumes (fully_reshardable), each parameter with its own
    step: without Apex or Transformer Engine (a CPU), 0.16.1's loader
    gives every parameter's state one shared `step` tensor, which torch's
    AdamW then advances once per parameter (GPU jobs' fused Adam keeps the
    step in the group)."""
    from megatron.core import dist_checkpointing

    mk.make_optimizer_state(optim)
    loaded = dist_checkpointing.load(mk.job_sharded_state(ddp, optim, is_loading=True), ckpt)
    ddp.module.load_state_dict(loaded["model"])
    optim.load_state_dict(loaded["optimizer"])
    for part in mk.optimizer_parts(optim):
        for state in part.optimizer.state.values():
            state["step"] = state["step"].clone()


def megatron_adam_worker(rank, world, port, tp, new, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing, parallel_state

    mk.cpu_only_optimizer_patches()
    losses = {}
    for run in ["loaded", "fresh"]:
        ddp, optim = mk.with_optimizer(mk.build(tp, 1))
        if run == "loaded":
            resume_megatron(ddp, optim, new)
        else:
            wanted = ddp.module.sharded_state_dict()
            loaded = dist_checkpointing.load(wanted, new)
            # The model's entries (common.pt holds the optimizer's too).
            ddp.module.load_state_dict({k: v for k, v in loaded.items() if k in wanted})
        losses[run] = mk.train_steps(ddp, optim, 2, 2)
        parallel_state.destroy_model_parallel()
    torch.save(losses, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def check_megatron_adam(fsdp2_dir, new, tp, dp):
    source, saved = dcp_tensors(fsdp2_dir), dcp_tensors(new)
    differ, compared = [], 0
    for what, prefix, want_prefix, suffix in [
        ("param", "optimizer.state.param.", "model.", ""),
        ("weights", "", "model.", ""),
        ("exp_avg", "optimizer.state.exp_avg.", "optim.state.", ".exp_avg"),
        ("exp_avg_sq", "optimizer.state.exp_avg_sq.", "optim.state.", ".exp_avg_sq"),
    ]:
        have = megatron_saved_as_hf(saved, prefix)
        for name, v in have.items():
            want = source.get(f"{want_prefix}{name}{suffix}")
            compared += 1
            if want is None or not torch.equal(v, want):
                differ.append(f"{what}: {name}")
    common = torch.load(os.path.join(new, "common.pt"), weights_only=False)
    groups = common["optimizer"]["optimizer"]["param_groups"]
    steps = sorted({v.item() for k, v in source.items() if k.endswith(".step")})
    step_ok = [g["step"] for g in groups] == [steps[0]] * len(groups) and len(steps) == 1
    with open(f"{fsdp2_dir}.losses.json") as f:
        reference = json.load(f)["after"]
    ranks = on_ranks(megatron_adam_worker, tp * dp, tp, new)
    loaded, fresh = ranks[0]["loaded"], ranks[0]["fresh"]
    off = max(abs(a - b) for a, b in zip(loaded, reference))
    off_fresh = max(abs(a - b) for a, b in zip(fresh, reference))
    ok = not differ and compared > 0 and step_ok and off < 1e-5 and off_fresh > 100 * max(off, 1e-7)
    return {
        "ok": ok,
        "compared": compared,
        "differ": differ,
        "step": steps,
        "groups": len(groups),
        "losses": {"fsdp2": reference, "megatron": loaded, "megatron_fresh_optimizer": fresh},
        "max_loss_difference": off,
        "max_loss_difference_fresh": off_fresh,
    }


def fsdp2_resume_worker(rank, world, port, config_dir, ckpt, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

    losses = {}
    for run in ["loaded", "fresh"]:
        model = fsdp2_model(config_dir, world, 5)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        msd, osd = get_state_dict(model, optim)
        if run == "loaded":
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=ckpt)
            set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            # The weights alone, into a fresh AdamW.
            optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
            state = {"model": msd}
            dcp.load(state, checkpoint_id=ckpt)
            set_model_state_dict(model, state["model"])
        mine = fsdp2_train(model, optim, 2, 2, rank, world)
        losses[run] = mine
        if run == "loaded":
            losses["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in optim.param_groups]
    torch.save(losses, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def megatron_resume_worker(rank, world, port, tp, ckpt, out):
    """Megatron's own job resumed from its checkpoint, two more steps."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    mk.cpu_only_optimizer_patches()
    ddp, optim = mk.with_optimizer(mk.build(tp, 1))
    resume_megatron(ddp, optim, ckpt)
    torch.save(mk.train_steps(ddp, optim, 2, 2), f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def check_fsdp2_resume_adam(megatron, export, config_dir):
    source, saved = dcp_tensors(megatron), dcp_tensors(export)
    differ, compared = [], 0
    for what, prefix, have_prefix, suffix in [
        ("weights", "", "model.", ""),
        ("exp_avg", "optimizer.state.exp_avg.", "optim.state.", ".exp_avg"),
        ("exp_avg_sq", "optimizer.state.exp_avg_sq.", "optim.state.", ".exp_avg_sq"),
    ]:
        for name, want in megatron_saved_as_hf(source, prefix).items():
            have = saved.get(f"{have_prefix}{name}{suffix}")
            compared += 1
            if have is None or not torch.equal(have, want):
                differ.append(f"{what}: {name}")
    common = torch.load(os.path.join(megatron, "common.pt"), weights_only=False)
    step = common["optimizer"]["optimizer"]["param_groups"][0]["step"]
    steps = sorted({v.item() for k, v in saved.items() if k.endswith(".step")})
    reference = on_ranks(megatron_resume_worker, 4, 2, megatron)[0]
    r = on_ranks(fsdp2_resume_worker, 2, config_dir, export)[0]
    off = max(abs(a - b) for a, b in zip(r["loaded"], reference))
    off_fresh = max(abs(a - b) for a, b in zip(r["fresh"], reference))
    lr_ok = all(g["lr"] == 1e-2 and g["weight_decay"] == 0.01 for g in r["groups"])
    ok = not differ and compared > 0 and steps == [step] and lr_ok and off < 1e-5 and off_fresh > 100 * max(off, 1e-7)
    return {
        "ok": ok,
        "compared": compared,
        "differ": differ,
        "steps": steps,
        "groups": r["groups"],
        "losses": {"megatron": reference, "fsdp2": r["loaded"], "fsdp2_fresh_optimizer": r["fresh"]},
        "max_loss_difference": off,
        "max_loss_difference_fresh": off_fresh,
    }


def save_dcp(hf_dir, out):
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    dcp.save(state, checkpoint_id=out, no_dist=True)
    return {"ok": True, "tensors": len(state)}


def main():
    what = sys.argv[1]
    if what == "hf":
        result = check_hf(sys.argv[2], sys.argv[3])
    elif what == "hf-mtp":
        result = check_hf_mtp(sys.argv[2], sys.argv[3])
    elif what == "fsdp2":
        result = check_fsdp2(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif what == "dcp":
        result = save_dcp(sys.argv[2], sys.argv[3])
    elif what == "fsdp2-adam":
        result = fsdp2_adam(sys.argv[2], sys.argv[3])
    elif what == "fsdp2-resume-adam":
        result = check_fsdp2_resume_adam(sys.argv[2], sys.argv[3], sys.argv[4])
    elif what == "megatron-adam":
        result = check_megatron_adam(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif what == "megatron-optim":
        result = check_megatron_optimizer(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7]))
    elif what == "megatron":
        ep = int(sys.argv[6]) if len(sys.argv) > 6 else 1
        size = sys.argv[7] if len(sys.argv) > 7 else "dense"
        result = check_megatron(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), ep, size)
    else:
        raise SystemExit(f"unknown check {what}")
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
