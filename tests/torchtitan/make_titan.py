"""torchtitan fixtures for tests/torchtitan.rs, made with real torchtitan.

    python tests/torchtitan/make_titan.py make OUT
        Builds a tiny torchtitan Llama 3 (torchtitan's own model and
        parameter initialisation), shards it with FSDP2 on 2 gloo processes
        and saves its state dict with torch.distributed.checkpoint.save, as
        torchtitan's model-only checkpoints hold it (top-level names,
        `layers.N.attention.qkv_linear.wq.weight`): OUT/titan. Converts
        the same weights with torchtitan's own converter
        (Llama3StateDictAdapter.to_hf) into a transformers LlamaForCausalLM
        saved with save_pretrained: OUT/hf. The full state dict:
        OUT/original.pt.

    python tests/torchtitan/make_titan.py stages '[[PP, LAYERS], ...]'
        torchtitan's own split of the layers over pipeline stages.

    python tests/torchtitan/make_titan.py load ORIGINAL DCP_DIR
        Loads DCP_DIR into the same torchtitan model's state dict with plain
        dcp.load (the default reader; every key asked for must be there) and
        compares every tensor with ORIGINAL, bit for bit.

Prints one JSON object; exits 1 when a check fails.
"""

import json
import os
import socket
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

DIM, HEADS, KV_HEADS, LAYERS, VOCAB, FFN = 64, 4, 2, 2, 256, 192


def titan_config():
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
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


def titan_model():
    torch.manual_seed(0)
    model = titan_config().build()
    model.init_states()
    return model


def save_worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = titan_model()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    for layer in model.layers.values() if isinstance(model.layers, torch.nn.ModuleDict) else model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    dcp.save(get_model_state_dict(model), checkpoint_id=out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make(out):
    from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(out, exist_ok=True)
    model = titan_model()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, os.path.join(out, "original.pt"))
    mp.start_processes(save_worker, args=(2, free_port(), os.path.join(out, "titan")), nprocs=2, start_method="spawn")
    # torchtitan's own conversion to Hugging Face names and row order.
    hf_state = Llama3StateDictAdapter(titan_config(), None).to_hf(state)
    config = LlamaConfig(
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        head_dim=DIM // HEADS,
        tie_word_embeddings=False,
    )
    hf = LlamaForCausalLM(config)
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    missing = [k for k in missing if "rotary" not in k]
    hf.save_pretrained(os.path.join(out, "hf"))
    return {"ok": not missing and not unexpected, "tensors": len(state), "missing": missing, "unexpected": unexpected}


def load(original, directory):
    want = torch.load(original)
    model = titan_model()
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
        result = make(sys.argv[2])
    elif what == "stages":
        result = stages(json.loads(sys.argv[2]))
    else:
        result = load(sys.argv[2], sys.argv[3])
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
