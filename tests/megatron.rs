//! Megatron-Core `torch_dist` checkpoints, against real megatron-core and
//! transformers: checkpoints that megatron-core wrote on gloo processes
//! (tests/megatron/make_checkpoints.py: a tiny Llama-shaped GPTModel under
//! tp=2 and tp=2,pp=2, a Mixtral-shaped MoE under ep=2, a Qwen3-MoE-shaped
//! one whose first layer is dense (saved layer by layer) under pp=2,ep=2,
//! a DeepSeek-V3-shaped one with multi-latent attention under ep=2 and one
//! with its multi-token-prediction module under pp=2, a job
//! trained with
//! Megatron's distributed optimizer under tp=2,dp=2) are checked, exported to Hugging Face (transformers
//! loads them with Megatron's logits), resharded into other Megatron
//! configurations (megatron-core loads them bit-identically to its own
//! load-time reshard of the original) and compared across formats; bad
//! input is refused in one line (tests/megatron/verify.py holds the
//! checks that run in Python).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{ok, python, python_with, tenplan};

/// The checkpoints, written once per test run.
fn fixtures() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = python_with("megatron.core, psutil", "megatron-core")?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("megatron-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let o = Command::new(&py)
            .arg(script("make_checkpoints.py"))
            .arg(&root)
            .env("PYTHONWARNINGS", "ignore")
            .output()
            .expect("run make_checkpoints.py");
        assert!(
            o.status.success(),
            "make_checkpoints.py: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Some(root)
    })
    .as_ref()
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/megatron").join(name)
}

/// Run a check of tests/megatron/verify.py; its JSON result.
fn verify(args: &[&str]) -> serde_json::Value {
    let py = python().expect("fixtures need a Python");
    let o = Command::new(py)
        .arg(script("verify.py"))
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("verify.py {args:?}: {e}\n{out}\n{}", String::from_utf8_lossy(&o.stderr)));
    assert!(o.status.success() && v["ok"] == true, "verify.py {args:?}: {v}");
    v
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("megatron-out-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A copy of a checkpoint directory, to change (sources are never modified).
fn copy_of(src: &Path, name: &str) -> PathBuf {
    let d = scratch(name);
    std::fs::create_dir_all(&d).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `tenplan export --dcp` of a checkpoint's weights for an FSDP2 job on
/// 2 ranks (`dp_shard=2`); its summary.
fn export_fsdp2(src: &Path, config: &Path, out: &Path) -> String {
    ok(&tenplan(&[
        "export",
        s(src),
        "--model",
        s(config),
        "--dcp",
        s(out),
        "--to",
        "dp_shard=2",
    ]))
}

/// The one `error:` line of a command that must fail.
fn fails(args: &[&str]) -> String {
    let o = tenplan(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "{args:?} succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(err.starts_with("error: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    err
}

#[test]
fn check_says_it_is_megatron_and_its_parallelism() {
    let Some(root) = fixtures() else { return };
    let out = ok(&tenplan(&["check", s(&root.join("tp2pp2"))]));
    // A dense model with standard attention: the same names under every
    // layer implementation, none said.
    assert!(out.contains("(Megatron-Core torch_dist, 4 ranks: tp=2, pp=2)"), "{out}");
    let out = ok(&tenplan(&["check", s(&root.join("tp2")), "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["format"], "Megatron-Core torch_dist", "{v}");
    assert_eq!((v["tp"].as_u64(), v["pp"].as_u64()), (Some(2), Some(1)), "{v}");
    // Megatron's stacked layers: 9 tensors, each layer's `_extra_state`
    // objects as entries that are not tensors.
    assert_eq!(v["tensors"], 9, "{v}");
    assert!(v["other_entries"].as_array().unwrap().len() >= 4, "{v}");
}

#[test]
fn export_to_hugging_face_loads_with_megatrons_logits() {
    let Some(root) = fixtures() else { return };
    let config = root.join("config.json");
    for name in ["tp2", "tp2pp2"] {
        let hf = scratch(&format!("hf-{name}"));
        let out = ok(&tenplan(&[
            "export",
            s(&root.join(name)),
            "--model",
            s(&config),
            "--hf",
            s(&hf),
        ]));
        assert!(out.contains("39 tensors"), "{out}");
        let reference = root.join(format!("{name}.reference.pt"));
        let v = verify(&["hf", s(&hf), s(&reference)]);
        assert!(v["max_logit_error"].as_f64().unwrap() < 1e-4, "{v}");
        // Across formats, through the model: the same weights.
        let out = ok(&tenplan(&["diff", s(&root.join(name)), s(&hf), "--model", s(&config)]));
        assert!(out.starts_with("identical"), "{out}");
        std::fs::remove_dir_all(&hf).unwrap();
    }
}

#[test]
fn reshard_into_other_configurations_loads_in_megatron_bit_exact() {
    let Some(root) = fixtures() else { return };
    for (src, to, tp, pp) in [("tp2pp2", "tp=1,pp=2", "1", "2"), ("tp2", "tp=2,pp=2", "2", "2")] {
        let out = scratch(&format!("{src}-{to}"));
        let summary = ok(&tenplan(&[
            "reshard",
            "--src",
            s(&root.join(src)),
            "--to",
            to,
            "--out",
            s(&out),
        ]));
        assert!(
            summary.contains("(Megatron-Core torch_dist)")
                && summary.contains(&format!("(Megatron-Core torch_dist, {to})")),
            "{summary}"
        );
        // Every entry carried: the stacked tensors, the `_extra_state`
        // objects, common.pt and metadata.json as they were.
        let checked = ok(&tenplan(&["check", s(&out)]));
        assert!(checked.contains(&format!("tp={tp}, pp={pp}")), "{checked}");
        for f in ["common.pt", "metadata.json"] {
            assert_eq!(
                std::fs::read(root.join(src).join(f)).unwrap(),
                std::fs::read(out.join(f)).unwrap(),
                "{f}"
            );
        }
        let same = ok(&tenplan(&["diff", s(&root.join(src)), s(&out)]));
        assert!(
            same.starts_with("identical") && same.contains("0 + 0 on one side only"),
            "{same}"
        );
        let v = verify(&["megatron", s(&root.join(src)), s(&out), tp, pp]);
        assert!(
            v["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["tensors"].as_u64() > Some(0)),
            "{v}"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn distributed_optimizer_state_reshards_into_megatrons_optimizer_bit_exact() {
    let Some(root) = fixtures() else { return };
    let src = root.join("tp2dp2-adam");
    let checked = ok(&tenplan(&["check", s(&src)]));
    assert!(
        checked.contains("distributed optimizer state, fully_reshardable"),
        "{checked}"
    );
    // Into other tensor-, pipeline- and data-parallel configurations: the
    // job loads model and optimizer as Megatron-LM does, with the same
    // state as from Megatron's own load-time reshard; under pp=1 it trains
    // on with the same losses and weights.
    for (to, tp, pp, dp) in [("tp=1,dp=2", "1", "1", "2"), ("tp=1,pp=2,dp=2", "1", "2", "2")] {
        let out = scratch(&format!("adam-{to}"));
        let text = ok(&tenplan(&[
            "reshard",
            "--src",
            s(&src),
            "--to",
            to,
            "--out",
            s(&out),
            "--json",
        ]));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v["excluded"].as_array().unwrap().is_empty(), "{v}");
        let same = ok(&tenplan(&["diff", s(&src), s(&out)]));
        assert!(same.starts_with("identical"), "{same}");
        let v = verify(&["megatron-optim", s(&src), s(&out), tp, pp, dp]);
        if pp == "1" {
            let losses = &v["ranks"][0]["losses"];
            assert_eq!(losses[0].as_array().unwrap().len(), 2, "{v}");
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
    // The default dp_reshardable format holds flat buffers of one tp/pp
    // layout: refused with how to save it otherwise, or left out on purpose.
    let flat = root.join("tp2dp2-adam-dp-reshardable");
    let checked = ok(&tenplan(&["check", s(&flat)]));
    assert!(
        checked.contains("distributed optimizer state, dp_reshardable"),
        "{checked}"
    );
    let out = scratch("adam-dp-reshardable");
    let e = fails(&["reshard", "--src", s(&flat), "--to", "tp=1,dp=2", "--out", s(&out)]);
    assert!(
        e.contains("optimizer.distributed.dp_group_idx_0")
            && e.contains("fully_reshardable")
            && e.contains("--exclude optimizer"),
        "{e}"
    );
    assert!(!out.exists());
    let text = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&flat),
        "--to",
        "tp=1,dp=2",
        "--out",
        s(&out),
        "--exclude",
        "optimizer",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(!v["excluded"].as_array().unwrap().is_empty(), "{v}");
    verify(&["megatron", s(&flat), s(&out), "1", "1"]);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn an_fsdp2_adamw_state_becomes_megatrons_distributed_optimizer_state() {
    let Some(root) = fixtures() else { return };
    let config = root.join("config.json");
    // A 2-process FSDP2 job on the transformers model trains two AdamW
    // steps and saves model and optimizer with get_state_dict + dcp.save.
    let fsdp2 = scratch("adamw-fsdp2");
    verify(&["fsdp2-adam", s(root), s(&fsdp2)]);
    // Into a Megatron job of tp=2, dp=2 (the harness's model has
    // Megatron's local layers): the moments like their parameters, the
    // fp32 weights as the optimizer's main parameters, groups and step in
    // common.pt; nothing of the source left behind.
    let out = scratch("adamw-megatron");
    let text = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&fsdp2),
        "--model",
        s(&config),
        "--to",
        "tp=2,dp=2",
        "--format",
        "torch_dist",
        "--transformer-impl",
        "local",
        "--out",
        s(&out),
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["excluded"].as_array().unwrap().is_empty(), "{v}");
    // Only the main data-parallel replica's ranks write, as Megatron's do,
    // so the files tell the configuration.
    let checked = ok(&tenplan(&["check", s(&out)]));
    assert!(
        checked.contains("tp=2, pp=1") && checked.contains("distributed optimizer state, fully_reshardable"),
        "{checked}"
    );
    let same = ok(&tenplan(&[
        "diff",
        s(&fsdp2),
        s(&out),
        "--model",
        s(&config),
        "--weights-only",
    ]));
    assert!(same.lines().any(|l| l.starts_with("identical")), "{same}");
    // ... and the whole state: weights, moments, Megatron's main
    // parameters against the weights, its groups and step against the
    // PyTorch optimizer's; one learning rate off is a difference.
    let same = ok(&tenplan(&["diff", s(&fsdp2), s(&out), "--model", s(&config)]));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
    let lr = fsdp2.with_file_name(format!("{}-lr", fsdp2.file_name().unwrap().to_str().unwrap()));
    let differ = tenplan(&["diff", s(&lr), s(&out), "--model", s(&config)]);
    let text = String::from_utf8_lossy(&differ.stdout);
    assert!(
        !differ.status.success() && text.contains("optimizer steps and hyperparameters") && text.contains("`lr`"),
        "{text}"
    );
    // Megatron's distributed optimizer loads it and trains on as the
    // FSDP2 job did; the moments, main parameters and step bit-exact.
    let v = verify(&["megatron-adam", s(&fsdp2), s(&out), "2", "2"]);
    assert!(v["compared"].as_u64().unwrap() > 100, "{v}");
    // A tenplan checkpoint of a Megatron layout has no place for them:
    // refused by name, saying where they go.
    let e = fails(&[
        "reshard",
        "--src",
        s(&fsdp2),
        "--model",
        s(&config),
        "--to",
        "tp=2",
        "--out",
        s(&scratch("adamw-tenplan")),
    ]);
    assert!(e.contains("optim.") && e.contains("--format torch_dist"), "{e}");
    for d in [&out, &fsdp2, &lr] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn megatrons_distributed_optimizer_state_exports_for_an_fsdp2_adamw_job() {
    let Some(root) = fixtures() else { return };
    let (src, config) = (root.join("tp2dp2-adam"), root.join("config.json"));
    // Megatron's job (tp=2,dp=2, two Adam steps) as the DCP checkpoint an
    // FSDP2 job's get_state_dict(model, optim) + dcp.save writes: weights
    // under `model.`, moments and steps under `optim.state.`, parameter
    // groups under `optim.param_groups.`; nothing of the source behind.
    let out = scratch("adam-fsdp2");
    let text = ok(&tenplan(&[
        "export",
        s(&src),
        "--model",
        s(&config),
        "--dcp",
        s(&out),
        "--to",
        "dp_shard=2",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["excluded"].as_array().unwrap().is_empty(), "{v}");
    // The FSDP2 job loads model and optimizer with plain dcp.load and
    // trains on as Megatron's own job does.
    let v = verify(&["fsdp2-resume-adam", s(&src), s(&out), s(root)]);
    assert!(v["compared"].as_u64().unwrap() > 100, "{v}");
    let same = ok(&tenplan(&["diff", s(&src), s(&out), "--model", s(&config)]));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
    // The weights alone, asked for: the Hugging Face names at the top
    // level, as before.
    let weights = scratch("adam-fsdp2-weights");
    let said = ok(&tenplan(&[
        "export",
        s(&src),
        "--model",
        s(&config),
        "--dcp",
        s(&weights),
        "--to",
        "dp_shard=2",
        "--weights-only",
    ]));
    assert!(said.contains("left out on purpose"), "{said}");
    // Hugging Face files have no place for an optimizer: refused by name.
    let e = fails(&["export", s(&src), "--model", s(&config), "--hf", s(&scratch("adam-hf"))]);
    assert!(
        e.contains("optimizer.state.exp_avg.") && e.contains("--weights-only"),
        "{e}"
    );
    for d in [&out, &weights] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn hugging_face_and_dcp_convert_into_megatron_bit_exact() {
    let Some(root) = fixtures() else { return };
    let (src, config) = (root.join("tp2pp2"), root.join("config.json"));
    // The checkpoint's weights as Hugging Face files, and as the DCP
    // checkpoint an FSDP2 job on the transformers model writes.
    let hf = scratch("conv-hf");
    ok(&tenplan(&["export", s(&src), "--model", s(&config), "--hf", s(&hf)]));
    let dcp = scratch("conv-dcp");
    verify(&["dcp", s(&hf), s(&dcp)]);
    let same = ok(&tenplan(&["diff", s(&dcp), s(&src), "--model", s(&config)]));
    assert!(same.starts_with("identical"), "{same}");
    // Megatron-Core -> DCP under Hugging Face names, directly: what an
    // FSDP2 job on the transformers model loads with plain dcp.load.
    let fsdp2 = scratch("conv-fsdp2");
    let said = export_fsdp2(&src, &config, &fsdp2);
    assert!(said.contains("(PyTorch DCP)"), "{said}");
    assert!(fsdp2.join("__0_0.distcp").is_file() && fsdp2.join("__1_0.distcp").is_file());
    verify(&["fsdp2", s(&hf), s(&fsdp2), "2"]);
    let same = ok(&tenplan(&["diff", s(&fsdp2), s(&src), "--model", s(&config)]));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
    // config.json beside it names the model: no --model needed.
    let same = ok(&tenplan(&["diff", s(&fsdp2), s(&hf)]));
    assert!(same.starts_with("identical"), "{same}");
    // Hugging Face -> tenplan -> Megatron-Core under tp=2.
    let imported = scratch("conv-imported");
    ok(&tenplan(&[
        "import",
        "--hf",
        s(&hf),
        "--layout",
        "tp=2",
        "--out",
        s(&imported),
    ]));
    let from_hf = scratch("conv-from-hf");
    let out = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&imported),
        "--to",
        "tp=2",
        "--format",
        "torch_dist",
        "--out",
        s(&from_hf),
    ]));
    assert!(out.contains("(Megatron-Core torch_dist, tp=2)"), "{out}");
    // DCP -> Megatron-Core under tp=1,pp=2.
    let from_dcp = scratch("conv-from-dcp");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&dcp),
        "--model",
        s(&config),
        "--to",
        "tp=1,pp=2",
        "--format",
        "torch_dist",
        "--out",
        s(&from_dcp),
    ]));
    for (out, tp, pp) in [(&from_hf, "2", "1"), (&from_dcp, "1", "2")] {
        // The same state as the checkpoint Megatron wrote (its `_extra_state`
        // objects hold nothing on both sides), and Megatron loads it so.
        let same = ok(&tenplan(&["diff", s(out), s(&src)]));
        assert!(
            same.starts_with("identical") && same.contains("0 + 0 on one side only"),
            "{same}"
        );
        verify(&["megatron", s(&src), s(out), tp, pp]);
    }
    // Optimizer state has Megatron's own names and formats: refused by name.
    let training = scratch("conv-training");
    ok(&tenplan(&[
        "init",
        "--model",
        "llama-tiny",
        "--layout",
        "tp=2",
        "--out",
        s(&training),
    ]));
    let err = fails(&[
        "reshard",
        "--src",
        s(&training),
        "--to",
        "tp=1",
        "--format",
        "torch_dist",
        "--out",
        s(&scratch("conv-no")),
    ]);
    assert!(err.contains("optimizer.") && err.contains("--weights-only"), "{err}");
    // ... and, asked for, the weights alone.
    let weights = scratch("conv-weights");
    let out = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&training),
        "--to",
        "tp=1",
        "--format",
        "torch_dist",
        "--weights-only",
        "--out",
        s(&weights),
    ]));
    assert!(out.contains("left out on purpose: 82 entries (optimizer."), "{out}");
    let checked = ok(&tenplan(&["check", s(&weights)]));
    assert!(checked.contains("9 tensors"), "{checked}");
    for d in [&hf, &dcp, &imported, &from_hf, &from_dcp, &training, &fsdp2, &weights] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A MoE fixture's checkpoint and its Hugging Face config (in
/// `config_dir` beside the checkpoints).
fn moe_fixture(root: &Path, ckpt: &str, config_dir: &str) -> (PathBuf, PathBuf) {
    (root.join(ckpt), root.join(config_dir).join("config.json"))
}

/// Megatron -> Hugging Face: `tenplan export` of `src`, which transformers
/// loads with the logits Megatron computed on the checkpoint (its
/// `<ckpt>.reference.pt`). The export's directory.
fn exports_with_megatrons_logits(root: &Path, src: &Path, config: &Path, name: &str) -> PathBuf {
    let hf = scratch(&format!("{name}-hf"));
    ok(&tenplan(&["export", s(src), "--model", s(config), "--hf", s(&hf)]));
    let reference = root.join(format!("{}.reference.pt", src.file_name().unwrap().to_str().unwrap()));
    let v = verify(&["hf", s(&hf), s(&reference)]);
    assert!(v["max_logit_error"].as_f64().unwrap() < 1e-4, "{v}");
    hf
}

/// Hugging Face -> Megatron: `hf` imported and written as torch_dist under
/// `to` for Megatron's local layer spec (the one megatron-core runs here):
/// the same entries `src` holds, which megatron-core loads under
/// (tp, pp, ep) of the fixture size `size` bit-identically to `src`. The
/// import's and the output's directories.
fn imports_back_as_megatron_wrote(src: &Path, hf: &Path, to: &str, parallel: [&str; 3], size: &str) -> [PathBuf; 2] {
    let name = src.file_name().unwrap().to_str().unwrap();
    let imported = scratch(&format!("{name}-imported"));
    ok(&tenplan(&[
        "import",
        "--hf",
        s(hf),
        "--layout",
        "tp=1",
        "--out",
        s(&imported),
    ]));
    let back = scratch(&format!("{name}-back"));
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&imported),
        "--to",
        to,
        "--format",
        "torch_dist",
        "--transformer-impl",
        "local",
        "--out",
        s(&back),
    ]));
    let same = ok(&tenplan(&["diff", s(&back), s(src)]));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
    let [tp, pp, ep] = parallel;
    verify(&["megatron", s(src), s(&back), tp, pp, ep, size]);
    [imported, back]
}

/// Megatron -> DCP under the names of transformers' live module (experts
/// in 3-D stacks): a 2-rank FSDP2 job on it loads it with dcp.load, and it
/// holds what `src` holds. Its directory.
fn exports_for_fsdp2(src: &Path, config: &Path, hf: &Path) -> PathBuf {
    let name = src.file_name().unwrap().to_str().unwrap();
    let fsdp2 = scratch(&format!("{name}-fsdp2"));
    export_fsdp2(src, config, &fsdp2);
    verify(&["fsdp2", s(hf), s(&fsdp2), "2"]);
    let same = ok(&tenplan(&["diff", s(&fsdp2), s(src), "--model", s(config)]));
    assert!(same.starts_with("identical"), "{same}");
    fsdp2
}

/// A Megatron reshard of `src` to `to`, which megatron-core loads under
/// (tp, pp, ep) bit-identically to `src`. Its directory.
fn reshards_as_megatron_loads(src: &Path, to: &str, parallel: [&str; 3], size: &str) -> PathBuf {
    let out = scratch(&format!(
        "{}-{}",
        src.file_name().unwrap().to_str().unwrap(),
        to.replace([',', '='], "")
    ));
    ok(&tenplan(&["reshard", "--src", s(src), "--to", to, "--out", s(&out)]));
    let [tp, pp, ep] = parallel;
    verify(&["megatron", s(src), s(&out), tp, pp, ep, size]);
    out
}

#[test]
fn a_mixtral_moe_converts_in_every_direction() {
    let Some(root) = fixtures() else { return };
    let (src, config) = moe_fixture(root, "moe-ep2", "mixtral");
    let out = ok(&tenplan(&["check", s(&src)]));
    assert!(out.contains("tp=1, pp=1, ep=2"), "{out}");
    let hf = exports_with_megatrons_logits(root, &src, &config, "moe");
    // Megatron -> Megatron without expert parallelism, and back to it,
    // each expert-parallel rank's file holding its own experts.
    let whole = reshards_as_megatron_loads(&src, "tp=1", ["1", "1", "1"], "moe");
    let experts = reshards_as_megatron_loads(&whole, "tp=1,dp=2,ep=2", ["1", "1", "2"], "moe");
    let same = ok(&tenplan(&["diff", s(&experts), s(&src)]));
    assert!(same.starts_with("identical"), "{same}");
    // Experts stacked under each layer, pipeline stages as given.
    let back = imports_back_as_megatron_wrote(&src, &hf, "tp=1,pp=2", ["1", "1", "2"], "moe");
    let fsdp2 = exports_for_fsdp2(&src, &config, &hf);
    for d in [&hf, &whole, &experts, &fsdp2].into_iter().chain(&back) {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A Qwen3-MoE-shaped model whose first layer is dense: Megatron-Core
/// saves such a block layer by layer (`decoder.layers.1.mlp.experts.
/// experts.linear_fc1.weight`, experts still stacked), here under pp=2,
/// ep=2.
#[test]
fn a_moe_whose_layers_differ_converts_in_every_direction() {
    let Some(root) = fixtures() else { return };
    let (src, config) = moe_fixture(root, "hetero-pp2ep2", "qwen3_moe");
    let out = ok(&tenplan(&["check", s(&src)]));
    assert!(out.contains("tp=1, pp=2, ep=2"), "{out}");
    let hf = exports_with_megatrons_logits(root, &src, &config, "hetero");
    // Each layer's stage moves with its index.
    let tp2pp2 = reshards_as_megatron_loads(&src, "tp=2,pp=2", ["2", "2", "1"], "hetero");
    // Saved layer by layer, as Megatron saves the block.
    let back = imports_back_as_megatron_wrote(&src, &hf, "tp=1", ["1", "1", "2"], "hetero");
    let fsdp2 = exports_for_fsdp2(&src, &config, &hf);
    for d in [&hf, &tp2pp2, &fsdp2].into_iter().chain(&back) {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A DeepSeek-V3-shaped model: multi-latent attention, a dense layer
/// before a MoE one with sigmoid routing, an expert bias and a shared
/// expert, saved by megatron-core's local layer spec under ep=2.
#[test]
fn a_deepseek_v3_with_latent_attention_converts_in_every_direction() {
    let Some(root) = fixtures() else { return };
    let (src, config) = moe_fixture(root, "mla-ep2", "deepseek_v3");
    let out = ok(&tenplan(&["check", s(&src)]));
    assert!(
        out.contains("tp=1, pp=1, ep=2; norms named for --transformer-impl local"),
        "{out}"
    );
    // Transformers' logits within 1e-4 of Megatron's: its latent attention
    // sums in another order.
    let hf = exports_with_megatrons_logits(root, &src, &config, "mla");
    // The local layer spec's names (q_layernorm, kv_layernorm and the MLA
    // layers' own input and pre-MLP norms), under tensor parallelism too
    // (the local spec splits the down projections by columns; saved whole,
    // Megatron loads them at tp=2 as it loads its own).
    let [imported, back] = imports_back_as_megatron_wrote(&src, &hf, "tp=2,dp=2,ep=2", ["2", "1", "2"], "mla");
    let tp2 = reshards_as_megatron_loads(&src, "tp=2,dp=2,ep=2", ["2", "1", "2"], "mla");
    // Transformer Engine's names by default: its fused up projections'
    // norms, the MoE layer's pre-MLP norm on its own, the dense layer's
    // fused into its first linear layer.
    let te = scratch("mla-te");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&imported),
        "--to",
        "tp=1",
        "--format",
        "torch_dist",
        "--out",
        s(&te),
    ]));
    let differ = tenplan(&["diff", s(&te), s(&src)]);
    let text = String::from_utf8_lossy(&differ.stdout);
    for name in [
        "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
        "decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight",
        "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight",
    ] {
        assert!(text.contains(name), "{name}: {text}");
    }
    // Both layers' up-projection norms and the dense layer's pre-MLP norm.
    assert!(text.contains("5 + 5 on one side only"), "{text}");
    let out = ok(&tenplan(&["check", s(&te)]));
    assert!(
        out.contains("norms named for --transformer-impl transformer_engine"),
        "{out}"
    );
    // ... which tenplan reads back as the same model.
    let again = scratch("mla-te-hf");
    ok(&tenplan(&["export", s(&te), "--model", s(&config), "--hf", s(&again)]));
    let same = ok(&tenplan(&["diff", s(&again), s(&hf)]));
    assert!(same.starts_with("identical"), "{same}");
    for d in [&hf, &imported, &back, &te, &again, &tp2] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// DeepSeek-V3's multi-token-prediction module, as Megatron-Core builds
/// it (`mtp.layers.0` on the last pipeline stage, which keeps a copy of the
/// embedding): it moves with the model between Megatron layouts, into
/// Hugging Face files as DeepSeek publishes them (layer
/// `num_hidden_layers`, with copies of the embedding and output head,
/// which transformers reports as unexpected and does not load) and back.
#[test]
fn a_deepseek_v3_mtp_module_moves_with_the_model() {
    let Some(root) = fixtures() else { return };
    let (src, config) = moe_fixture(root, "mla-mtp-pp2", "deepseek_v3_mtp");
    let out = ok(&tenplan(&["check", s(&src)]));
    assert!(out.contains("tp=1, pp=2"), "{out}");
    // The module and the last stage's embedding under tp=2, pp=1.
    let tp2 = reshards_as_megatron_loads(&src, "tp=2", ["2", "1", "1"], "mla-mtp");
    let hf = scratch("mtp-hf");
    let out = ok(&tenplan(&[
        "export",
        s(&src),
        "--model",
        s(&config),
        "--hf",
        s(&hf),
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["excluded"], serde_json::json!([]), "{out}");
    verify(&["hf-mtp", s(&hf), s(&root.join("mla-mtp-pp2.reference.pt"))]);
    let same = ok(&tenplan(&["diff", s(&src), s(&hf), "--model", s(&config)]));
    assert!(
        same.starts_with("identical") && same.contains("0 + 0 on one side only"),
        "{same}"
    );
    // Back from DeepSeek's layout, onto tp=2 and both stages.
    let back = imports_back_as_megatron_wrote(&src, &hf, "tp=2,pp=2", ["2", "2", "1"], "mla-mtp");
    // Left out only on purpose: the output then says so.
    let without = scratch("mtp-without");
    let out = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "tp=1",
        "--exclude",
        "mtp.",
        "--out",
        s(&without),
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        r["excluded"].as_array().unwrap().len() > 20 && out.contains("mtp.layers.0.eh_proj.weight"),
        "{out}"
    );
    for d in [&tp2, &hf, &without].into_iter().chain(&back) {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn nothing_of_common_pt_is_left_behind() {
    let Some(root) = fixtures() else { return };
    let py = python().unwrap();
    // A training job keeps its iteration and arguments in common.pt, as
    // Megatron-LM's save_checkpoint does: an argparse Namespace (a torch
    // dtype, Megatron's enums), the optimizer's param_groups, a tensor.
    let src = copy_of(&root.join("tp2"), "common");
    let o = Command::new(&py)
        .args([
            "-c",
            "import argparse, sys, torch\n\
             from megatron.core.transformer.enums import AttnBackend\n\
             args = argparse.Namespace(lr=0.1, params_dtype=torch.bfloat16, attention_backend=AttnBackend.auto,\n\
                 tensor_model_parallel_size=2, data_path=['a', 'b'], betas=(0.9, 0.95))\n\
             groups = [{'lr': 0.1, 'betas': (0.9, 0.95), 'params': [0, 1, 2]}, {'lr': 0.1, 'params': [3]}]\n\
             torch.save({'iteration': 7, 'args': args, 'checkpoint_version': 3.0,\n\
                 'optimizer': {'optimizer': {'param_groups': groups}, 'param_state_sharding_type': 'fully_reshardable'},\n\
                 'rerun_state_machine': {'seen': torch.arange(6, dtype=torch.int32), 'mode': 'disabled'}}, sys.argv[1])",
            s(&src.join("common.pt")),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config = root.join("config.json");
    let hf = scratch("common-hf");
    let err = fails(&["export", s(&src), "--model", s(&config), "--hf", s(&hf)]);
    assert!(
        err.contains("common.pt:args") && err.contains("--weights-only"),
        "{err}"
    );
    assert!(!hf.exists());
    let out = ok(&tenplan(&[
        "export",
        s(&src),
        "--model",
        s(&config),
        "--hf",
        s(&hf),
        "--weights-only",
    ]));
    assert!(out.contains("common.pt:args"), "{out}");
    // Into another configuration it goes along.
    let moved = scratch("common-moved");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "tp=1",
        "--out",
        s(&moved),
    ]));
    assert_eq!(
        std::fs::read(src.join("common.pt")).unwrap(),
        std::fs::read(moved.join("common.pt")).unwrap()
    );
    let checked = ok(&tenplan(&["check", s(&moved), "--json"]));
    assert!(checked.contains("common.pt:iteration"), "{checked}");
    // Left out on purpose, it leaves common.pt too: the rest as it was,
    // loaded as Megatron loads common.pt.
    let without = scratch("common-without-optimizer");
    let said = ok(&tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "tp=1",
        "--out",
        s(&without),
        "--exclude",
        "optimizer",
        "--json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(v["excluded"], serde_json::json!(["common.pt:optimizer"]), "{v}");
    let o = Command::new(&py)
        .args([
            "-c",
            "import sys, torch\n\
             a = torch.load(sys.argv[1], weights_only=False)\n\
             b = torch.load(sys.argv[2], weights_only=False)\n\
             assert set(b) == set(a) - {'optimizer'}, (sorted(a), sorted(b))\n\
             r = 'rerun_state_machine'\n\
             assert torch.equal(a[r]['seen'], b[r]['seen']) and a[r]['mode'] == b[r]['mode']\n\
             differ = [k for k in b if k != r and a[k] != b[k]]\n\
             assert not differ, differ\n\
             assert b['args'].params_dtype is torch.bfloat16 and type(b['args'].attention_backend) is type(a['args'].attention_backend)\n\
             print(sorted(b))",
            s(&src.join("common.pt")),
            s(&without.join("common.pt")),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let checked = ok(&tenplan(&["check", s(&without), "--json"]));
    assert!(!checked.contains("common.pt:optimizer"), "{checked}");
    for d in [&src, &hf, &moved, &without] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn bad_megatron_checkpoints_are_refused_in_one_line() {
    let Some(root) = fixtures() else { return };
    let copy = |name: &str| copy_of(&root.join("tp2pp2"), name);
    // A rank's file missing.
    let d = copy("no-chunk");
    std::fs::remove_file(d.join("__1_0.distcp")).unwrap();
    let err = fails(&["check", s(&d)]);
    assert!(err.contains("__1_0.distcp"), "{err}");
    // common.pt missing, or cut short.
    let d = copy("no-common");
    std::fs::remove_file(d.join("common.pt")).unwrap();
    let err = fails(&["check", s(&d)]);
    assert!(err.contains("common.pt"), "{err}");
    let d = copy("cut-common");
    let bytes = std::fs::read(d.join("common.pt")).unwrap();
    std::fs::write(d.join("common.pt"), &bytes[..bytes.len() / 2]).unwrap();
    let err = fails(&["check", s(&d)]);
    assert!(
        err.contains("common.pt") && err.contains("truncated or corrupt"),
        "{err}"
    );
    // Another backend.
    let d = copy("zarr");
    std::fs::write(
        d.join("metadata.json"),
        r#"{"sharded_backend": "zarr", "sharded_backend_version": 1}"#,
    )
    .unwrap();
    let err = fails(&["check", s(&d)]);
    assert!(err.contains("zarr") && err.contains("torch_dist"), "{err}");
    // A model of another size: its config names 2 layers, the checkpoint has 4.
    let d = copy("other-size");
    let text = std::fs::read_to_string(root.join("config.json")).unwrap();
    let small = text.replace("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 2");
    assert_ne!(small, text);
    let config = d.join("small.json");
    std::fs::write(&config, small).unwrap();
    let hf = scratch("other-size-hf");
    let err = fails(&["export", s(&d), "--model", s(&config), "--hf", s(&hf)]);
    assert!(
        err.contains("stacks 4 layers") && err.contains("reads 2 of them"),
        "{err}"
    );
    assert!(!hf.exists());
    // A Megatron target for a plain DCP format request.
    let out = scratch("as-dcp");
    let err = fails(&[
        "reshard",
        "--src",
        s(&d),
        "--to",
        "tp=1",
        "--format",
        "dcp",
        "--out",
        s(&out),
    ]);
    assert!(err.contains("torch_dist"), "{err}");
    assert!(!out.exists());
    for name in ["no-chunk", "no-common", "cut-common", "zarr", "other-size"] {
        // scratch() removes what the name held.
        scratch(name);
    }
}
