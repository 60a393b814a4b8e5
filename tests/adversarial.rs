//! Adversarial inputs, as an attacker or a careless user would give them:
//! every one gets a clear one-line error and a non-zero exit — never a
//! panic, a hang or an acceptance. The reproductions of the hardening issue
//! first, then their generalisations (random oversized numbers, random
//! damage to plan files and manifests), then recovery after a crash.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;

/// What a run gave: exit code (`None` when killed), stdout, stderr.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Longest a refused input may run before the test calls it a hang. Not a
/// speed target (those are benchmarks): the inputs below used to run for
/// minutes and gigabytes.
const HANG: Duration = Duration::from_secs(60);

fn tenplan(args: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenplan"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let (mut out, mut err) = (String::new(), String::new());
            child
                .stdout
                .take()
                .expect("piped")
                .read_to_string(&mut out)
                .expect("stdout");
            child
                .stderr
                .take()
                .expect("piped")
                .read_to_string(&mut err)
                .expect("stderr");
            return Run {
                code: status.code(),
                stdout: out,
                stderr: err,
            };
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("tenplan {args:?} ran past {HANG:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A clean refusal: exit 1 (or `code`), no panic, the last line one
/// `error:` line containing `needle`.
fn refused_with(r: &Run, code: i32, needle: &str, what: &str) {
    assert_eq!(r.code, Some(code), "{what}: stderr {}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{what}: {}", r.stderr);
    let last = r.stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("error: "), "{what}: {}", r.stderr);
    assert!(last.contains(needle), "{what}: expected `{needle}` in: {last}");
}

fn refused(r: &Run, needle: &str, what: &str) {
    refused_with(r, 1, needle, what);
}

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tenplan-adversarial-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_reproductions_are_refused_at_once() {
    let base = ["plan", "--model", "gpt-tiny"];
    let cases: &[(&[&str], &str)] = &[
        (&["--from", "dp=4294967295", "--to", "tp=1"], "exceeds the limit"),
        (&["--from", "dp=1000000", "--to", "tp=1"], "has 16 devices"),
        (
            &[
                "--cluster",
                "2x4",
                "--from",
                "tp=2,dp=2",
                "--to",
                "tp=4",
                "--threads",
                "100000",
            ],
            "--threads 100000",
        ),
        (&["--from", "tp=2", "--to", "tp=1", "--threads", "0"], "--threads 0"),
        (
            &["--from", "tp=2", "--to", "tp=1", "--staging-budget", "1e30GiB"],
            "exceeds the limit",
        ),
        (
            &[
                "--from",
                "tp=2",
                "--to",
                "tp=1",
                "--staging-budget",
                "18446744073709551616",
            ],
            "exceeds the limit",
        ),
        (&["--from", "tp=2", "--to", "tp=1", "--time-limit", "nan"], "time limit"),
        (&["--from", "tp=2", "--to", "tp=1", "--time-limit=-1"], "time limit"),
        (&["--from", "tp=4294967296", "--to", "tp=1"], "exceeds the limit"),
        (
            &["--from", "tp=2", "--to", "tp=1", "--dead", "0-4294967295"],
            "does not exist",
        ),
        (
            &["--from", "tp=2", "--to", "tp=1", "--cluster", "4294967295x8"],
            "exceeds the limit",
        ),
        (
            &["--from", "tp=2", "--to", "tp=1", "--cluster", "dgx-h100:99999999999"],
            "exceeds the limit",
        ),
        (
            &["--from", "tp=2,devices=0-1048575", "--to", "tp=1"],
            "devices were given",
        ),
    ];
    for (extra, needle) in cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        refused(&tenplan(&args), needle, &args.join(" "));
    }
}

#[test]
fn a_problem_larger_than_memory_is_refused_with_its_estimate() {
    // GPT-3 175B with a distributed optimizer on 2^20 GPUs: tens of millions
    // of pieces, more than any machine this runs on has memory for.
    let r = tenplan(&[
        "plan",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-h100:131072",
        "--from",
        "tp=8,pp=16,dp=8192,zero=1",
        "--to",
        "tp=8,pp=16,dp=4096,zero=1",
    ]);
    refused(&r, "would need about", "175B on 2^20 GPUs");
}

/// A small plan file to damage.
fn plan_file(dir: &Path) -> (PathBuf, serde_json::Value) {
    let path = dir.join("plan.json");
    let r = tenplan(&[
        "plan",
        "--model",
        "gpt-tiny",
        "--cluster",
        "2x4",
        "--from",
        "tp=2,dp=2",
        "--to",
        "tp=4,dp=2",
        "--out",
        s(&path),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let v = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    (path, v)
}

fn with(v: &serde_json::Value, edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut v = v.clone();
    edit(&mut v);
    v.to_string()
}

#[test]
fn damaged_plan_files_are_refused_by_every_command() {
    let dir = scratch("plans");
    let (_, plan) = plan_file(dir.parent().unwrap());
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "tensor 1000000",
            with(&plan, |v| v["copies"][0]["tensor"] = 1_000_000.into()),
            "tensor 1000000",
        ),
        (
            "unknown field in a copy",
            with(&plan, |v| v["copies"][0]["colour"] = "red".into()),
            "unknown field",
        ),
        (
            "pace names device 999",
            with(&plan, |v| {
                v["paces"] = serde_json::json!([{"src": 0, "dst": 999, "bytes_per_s": 1e9}]);
            }),
            "device 999",
        ),
        (
            "pace of 0",
            with(&plan, |v| {
                v["paces"] = serde_json::json!([{"src": 0, "dst": 1, "bytes_per_s": 0.0}]);
            }),
            "positive and finite",
        ),
        (
            "pace of -1",
            with(&plan, |v| {
                v["paces"] = serde_json::json!([{"src": 0, "dst": 1, "bytes_per_s": -1.0}]);
            }),
            "positive and finite",
        ),
        (
            "source buffer of 2^62 elements",
            with(&plan, |v| {
                v["problem"]["source"]["shards"][0]["buffers"][0]["len"] = (1u64 << 62).into();
            }),
            "exceeds the limit",
        ),
        (
            "destination buffer 7777",
            with(&plan, |v| v["copies"][0]["buffer"] = 7777.into()),
            "buffer 7777",
        ),
        (
            "box outside its tensor",
            with(&plan, |v| {
                v["copies"][0]["box"][0] = serde_json::json!([0, 4_000_000_000u64])
            }),
            "outside tensor",
        ),
    ];
    for (what, text, needle) in cases {
        let path = dir.with_file_name(format!("{}.json", what.replace(' ', "-")));
        fs::write(&path, text).unwrap();
        for cmd in ["verify", "simulate"] {
            refused(&tenplan(&[cmd, s(&path)]), needle, &format!("{cmd} with {what}"));
        }
    }
}

/// The JSON nodes of a document, as paths of keys and indices.
fn nodes(v: &serde_json::Value, at: &mut Vec<serde_json::Value>, out: &mut Vec<Vec<serde_json::Value>>) {
    out.push(at.clone());
    match v {
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate().take(4) {
                at.push(i.into());
                nodes(x, at, out);
                at.pop();
            }
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                at.push(k.clone().into());
                nodes(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn at_path<'a>(v: &'a mut serde_json::Value, path: &[serde_json::Value]) -> &'a mut serde_json::Value {
    path.iter().fold(v, |v, k| match k {
        serde_json::Value::String(k) => &mut v[k.as_str()],
        serde_json::Value::Number(i) => &mut v[i.as_u64().unwrap() as usize],
        _ => unreachable!(),
    })
}

fn hostile_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::json!(0)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(1u64 << 62)),
        Just(serde_json::json!(u64::MAX)),
        Just(serde_json::json!(1e300)),
        Just(serde_json::json!(4_294_967_296u64)),
        Just(serde_json::json!("x")),
        Just(serde_json::json!(null)),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
        any::<u32>().prop_map(|n| serde_json::json!(n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any one value of a plan file replaced by a hostile one: `verify` and
    /// `simulate` accept it (exit 0) or refuse it cleanly (1 or 4), never panic.
    #[test]
    fn any_damaged_plan_value_is_refused_or_accepted_cleanly(pick in any::<prop::sample::Index>(), value in hostile_value()) {
        let dir = scratch("plans");
        let (_, plan) = plan_file(dir.parent().unwrap());
        let mut all = Vec::new();
        nodes(&plan, &mut Vec::new(), &mut all);
        let path = &all[pick.index(all.len())];
        let mut damaged = plan.clone();
        *at_path(&mut damaged, path) = value.clone();
        let file = dir.with_file_name("damaged.json");
        fs::write(&file, damaged.to_string()).unwrap();
        for cmd in ["verify", "simulate"] {
            let r = tenplan(&[cmd, s(&file)]);
            prop_assert!(!r.stderr.contains("panicked"), "{cmd} at {path:?} = {value}: {}", r.stderr);
            prop_assert!(matches!(r.code, Some(0 | 1 | 4)), "{cmd} at {path:?} = {value}: {:?} {}", r.code, r.stderr);
            if r.code != Some(0) {
                prop_assert_eq!(r.stderr.lines().filter(|l| l.starts_with("error: ")).count(), 1);
            }
        }
    }

    /// Layout strings with random keys and oversized numbers: refused at once
    /// or planned, never a panic or a hang.
    #[test]
    fn layout_strings_with_any_numbers(key in prop::sample::select(vec!["tp", "pp", "dp", "ep", "zero"]), n in any::<u64>()) {
        let from = format!("{key}={n}");
        let r = tenplan(&["plan", "--model", "gpt-tiny", "--from", &from, "--to", "tp=1"]);
        prop_assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        prop_assert!(matches!(r.code, Some(0 | 1)), "{from}: {:?} {}", r.code, r.stderr);
    }
}

/// A small checkpoint and its manifest.
fn checkpoint(name: &str) -> (PathBuf, serde_json::Value) {
    let dir = scratch(name);
    let r = tenplan(&[
        "init",
        "--model",
        "gpt-tiny",
        "--layout",
        "tp=2,dp=2,zero=1",
        "--out",
        s(&dir),
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let m = serde_json::from_str(&fs::read_to_string(dir.join("tenplan.json")).unwrap()).unwrap();
    (dir, m)
}

#[test]
fn manifests_that_lie_about_their_shards_are_refused() {
    let (good, m) = checkpoint("good");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "buffer len 2^62",
            with(&m, |v| v["shards"][0]["buffers"][0]["len"] = (1u64 << 62).into()),
            "exceeds the limit",
        ),
        (
            "config tp=0",
            with(&m, |v| v["config"] = "tp=0".into()),
            "tp must be at least 1",
        ),
        (
            "config the shards do not have",
            with(&m, |v| v["config"] = "tp=4,dp=1,zero=1".into()),
            "does not build the manifest's shards",
        ),
        (
            "config of other ranks",
            with(&m, |v| v["config"] = "tp=2,dp=4,zero=1".into()),
            "ranks",
        ),
        (
            "one device per node and one node",
            with(&m, |v| {
                v["cluster"]["gpus_per_node"] = 1.into();
                v["cluster"]["nodes"] = 1.into();
                v["cluster"]["nics_per_node"] = 1.into();
            }),
            "but the layout uses device",
        ),
        (
            "another model",
            with(&m, |v| v["model"] = "llama-tiny".into()),
            "not those of the model",
        ),
        (
            "an unknown model",
            with(&m, |v| v["model"] = "gpt-huge".into()),
            "unknown model",
        ),
        (
            "another state",
            with(&m, |v| v["state"] = "weights:bf16".into()),
            "not those of the model",
        ),
        (
            "a bad state",
            with(&m, |v| v["state"] = "optimizer".into()),
            "unknown state",
        ),
        (
            "an unknown field in a shard",
            with(&m, |v| v["shards"][0]["colour"] = "red".into()),
            "unknown field",
        ),
    ];
    for (what, text, needle) in cases {
        let dir = scratch(&what.replace(' ', "-"));
        fs::create_dir_all(&dir).unwrap();
        for e in fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        fs::write(dir.join("tenplan.json"), text).unwrap();
        refused(&tenplan(&["check", s(&dir)]), needle, &format!("check with {what}"));
        let out = dir.with_file_name(format!("{}-out", what.replace(' ', "-")));
        let r = tenplan(&["reshard", "--src", s(&dir), "--to", "tp=1", "--out", s(&out)]);
        refused(&r, needle, &format!("reshard with {what}"));
        assert!(!out.exists(), "{what}: reshard left {}", out.display());
    }
}

/// What an interrupted write leaves: rank files under temporary names, the
/// incomplete-write marker, no manifest.
fn interrupted(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(".tenplan-incomplete"), "").unwrap();
    fs::write(dir.join(".rank-00000.safetensors.tmp"), vec![7u8; 4096]).unwrap();
    fs::write(dir.join("rank-00001.safetensors"), vec![7u8; 1024]).unwrap();
}

#[test]
fn an_interrupted_write_is_named_and_overwrite_replaces_it() {
    let (src, _) = checkpoint("src");
    for cmd in ["init", "reshard"] {
        let out = scratch(&format!("{cmd}-out"));
        interrupted(&out);
        let args: Vec<&str> = match cmd {
            "init" => vec!["init", "--model", "gpt-tiny", "--layout", "tp=4", "--out", s(&out)],
            _ => vec!["reshard", "--src", s(&src), "--to", "tp=4", "--out", s(&out)],
        };
        refused(&tenplan(&args), "incomplete write", cmd);
        refused(&tenplan(&["check", s(&out)]), "interrupted", cmd);
        let mut again = args.clone();
        again.push("--overwrite");
        let r = tenplan(&again);
        assert_eq!(r.code, Some(0), "{cmd} --overwrite: {}", r.stderr);
        let r = tenplan(&["check", s(&out)]);
        assert_eq!(r.code, Some(0), "{cmd}: {}", r.stderr);
        let left: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{cmd}: temporary files left: {left:?}");
    }
}

#[test]
fn overwrite_replaces_a_checkpoint_but_never_a_source_or_someone_elses_directory() {
    let (src, _) = checkpoint("src");
    let (old, _) = checkpoint("old");
    // A complete checkpoint: refused without --overwrite, replaced with it.
    let args = ["reshard", "--src", s(&src), "--to", "tp=1,dp=2", "--out", s(&old)];
    refused(&tenplan(&args), "already exists", "reshard over a checkpoint");
    let mut again = args.to_vec();
    again.push("--overwrite");
    let r = tenplan(&again);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let m = fs::read_to_string(old.join("tenplan.json")).unwrap();
    assert!(m.contains("\"config\":\"tp=1,dp=2\""), "{m}");
    assert!(!old.with_file_name(".old.tenplan-new").exists());
    // The source itself: never.
    let before = fs::read(src.join("tenplan.json")).unwrap();
    let r = tenplan(&[
        "reshard",
        "--src",
        s(&src),
        "--to",
        "tp=1",
        "--out",
        s(&src),
        "--overwrite",
    ]);
    refused(&r, "source", "reshard onto its source");
    assert_eq!(fs::read(src.join("tenplan.json")).unwrap(), before);
    // A directory of someone else's: never removed.
    let foreign = scratch("foreign");
    fs::create_dir_all(&foreign).unwrap();
    fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let r = tenplan(&[
        "init",
        "--model",
        "gpt-tiny",
        "--layout",
        "tp=2",
        "--out",
        s(&foreign),
        "--overwrite",
    ]);
    refused(&r, "not a tenplan checkpoint", "init over a foreign directory");
    assert_eq!(fs::read_to_string(foreign.join("notes.txt")).unwrap(), "mine");
}

#[test]
fn a_killed_write_is_recognised_and_recovered() {
    // Kill a real write part-way; whatever it left, a rerun says what it is
    // and --overwrite finishes the job.
    let out = scratch("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenplan"))
        .args([
            "init",
            "--model",
            "gpt3-350m",
            "--layout",
            "tp=2,dp=2",
            "--out",
            s(&out),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !out.join(".tenplan-incomplete").exists() && start.elapsed() < HANG {
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(100));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    let rerun = [
        "init",
        "--model",
        "gpt3-350m",
        "--layout",
        "tp=2,dp=2",
        "--out",
        s(&out),
    ];
    let r = tenplan(&rerun);
    if status.success() {
        refused(&r, "already exists", "rerun after a finished write");
    } else {
        refused(&r, "incomplete write", "rerun after kill -9");
    }
    let mut again = rerun.to_vec();
    again.push("--overwrite");
    let r = tenplan(&again);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = tenplan(&["check", s(&out)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let _ = fs::remove_dir_all(&out);
}

#[test]
fn other_commands_refuse_oversized_arguments() {
    let dir = scratch("data");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "data".into(),
                "--state".into(),
                "dataset_size=18446744073709551615,seed=1,consumed=0,global_batch=8".into(),
                "--layout".into(),
                "dp=2".into(),
                "--rank".into(),
                "0".into(),
                "--steps".into(),
                "1000000000000".into(),
            ],
            "samples asked for",
        ),
        (
            vec![
                "switch".into(),
                "--model".into(),
                "gpt-tiny".into(),
                "--cluster".into(),
                "1x8".into(),
                "--configs".into(),
                "tp=2,dp=4".into(),
                "dp=1000000".into(),
            ],
            "has 8 devices",
        ),
        (
            vec![
                "init".into(),
                "--model".into(),
                "gpt-tiny".into(),
                "--layout".into(),
                "dp=4294967295".into(),
                "--out".into(),
                s(&dir).into(),
            ],
            "exceeds the limit",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&tenplan(&args), needle, &args.join(" "));
    }
    assert!(!dir.exists());
}

#[test]
fn stdout_stays_empty_on_refusal() {
    let r = tenplan(&["plan", "--model", "gpt-tiny", "--from", "dp=4294967295", "--to", "tp=1"]);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

#[test]
fn hostile_model_configs_and_model_specs_are_refused() {
    let dir = scratch("qwen");
    fs::create_dir_all(&dir).unwrap();
    let config = r#"{"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40}"#;
    fs::write(dir.join("config.json"), config).unwrap();
    for (bad, needle) in [
        (config.replace("\"qwen2\"", "\"t5\""), "unknown model_type `t5`"),
        (
            config.replace("\"num_attention_heads\": 4,", ""),
            "missing field `num_attention_heads`",
        ),
        (config.replace("16", "-16"), "field `hidden_size` is -16"),
        (
            config.replace("\"vocab_size\": 40", "\"vocab_size\": 1e300"),
            "field `vocab_size` is 1e+300",
        ),
        ("{\"model_type\": \"llama\"".repeat(100_000), "not valid JSON"),
    ] {
        let d = scratch("bad");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("config.json"), &bad).unwrap();
        refused(&tenplan(&["models", "--model", s(&d)]), needle, needle);
    }
    refused(
        &tenplan(&["models", "--model", s(&scratch("nowhere"))]),
        "or a path to a Hugging Face config.json",
        "missing path",
    );
    let ckpt = scratch("ckpt");
    let r = tenplan(&["init", "--model", s(&dir), "--layout", "tp=2,pp=2", "--out", s(&ckpt)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let manifest: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(ckpt.join("tenplan.json")).unwrap()).unwrap();
    for (edit, needle) in [
        (
            with(&manifest, |m| m["model_spec"]["layers"] = (1u64 << 31).into()),
            "model_spec",
        ),
        (
            with(&manifest, |m| m["model_spec"]["name"] = "other".into()),
            "has a model_spec named `other`",
        ),
        (
            with(&manifest, |m| m["model_spec"]["vocab"] = 41.into()),
            "not those of the model",
        ),
    ] {
        fs::write(ckpt.join("tenplan.json"), edit).unwrap();
        refused(&tenplan(&["check", s(&ckpt)]), needle, needle);
    }
}
