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
    e = tenplan.export(out, tmp_path / "hf")
    assert e["tensors"] > 0
    from safetensors.torch import load_file

    files = [f for f in os.listdir(tmp_path / "hf") if f.endswith(".safetensors")]
    loaded = {}
    for f in files:
        loaded.update(load_file(tmp_path / "hf" / f))
    assert len(loaded) == e["tensors"]


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
    tenplan.export(out, tmp_path / "hf")
    # The weights of a training checkpoint against its Hugging Face export.
    w = tenplan.diff(ckpt, tmp_path / "hf", weights_only=True)
    assert w["identical"] and w["b_kind"] == "Hugging Face model", w
    other = tmp_path / "seed1"
    subprocess.run([BIN, "init", "--model", "llama-tiny", "--layout", "tp=2,dp=1", "--seed", "1", "--out", str(other)], check=True)
    d = tenplan.diff(ckpt, other)
    assert not d["identical"] and d["different"]
    first = d["first_difference"]
    assert first["tensor"] in {x["name"] for x in d["different"]}
    assert d["first_difference_in_a"].startswith("box [")
    with pytest.raises(tenplan.CheckpointError):
        tenplan.diff(ckpt, tmp_path / "nothing-here")
