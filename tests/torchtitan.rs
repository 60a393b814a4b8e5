//! torchtitan checkpoints against real torchtitan: a tiny torchtitan
//! Llama 3 (and a Qwen3, a Qwen3-MoE, a DeepSeek-V3), sharded with FSDP2 on 2 gloo processes and saved with
//! `torch.distributed.checkpoint.save` under torchtitan's names
//! (`layers.N.attention.qkv_linear.wq.weight`, its rotary row order), is
//! read by tenplan with the model's Hugging Face config: equal to what
//! torchtitan's own converter (`Llama3StateDictAdapter.to_hf`) makes of it,
//! exported, resharded into Megatron layouts, and resharded on a DTensor
//! mesh under its own names, which torchtitan's model loads back with
//! plain `dcp.load`; a torchtitan training job's whole state, saved by
//! its CheckpointManager, resumes after a reshard as after DCP's own
//! (tests/torchtitan/make_titan.py); pipeline schedules and mesh ranks are
//! torchtitan's own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{err, ok, python, python_with, tenplan};

/// The fixtures' directory of torchtitan's Llama 3, made once per test run.
fn fixtures() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| make_fixtures("llama3")).as_ref()
}

/// Make the fixtures of a torchtitan model family.
fn make_fixtures(family: &str) -> Option<PathBuf> {
    python_with(
        "torchtitan.models.llama3.state_dict_adapter, torchdata.stateful_dataloader",
        "torchtitan",
    )?;
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("torchtitan-{family}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    check(&["make", s(&root), family]);
    Some(root)
}

/// Run tests/torchtitan/make_titan.py; its JSON result, which must be ok.
fn check(args: &[&str]) -> serde_json::Value {
    let o = Command::new(python().expect("fixtures need a Python"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torchtitan/make_titan.py"))
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "make_titan.py {args:?}: {e}\n{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert!(o.status.success() && v["ok"] == true, "make_titan.py {args:?}: {v}");
    v
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `tenplan diff A B [--model M]` says identical, nothing on one side only.
fn assert_identical(a: &Path, b: &Path, model: Option<&Path>) {
    let mut args = vec!["diff", s(a), s(b)];
    if let Some(m) = model {
        args.extend(["--model", s(m)]);
    }
    let same = ok(&tenplan(&args));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
}

/// Reshard the torchtitan checkpoint, read with its Hugging Face config,
/// to `to` into `out`.
fn reshard(root: &Path, to: &str, out: &Path) {
    reshard_from(root, &root.join("titan"), to, out);
}

/// Reshard `src`, a checkpoint of the fixtures' model, to `to` into `out`.
fn reshard_from(root: &Path, src: &Path, to: &str, out: &Path) -> String {
    let hf = root.join("hf");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(src),
        "--model",
        s(&hf),
        "--to",
        to,
        "--out",
        s(out),
    ]))
}

/// The fixtures of `family` read with the model's Hugging Face config:
/// the same weights as torchtitan's own conversion (`diff` identical,
/// nothing on one side only), exported to Hugging Face files, into a
/// Megatron layout (fused QKV and SwiGLU), and onto a dp_shard x tp mesh
/// under torchtitan's own names, split as the model's tensor-parallel plan
/// says, which torchtitan's model loads back: that load's result, and the
/// mesh checkpoint.
fn converts_as_torchtitans_converter(root: &Path, family: &str) -> (serde_json::Value, PathBuf) {
    let (titan, hf) = (root.join("titan"), root.join("hf"));
    let out = |n: &str| {
        let d = root.join(n);
        let _ = std::fs::remove_dir_all(&d);
        d
    };
    assert_identical(&titan, &hf, Some(&hf));
    let exported = out("export");
    ok(&tenplan(&[
        "export",
        s(&titan),
        "--model",
        s(&hf),
        "--hf",
        s(&exported),
    ]));
    assert!(ok(&tenplan(&["diff", s(&exported), s(&hf)])).starts_with("identical"));
    let megatron = out("megatron");
    reshard(root, "tp=2,pp=2", &megatron);
    assert!(ok(&tenplan(&["diff", s(&megatron), s(&hf)])).starts_with("identical"));
    let mesh = out("mesh");
    reshard(root, "dp_shard=2,tp=2", &mesh);
    let v = check(&["load", s(&root.join("original.pt")), s(&mesh), family]);
    (v, mesh)
}

/// torchtitan's Llama 3 (its rotary row order) reads as its converter
/// (`Llama3StateDictAdapter.to_hf`) says.
#[test]
fn a_torchtitan_checkpoint_reads_as_torchtitans_converter_says() {
    let Some(root) = fixtures() else { return };
    let (v, mesh) = converts_as_torchtitans_converter(root, "llama3");
    let chunks = &v["chunks"];
    assert_eq!(chunks["layers.0.attention.qkv_linear.wq.weight"], 4, "{v}");
    assert_eq!(chunks["layers.1.attention.wo.weight"], 4, "{v}");
    assert_eq!(chunks["norm.weight"], 2, "{v}");
    let (titan, hf) = (root.join("titan"), root.join("hf"));
    assert!(ok(&tenplan(&["diff", s(&mesh), s(&titan), "--model", s(&hf)])).starts_with("identical"));
}

/// torchtitan's dense Qwen3 (query and key norms, a head dimension of its
/// own, transformers' rotary order) reads as its converter
/// (`Qwen3StateDictAdapter.to_hf`) says.
#[test]
fn a_torchtitan_qwen3_checkpoint_reads_as_its_converter_says() {
    let Some(root) = make_fixtures("qwen3") else { return };
    let (v, _) = converts_as_torchtitans_converter(&root, "qwen3");
    assert_eq!(v["chunks"]["layers.0.attention.qkv_linear.wq.weight"], 4, "{v}");
    assert_eq!(v["chunks"]["layers.0.attention.q_norm.weight"], 2, "{v}");
}

/// torchtitan's Qwen3-MoE keeps each layer's routed experts in grouped
/// stacks (`moe.routed_experts.inner_experts.w1_EFD`, ...): read with the
/// model's Hugging Face config, each expert comes from its index, equal to
/// what torchtitan's converter and transformers make of it. Its routing
/// bias (`moe.expert_bias_E`), which transformers' model has no place for,
/// is named and left out only on purpose.
#[test]
fn a_torchtitan_moe_checkpoint_reads_its_grouped_experts() {
    let Some(root) = make_fixtures("qwen3_moe") else { return };
    let (titan, hf) = (root.join("titan"), root.join("hf"));
    let exported = root.join("export");
    let e = err(&tenplan(&[
        "export",
        s(&titan),
        "--model",
        s(&hf),
        "--hf",
        s(&exported),
    ]));
    assert!(e.contains("expert_bias_E") && e.contains("--exclude"), "{e}");
    assert!(!exported.exists());
    let said = ok(&tenplan(&[
        "export",
        s(&titan),
        "--model",
        s(&hf),
        "--hf",
        s(&exported),
        "--exclude",
        "expert_bias_E",
    ]));
    assert!(said.contains("expert_bias_E"), "{said}");
    assert!(ok(&tenplan(&["diff", s(&exported), s(&hf)])).starts_with("identical"));
    // Into a Megatron layout with expert parallelism.
    let megatron = root.join("megatron");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&titan),
        "--model",
        s(&hf),
        "--to",
        "tp=1,dp=2,ep=2",
        "--out",
        s(&megatron),
        "--exclude",
        "expert_bias_E",
    ]));
    assert!(ok(&tenplan(&["diff", s(&megatron), s(&hf)])).starts_with("identical"));
    // On a mesh with expert parallelism the whole state stays, routing
    // bias too, and torchtitan's model loads it back.
    let mesh = root.join("mesh-ep");
    reshard(&root, "dp_shard=2,tp=2,ep=2", &mesh);
    let v = check(&["load", s(&root.join("original.pt")), s(&mesh), "qwen3_moe"]);
    assert_eq!(
        v["chunks"]["layers.1.moe.routed_experts.inner_experts.w2_EDF"], 4,
        "{v}"
    );
    // A buffer: FSDP2 keeps it whole, and so does the mesh.
    assert_eq!(v["chunks"]["layers.1.moe.expert_bias_E"], 1, "{v}");
}

/// torchtitan's DeepSeek-V3 (multi-head latent attention with a query low
/// rank, a dense first layer, grouped routed experts, shared experts, its
/// routing bias — transformers' `e_score_correction_bias`) reads as its
/// converter (`DeepSeekV3StateDictAdapter.to_hf`) and transformers say:
/// every tensor, the bias included, reaches the export and the Megatron
/// layouts, and a mesh of it loads back into torchtitan's model.
#[test]
fn a_torchtitan_deepseek_v3_checkpoint_reads_as_its_converter_says() {
    let Some(root) = make_fixtures("deepseek_v3") else {
        return;
    };
    let (v, _) = converts_as_torchtitans_converter(&root, "deepseek_v3");
    let chunks = &v["chunks"];
    // The plan splits the output projection and the MLPs over tp; the
    // latent projections only FSDP2 shards.
    assert_eq!(chunks["layers.0.attention.wo.weight"], 4, "{v}");
    assert_eq!(chunks["layers.1.attention.wkv_b.weight"], 2, "{v}");
    assert_eq!(chunks["layers.1.moe.shared_experts.w1.weight"], 4, "{v}");
    assert_eq!(chunks["layers.1.moe.expert_bias_E"], 1, "{v}");
    let megatron = root.join("megatron-ep");
    reshard(&root, "tp=1,dp=2,ep=2", &megatron);
    assert!(ok(&tenplan(&["diff", s(&megatron), s(&root.join("hf"))])).starts_with("identical"));
}

/// torchtitan's DeepSeek-V3 with a multi-token-prediction module
/// (`mtp_layers.0`, its own norms and projection beside a MoE layer's
/// names), which its converter maps to DeepSeek's layer
/// `num_hidden_layers`: read as the converter says, and the module goes
/// along into Hugging Face files, a Megatron layout and a mesh that
/// torchtitan's model loads back bit for bit.
#[test]
fn a_torchtitan_deepseek_v3_mtp_module_goes_along() {
    let Some(root) = make_fixtures("deepseek_v3_mtp") else {
        return;
    };
    let (titan, hf) = (root.join("titan"), root.join("hf"));
    assert_identical(&titan, &hf, Some(&hf));
    let exported = root.join("export");
    ok(&tenplan(&[
        "export",
        s(&titan),
        "--model",
        s(&hf),
        "--hf",
        s(&exported),
    ]));
    assert_identical(&titan, &exported, Some(&hf));
    // The export holds DeepSeek's layout: the module's copies of the
    // embedding and output head too, which the converter does not write.
    let o = tenplan(&["diff", s(&exported), s(&hf)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("model.layers.2.embed_tokens.weight") && text.contains("2 + 0 on one side only"),
        "{text}"
    );
    let megatron = root.join("megatron");
    reshard(&root, "tp=2,pp=2", &megatron);
    assert_identical(&megatron, &hf, None);
    let mesh = root.join("mesh");
    reshard(&root, "dp_shard=2,tp=2", &mesh);
    let v = check(&["load", s(&root.join("original.pt")), s(&mesh), "deepseek_v3_mtp"]);
    // The module's layer splits as the model's layers do.
    assert_eq!(v["chunks"]["mtp_layers.0.attention.wo.weight"], 4, "{v}");
    assert_eq!(v["chunks"]["mtp_layers.0.eh_proj.weight"], 2, "{v}");
    assert_eq!(v["chunks"]["mtp_layers.0.moe.expert_bias_E"], 1, "{v}");
}

/// A pipeline-parallel mesh splits the layers as torchtitan does, and each
/// stage's ranks write their own tensors.
#[test]
fn pipeline_stages_are_torchtitans() {
    let Some(root) = fixtures() else { return };
    let cases: Vec<(u32, u64)> = vec![(2, 2), (2, 3), (3, 8), (4, 6), (4, 32), (8, 126)];
    let json = serde_json::to_string(&cases).unwrap();
    let v = check(&["stages", &json]);
    for (i, &(pp, layers)) in cases.iter().enumerate() {
        let ours: Vec<Vec<u64>> = tenplan::models::pipeline_stages(layers, pp)
            .unwrap()
            .into_iter()
            .map(|r| r.collect())
            .collect();
        let theirs: Vec<Vec<u64>> = serde_json::from_value(v["stages"][i].clone()).unwrap();
        assert_eq!(ours, theirs, "pp={pp}, {layers} layers");
    }
    let original = root.join("original.pt");
    let mesh = root.join("pp2");
    let _ = std::fs::remove_dir_all(&mesh);
    reshard(root, "pp=2,dp_shard=2", &mesh);
    let v = check(&["load", s(&original), s(&mesh)]);
    let files = &v["files"];
    // 2 layers: the first stage has the embedding and layer 0, the last
    // layer 1, the norm and the output layer; each on its 2 dp_shard ranks.
    assert_eq!(
        files["tok_embeddings.weight"],
        serde_json::json!(["__0_0.distcp", "__1_0.distcp"]),
        "{v}"
    );
    assert_eq!(
        files["layers.0.feed_forward.w1.weight"],
        serde_json::json!(["__0_0.distcp", "__1_0.distcp"]),
        "{v}"
    );
    assert_eq!(
        files["layers.1.feed_forward.w1.weight"],
        serde_json::json!(["__2_0.distcp", "__3_0.distcp"]),
        "{v}"
    );
    assert_eq!(
        files["lm_head.weight"],
        serde_json::json!(["__2_0.distcp", "__3_0.distcp"]),
        "{v}"
    );
    // An interleaved schedule: 4 stages of 2 layers on 2 ranks, stage s
    // on rank s mod 2 -- the embedding and layer 1 on the first, layer 0
    // and the output on the second.
    let interleaved = root.join("interleaved");
    let _ = std::fs::remove_dir_all(&interleaved);
    reshard(root, "pp=2,pp_schedule=Interleaved1F1B,dp_shard=1", &interleaved);
    let v = check(&["load", s(&original), s(&interleaved)]);
    let files = &v["files"];
    for (name, file) in [
        ("tok_embeddings.weight", "__0_0.distcp"),
        ("layers.1.feed_forward.w1.weight", "__0_0.distcp"),
        ("layers.0.feed_forward.w1.weight", "__1_0.distcp"),
        ("lm_head.weight", "__1_0.distcp"),
    ] {
        assert_eq!(files[name], serde_json::json!([file]), "{name}: {v}");
    }
    // Context parallelism: FSDP2 shards over dp_shard·cp, four chunks.
    let cp = root.join("cp2");
    let _ = std::fs::remove_dir_all(&cp);
    reshard(root, "dp_shard=2,cp=2", &cp);
    let v = check(&["load", s(&original), s(&cp)]);
    assert_eq!(v["chunks"]["layers.1.feed_forward.w2.weight"], 4, "{v}");
    // Expert parallelism needs experts: a dense Llama has none.
    let ep = root.join("ep2");
    let e = err(&tenplan(&[
        "reshard",
        "--src",
        s(&root.join("titan")),
        "--to",
        "dp_shard=2,ep=2",
        "--out",
        s(&ep),
    ]));
    assert!(e.contains("no MoE expert stacks"), "{e}");
    assert!(!ep.exists());
}

/// A torchtitan training job's whole state, as its CheckpointManager saves
/// it on 4 ranks (the model under top-level names, the flattened AdamW
/// state `optimizer.state.<fqn>.exp_avg` with its steps and
/// `optimizer.param_groups.<fqn>.*`, the learning-rate scheduler, each dp
/// rank's dataloader state, the train state), moved to 2 ranks: torchtitan
/// resumes from it exactly as from DCP's own load-time reshard of the
/// original, and nothing is left behind.
#[test]
fn a_torchtitan_training_state_resumes_after_a_reshard() {
    let Some(root) = fixtures() else { return };
    let (job, moved) = (root.join("job"), root.join("moved"));
    let _ = std::fs::remove_dir_all(&job);
    let _ = std::fs::remove_dir_all(&moved);
    check(&["train", s(&job), "4", "3"]);
    let said = reshard_from(root, &job.join("step-3"), "dp_shard=2", &moved.join("step-3"));
    assert!(said.contains("wrote 84 tensors and 260 other entries"), "{said}");
    let same = ok(&tenplan(&[
        "diff",
        s(&job.join("step-3")),
        s(&moved.join("step-3")),
        "--model",
        s(&root.join("hf")),
    ]));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
    // The dataloader's state is per dp rank and torchtitan cannot reshard
    // it: both resumed jobs exclude it from loading, as torchtitan asks.
    let theirs = check(&["resume", s(&job), "3", "2", "3"]);
    let ours = check(&["resume", s(&moved), "3", "2", "3"]);
    assert_eq!(
        ours["restored"],
        serde_json::json!({"step": 3, "ntokens_seen": 192}),
        "{ours}"
    );
    for what in ["restored", "lr", "losses"] {
        assert_eq!(
            ours[what], theirs[what],
            "{what}: tenplan's {ours} against DCP's {theirs}"
        );
    }
}

/// Pipeline schedules with several stages per rank place each layer on
/// the pp rank torchtitan's own pipeline code gives it, and refuse what
/// torchtitan refuses.
#[test]
fn pipeline_schedules_are_torchtitans() {
    if fixtures().is_none() {
        return;
    }
    let cases: Vec<(u32, u64, &str, Option<u32>)> = vec![
        (2, 6, "Interleaved1F1B", None),
        (2, 6, "ZBVZeroBubble", None),
        (4, 30, "Interleaved1F1B", Some(2)),
        (4, 30, "LoopedBFS", Some(4)),
        (8, 126, "InterleavedZeroBubble", None),
        (4, 14, "DualPipeV", None),
        (2, 6, "LoopedBFS", Some(3)),
        (2, 6, "1F1B", Some(2)),
        (2, 6, "GPipe", None),
        (4, 30, "ZBVZeroBubble", Some(2)),
    ];
    let v = check(&["schedules", &serde_json::to_string(&cases).unwrap()]);
    for (i, &(pp, layers, schedule, per_stage)) in cases.iter().enumerate() {
        let ours: Option<Vec<Vec<u64>>> = tenplan::models::pipeline_schedule(layers, pp, Some(schedule), per_stage)
            .ok()
            .map(|stages| {
                (0..pp)
                    .map(|rank| {
                        let mut held: Vec<u64> = stages
                            .iter()
                            .filter(|(_, r)| *r == rank)
                            .flat_map(|(l, _)| l.clone())
                            .collect();
                        held.sort();
                        held
                    })
                    .collect()
            });
        let theirs: Option<Vec<Vec<u64>>> = serde_json::from_value(v["schedules"][i].clone()).unwrap();
        assert_eq!(ours, theirs, "pp={pp}, {layers} layers, {schedule}, {per_stage:?}");
    }
}

/// Every rank of a mesh with context and expert parallelism holds what
/// torchtitan's own device meshes say it holds: its coordinates come from
/// torchtitan's ParallelDims (FSDP2 over dp_shard·cp folded, ep and its
/// efsdp borrowed from dp_shard·cp·tp), the placements from torchtitan's
/// rules (dense tensors: tp, then FSDP2 on the first dimension; routed
/// experts: Shard(0) over ep, FSDP2 over efsdp on the experts' dimension,
/// or the next one when efsdp·ep outnumbers the experts).
#[test]
fn mesh_ranks_are_torchtitans() {
    use tenplan::models::{chunk, MeshConfig, TensorPlacement};
    use tenplan::ptc::{DType, TensorSpec};

    if fixtures().is_none() {
        return;
    }
    // (pp, dp_replicate, dp_shard, cp, tp, ep)
    let cases: Vec<[u32; 6]> = vec![
        [1, 1, 2, 2, 1, 1],
        [1, 1, 2, 2, 1, 2],
        [1, 2, 2, 1, 2, 4],
        [2, 1, 2, 2, 2, 4],
        [1, 1, 4, 1, 1, 2],
        [1, 1, 8, 1, 1, 1],
    ];
    let v = check(&["coords", &serde_json::to_string(&cases).unwrap()]);
    let tensors: Vec<TensorSpec> = vec![
        TensorSpec::new("layers.0.attention.wq.weight", DType::F32, [16, 8]),
        TensorSpec::new(
            "layers.0.moe.routed_experts.inner_experts.w1_EFD",
            DType::F32,
            [8, 6, 4],
        ),
        TensorSpec::new(
            "layers.1.moe.routed_experts.inner_experts.w2_EDF",
            DType::F32,
            [4, 4, 6],
        ),
    ];
    for (i, &[pp, dp_replicate, dp_shard, cp, tp, ep]) in cases.iter().enumerate() {
        let mesh: MeshConfig =
            format!("pp={pp},dp_replicate={dp_replicate},dp_shard={dp_shard},cp={cp},tp={tp},ep={ep}")
                .parse()
                .unwrap();
        let layout = mesh
            .layout(tensors.clone().into(), &|_, t| {
                let experts = t.shape.len() == 3;
                Ok(TensorPlacement {
                    tp_dim: (!experts).then_some(0),
                    fsdp: true,
                    fsdp_dim: None,
                    experts,
                    stack: None,
                })
            })
            .unwrap();
        // What each rank holds of each tensor: (rank, tensor) -> box.
        let mut held = std::collections::BTreeMap::new();
        for shard in layout.shards() {
            for b in &shard.buffers {
                let r = &b.pieces[0].region;
                let ranges: Vec<_> = (0..r.ndim()).map(|d| r.range(d)).collect();
                for &d in &shard.devices {
                    held.insert((d, b.name.clone()), ranges.clone());
                }
            }
        }
        let fsdp_n = dp_shard * cp;
        let efsdp_n = fsdp_n * tp / ep;
        for (rank, at) in v["coords"][i].as_array().unwrap().iter().enumerate() {
            let c = |k: &str| at[k].as_u64().unwrap() as u32;
            for (ti, spec) in tensors.iter().enumerate() {
                // Two layers over two stages: layer 0 on the first, 1 on the last.
                let stage = if pp == 1 { 0 } else { u32::from(ti == 2) };
                let mut want: Vec<_> = spec.shape.iter().map(|&n| 0..n).collect();
                if spec.shape.len() == 2 {
                    want[0] = chunk(want[0].clone(), tp, c("tp"));
                    want[0] = chunk(want[0].clone(), fsdp_n, c("fsdp"));
                } else if ep > 1 {
                    want[0] = chunk(want[0].clone(), ep, c("ep"));
                    let d = usize::from(u64::from(efsdp_n * ep) > spec.shape[0]);
                    want[d] = chunk(want[d].clone(), efsdp_n, c("efsdp"));
                } else {
                    let d = usize::from(u64::from(fsdp_n) > spec.shape[0]);
                    want[d] = chunk(want[d].clone(), fsdp_n, c("fsdp"));
                }
                let got = held.get(&(rank as u32, spec.name.clone()));
                let want = (c("pp") == stage && want.iter().all(|r| r.start < r.end)).then_some(&want);
                assert_eq!(got, want, "case {:?}, rank {rank} ({at}), {}", cases[i], spec.name);
            }
        }
    }
}
