#!/usr/bin/env python3
"""Hugging Face import and export throughput and peak memory, against
reading the same bytes once (`cat > /dev/null`), on a model transformers
writes: a Llama-style model of 0.98 GB in bf16 (hidden 2048, 8 layers, GQA 16:4,
vocab 32000, two shards of at most 500 MB); and `tenplan diff` of GPT-3 350M
fp32 weights at two layouts.

    python benches/hf_io.py TENPLAN WORKDIR [--json OUT] [--reps 3]

Every command runs with warm page cache (each is run once before timing);
writes are synced to disk, so `cp; sync` of the files is the write path's
peer, `cat > /dev/null` the read path's. Writes a markdown table on
stdout and, with --json, every measurement with the machine's description.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PEAK = os.path.join(HERE, "..", "scripts", "peak_memory.py")


def make_model(path):
    if os.path.exists(os.path.join(path, "config.json")):
        return
    import torch
    import transformers
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                                      max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    model.save_pretrained(path, max_shard_size="500MB")


def _save_dcp(rank, port, hf, out):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    mesh = init_device_mesh("cpu", (4,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    dcp.save(model.state_dict(), checkpoint_id=out)
    dist.destroy_process_group()


def make_dcp(hf, out):
    if os.path.exists(os.path.join(out, ".metadata")):
        return
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_save_dcp, args=(port, hf, out), nprocs=4, join=True)


def torch_convert_seconds(dcp_dir, out_file, reps):
    """torch's dcp_to_torch_save, best of reps after one warm run, synced."""
    code = (
        "import os, sys, time\n"
        "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
        "best = None\n"
        f"for i in range({reps} + 1):\n"
        f"    t = time.perf_counter(); dcp_to_torch_save({dcp_dir!r}, {out_file!r}); os.sync()\n"
        "    s = time.perf_counter() - t\n"
        f"    os.remove({out_file!r})\n"
        "    best = s if i and (best is None or s < best) else best\n"
        "print(best)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run(cmd):
    out = subprocess.run([sys.executable, PEAK, "--"] + cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(cmd, reps, before=None):
    results = []
    for _ in range(reps + 1):
        if before:
            before()
        results.append(run(cmd))
    results = results[1:]  # the first warms the page cache
    r = min(results, key=lambda x: x["seconds"])
    r["peak_rss_bytes"] = max(x["peak_rss_bytes"] for x in results)
    r["peak_anon_bytes"] = max(x["peak_anon_bytes"] for x in results)
    return r


def files_of(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tenplan")
    ap.add_argument("work")
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    hf = os.path.join(a.work, "llama-1b")
    make_model(hf)
    ckpt, ckpt2, out = (os.path.join(a.work, x) for x in ("ckpt", "ckpt2", "export"))
    hf_files = files_of(hf)
    data = sum(os.path.getsize(f) for f in hf_files)
    largest = max(os.path.getsize(f) for f in hf_files)
    rows = []

    def clear(*paths):
        return lambda: [shutil.rmtree(p, ignore_errors=True) for p in paths]

    cat = best(["cat"] + hf_files, a.reps)
    rows.append(("read the HF files once (cat > /dev/null)", cat))
    # The write path's physical limit: copy the files and sync them.
    dst = os.path.join(a.work, "copy")
    copy = best(["sh", "-c", f"mkdir {dst} && cp {' '.join(hf_files)} {dst}/ && sync {dst}/*"], a.reps, clear(dst))
    rows.append(("copy the HF files and sync (cp; sync)", copy))
    for layout in ["tp=1", "tp=2,pp=2"]:
        r = best([a.tenplan, "import", "--hf", hf, "--layout", layout, "--out", ckpt], a.reps, clear(ckpt))
        rows.append((f"import, {layout}", r))
    # A resharded checkpoint, exported back.
    shutil.rmtree(ckpt2, ignore_errors=True)
    subprocess.run([a.tenplan, "reshard", "--src", ckpt, "--to", "tp=4", "--out", ckpt2], check=True,
                   stdout=subprocess.DEVNULL)
    r = best([a.tenplan, "export", ckpt2, "--hf", out], a.reps, clear(out))
    rows.append(("export from tp=4 (digests checked, then written)", r))
    ckpt_files = files_of(ckpt2)
    rows.append(("read the tp=4 checkpoint once (cat > /dev/null)", best(["cat"] + ckpt_files, a.reps)))
    r = best([a.tenplan, "diff", hf, ckpt2], a.reps)
    rows.append(("diff HF files vs tp=4 checkpoint (both sides digested)", r))
    rows.append(("read both once (cat > /dev/null)", best(["cat"] + hf_files + ckpt_files, a.reps)))
    # The model as a DCP checkpoint of FSDP2 on 4 ranks.
    dcp_dir = os.path.join(a.work, "dcp")
    make_dcp(hf, dcp_dir)
    dcp_files = sorted(os.path.join(dcp_dir, f) for f in os.listdir(dcp_dir) if f.endswith(".distcp"))
    dcp_rows = [("read the DCP files once (cat > /dev/null)", best(["cat"] + dcp_files, a.reps))]
    dcp_rows.append(("check DCP (structure, every byte read)", best([a.tenplan, "check", dcp_dir], a.reps)))
    for layout in ["tp=1", "tp=2,pp=2"]:
        r = best([a.tenplan, "reshard", "--src", dcp_dir, "--model", hf, "--to", layout, "--out", ckpt], a.reps,
                 clear(ckpt))
        dcp_rows.append((f"reshard DCP -> {layout}", r))
    dcp_rows.append(("export DCP -> HF", best([a.tenplan, "export", dcp_dir, "--model", hf, "--hf", out], a.reps,
                                              clear(out))))
    dcp_rows.append(("diff DCP vs HF files", best([a.tenplan, "diff", dcp_dir, hf, "--model", hf], a.reps)))
    torch_s = torch_convert_seconds(dcp_dir, os.path.join(a.work, "torch-save.pt"), a.reps)
    dcp_rows.append(("torch dcp_to_torch_save (one file, synced)", {"seconds": torch_s, "peak_rss_bytes": 0,
                                                                    "peak_anon_bytes": 0}))
    # GPT-3 350M fp32 weights at two layouts (the executor benchmark's model).
    g1, g2 = os.path.join(a.work, "gpt-a"), os.path.join(a.work, "gpt-b")
    if not os.path.exists(g2):
        subprocess.run([a.tenplan, "init", "--model", "gpt3-350m", "--layout", "tp=2,dp=2", "--dtype", "f32",
                        "--weights-only", "--out", g1], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([a.tenplan, "reshard", "--src", g1, "--to", "tp=4", "--out", g2], check=True,
                       stdout=subprocess.DEVNULL)
    gfiles = files_of(g1) + files_of(g2)
    gcat = best(["cat"] + gfiles, a.reps)
    gdiff = best([a.tenplan, "diff", g1, g2], a.reps)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(),
               "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}
    print(f"Model: Llama-style, {data / 1e9:.2f} GB of bf16 tensors in {len(hf_files)} files "
          f"(largest {largest / 1e6:.0f} MB); {machine['cpus']} CPUs; best of {a.reps}, warm cache.\n")
    print("| step | seconds | GB/s | × cat | × cp; sync | peak RSS (MB) | peak anonymous (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['seconds']:.2f} | {data / r['seconds'] / 1e9:.2f} | {r['seconds'] / cat['seconds']:.1f} | "
              f"{r['seconds'] / copy['seconds']:.2f} | {r['peak_rss_bytes'] / 1e6:.0f} | {r['peak_anon_bytes'] / 1e6:.0f} |")
    gbytes = sum(os.path.getsize(f) for f in gfiles)
    print(f"\nGPT-3 350M fp32 weights, tp=2,dp=2 vs tp=4 ({gbytes / 1e9:.2f} GB of files): "
          f"`tenplan diff` {gdiff['seconds']:.2f} s, `cat > /dev/null` of both {gcat['seconds']:.2f} s "
          f"({gdiff['seconds'] / gcat['seconds']:.1f}x).")
    dcat = dcp_rows[0][1]
    print(f"\nThe same model as a PyTorch DCP checkpoint (FSDP2, 4 gloo ranks, {len(dcp_files)} files); "
          "torch's conversion timed inside Python (no peak memory):\n")
    print("| step | seconds | GB/s | × cat | × cp; sync | × torch dcp_to_torch_save | peak RSS (MB) | peak anonymous (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in dcp_rows:
        print(f"| {name} | {r['seconds']:.2f} | {data / r['seconds'] / 1e9:.2f} | {r['seconds'] / dcat['seconds']:.1f} | "
              f"{r['seconds'] / copy['seconds']:.2f} | {r['seconds'] / torch_s:.2f} | {r['peak_rss_bytes'] / 1e6:.0f} | "
              f"{r['peak_anon_bytes'] / 1e6:.0f} |")
    rows.extend(("dcp: " + n, r) for n, r in dcp_rows)
    rows.append(("gpt3-350m diff tp=2,dp=2 vs tp=4", gdiff))
    rows.append(("gpt3-350m read both once (cat)", gcat))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine, "model_bytes": data, "largest_shard_bytes": largest,
                       "reps": a.reps, "rows": [dict(step=n, **r) for n, r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
