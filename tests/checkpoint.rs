//! End-to-end tests of the checkpoint commands: init, reshard, check, import,
//! and every kind of bad input they must refuse cleanly.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tenplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenplan"))
        .args(args)
        .output()
        .expect("runs")
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A clean failure: exit code 1, no panic, one `error:` line naming the problem.
fn fails(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("error: "), "{err}");
    assert!(last.contains(needle), "expected `{needle}` in: {last}");
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenplan-ckpt-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn init(dir: &Path, model: &str, layout: &str, extra: &[&str]) {
    let mut args = vec!["init", "--model", model, "--layout", layout, "--out", s(dir)];
    args.extend_from_slice(extra);
    ok(&tenplan(&args));
}

/// Every file of a directory and its bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), fs::read(e.path()).unwrap())
        })
        .collect()
}

fn rank_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut c = contents(dir);
    c.remove("tenplan.json");
    c
}

fn digests(dir: &Path) -> Vec<(String, String)> {
    let m: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("tenplan.json")).unwrap()).unwrap();
    m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().into(), t["digest"].as_str().unwrap().into()))
        .collect()
}

/// Reshard `src` to layout `to` into `out` with `planner`: the JSON report.
fn reshard(src: &Path, to: &str, out: &Path, planner: &str) -> serde_json::Value {
    let o = tenplan(&[
        "reshard",
        "--src",
        s(src),
        "--to",
        to,
        "--out",
        s(out),
        "--planner",
        planner,
        "--json",
    ]);
    serde_json::from_str(&ok(&o)).unwrap()
}

#[test]
fn reshard_equals_writing_the_target_directly_for_every_planner() {
    let root = scratch("equal");
    let (src, direct) = (root.join("src"), root.join("direct"));
    init(&src, "gpt-tiny", "tp=2,pp=2,dp=2", &[]);
    init(&direct, "gpt-tiny", "tp=4,dp=2,zero=1", &[]);
    let before = contents(&src);
    for planner in ["lp", "lp-placed", "tenplex", "central", "least-loaded", "hotspa"] {
        let out = root.join(planner);
        let report = reshard(&src, "tp=4,dp=2,zero=1", &out, planner);
        // Every byte of the new state is read once, and nothing else.
        assert_eq!(report["bytes_read"], report["data_bytes"], "{planner}");
        assert_eq!(digests(&out), digests(&direct), "{planner}");
        if planner != "lp-placed" {
            // Same layout, same contents: the same files, byte for byte.
            assert_eq!(rank_files(&out), rank_files(&direct), "{planner}");
        }
        ok(&tenplan(&["check", s(&out)]));
    }
    assert_eq!(contents(&src), before, "the source is never modified");
}

#[test]
fn zero1_checkpoints_whose_embedding_replicas_are_cut_differently() {
    // pp=2,dp=12: the tied embedding's optimizer state sits in flat buffers
    // of different sizes on the two stages, cut at different rows.
    let root = scratch("zero-replicas");
    let (src, direct) = (root.join("src"), root.join("direct"));
    init(&src, "gpt-tiny", "pp=2,dp=12,zero=1", &["--seed", "3"]);
    init(&direct, "gpt-tiny", "pp=2,dp=7,zero=1", &["--seed", "3"]);
    ok(&tenplan(&["check", s(&src)]));
    for planner in ["lp", "tenplex"] {
        let (out, back) = (root.join(planner), root.join(format!("{planner}-back")));
        let report = reshard(&src, "pp=2,dp=7,zero=1", &out, planner);
        assert_eq!(report["bytes_read"], report["data_bytes"], "{planner}");
        assert_eq!(rank_files(&out), rank_files(&direct), "{planner}");
        reshard(&out, "pp=2,dp=12,zero=1", &back, planner);
        assert_eq!(rank_files(&back), rank_files(&src), "{planner}: there and back");
    }
}

#[test]
fn weights_only_and_llama_layouts_round_trip() {
    let root = scratch("llama");
    let (a, b, c) = (root.join("a"), root.join("b"), root.join("c"));
    init(
        &a,
        "llama-tiny",
        "tp=2,pp=2",
        &["--weights-only", "--dtype", "f32", "--seed", "7"],
    );
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&a),
        "--to",
        "tp=1,dp=4",
        "--out",
        s(&b),
    ]));
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&b),
        "--to",
        "tp=2,pp=2",
        "--out",
        s(&c),
    ]));
    assert_eq!(rank_files(&a), rank_files(&c), "there and back restores every byte");
    let d = root.join("d");
    init(
        &d,
        "llama-tiny",
        "tp=2,pp=2",
        &["--weights-only", "--dtype", "f32", "--seed", "8"],
    );
    assert_ne!(digests(&a), digests(&d), "the seed changes the contents");
}

#[test]
fn files_carry_dcp_sharding_info() {
    let root = scratch("dcp");
    let dir = root.join("c");
    init(&dir, "llama-tiny", "tp=2", &["--weights-only"]);
    let bytes = fs::read(dir.join("rank-00001.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let info: serde_json::Value =
        serde_json::from_str(header["__metadata__"]["DCP_SHARDING_INFO"].as_str().unwrap()).unwrap();
    // Rank 1 of tp=2 holds the second half of the QKV rows.
    let qkv = "decoder.layers.0.self_attention.linear_qkv.weight";
    assert_eq!(info[qkv]["saved_offsets"], serde_json::json!([16, 0]));
    assert_eq!(header[qkv]["shape"], serde_json::json!([16, 16]));
    assert_eq!(header[qkv]["dtype"], "BF16");
    // SwiGLU: two boxes of fc1 on one rank, the second in the rank's part
    // file under the same key (DCP keys chunks by entry name).
    let fc1 = "decoder.layers.0.mlp.linear_fc1.weight";
    assert_eq!(info[fc1]["saved_offsets"], serde_json::json!([12, 0]));
    assert!(info.get(format!("{fc1}#1")).is_none());
    let bytes = fs::read(dir.join("rank-00001.part1.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let part: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let part_info: serde_json::Value =
        serde_json::from_str(part["__metadata__"]["DCP_SHARDING_INFO"].as_str().unwrap()).unwrap();
    assert_eq!(part_info[fc1]["saved_offsets"], serde_json::json!([36, 0]));
    assert!(part.get(qkv).is_none(), "a part file holds only second boxes");
    // Padding is not stored: rank 0's vocabulary slice is padded to 128
    // rows in memory, but only the 100 real rows are in its file.
    let bytes = fs::read(dir.join("rank-00000.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(
        header["embedding.word_embeddings.weight"]["shape"],
        serde_json::json!([100, 16])
    );
}

#[test]
fn damaged_checkpoints_are_refused_and_nothing_half_written_remains() {
    let root = scratch("bad");
    let good = root.join("good");
    init(&good, "gpt-tiny", "tp=2,dp=2", &[]);
    let copy = |name: &str| -> PathBuf {
        let d = root.join(name);
        fs::create_dir_all(&d).unwrap();
        for (f, b) in contents(&good) {
            fs::write(d.join(f), b).unwrap();
        }
        d
    };
    let rank = "rank-00001.safetensors";

    // Truncated file.
    let d = copy("truncated");
    let b = fs::read(d.join(rank)).unwrap();
    fs::write(d.join(rank), &b[..b.len() - 10]).unwrap();
    fails(&tenplan(&["check", s(&d)]), "truncated");

    // Truncated file, same size in the manifest: the header no longer covers it.
    let d = copy("short-manifest");
    let m = fs::read_to_string(d.join("tenplan.json")).unwrap();
    let size = b.len().to_string();
    fs::write(d.join(rank), &b[..b.len() - 10]).unwrap();
    let fixed = m.replacen(&format!("\"bytes\":{size}"), &format!("\"bytes\":{}", b.len() - 10), 1);
    assert_ne!(fixed, m);
    fs::write(d.join("tenplan.json"), fixed).unwrap();
    fails(&tenplan(&["check", s(&d)]), "not a valid safetensors file");

    // A header that lies about offsets.
    let d = copy("lying");
    let mut b2 = b.clone();
    let n = u64::from_le_bytes(b2[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(b2[8..8 + n].to_vec()).unwrap();
    let lie = header.replacen("\"data_offsets\":[0,", "\"data_offsets\":[8,", 1);
    assert_eq!(lie.len(), header.len());
    b2[8..8 + n].copy_from_slice(lie.as_bytes());
    fs::write(d.join(rank), &b2).unwrap();
    fails(&tenplan(&["check", s(&d)]), "not a valid safetensors file");

    // Flipped data byte: structure fine, digest not.
    let d = copy("flipped");
    let mut b3 = b.clone();
    let last = b3.len() - 1;
    b3[last] ^= 0x40;
    fs::write(d.join(rank), &b3).unwrap();
    fails(&tenplan(&["check", s(&d)]), "does not match the manifest");
    let out = root.join("from-flipped");
    fails(
        &tenplan(&["reshard", "--src", s(&d), "--to", "tp=4", "--out", s(&out)]),
        "does not match the manifest",
    );
    assert!(!out.exists(), "a failed reshard leaves no directory behind");

    // Missing rank.
    let d = copy("missing");
    fs::remove_file(d.join(rank)).unwrap();
    fails(&tenplan(&["check", s(&d)]), "missing: the file of rank 1");

    // Manifest that does not match the files.
    let d = copy("manifest");
    let m = fs::read_to_string(d.join("tenplan.json")).unwrap();
    let changed = m.replacen("\"shape\":[100,16]", "\"shape\":[101,16]", 1);
    assert_ne!(changed, m);
    fs::write(d.join("tenplan.json"), changed).unwrap();
    fails(&tenplan(&["check", s(&d)]), "manifest");

    // A manifest that lists a file under another rank: the device fields of
    // two files swapped.
    let d = copy("devices-swapped");
    let mut m: serde_json::Value = serde_json::from_str(&fs::read_to_string(d.join("tenplan.json")).unwrap()).unwrap();
    let (d0, d1) = (m["files"][0]["device"].clone(), m["files"][1]["device"].clone());
    m["files"][0]["device"] = d1;
    m["files"][1]["device"] = d0;
    fs::write(d.join("tenplan.json"), m.to_string()).unwrap();
    fails(
        &tenplan(&["check", s(&d)]),
        "is listed for rank 1, whose files are rank-00001.safetensors",
    );

    // Two ranks' files exchanged on disk, the manifest's sizes and entry
    // counts made to agree: each file holds boxes its rank does not.
    let d = copy("files-swapped");
    let mut m: serde_json::Value = serde_json::from_str(&fs::read_to_string(d.join("tenplan.json")).unwrap()).unwrap();
    let (a, b) = ("rank-00000.safetensors", "rank-00001.safetensors");
    let (fa, fb) = (fs::read(d.join(a)).unwrap(), fs::read(d.join(b)).unwrap());
    fs::write(d.join(a), &fb).unwrap();
    fs::write(d.join(b), &fa).unwrap();
    for key in ["bytes", "entries"] {
        let (x, y) = (m["files"][0][key].clone(), m["files"][1][key].clone());
        m["files"][0][key] = y;
        m["files"][1][key] = x;
    }
    fs::write(d.join("tenplan.json"), m.to_string()).unwrap();
    fails(
        &tenplan(&["check", s(&d)]),
        "which rank 0 does not hold in the manifest's layout",
    );

    // No manifest: visibly incomplete.
    let d = copy("incomplete");
    fs::remove_file(d.join("tenplan.json")).unwrap();
    fails(&tenplan(&["check", s(&d)]), "incomplete");

    // Garbage manifest.
    let d = copy("garbage");
    fs::write(d.join("tenplan.json"), "{\"format\": 3").unwrap();
    fails(&tenplan(&["check", s(&d)]), "not JSON");

    // Destination exists: refused, untouched.
    let o = tenplan(&["reshard", "--src", s(&good), "--to", "tp=4", "--out", s(&d)]);
    fails(&o, "already exists");
    let o = tenplan(&["init", "--model", "gpt-tiny", "--layout", "tp=2", "--out", s(&good)]);
    fails(&o, "already exists");
    ok(&tenplan(&["check", s(&good)]));

    // Impossible target layout.
    let out = root.join("impossible");
    fails(
        &tenplan(&["reshard", "--src", s(&good), "--to", "tp=3", "--out", s(&out)]),
        "tp",
    );
    assert!(!out.exists());
}

/// Write a safetensors file (as the Python library does) from named arrays.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<u64>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (name, shape, data) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + data.len()]}),
        );
        at += data.len();
    }
    let h = serde_json::Value::Object(header).to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    for (_, _, d) in tensors {
        out.extend_from_slice(d);
    }
    fs::write(path, out).unwrap();
}

fn floats(n: u64, base: f32) -> Vec<u8> {
    (0..n).flat_map(|i| (base + i as f32).to_le_bytes()).collect()
}

#[test]
fn import_converts_hugging_face_llama_names() {
    // llama-tiny: 4 layers, hidden 16, 8 heads in 4 groups (head 2), ffn 24, vocab 100.
    let root = scratch("import");
    let hf = root.join("hf");
    fs::create_dir_all(&hf).unwrap();
    let mut t: Vec<(String, Vec<u64>, Vec<u8>)> = vec![
        ("model.embed_tokens.weight".into(), vec![100, 16], floats(1600, 0.0)),
        ("model.norm.weight".into(), vec![16], floats(16, 1.0)),
        ("lm_head.weight".into(), vec![100, 16], floats(1600, 2.0)),
    ];
    for l in 0..4u64 {
        let p = format!("model.layers.{l}");
        let b = 1000.0 * (l + 1) as f32;
        t.push((format!("{p}.input_layernorm.weight"), vec![16], floats(16, b)));
        t.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![16],
            floats(16, b + 1.0),
        ));
        t.push((
            format!("{p}.self_attn.q_proj.weight"),
            vec![16, 16],
            floats(256, b + 2.0),
        ));
        t.push((
            format!("{p}.self_attn.k_proj.weight"),
            vec![8, 16],
            floats(128, b + 3.0),
        ));
        t.push((
            format!("{p}.self_attn.v_proj.weight"),
            vec![8, 16],
            floats(128, b + 4.0),
        ));
        t.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![16, 16],
            floats(256, b + 5.0),
        ));
        t.push((format!("{p}.mlp.gate_proj.weight"), vec![24, 16], floats(384, b + 6.0)));
        t.push((format!("{p}.mlp.up_proj.weight"), vec![24, 16], floats(384, b + 7.0)));
        t.push((format!("{p}.mlp.down_proj.weight"), vec![16, 24], floats(384, b + 8.0)));
    }
    // Two shards and an index, as transformers writes large models.
    let (first, second) = t.split_at(20);
    write_safetensors(&hf.join("model-00001-of-00002.safetensors"), first);
    write_safetensors(&hf.join("model-00002-of-00002.safetensors"), second);
    let map: serde_json::Map<String, serde_json::Value> = first
        .iter()
        .map(|x| (x.0.clone(), "model-00001-of-00002.safetensors".into()))
        .chain(
            second
                .iter()
                .map(|x| (x.0.clone(), "model-00002-of-00002.safetensors".into())),
        )
        .collect();
    fs::write(
        hf.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let out = root.join("ckpt");
    ok(&tenplan(&[
        "import",
        "--hf",
        s(&hf),
        "--model",
        "llama-tiny",
        "--layout",
        "tp=2,pp=2",
        "--out",
        s(&out),
    ]));
    ok(&tenplan(&["check", s(&out)]));
    // The QKV weight of layer 0 on tp rank 0 (groups 0 and 1): q rows 0..4,
    // k rows 0..2, v rows 0..2, then group 1.
    let bytes = fs::read(out.join("rank-00000.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let e = &header["decoder.layers.0.self_attention.linear_qkv.weight"];
    assert_eq!(e["shape"], serde_json::json!([16, 16]));
    let start = 8 + n + e["data_offsets"][0].as_u64().unwrap() as usize;
    let row = |r: usize| f32::from_le_bytes(bytes[start + r * 64..start + r * 64 + 4].try_into().unwrap());
    let q = 1002.0;
    let (k, v) = (1003.0, 1004.0);
    let want = [
        q,
        q + 16.0,
        q + 32.0,
        q + 48.0,
        k,
        k + 16.0,
        v,
        v + 16.0,
        q + 64.0,
        q + 80.0,
        q + 96.0,
        q + 112.0,
        k + 32.0,
        k + 48.0,
        v + 32.0,
        v + 48.0,
    ];
    let got: Vec<f32> = (0..16).map(row).collect();
    assert_eq!(got, want);
    // Resharding the import keeps every tensor.
    let re = root.join("re");
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&out),
        "--to",
        "tp=4",
        "--out",
        s(&re),
    ]));
    assert_eq!(digests(&re), digests(&out));

    // A model whose shapes do not match the family is refused by name.
    let bad = root.join("bad");
    fs::create_dir_all(&bad).unwrap();
    let mut t2 = t.clone();
    t2[0].1 = vec![99, 16];
    t2[0].2 = floats(99 * 16, 0.0);
    write_safetensors(&bad.join("model.safetensors"), &t2);
    fails(
        &tenplan(&[
            "import",
            "--hf",
            s(&bad),
            "--model",
            "llama-tiny",
            "--layout",
            "tp=2",
            "--out",
            s(&root.join("x")),
        ]),
        "model.embed_tokens.weight",
    );
    // A missing tensor too.
    t2.remove(0);
    fs::remove_file(bad.join("model.safetensors")).unwrap();
    write_safetensors(&bad.join("model.safetensors"), &t2);
    fails(
        &tenplan(&[
            "import",
            "--hf",
            s(&bad),
            "--model",
            "llama-tiny",
            "--layout",
            "tp=2",
            "--out",
            s(&root.join("x")),
        ]),
        "no tensor `model.embed_tokens.weight`",
    );
    assert!(!root.join("x").exists());
}

#[test]
fn export_writes_hugging_face_files_and_refuses_bad_input() {
    let root = scratch("export");
    let c = root.join("c");
    init(&c, "gpt-tiny", "tp=2,pp=2", &["--weights-only", "--dtype", "f32"]);
    let hf = root.join("hf");
    let out = ok(&tenplan(&[
        "export",
        s(&c),
        "--hf",
        s(&hf),
        "--max-shard-size",
        "20KB",
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let files: Vec<String> = serde_json::from_value(r["files"].clone()).unwrap();
    let n = files.len();
    assert!(n > 2, "{out}");
    assert_eq!(files[0], format!("model-00001-of-{n:05}.safetensors"));
    let mut names: Vec<String> = fs::read_dir(&hf)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want = files.clone();
    want.extend(["config.json".to_string(), "model.safetensors.index.json".to_string()]);
    want.sort();
    assert_eq!(names, want, "no temporary or marker file is left");
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(hf.join("model.safetensors.index.json")).unwrap()).unwrap();
    assert_eq!(index["metadata"]["total_size"], r["data_bytes"]);
    assert_eq!(
        index["weight_map"]["transformer.h.7.attn.c_attn.weight"]
            .as_str()
            .map(|f| files.contains(&f.to_string())),
        Some(true)
    );
    let config: serde_json::Value = serde_json::from_str(&fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "gpt2");
    assert_eq!(config["dtype"], "float32");

    // The export imports back (GPT-2 names, transposed) to the same tensors.
    let back = root.join("back");
    ok(&tenplan(&[
        "import",
        "--hf",
        s(&hf),
        "--layout",
        "tp=4",
        "--out",
        s(&back),
    ]));
    let (a, b) = (digests(&c), digests(&back));
    assert_eq!(a, b);
    // `diff` agrees across layouts and formats, and exits 5 on a difference.
    for (x, y) in [(&c, &back), (&hf, &c), (&back, &hf)] {
        let out = ok(&tenplan(&["diff", s(x), s(y), "--json"]));
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (r["identical"].as_bool(), r["same"].as_u64()),
            (Some(true), Some(a.len() as u64)),
            "{out}"
        );
    }
    let other = root.join("other");
    init(
        &other,
        "gpt-tiny",
        "tp=1",
        &["--weights-only", "--dtype", "f32", "--seed", "3"],
    );
    let o = tenplan(&["diff", s(&hf), s(&other)]);
    assert_eq!(o.status.code(), Some(5), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("differs: embedding.word_embeddings.weight: contents differ"),
        "{text}"
    );
    assert!(text.contains("different:") && o.stderr.is_empty(), "{text}");
    // Down to the first differing element.
    assert!(
        text.contains("first difference: embedding.word_embeddings.weight at element [0, 0]"),
        "{text}"
    );
    // ... and where each side keeps it: the HF tensor's row, the stored box.
    assert!(
        text.contains("`transformer.wte.weight` row 0 of") && text.contains("box [0.."),
        "{text}"
    );

    // An existing destination is refused and left as it was.
    let before = contents(&hf);
    fails(&tenplan(&["export", s(&c), "--hf", s(&hf)]), "already exists");
    assert_eq!(contents(&hf), before);
    fails(
        &tenplan(&["export", s(&c), "--hf", s(&root.join("x")), "--max-shard-size", "5XB"]),
        "unknown unit",
    );
    fails(
        &tenplan(&["export", s(&c), "--hf", s(&root.join("x")), "--max-shard-size", "0"]),
        "expected a positive size",
    );
    // A checkpoint whose data was changed is refused before anything is written.
    let damaged = root.join("damaged");
    fs::create_dir_all(&damaged).unwrap();
    for (name, bytes) in contents(&c) {
        fs::write(damaged.join(name), bytes).unwrap();
    }
    let rank = damaged.join("rank-00000.safetensors");
    let mut bytes = fs::read(&rank).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs::write(&rank, bytes).unwrap();
    fails(&tenplan(&["export", s(&damaged), "--hf", s(&root.join("x"))]), "digest");
    assert!(!root.join("x").exists());

    // An index naming a missing shard; a shard left out of the index's files.
    let partial = root.join("partial");
    fs::create_dir_all(&partial).unwrap();
    for f in files
        .iter()
        .skip(1)
        .map(String::as_str)
        .chain(["config.json", "model.safetensors.index.json"])
    {
        fs::copy(hf.join(f), partial.join(f)).unwrap();
    }
    fails(
        &tenplan(&[
            "import",
            "--hf",
            s(&partial),
            "--layout",
            "tp=2",
            "--out",
            s(&root.join("x")),
        ]),
        &format!("names shard `{}`, which is not there", files[0]),
    );
    assert!(!root.join("x").exists());

    // Tensors of the files that no weight reads are named.
    let extra = root.join("extra");
    fs::create_dir_all(&extra).unwrap();
    let mut all: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
    for f in &files {
        let bytes = fs::read(hf.join(f)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (k, v) in st.tensors() {
            all.push((k, v.shape().iter().map(|&x| x as u64).collect(), v.data().to_vec()));
        }
    }
    all.push(("transformer.h.9.mlp.c_fc.weight".into(), vec![2], floats(2, 0.0)));
    write_safetensors(&extra.join("model.safetensors"), &all);
    fs::copy(hf.join("config.json"), extra.join("config.json")).unwrap();
    // Nothing is lost: refused, unless left out on purpose.
    let imported_extra = root.join("e");
    let import_extra = |more: &[&str]| {
        let mut args = vec![
            "import",
            "--hf",
            s(&extra),
            "--layout",
            "tp=2",
            "--out",
            s(&imported_extra),
        ];
        args.extend_from_slice(more);
        tenplan(&args)
    };
    fails(
        &import_extra(&[]),
        "1 tensor of the model files is not part of extra (transformer.h.9.mlp.c_fc.weight)",
    );
    assert!(!imported_extra.exists());
    let out = ok(&import_extra(&["--exclude", "h.9.mlp"]));
    assert!(
        out.contains("left out on purpose: 1 entry (transformer.h.9.mlp.c_fc.weight)"),
        "{out}"
    );

    // A manifest whose kept config.json was edited to another model.
    let imported = root.join("imported");
    ok(&tenplan(&[
        "import",
        "--hf",
        s(&hf),
        "--layout",
        "tp=2",
        "--out",
        s(&imported),
    ]));
    let mpath = imported.join("tenplan.json");
    let mut m: serde_json::Value = serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    assert_eq!(m["hf_config"]["n_layer"], 8);
    m["hf_config"]["n_layer"] = 7.into();
    fs::write(&mpath, m.to_string()).unwrap();
    fails(
        &tenplan(&["export", s(&imported), "--hf", s(&root.join("x"))]),
        "hf_config describes another model",
    );
    assert!(!root.join("x").exists());
}

#[test]
fn the_job_state_travels_with_the_checkpoint() {
    let root = scratch("job");
    let job = root.join("job.json");
    fs::write(
        &job,
        r#"{"dataset":{"dataset_size":1000,"seed":1,"consumed":640,"global_batch":64},"rng":{"seed":9,"step":10}}"#,
    )
    .unwrap();
    let (a, b) = (root.join("a"), root.join("b"));
    init(&a, "gpt-tiny", "tp=2,dp=4", &["--job", s(&job)]);
    ok(&tenplan(&[
        "reshard",
        "--src",
        s(&a),
        "--to",
        "tp=2,dp=2",
        "--out",
        s(&b),
    ]));
    let m: serde_json::Value = serde_json::from_slice(&fs::read(b.join("tenplan.json")).unwrap()).unwrap();
    assert_eq!(m["job"]["dataset"]["consumed"], 640);
    assert_eq!(m["job"]["rng"]["step"], 10);
    assert_eq!(m["config"], "tp=2,dp=2");
}
