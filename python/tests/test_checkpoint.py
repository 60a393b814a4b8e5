"""Checkpoint operations from Python: reshard, check, export (checkpoints
made by the tenplan binary, exports loaded with safetensors)."""

import os
import subprocess

import pytest

import tenplan

BIN = os.environ.get("TENPLAN_BIN", "target/debug/tenplan")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "a"
    subprocess.run([BIN, "init", "--model", "llama-tiny", "--layout", "tp=2,pp=2,dp=2,zero=1", "--out", str(d)], check=True)
    return d


def test_reshard_check_export(ckpt, tmp_path):
    out = tmp_path / "b"
    r = tenplan.reshard(ckpt, out, "tp=4,dp=2")
    assert r["src_format"] == "tenplan" and r["copies"] > 0 and r["bytes_read"] == r["data_bytes"]
    c = tenplan.check(out)
    assert c["format"] == "tenplan" and c["layout"] == "tp=4,dp=2"
    # Hugging Face files hold weights: the optimizer state is named, and
    # left out only on request.
    with pytest.raises(tenplan.CheckpointError, match="82 entries would not reach"):
        tenplan.export(out, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    e = tenplan.export(out, tmp_path / "hf", weights_only=True)
    assert e["tensors"] > 0 and len(e["excluded"]) == 82
    from safetensors.torch import load_file

    files = [f for f in os.listdir(tmp_path / "hf") if f.endswith(".safetensors")]
    loaded = {}
    for f in files:
        loaded.update(load_file(tmp_path / "hf" / f))
    assert len(loaded) == e["tensors"]


def test_export_as_dcp_loads_into_the_transformers_model(ckpt, tmp_path):
    """The weights as the DCP checkpoint of the transformers model: plain
    dcp.load fills the model's own state dict, equal to the Hugging Face
    export of the same checkpoint."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "dcp"
    with pytest.raises(tenplan.CheckpointError, match="would not reach"):
        tenplan.export(ckpt, dcp=out, to="dp_shard=2")
    e = tenplan.export(ckpt, dcp=out, to="dp_shard=2", weights_only=True)
    assert e["format"] == "PyTorch DCP" and sorted(e["files"]) == ["__0_0.distcp", "__1_0.distcp"]
    with pytest.raises(ValueError, match="dcp"):
        tenplan.export(ckpt, tmp_path / "hf", to="dp_shard=2")
    tenplan.export(ckpt, tmp_path / "hf", weights_only=True)
    want = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(out), dtype=want.dtype
    )
    state = model.state_dict()
    dcp.load(state, checkpoint_id=out, no_dist=True)
    for k, v in want.state_dict().items():
        assert torch.equal(state[k], v), k


def test_placements_on_a_mesh(ckpt, tmp_path):
    """Each tensor's tensor-parallel placement, by name pattern, where no
    model plan says it: DCP's own reader sees the split."""
    pytest.importorskip("torch")
    from torch.distributed.checkpoint import FileSystemReader

    out = tmp_path / "placed"
    tenplan.reshard(
        ckpt,
        out,
        "dp_shard=2,tp=2",
        format="dcp",
        place=["*linear_qkv.weight=Shard(0)", "*linear_proj.weight=Shard(1)"],
    )
    meta = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    proj = meta["decoder.layers.0.self_attention.linear_proj.weight"]
    assert {c.offsets[1] for c in proj.chunks} == {0, proj.size[1] // 2}
    with pytest.raises(tenplan.LayoutError, match="not a placement"):
        tenplan.reshard(ckpt, tmp_path / "x", "dp_shard=2,tp=2", format="dcp", place=["*=Shard(x)"])


def test_megatron_output_names_norms_for_its_layer_implementation(ckpt, tmp_path):
    # A dense model with standard attention: the same names under both.
    for impl in ["local", "transformer_engine"]:
        r = tenplan.reshard(
            ckpt, tmp_path / impl, "tp=2", format="torch_dist", weights_only=True, transformer_impl=impl
        )
        assert r["format"] == "Megatron-Core torch_dist", r
    assert tenplan.diff(tmp_path / "local", tmp_path / "transformer_engine")["identical"]
    with pytest.raises(ValueError, match="transformer_engine or local"):
        tenplan.reshard(ckpt, tmp_path / "x", "tp=2", format="torch_dist", transformer_impl="apex")
    # Only a torch_dist output of a model has names to choose.
    with pytest.raises(tenplan.CheckpointError, match="written as a tenplan checkpoint"):
        tenplan.reshard(ckpt, tmp_path / "x", "tp=2", transformer_impl="local")
    assert not (tmp_path / "x").exists()


def test_reshard_never_overwrites_and_names_the_problem(ckpt, tmp_path):
    with pytest.raises(tenplan.CheckpointError, match="already exists"):
        tenplan.reshard(ckpt, ckpt, "tp=4,dp=2")
    with pytest.raises(tenplan.LayoutError, match="does not divide"):
        tenplan.reshard(ckpt, tmp_path / "c", "tp=3")
    with pytest.raises(tenplan.CheckpointError):
        tenplan.check(tmp_path / "nothing-here")


def test_diff_across_layouts_and_formats(ckpt, tmp_path):
    out = tmp_path / "b"
    tenplan.reshard(ckpt, out, "tp=1,dp=4")
    same = tenplan.diff(ckpt, out)
    assert same["identical"] and same["same"] > 0 and not same["different"]
    tenplan.export(out, tmp_path / "hf", weights_only=True)
    # A training checkpoint holds more than its Hugging Face export...
    full = tenplan.diff(ckpt, tmp_path / "hf")
    assert not full["identical"] and len(full["only_a"]) == 82, full
    # ...and its weights are the export's.
    w = tenplan.diff(ckpt, tmp_path / "hf", weights_only=True)
    assert w["identical"] and w["b_kind"] == "Hugging Face model", w
    assert len(w["left_out"]) == 82
    other = tmp_path / "seed1"
    subprocess.run([BIN, "init", "--model", "llama-tiny", "--layout", "tp=2,dp=1", "--seed", "1", "--out", str(other)], check=True)
    d = tenplan.diff(ckpt, other)
    assert not d["identical"] and d["different"]
    first = d["first_difference"]
    assert first["tensor"] in {x["name"] for x in d["different"]}
    assert d["first_difference_in_a"].startswith("box [")
    with pytest.raises(tenplan.CheckpointError):
        tenplan.diff(ckpt, tmp_path / "nothing-here")


def test_a_family_beyond_the_catalog_round_trips_from_python(tmp_path):
    """Gemma (no catalog preset): import under its files' names at tp=2,
    reshard to one device, export, and transformers loads it with the
    original's logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.GemmaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "gemma")
    i = tenplan.import_hf(tmp_path / "gemma", tmp_path / "a", "tp=2")
    assert i["model"] == "gemma" and i["files_names"] and not i["excluded"]
    r = tenplan.reshard(tmp_path / "a", tmp_path / "b", "tp=1")
    assert r["model"] == "gemma"
    tenplan.export(tmp_path / "b", tmp_path / "hf")
    assert tenplan.diff(tmp_path / "hf", tmp_path / "gemma")["identical"]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.arange(12).reshape(2, 6)
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(tenplan.LayoutError, match="does not divide the 2 key/value heads"):
        tenplan.import_hf(tmp_path / "gemma", tmp_path / "c", "tp=4")
