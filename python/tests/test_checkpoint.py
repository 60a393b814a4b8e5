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
