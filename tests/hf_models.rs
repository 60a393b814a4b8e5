//! Models from Hugging Face configs, against real transformers: tiny models
//! of every family written by `transformers` (tests/hf/make_models.py), and
//! the published architectures at full size (configs only, counted on the
//! meta device). Needs a Python with torch and transformers: `TENPLAN_PYTHON`,
//! or the virtual environment scripts/setup.sh makes. Without one the tests
//! say so and pass, except under CI (`CI=true`), where they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{ok, python, tenplan};

use tenplan::models::{resolve, ModelState, StateKind};
use tenplan::ptc::DType;

/// The fixture directories, written once per test run: (tiny, published).
/// `tiny` holds every family in bf16 and four of them in fp16 and fp32
/// (`NAME-f16`, `NAME-f32`).
fn fixtures() -> Option<&'static (PathBuf, PathBuf)> {
    static DIRS: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let py = python()?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-models-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (tiny, published) = (root.join("tiny"), root.join("published"));
        let some = ["--only", "llama-tied-bias", "gpt2", "qwen2-moe", "deepseek-v3"];
        let f16 = [&["--dtype", "float16", "--suffix=-f16"][..], &some].concat();
        let f32 = [&["--dtype", "float32", "--suffix=-f32"][..], &some].concat();
        for (dir, extra) in [
            (&tiny, &["--shard-size", "40KB"][..]),
            (&tiny, &f16[..]),
            (&tiny, &f32[..]),
            (&published, &["--published"][..]),
        ] {
            make_models(&py, dir, extra);
        }
        Some((tiny, published))
    })
    .as_ref()
}

/// Run tests/hf/make_models.py with `py` into `dir`.
fn make_models(py: impl AsRef<std::ffi::OsStr>, dir: &Path, extra: &[&str]) {
    let o = Command::new(py)
        .arg(script("make_models.py"))
        .arg(dir)
        .args(extra)
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("run make_models.py");
    assert!(
        o.status.success(),
        "make_models.py: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn models_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    out.sort();
    out
}

fn expected(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

#[test]
fn every_family_counts_exactly_what_transformers_stores() {
    let Some((tiny, published)) = fixtures() else { return };
    let mut seen = 0;
    for dir in models_in(tiny).into_iter().chain(models_in(published)) {
        let spec = resolve(dir.to_str().unwrap()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let count = ModelState::new(&spec, StateKind::Weights(DType::BF16)).parameter_count();
        let want = expected(&dir)["stored_elements"].as_u64().unwrap();
        // Exact, not within 0.1%: every stored element is a state element.
        assert_eq!(count, want, "{}", dir.display());
        seen += 1;
    }
    assert_eq!(seen, 29, "every fixture was generated");
    // The CLI says the same, for a directory and for its config.json.
    let dir = published.join("DeepSeek-V3");
    for arg in [dir.clone(), dir.join("config.json")] {
        let out = ok(&tenplan(&["models", "--model", arg.to_str().unwrap(), "--json"]));
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(rows[0]["parameters"], expected(&dir)["stored_elements"]);
        assert_eq!(rows[0]["name"], "DeepSeek-V3");
    }
}

#[test]
fn configs_plan_between_layouts_and_verify() {
    let Some((tiny, _)) = fixtures() else { return };
    for dir in models_in(tiny) {
        let spec = resolve(dir.to_str().unwrap()).unwrap();
        // ep where the model has experts; tp as far as the KV heads allow.
        let tp = spec.groups.min(2);
        let to = if spec.experts > 0 {
            format!("tp={tp},dp=2,ep=2,zero=1")
        } else {
            format!("tp={tp},dp=2,zero=1")
        };
        let out = ok(&tenplan(&[
            "plan",
            "--model",
            dir.to_str().unwrap(),
            "--cluster",
            "dgx-h100:1",
            "--from",
            "tp=1,pp=3",
            "--to",
            &to,
            "--json",
        ]));
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["verified"], true, "{}: {out}", dir.display());
        assert!(r["makespan_s"].as_f64().unwrap() <= 1.02 * r["lower_bound_s"].as_f64().unwrap() + 1e-9);
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf").join(name)
}

/// Run a checking script on `DIR:DIR` pairs; it prints one line per pair.
fn run_script(name: &str, pairs: &[String]) -> String {
    let py = python().expect("fixtures exist, so Python does");
    let o = Command::new(py)
        .arg(script(name))
        .args(pairs)
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{name}: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.lines().count(), pairs.len(), "{out}");
    out
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn transformers_models_import_reshard_and_export_bit_identical() {
    let Some((tiny, _)) = fixtures() else { return };
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-roundtrip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let (mut loads, mut fused) = (Vec::new(), Vec::new());
    for dir in models_in(tiny) {
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let [a, b, c, hf] = ["a", "b", "c", "hf"].map(|x| work.join(format!("{name}.{x}")));
        // Without --model: the directory's config.json names it.
        let out = ok(&tenplan(&[
            "import",
            "--hf",
            p(&dir),
            "--layout",
            "tp=1,pp=3",
            "--out",
            p(&a),
            "--json",
        ]));
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["excluded"], serde_json::json!([]), "{name}");
        let spec = resolve(p(&dir)).unwrap();
        // A chain of reshards: tensor and data parallel with ZeRO-1, then
        // back to one device.
        let tp = spec.groups.min(2);
        let ep = if spec.experts > 0 { ",ep=2" } else { "" };
        ok(&tenplan(&[
            "reshard",
            "--src",
            p(&a),
            "--to",
            &format!("tp={tp},dp=2{ep}"),
            "--out",
            p(&b),
        ]));
        ok(&tenplan(&["reshard", "--src", p(&b), "--to", "tp=1", "--out", p(&c)]));
        let out = ok(&tenplan(&["check", p(&c), "--json"]));
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["ok"], true, "{name}: {out}");
        assert_eq!(r["model"], name.as_str());
        // The manifest carries the model's hyper-parameters (no catalog
        // preset has its name) and the config.json it came with.
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(c.join("tenplan.json")).unwrap()).unwrap();
        assert_eq!(m["model_spec"]["family"], spec.family.model_type());
        assert!(m["hf_config"].is_object(), "{name}");
        let out = ok(&tenplan(&[
            "export",
            p(&c),
            "--hf",
            p(&hf),
            "--max-shard-size",
            "30KB",
            "--json",
        ]));
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["original_config"], true);
        assert!(r["files"].as_array().unwrap().len() > 1, "{name}: sharded");
        loads.push(format!("{}:{}", p(&dir), p(&hf)));
        fused.push(format!("{}:{}", p(&dir), p(&a)));
    }
    assert_eq!(loads.len(), 19);
    // Catalog presets export with a generated config.json, in fp32 and,
    // from a training state, its bf16 weights.
    for (model, extra) in [
        ("llama-tiny", &["--weights-only", "--dtype", "f32"][..]),
        ("mixtral-tiny", &["--weights-only", "--dtype", "f16"][..]),
        ("gpt-tiny", &[][..]),
    ] {
        let (c, hf) = (work.join(model), work.join(format!("{model}.hf")));
        let mut args = vec!["init", "--model", model, "--layout", "tp=2,pp=2", "--out", p(&c)];
        args.extend_from_slice(extra);
        ok(&tenplan(&args));
        let training = extra.is_empty();
        if training {
            // Hugging Face files hold weights: the optimizer state is
            // refused, named, unless left out on purpose.
            let o = tenplan(&["export", p(&c), "--hf", p(&hf)]);
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success() && e.contains("optimizer.master.embedding.word_embeddings.weight"),
                "{e}"
            );
            assert!(!hf.exists());
        }
        let weights_only: &[&str] = if training { &["--weights-only"] } else { &[] };
        let out = ok(&tenplan(
            &[&["export", p(&c), "--hf", p(&hf), "--json"], weights_only].concat(),
        ));
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["excluded"].as_array().unwrap().is_empty(), !training, "{model}");
        assert_eq!(r["original_config"], false);
        assert_eq!(r["files"], serde_json::json!(["model.safetensors"]));
        loads.push(format!("{}:{}", p(&hf), p(&hf)));
        fused.push(format!("{}:{}", p(&hf), p(&c)));
    }
    // transformers loads every export with every weight bit-identical to
    // the original and runs it; every fused tensor of the imports equals the
    // Megatron layout torch builds from the original.
    run_script("compare_models.py", &loads);
    run_script("check_fused.py", &fused);
}

/// DeepSeek-V3 as DeepSeek publishes it: the files hold its
/// multi-token-prediction module as layer `num_hidden_layers` (with copies
/// of the embedding and output head), which transformers neither builds
/// nor loads. The state is what the files hold: the module goes through
/// import, reshards and export bit for bit, and leaves only when asked to.
#[test]
fn deepseek_v3_keeps_its_mtp_module() {
    let Some(py) = python() else { return };
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-mtp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    make_models(&py, &work, &["--mtp", "--shard-size", "40KB"]);
    let (src, unshared) = (work.join("deepseek-v3-mtp"), work.join("deepseek-v3-mtp-unshared"));
    let [a, b, c, hf, dcp, mesh, left] = ["a", "b", "c", "hf", "dcp", "mesh", "left"].map(|x| work.join(x));
    let out = ok(&tenplan(&[
        "import",
        "--hf",
        p(&src),
        "--layout",
        "tp=2,pp=2,split=2:1",
        "--out",
        p(&a),
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["excluded"], serde_json::json!([]), "{out}");
    // 99 tensors in the files: the model's 67, the module's 30 and the two
    // copies, which the state holds once.
    assert_eq!(
        (r["hf_tensors"].as_u64(), r["tensors"].as_u64()),
        (Some(99), Some(81)),
        "{out}"
    );
    ok(&tenplan(&[
        "reshard",
        "--src",
        p(&a),
        "--to",
        "tp=1,dp=2,ep=2",
        "--out",
        p(&b),
    ]));
    ok(&tenplan(&["reshard", "--src", p(&b), "--to", "tp=1", "--out", p(&c)]));
    ok(&tenplan(&["export", p(&c), "--hf", p(&hf), "--max-shard-size", "30KB"]));
    let same = ok(&tenplan(&["diff", p(&src), p(&hf)]));
    assert!(
        same.starts_with("identical") && same.contains("99 entries equal"),
        "{same}"
    );
    // Into a DCP checkpoint under the files' names, and onto a mesh.
    ok(&tenplan(&["export", p(&c), "--dcp", p(&dcp), "--to", "dp_shard=2"]));
    ok(&tenplan(&[
        "reshard",
        "--src",
        p(&dcp),
        "--model",
        p(&src),
        "--to",
        "dp_shard=2,pp=2",
        "--out",
        p(&mesh),
    ]));
    for other in [&dcp, &mesh] {
        let same = ok(&tenplan(&["diff", p(&c), p(other), "--model", p(&src)]));
        assert!(
            same.starts_with("identical") && same.contains("0 + 0 on one side only"),
            "{same}"
        );
    }
    // A copy that is not the model's embedding is named, not dropped.
    let o = tenplan(&["import", "--hf", p(&unshared), "--layout", "tp=2", "--out", p(&left)]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("`model.layers.3.embed_tokens.weight` is not `model.embed_tokens.weight`"),
        "{e}"
    );
    assert!(!left.exists());
    // Leaving the module out is a choice, said.
    let out = ok(&tenplan(&[
        "import",
        "--hf",
        p(&src),
        "--layout",
        "tp=2",
        "--out",
        p(&left),
        "--exclude",
        "model.layers.3.",
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["excluded"].as_array().unwrap().len(), 32, "{out}");
    // Every tensor of DeepSeek's files bit for bit, and transformers loads
    // the export as it loads the original (the module's keys unexpected).
    let out = run_script("compare_files.py", &[format!("{}:{}", p(&src), p(&hf))]);
    assert!(out.contains("99 tensors bit-identical"), "{out}");
    std::fs::remove_dir_all(&work).unwrap();
}
