//! PyTorch DCP checkpoints against real torch: checkpoints that
//! `torch.distributed.checkpoint.save` wrote on gloo processes from FSDP2
//! and 2-D DTensor state dicts of transformers models
//! (tests/dcp/make_dcp.py) are checked, resharded, exported and compared by
//! tenplan; tenplan's Hugging Face exports are loaded back by
//! `torch.distributed.checkpoint.load` into DTensors of other placements,
//! and so are tenplan's own checkpoints (tests/dcp/load_hf.py). Needs a Python with torch and transformers, like
//! tests/hf_models.rs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{err, ok, python, tenplan};

/// (tiny HF models, DCP checkpoints of them), written once per test run.
fn fixtures() -> Option<&'static (PathBuf, PathBuf)> {
    static DIRS: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let py = python()?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dcp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (models, dcp) = (root.join("models"), root.join("dcp"));
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let only = [
            "llama",
            "llama-tied-bias",
            "qwen2",
            "qwen3-moe",
            "mixtral",
            "deepseek-v3",
            "gpt2",
        ];
        for (script, args) in [
            (
                "tests/hf/make_models.py",
                [
                    &[models.as_os_str()][..],
                    &["--only".as_ref()],
                    &only.map(|s| s.as_ref()),
                ]
                .concat(),
            ),
            ("tests/dcp/make_dcp.py", vec![models.as_os_str(), dcp.as_os_str()]),
        ] {
            let o = Command::new(&py)
                .arg(here.join(script))
                .args(args)
                .env("TRANSFORMERS_VERBOSITY", "error")
                .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                .env("HF_HUB_OFFLINE", "1")
                .output()
                .expect("run the fixture script");
            assert!(o.status.success(), "{script}: {}", String::from_utf8_lossy(&o.stderr));
        }
        Some((models, dcp))
    })
    .as_ref()
}

/// The cases make_dcp.py wrote: (case, model).
fn cases(dcp: &Path) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dcp.join("cases.json")).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| (c["case"].as_str().unwrap().into(), c["model"].as_str().unwrap().into()))
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A target layout each model allows (heads, KV heads and experts).
fn target_of(model: &str) -> &'static str {
    match model {
        "llama-tied-bias" => "tp=1,pp=3",
        m if m.contains("moe") || m.contains("mixtral") || m.contains("deepseek") => "tp=2,dp=2,ep=2",
        _ => "tp=2,pp=3",
    }
}

#[test]
fn torch_dcp_checkpoints_reshard_export_and_diff_bit_identical() {
    let Some((models, dcp)) = fixtures() else { return };
    let out = dcp.parent().unwrap().join("out");
    let cases = cases(dcp);
    assert_eq!(cases.len(), 9, "every case was written");
    let mut pairs = Vec::new();
    for (case, model) in &cases {
        let (src, hf) = (dcp.join(case), models.join(model));
        // Structure and every byte.
        let checked: serde_json::Value = serde_json::from_str(&ok(&tenplan(&["check", s(&src), "--json"]))).unwrap();
        assert_eq!(checked["format"], "PyTorch DCP", "{case}");
        // DCP -> tenplan checkpoint at a new layout, equal to the original model.
        let ckpt = out.join(format!("{case}-ckpt"));
        let reshard = |more: &[&str]| {
            let mut args = vec!["reshard", "--src", s(&src), "--model", s(&hf), "--to", target_of(model)];
            args.extend_from_slice(&["--out", s(&ckpt), "--json"]);
            args.extend_from_slice(more);
            tenplan(&args)
        };
        if case.contains("nested") {
            // {"model": state_dict, "step": 7}: the step has no place in a
            // Megatron layout of the weights; nothing is lost silently.
            let e = err(&reshard(&[]));
            assert!(
                e.contains("1 entry of the source would not reach the output (step)"),
                "{e}"
            );
            assert!(!ckpt.exists());
        }
        let more: &[&str] = if case.contains("nested") {
            &["--weights-only"]
        } else {
            &[]
        };
        let r: serde_json::Value = serde_json::from_str(&ok(&reshard(more))).unwrap();
        // Only the bytes the model's weights need are read.
        assert_eq!(r["bytes_read"], r["data_bytes"], "{case}");
        ok(&tenplan(&["check", s(&ckpt)]));
        ok(&tenplan(&["diff", s(&ckpt), s(&hf)]));
        // DCP against the HF original, directly: the nested case's step
        // is one entry more, named, unless left out of the comparison.
        let direct = tenplan(&["diff", s(&src), s(&hf), "--model", s(&hf)]);
        if case.contains("nested") {
            assert_eq!(direct.status.code(), Some(5), "{case}");
            let said = String::from_utf8_lossy(&direct.stdout);
            assert!(said.contains(": 1 entry (step)"), "{said}");
            ok(&tenplan(&[
                "diff",
                s(&src),
                s(&hf),
                "--model",
                s(&hf),
                "--weights-only",
            ]));
        } else {
            ok(&direct);
        }
        // DCP -> HF, and the resharded checkpoint -> HF: both equal the original.
        let from_dcp = out.join(format!("{case}-hf"));
        let export = [&["export", s(&src), "--model", s(&hf), "--hf", s(&from_dcp)], more].concat();
        ok(&tenplan(&export));
        ok(&tenplan(&["diff", s(&from_dcp), s(&hf)]));
        let from_ckpt = out.join(format!("{case}-ckpt-hf"));
        ok(&tenplan(&["export", s(&ckpt), "--hf", s(&from_ckpt)]));
        pairs.push(serde_json::json!({"export": from_ckpt, "original": hf}));
        pairs.push(serde_json::json!({"ckpt": ckpt, "original": hf}));
        if case.contains("nested") {
            // Found under its prefix; the step named as left out on purpose.
            assert_eq!(r["excluded"], serde_json::json!(["step"]), "{r}");
        } else {
            // Tied (qwen2): the live module's lm_head.weight is the
            // embedding, which the target holds; nothing is left out.
            assert_eq!(r["excluded"], serde_json::json!([]), "{case}: {r}");
        }
    }
    // The other direction: real DCP loads tenplan's exports and tenplan's own
    // checkpoints (rank files through DCP_SHARDING_INFO) into DTensors of
    // other placements, every shard bit-identical to what is expected.
    let py = python().unwrap();
    let list = out.join("pairs.json");
    std::fs::write(&list, serde_json::to_string(&pairs).unwrap()).unwrap();
    let o = Command::new(py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dcp/load_hf.py"))
        .arg(&list)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{summary}\n{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    assert_eq!(v["pairs"], 18);
    assert!(v["shards_compared"].as_u64().unwrap() > 1000, "{v}");
}

/// Copy a DCP checkpoint (to damage the copy).
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn tensor_parallelism_on_a_mesh_splits_as_the_models_plan_says() {
    let Some((models, dcp)) = fixtures() else { return };
    let root = dcp.parent().unwrap().join("mesh-tp");
    let _ = std::fs::remove_dir_all(&root);
    // Qwen2: column-wise projections carry their biases; the output keeps
    // every entry, cut into (dp_shard, tp) chunks, and is the same state.
    let (src, out) = (dcp.join("qwen2-fsdp2-2"), root.join("qwen2-tp"));
    let text = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "dp_shard=2,tp=2",
        "--model",
        s(&models.join("qwen2")),
        "--out",
        s(&out),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["files"], 4, "{v}");
    ok(&tenplan(&["diff", s(&src), s(&out)]));
    let py = python().unwrap();
    let o = Command::new(py)
        .args([
            "-c",
            "import sys; from torch.distributed.checkpoint import FileSystemReader as R; \
             m = R(sys.argv[1]).read_metadata().state_dict_metadata; \
             print(sorted((tuple(c.offsets), tuple(c.sizes)) for c in m[sys.argv[2]].chunks))",
            s(&out),
            "model.layers.0.self_attn.q_proj.bias",
        ])
        .output()
        .unwrap();
    let chunks = ok(&o);
    // 32 features: tp halves of 16, each FSDP-sharded into 8 + 8.
    assert_eq!(
        chunks.trim(),
        "[((0,), (8,)), ((8,), (8,)), ((16,), (8,)), ((24,), (8,))]",
        "{chunks}"
    );
    // No model: nothing says how tp splits a tensor.
    let e = err(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "dp_shard=2,tp=2",
        "--out",
        s(&root.join("no-model")),
    ]));
    assert!(e.contains("--model") && e.contains("tensor-parallel plan"), "{e}");
    // ... unless the user places each tensor: the plan's own split, said
    // by hand, writes the same checkpoint byte for byte.
    let placed = root.join("placed");
    let place = [
        "*_proj.weight=Shard(0)",
        "*_proj.bias=Shard(0)",
        "*.o_proj.weight=Shard(1)",
        "*.down_proj.weight=Shard(1)",
        "lm_head.weight=Shard(0)",
    ];
    let mut args = vec![
        "reshard",
        "--src",
        s(&src),
        "--to",
        "dp_shard=2,tp=2",
        "--out",
        s(&placed),
    ];
    for p in &place {
        args.extend(["--place", p]);
    }
    ok(&tenplan(&args));
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 5, "{names:?}");
    for n in &names {
        assert!(
            std::fs::read(out.join(n)).unwrap() == std::fs::read(placed.join(n)).unwrap(),
            "{n:?} differs"
        );
    }
    // A placement over the model's plan: down_proj split by rows instead.
    let over = root.join("over");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "dp_shard=2,tp=2",
        "--model",
        s(&models.join("qwen2")),
        "--place",
        "*.down_proj.weight=Shard(0)",
        "--out",
        s(&over),
    ]));
    ok(&tenplan(&["diff", s(&src), s(&over)]));
    let o = Command::new(python().unwrap())
        .args([
            "-c",
            "import sys; from torch.distributed.checkpoint import FileSystemReader as R; \
             m = R(sys.argv[1]).read_metadata().state_dict_metadata; \
             print(sorted({c.offsets[1] for c in m[sys.argv[2]].chunks}))",
            s(&over),
            "model.layers.0.mlp.down_proj.weight",
        ])
        .output()
        .unwrap();
    assert_eq!(ok(&o).trim(), "[0]", "rows, not columns, are split");
    // Placements need a tp dimension, and must name a tensor.
    for (to, p, says) in [
        ("dp_shard=2", "*=Replicate()", "tp=1"),
        ("dp_shard=2,tp=2", "nothing.here=Shard(0)", "names no tensor"),
    ] {
        let e = err(&tenplan(&[
            "reshard",
            "--src",
            s(&src),
            "--to",
            to,
            "--place",
            p,
            "--out",
            s(&root.join("bad-place")),
        ]));
        assert!(e.contains(says), "{e}");
    }
    // FSDP2's placements: Shard(d) of a dimension the tensor has, naming a
    // tensor, on a mesh.
    for (to, p, says) in [
        ("dp_shard=2", "*=Replicate()", "Shard(d)"),
        ("dp_shard=2", "nothing.here=Shard(1)", "names no tensor"),
        ("dp_shard=2", "*norm.weight=Shard(1)", "no dimension 1"),
        ("tp=2", "*=Shard(1)", "Megatron layout"),
    ] {
        let e = err(&tenplan(&[
            "reshard",
            "--src",
            s(&src),
            "--to",
            to,
            "--fsdp-place",
            p,
            "--out",
            s(&root.join("bad-place")),
        ]));
        assert!(e.contains(says) && e.lines().count() == 1, "{p}: {e}");
    }
    assert!(!root.join("bad-place").exists());
    // Mixtral's fused expert weights: split half by half, no DTensor placement.
    let e = err(&tenplan(&[
        "reshard",
        "--src",
        s(&dcp.join("mixtral-2d")),
        "--to",
        "dp_shard=2,tp=2",
        "--model",
        s(&models.join("mixtral")),
        "--out",
        s(&root.join("packed")),
    ]));
    assert!(e.contains("gate_up_proj") && e.contains("DTensor"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(!root.join("no-model").exists() && !root.join("packed").exists());
}

/// Load the DCP checkpoint `out` into the transformers model of `hf` with
/// plain `dcp.load`: every weight equal to `from_pretrained`'s.
fn loads_into_transformers(hf: &Path, out: &Path) {
    let o = Command::new(python().unwrap())
        .args([
            "-c",
            "import sys, torch, torch.distributed.checkpoint as dcp\n\
             from transformers import AutoConfig, AutoModelForCausalLM\n\
             hf, out = sys.argv[1:]\n\
             want = AutoModelForCausalLM.from_pretrained(hf)\n\
             m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf), dtype=want.dtype)\n\
             sd = m.state_dict()\n\
             dcp.load(sd, checkpoint_id=out, no_dist=True)\n\
             m.load_state_dict(sd)\n\
             differ = [k for k, v in want.state_dict().items() if not torch.equal(m.state_dict()[k], v)]\n\
             assert not differ, differ\n\
             print(len(sd), 'lm_head.weight' in sd)",
            s(hf),
            s(out),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{out:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// Expert and context parallelism on a mesh, as torchtitan lays them out:
/// each MoE stack's experts split over ep (borrowed from dp_shard·cp·tp),
/// FSDP2 over what ep leaves; the output is the same state, each rank's
/// file holding its experts, and the transformers model loads it.
#[test]
fn expert_parallelism_on_a_mesh_splits_the_experts() {
    let Some((models, dcp)) = fixtures() else { return };
    let root = dcp.parent().unwrap().join("mesh-ep");
    let _ = std::fs::remove_dir_all(&root);
    let (src, out) = (dcp.join("mixtral-2d"), root.join("ep2"));
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "dp_shard=2,cp=2,ep=2",
        "--out",
        s(&out),
    ]));
    assert!(ok(&tenplan(&["diff", s(&src), s(&out)])).starts_with("identical"));
    let o = Command::new(python().unwrap())
        .args([
            "-c",
            "import sys; from torch.distributed.checkpoint import FileSystemReader as R; \
             m = R(sys.argv[1]).read_metadata(); \
             print(sorted((i.offset[0], d.relative_path) for i, d in m.storage_data.items() if i.fqn == sys.argv[2]))",
            s(&out),
            "model.layers.0.mlp.experts.down_proj",
        ])
        .output()
        .unwrap();
    // 4 experts: ep rank = rank mod 2 holds 2 of them, FSDP2 over the
    // 2 ranks of its efsdp group one each.
    assert_eq!(
        ok(&o).trim(),
        "[(0, '__0_0.distcp'), (1, '__2_0.distcp'), (2, '__1_0.distcp'), (3, '__3_0.distcp')]"
    );
    loads_into_transformers(&models.join("mixtral"), &out);
    // ep must divide the experts.
    let e = err(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "dp_shard=8,ep=8",
        "--out",
        s(&root.join("ep8")),
    ]));
    assert!(e.contains("ep=8 cannot split evenly"), "{e}");
    assert!(!root.join("ep8").exists());
    // An export lays out each expert's tensors: it says how to get there.
    let e = err(&tenplan(&[
        "export",
        s(&src),
        "--model",
        s(&models.join("mixtral")),
        "--dcp",
        s(&root.join("export-ep")),
        "--to",
        "dp_shard=2,ep=2",
    ]));
    assert!(e.contains("export with ep=1, then `tenplan reshard`"), "{e}");
    assert!(!root.join("export-ep").exists());
    // An export without ep cuts each stack as FSDP2 does, on its experts:
    // rank 0's file the first two whole experts, rank 1's the others.
    let exported = root.join("export-fsdp2");
    ok(&tenplan(&[
        "export",
        s(&src),
        "--model",
        s(&models.join("mixtral")),
        "--dcp",
        s(&exported),
        "--to",
        "dp_shard=2",
    ]));
    let o = Command::new(python().unwrap())
        .args([
            "-c",
            "import sys; from torch.distributed.checkpoint import FileSystemReader as R; \
             m = R(sys.argv[1]).read_metadata(); \
             print(sorted((tuple(i.offset), d.relative_path) for i, d in m.storage_data.items() if i.fqn == sys.argv[2]))",
            s(&exported),
            "model.layers.0.mlp.experts.down_proj",
        ])
        .output()
        .unwrap();
    assert_eq!(
        ok(&o).trim(),
        "[((0, 0, 0), '__0_0.distcp'), ((1, 0, 0), '__0_0.distcp'), ((2, 0, 0), '__1_0.distcp'), ((3, 0, 0), '__1_0.distcp')]"
    );
    loads_into_transformers(&models.join("mixtral"), &exported);
}

/// `export --dcp`: the model's weights as the DCP checkpoint the
/// transformers model's job loads with plain `dcp.load` — a tied output
/// layer under its own name too, tensor-parallel parts as the model's plan
/// splits them.
#[test]
fn a_dcp_export_loads_into_the_transformers_model() {
    let Some((models, dcp)) = fixtures() else { return };
    let root = dcp.parent().unwrap().join("export-dcp");
    for (case, model, mesh) in [
        ("qwen2-fsdp2-2", "qwen2", "dp_shard=2"),
        ("llama-2d", "llama", "dp_shard=2,tp=2"),
    ] {
        let (src, hf, out) = (dcp.join(case), models.join(model), root.join(case));
        let said = ok(&tenplan(&[
            "export",
            s(&src),
            "--model",
            s(&hf),
            "--dcp",
            s(&out),
            "--to",
            mesh,
            "--json",
        ]));
        let v: serde_json::Value = serde_json::from_str(&said).unwrap();
        assert_eq!(v["format"], "PyTorch DCP", "{v}");
        loads_into_transformers(&hf, &out);
        ok(&tenplan(&["diff", s(&out), s(&hf)]));
    }
    // A mesh without --dcp, and a Hugging Face export with one, are refused.
    let e = err(&tenplan(&[
        "export",
        s(&dcp.join("llama-2d")),
        "--model",
        s(&models.join("llama")),
        "--hf",
        s(&root.join("x")),
        "--to",
        "dp_shard=2",
    ]));
    assert!(e.contains("--dcp"), "{e}");
}

#[test]
fn damaged_or_mismatched_dcp_checkpoints_are_refused() {
    let Some((models, dcp)) = fixtures() else { return };
    let root = dcp.parent().unwrap().join("bad");
    let (src, llama, qwen2) = (dcp.join("llama-fsdp2-3"), models.join("llama"), models.join("qwen2"));
    let tmp = |n: &str| root.join(n);
    // No model named, and none beside the checkpoint.
    let e = err(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "tp=2",
        "--out",
        s(&tmp("o1")),
    ]));
    assert!(e.contains("does not name its model") && e.contains("--model"), "{e}");
    // Another model's checkpoint.
    let e = err(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--model",
        s(&qwen2),
        "--to",
        "tp=2",
        "--out",
        s(&tmp("o2")),
    ]));
    assert!(e.starts_with("error: ") && e.contains("llama-fsdp2-3"), "{e}");
    assert!(!tmp("o2").exists());
    // A truncated file of DCP's safetensors serialization: named.
    let cut = tmp("truncated-safetensors");
    copy_dir(&dcp.join("llama-nested-safetensors"), &cut);
    let f = cut.join("__0_0.distcp");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 7)
        .unwrap();
    let e = err(&tenplan(&["check", s(&cut)]));
    assert!(
        e.contains("__0_0.distcp") && e.contains("safetensors") && e.contains("not a valid safetensors file"),
        "{e}"
    );
    // A truncated data file: named, with what is wrong.
    let cut = tmp("truncated");
    copy_dir(&src, &cut);
    let f = cut.join("__1_0.distcp");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    for args in [
        vec!["check", s(&cut)],
        vec![
            "reshard",
            "--src",
            s(&cut),
            "--model",
            s(&llama),
            "--to",
            "tp=2",
            "--out",
            s(&tmp("o3")),
        ],
        vec!["export", s(&cut), "--model", s(&llama), "--hf", s(&tmp("o4"))],
    ] {
        let e = err(&tenplan(&args));
        assert!(e.contains("__1_0.distcp") && e.contains("truncated"), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    assert!(!tmp("o3").exists() && !tmp("o4").exists());
    // A missing data file.
    let gone = tmp("missing-file");
    copy_dir(&src, &gone);
    std::fs::remove_file(gone.join("__2_0.distcp")).unwrap();
    let e = err(&tenplan(&["check", s(&gone)]));
    assert!(e.contains("__2_0.distcp"), "{e}");
    // A damaged .metadata.
    let meta = tmp("bad-metadata");
    copy_dir(&src, &meta);
    let m = meta.join(".metadata");
    let bytes = std::fs::read(&m).unwrap();
    std::fs::write(&m, &bytes[..bytes.len() / 3]).unwrap();
    let e = err(&tenplan(&["check", s(&meta)]));
    assert!(e.contains(".metadata") && e.contains("pickle"), "{e}");
    // A chunk missing from the metadata (rewritten by Python's pickle).
    let py = python().unwrap();
    let chunk = tmp("missing-chunk");
    copy_dir(&src, &chunk);
    let o = Command::new(py)
        .args([
            "-c",
            "import pickle, sys; p = sys.argv[1] + '/.metadata'; m = pickle.load(open(p, 'rb')); \
             m.state_dict_metadata['model.layers.1.mlp.up_proj.weight'].chunks.pop(); \
             pickle.dump(m, open(p, 'wb'))",
            s(&chunk),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e = err(&tenplan(&["check", s(&chunk)]));
    assert!(
        e.contains("model.layers.1.mlp.up_proj.weight") && e.contains("chunk is missing"),
        "{e}"
    );
    // A mesh target's --model guides the split only, but must be the
    // checkpoint's: another family, and the same family with fewer layers,
    // are refused naming the tensor.
    let fewer = tmp("llama-fewer-layers");
    std::fs::create_dir_all(&fewer).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(llama.join("config.json")).unwrap()).unwrap();
    let mut small = config.clone();
    let layers = config["num_hidden_layers"].as_u64().unwrap();
    small["num_hidden_layers"] = serde_json::json!(layers - 1);
    std::fs::write(fewer.join("config.json"), small.to_string()).unwrap();
    for (model, says) in [
        (&qwen2, "is it a checkpoint of".to_string()),
        (&fewer, format!("model.layers.{}.", layers - 1)),
    ] {
        let e = err(&tenplan(&[
            "reshard",
            "--src",
            s(&src),
            "--model",
            s(model),
            "--to",
            "dp_shard=2,tp=2",
            "--out",
            s(&tmp("o7")),
        ]));
        assert!(e.contains(&says) && e.contains("llama-fsdp2-3"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    assert!(!tmp("o7").exists());
    // A tied model's output layer whose values are not its embedding's (a
    // checkpoint of an untied model, read with a tied config): refused by
    // name, not dropped as a copy of the embedding.
    let untied = tmp("untied");
    let o = Command::new(python().unwrap())
        .args([
            "-c",
            "import sys, torch; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp; \
             src, out = sys.argv[1:]; dcp_to_torch_save(src, out + '.pt'); sd = torch.load(out + '.pt'); \
             sd['lm_head.weight'] = sd['lm_head.weight'] * 2; torch.save(sd, out + '.pt'); torch_save_to_dcp(out + '.pt', out)",
            s(&dcp.join("qwen2-fsdp2-2")),
            s(&untied),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for args in [
        vec!["export", s(&untied), "--model", s(&qwen2), "--hf", s(&tmp("o5"))],
        vec![
            "reshard",
            "--src",
            s(&untied),
            "--model",
            s(&qwen2),
            "--to",
            "tp=2",
            "--out",
            s(&tmp("o6")),
        ],
    ] {
        let e = err(&tenplan(&args));
        assert!(
            e.contains("lm_head.weight") && e.contains("differs from `model.embed_tokens.weight`"),
            "{args:?}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    assert!(!tmp("o5").exists() && !tmp("o6").exists());
    // Sources are never modified: the original still checks.
    ok(&tenplan(&["check", s(&src)]));
}
