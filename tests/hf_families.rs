//! Any transformers family, against real transformers: one tiny causal LM
//! per family (36 of them), built from the family's own config class and
//! saved by transformers (tests/hf/make_families.py), in bf16 and fp32.
//! Each goes `import --layout tp=2` → `reshard --to tp=1` → `export --hf`
//! and loads with `AutoModelForCausalLM.from_pretrained`: no missing,
//! unexpected or mismatched key, every tensor bit-identical, the logits on
//! a fixed batch equal to the original's. Families of tenplan's catalog go
//! through Megatron's names; the others keep their files' names, laid out
//! by the family's tensor-parallel plan. Needs a Python with torch and
//! transformers (see tests/common).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{ok, python, tenplan};

/// The fixtures, written once per test run: `root/<dtype>/<model_type>`.
fn fixtures() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = python()?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-families-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf/make_families.py");
        for dtype in ["bfloat16", "float32"] {
            let o = Command::new(&py)
                .arg(&script)
                .arg(root.join(dtype))
                .args(["--dtype", dtype])
                .env("TRANSFORMERS_VERBOSITY", "error")
                .env("HF_HUB_OFFLINE", "1")
                .output()
                .expect("run make_families.py");
            assert!(
                o.status.success(),
                "make_families.py: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Some(root)
    })
    .as_ref()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The families make_families.py wrote in `dir`, and those transformers
/// could not build at these sizes.
fn written(dir: &Path) -> (Vec<String>, serde_json::Value) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("families.json")).unwrap()).unwrap();
    let names = v["written"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    (names, v["failed"].clone())
}

#[test]
fn every_family_round_trips_through_tensor_parallel_layouts_bit_exact() {
    let Some(root) = fixtures() else { return };
    let work = root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut pairs = Vec::new();
    let mut named = 0;
    for dtype in ["bfloat16", "float32"] {
        let (families, failed) = written(&root.join(dtype));
        assert_eq!(failed, serde_json::json!({}), "transformers builds every family");
        assert_eq!(families.len(), 36, "{dtype}");
        for family in &families {
            let original = root.join(dtype).join(family);
            let [a, b, hf] = ["a", "b", "hf"].map(|x| work.join(format!("{dtype}-{family}.{x}")));
            let r: serde_json::Value = serde_json::from_str(&ok(&tenplan(&[
                "import",
                "--hf",
                p(&original),
                "--layout",
                "tp=2",
                "--out",
                p(&a),
                "--json",
            ])))
            .unwrap();
            assert_eq!(r["excluded"], serde_json::json!([]), "{family}");
            let m: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(a.join("tenplan.json")).unwrap()).unwrap();
            if m["state"] == "hf" {
                named += 1;
                assert!(
                    m["model"].is_null() && m["hf_config"]["model_type"] == family.as_str(),
                    "{family}"
                );
            }
            ok(&tenplan(&["check", p(&a)]));
            ok(&tenplan(&["reshard", "--src", p(&a), "--to", "tp=1", "--out", p(&b)]));
            ok(&tenplan(&["export", p(&b), "--hf", p(&hf)]));
            // The export holds exactly the original files' tensors.
            ok(&tenplan(&["diff", p(&hf), p(&original)]));
            pairs.push(format!("{}:{}", p(&original), p(&hf)));
        }
    }
    // 27 families beyond the catalog in each type, and DeepSeek-V3 in bf16,
    // whose f32 router bias transformers keeps: a file of mixed types
    // imports as it is.
    assert_eq!(named, 2 * 27 + 1);
    let o = Command::new(python().unwrap())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf/compare_models.py"))
        .args(&pairs)
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{said}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(said.matches("logits equal, forward pass ok").count(), 72, "{said}");
}

#[test]
fn a_family_laid_out_by_its_plan_keeps_names_and_refuses_what_does_not_split() {
    let Some(root) = fixtures() else { return };
    let work = root.join("plans");
    std::fs::create_dir_all(&work).unwrap();
    let phi3 = root.join("bfloat16/phi3");
    // Pipeline and tensor parallel: fused qkv_proj split as queries, keys
    // and values, each by tp.
    let a = work.join("phi3.tp2pp2");
    ok(&tenplan(&[
        "import",
        "--hf",
        p(&phi3),
        "--layout",
        "tp=2,pp=2",
        "--out",
        p(&a),
    ]));
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(a.join("tenplan.json")).unwrap()).unwrap();
    let qkv = m["shards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "pp0.tp1")
        .unwrap()["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "model.layers.0.self_attn.qkv_proj.weight")
        .unwrap()
        .clone();
    // 4 query heads and 2 key/value heads of 16: rank 1 holds query rows
    // 32..64, key rows 80..96 and value rows 112..128.
    let starts: Vec<u64> = qkv["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|piece| piece["box"][0][0].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [32, 80, 112], "{qkv}");
    ok(&tenplan(&["diff", p(&a), p(&phi3)]));
    // A key/value head count tp does not divide is refused by name.
    let mqa = work.join("mqa");
    std::fs::create_dir_all(&mqa).unwrap();
    std::fs::copy(phi3.join("model.safetensors"), mqa.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(phi3.join("config.json")).unwrap()).unwrap();
    config["num_key_value_heads"] = 1.into();
    std::fs::write(mqa.join("config.json"), config.to_string()).unwrap();
    let o = tenplan(&[
        "import",
        "--hf",
        p(&mqa),
        "--layout",
        "tp=2",
        "--out",
        p(&work.join("x")),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("tp=2 does not divide the 1 key/value heads"),
        "{e}"
    );
    assert!(!work.join("x").exists());
    // A manifest whose configuration does not lay the tensors out as its
    // shards do is refused.
    let mpath = a.join("tenplan.json");
    let mut m2 = m.clone();
    m2["config"] = "tp=4".into();
    std::fs::write(&mpath, m2.to_string()).unwrap();
    let o = tenplan(&["check", p(&a)]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("config `tp=4") && e.contains("does not divide the 2 key/value heads"),
        "{e}"
    );
    // Four ranks either way, but not these shards.
    m2["config"] = "tp=1,pp=2,dp=2".into();
    std::fs::write(&mpath, m2.to_string()).unwrap();
    let o = tenplan(&["check", p(&a)]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("does not lay out the tensors as the manifest's shards do"),
        "{e}"
    );
    std::fs::write(&mpath, m.to_string()).unwrap();
    ok(&tenplan(&["check", p(&a)]));
}
