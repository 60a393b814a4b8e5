//! The fuzz targets: one per parser of outside input, each with valid seeds
//! made by tenplan itself and the work a command does after parsing.

use std::path::{Path, PathBuf};

use tenplan_executor::generate::{fill_region, tensor_key};
use tenplan_formats::checkpoint::{self, Checkpoint, CheckpointInfo};
use tenplan_models::{find, ModelState, ParallelConfig, StateKind};
use tenplan_planner::{planner, simulate, Loads};
use tenplan_ptc::{limits, Cluster, JobState, Plan, Problem, Purpose};

/// The targets, in the order `all` runs them.
pub const NAMES: &[&str] = &[
    "layout",
    "cluster",
    "bytes",
    "plan",
    "problem",
    "manifest",
    "safetensors",
    "hf",
    "hf-index",
    "job",
    "hf-config",
    "dcp-metadata",
    "dcp-data",
];

/// What runs on one input: its outcome, `ok` or the error.
pub type Run = Box<dyn Fn(&[u8]) -> String>;

/// A fuzz target: seeds and what runs on an input.
pub struct Target {
    pub name: &'static str,
    pub seeds: Vec<Vec<u8>>,
    pub run: Run,
}

fn outcome<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

fn text(input: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(input).map_err(|_| "not UTF-8".to_string())
}

/// Problems the plan and problem targets start from.
fn problems() -> Vec<Problem> {
    let mut out = Vec::new();
    for (model, kind, from, to, cluster) in [
        ("gpt-tiny", StateKind::Training, "tp=2,dp=2", "tp=4", "2x4"),
        (
            "llama-tiny",
            StateKind::Training,
            "tp=2,pp=2,zero=1,dp=2",
            "tp=1,dp=2",
            "2x4",
        ),
        (
            "gpt-tiny",
            StateKind::Weights(tenplan_ptc::DType::BF16),
            "tp=2",
            "tp=2,dp=2,devices=4-7",
            "2x4",
        ),
        (
            "mixtral-tiny",
            StateKind::Training,
            "tp=1,dp=4,ep=2",
            "tp=2,dp=2",
            "1x4",
        ),
    ] {
        let state = ModelState::new(find(model).expect("catalog model"), kind);
        let layout = |s: &str| state.layout(&s.parse().expect("valid config")).expect("valid layout");
        let cluster = Cluster::parse(cluster).expect("valid cluster");
        out.push(Problem::new(layout(from), layout(to), cluster).expect("valid problem"));
    }
    out
}

fn plans() -> Vec<Plan> {
    let mut out = Vec::new();
    for (i, p) in problems().iter().enumerate() {
        let name = ["lp", "tenplex", "lp", "hotspa"][i];
        let plan = planner(name).expect("planner").plan(p).expect("plan");
        out.push(plan);
    }
    let staged = tenplan_planner::issue::stage(&out[0], 4096).expect("staged plan");
    out.push(staged);
    out
}

fn run_plan(input: &[u8]) -> String {
    let plan = match text(input).and_then(|t| Plan::from_json(t).map_err(|e| e.to_string())) {
        Ok(p) => p,
        Err(e) => return e,
    };
    // What `simulate` and `verify` do: cost (indices are valid once parsed), check, simulate.
    let loads = Loads::of(&plan);
    let _ = loads.max_time(plan.problem.cluster());
    match tenplan_proofs::check(&plan) {
        Ok(_) => {
            let r = simulate(&plan);
            format!("ok {}", r.makespan_s.is_finite())
        }
        Err(v) => v.to_string(),
    }
}

fn run_problem(input: &[u8]) -> String {
    let problem = match text(input).and_then(|t| Problem::from_json(t).map_err(|e| e.to_string())) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if let Ok(f) = tenplan_planner::fragments(&problem) {
        let _ = tenplan_planner::trivial_lower_bound(&problem, &f);
    }
    match planner("tenplex").expect("planner").plan(&problem) {
        Ok(plan) => outcome(tenplan_proofs::check(&plan)),
        Err(e) => e.to_string(),
    }
}

fn run_layout(input: &[u8]) -> String {
    let cfg: ParallelConfig =
        match text(input).and_then(|t| t.parse().map_err(|e: tenplan_models::Error| e.to_string())) {
            Ok(c) => c,
            Err(e) => return e,
        };
    let cluster = Cluster::parse("4x8").expect("valid cluster");
    let mut last = String::new();
    for model in ["gpt-tiny", "llama-tiny", "mixtral-tiny"] {
        let state = ModelState::new(find(model).expect("catalog model"), StateKind::Training);
        last = match cfg.check_cluster(&cluster).and_then(|_| state.estimate_pieces(&cfg)) {
            Ok(pieces) if pieces > 1 << 20 => format!("too many pieces: {pieces}"),
            Ok(_) => outcome(state.layout(&cfg)),
            Err(e) => e.to_string(),
        };
    }
    last
}

/// A tiny checkpoint written once; the manifest and safetensors targets
/// rewrite one of its files per input.
fn checkpoint_dir(work: &Path) -> PathBuf {
    let seed = work.join("seed");
    if Checkpoint::open(&seed).is_ok() {
        return seed;
    }
    let _ = std::fs::remove_dir_all(&seed);
    let state = ModelState::new(find("llama-tiny").expect("catalog model"), StateKind::Training);
    let layout = state
        .layout(&"tp=2,dp=2,zero=1".parse().expect("valid config"))
        .expect("layout");
    let tensors = layout.tensors().clone();
    let info = CheckpointInfo {
        model: Some(find("llama-tiny").expect("catalog model").clone()),
        config: Some("tp=2,dp=2,zero=1".into()),
        state: Some("training".into()),
        cluster: Cluster::parse("1x4").expect("valid cluster"),
        job: JobState::default(),
        hf_config: None,
        scalars: Vec::new(),
    };
    checkpoint::write(
        &seed,
        &layout,
        &info,
        None,
        |b, slab, buf| {
            let t = &tensors[b.tensor as usize];
            fill_region(tensor_key(1, t), t, slab, buf);
            Ok(())
        },
        &|_| {},
    )
    .expect("seed checkpoint");
    seed
}

/// A copy of the seed checkpoint to damage.
fn scratch_copy(seed: &Path, work: &Path) -> PathBuf {
    let dir = work.join("case");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    for e in std::fs::read_dir(seed).expect("seed checkpoint") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    dir
}

fn open_and_verify(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(c) => outcome(c.verify()),
        Err(e) => e.to_string(),
    }
}

/// A Hugging Face model directory of gpt-tiny's weights (tenplan's own
/// names, which `import` accepts): the one file of a tp=1 checkpoint.
fn hf_model(work: &Path) -> Vec<u8> {
    let dir = work.join("hf-seed");
    let _ = std::fs::remove_dir_all(&dir);
    let state = ModelState::new(
        find("gpt-tiny").expect("catalog model"),
        StateKind::Weights(tenplan_ptc::DType::BF16),
    );
    let layout = state.layout(&"tp=1".parse().expect("valid config")).expect("layout");
    let tensors = layout.tensors().clone();
    let info = CheckpointInfo {
        model: None,
        config: None,
        state: None,
        cluster: Cluster::parse("1x1").expect("valid cluster"),
        job: JobState::default(),
        hf_config: None,
        scalars: Vec::new(),
    };
    checkpoint::write(
        &dir,
        &layout,
        &info,
        None,
        |b, slab, buf| {
            let t = &tensors[b.tensor as usize];
            fill_region(tensor_key(1, t), t, slab, buf);
            Ok(())
        },
        &|_| {},
    )
    .expect("seed model");
    std::fs::read(dir.join(checkpoint::file_name(0))).expect("rank file")
}

/// What `tenplan import` does with a model directory after opening it.
fn import(dir: &Path) -> String {
    use tenplan_formats::hf::HfModel;
    let hf = match HfModel::open(dir) {
        Ok(m) => m,
        Err(e) => return e.to_string(),
    };
    let Some(dtype) = hf.dtype() else {
        return "no tensor".into();
    };
    let spec = find("gpt-tiny").expect("catalog model");
    let state = ModelState::new(spec, StateKind::Weights(dtype));
    outcome(hf.sources(spec, state.tensors()).map(|s| s.unused().len()))
}

/// The DCP checkpoint real torch wrote (tests/dcp/make_seed.py).
fn dcp_seed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/dcp")
}

/// What `tenplan check` does with a DCP checkpoint: open it, read every chunk.
fn check_dcp(dir: &Path) -> String {
    use tenplan_formats::dcp::{read_all, Dcp};
    match Dcp::open(dir) {
        Ok(d) => format!("ok {}", read_all(&d)),
        Err(e) => e.to_string(),
    }
}

/// A DCP target: the seed checkpoint with one file replaced by the input.
fn dcp_target(name: &'static str, work: &Path, file: &'static str) -> Target {
    let dir = scratch_copy(&dcp_seed(), work);
    let seed = std::fs::read(dir.join(file)).expect("seed file");
    Target {
        name,
        seeds: vec![seed],
        run: Box::new(move |input| {
            if std::fs::write(dir.join(file), input).is_err() {
                return "cannot write".into();
            }
            check_dcp(&dir)
        }),
    }
}

/// A Hugging Face config.json: parsed, and when it describes a small model,
/// its state and a tensor-parallel layout built.
fn run_hf_config(input: &[u8]) -> String {
    let t = match text(input) {
        Ok(t) => t,
        Err(e) => return e,
    };
    match tenplan_models::from_hf_config("fuzz", t) {
        Ok(spec) if spec.layers as u64 * (spec.experts as u64 + 1) <= 4096 => {
            let state = ModelState::new(&spec, StateKind::Training);
            let cfg: ParallelConfig = "tp=2,dp=2,zero=1".parse().expect("config");
            match state.estimate_pieces(&cfg) {
                Ok(p) if p > 1 << 20 => format!("too many pieces: {p}"),
                Ok(_) => outcome(state.layout(&cfg)),
                Err(e) => e.to_string(),
            }
        }
        other => outcome(other),
    }
}

/// What `plan --job` and `tenplan data` do with a job state: read it, list
/// ranks' micro-batches under a few layouts, advance it, draw from its streams.
fn run_job(input: &[u8]) -> String {
    let job: JobState = match text(input).and_then(|t| serde_json::from_str(t).map_err(|e| e.to_string())) {
        Ok(j) => j,
        Err(e) => return e,
    };
    let mut last = "ok".to_string();
    if let Some(d) = &job.dataset {
        for dp in [1, 3, 8] {
            for rank in [0, dp - 1] {
                if let Err(e) = d.micro_batches(dp, rank, 2, 5) {
                    last = e.to_string();
                }
            }
        }
        if let Err(e) = d.advance(3) {
            last = e.to_string();
        }
    }
    if let Some(r) = &job.rng {
        let u = r.stream(Purpose::Dropout { layer: 3 }, 7, 1).uniform(5);
        if !(0.0..1.0).contains(&u) {
            last = format!("uniform draw {u} outside [0, 1)");
        }
    }
    last
}

/// Make a target, writing what it needs under `work`.
pub fn make(name: &'static str, work: &Path) -> Target {
    std::fs::create_dir_all(work).expect("work directory");
    let strings = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
    match name {
        "layout" => Target {
            name,
            seeds: strings(&[
                "tp=2,pp=2,dp=2,zero=1",
                "tp=4,dp=4,ep=2",
                "tp=1,pp=3,dp=1,split=1:1:2",
                "tp=2,dp=2,devices=8-11",
                "tp=2,pp=2,dp=4,zero=1,ep=2,devices=0-15",
            ]),
            run: Box::new(run_layout),
        },
        "cluster" => Target {
            name,
            seeds: strings(&["4x4", "dgx-h100:16", "tenplex-onprem", "dgx-h100", "2x8"]),
            run: Box::new(|input| match text(input) {
                Ok(t) => match Cluster::parse(t) {
                    Ok(c) => {
                        let last = c.num_devices() - 1;
                        format!("ok {} {}", c.node_of(last), c.nic_of(last))
                    }
                    Err(e) => e.to_string(),
                },
                Err(e) => e,
            }),
        },
        "bytes" => Target {
            name,
            seeds: strings(&["2GiB", "1.5e9", "512 MB", "1048576", "80GB"]),
            run: Box::new(|input| match text(input) {
                Ok(t) => outcome(limits::parse_bytes(t)),
                Err(e) => e,
            }),
        },
        "plan" => Target {
            name,
            seeds: plans().iter().map(|p| p.to_json().into_bytes()).collect(),
            run: Box::new(run_plan),
        },
        "problem" => Target {
            name,
            seeds: problems().iter().map(|p| p.to_json().into_bytes()).collect(),
            run: Box::new(run_problem),
        },
        "manifest" => {
            let seed = checkpoint_dir(work);
            let manifest = std::fs::read(seed.join(checkpoint::MANIFEST_FILE)).expect("manifest");
            let work = work.to_path_buf();
            Target {
                name,
                seeds: vec![manifest],
                run: Box::new(move |input| {
                    let dir = work.join("case");
                    if !dir.join("rank-00000.safetensors").exists() {
                        scratch_copy(&seed, &work);
                    }
                    if std::fs::write(dir.join(checkpoint::MANIFEST_FILE), input).is_err() {
                        return "cannot write".into();
                    }
                    open_and_verify(&dir)
                }),
            }
        }
        "safetensors" => {
            let seed = checkpoint_dir(work);
            let file = "rank-00001.safetensors";
            let original = std::fs::read(seed.join(file)).expect("rank file");
            let manifest: serde_json::Value =
                serde_json::from_slice(&std::fs::read(seed.join(checkpoint::MANIFEST_FILE)).expect("manifest"))
                    .expect("manifest JSON");
            let work = work.to_path_buf();
            Target {
                name,
                seeds: vec![original],
                run: Box::new(move |input| {
                    let dir = work.join("case");
                    if !dir.join(file).exists() {
                        scratch_copy(&seed, &work);
                    }
                    // The manifest records the file's size: keep it equal so
                    // the header parser, not the size check, meets the damage.
                    let mut m = manifest.clone();
                    if let Some(files) = m["files"].as_array_mut() {
                        for f in files.iter_mut().filter(|f| f["file"] == file) {
                            f["bytes"] = serde_json::Value::from(input.len() as u64);
                        }
                    }
                    let ok = std::fs::write(dir.join(file), input).is_ok()
                        && std::fs::write(dir.join(checkpoint::MANIFEST_FILE), m.to_string()).is_ok();
                    if !ok {
                        return "cannot write".into();
                    }
                    open_and_verify(&dir)
                }),
            }
        }
        "hf" => {
            let seed = hf_model(work);
            let dir = work.join("case");
            std::fs::create_dir_all(&dir).expect("scratch directory");
            Target {
                name,
                seeds: vec![seed],
                run: Box::new(move |input| {
                    if std::fs::write(dir.join("model.safetensors"), input).is_err() {
                        return "cannot write".into();
                    }
                    import(&dir)
                }),
            }
        }
        "hf-index" => {
            let model = hf_model(work);
            let dir = work.join("case");
            std::fs::create_dir_all(&dir).expect("scratch directory");
            std::fs::write(dir.join("model-00001-of-00001.safetensors"), &model).expect("shard");
            let state = ModelState::new(
                find("gpt-tiny").expect("catalog model"),
                StateKind::Weights(tenplan_ptc::DType::BF16),
            );
            let map: serde_json::Map<String, serde_json::Value> = state
                .tensors()
                .iter()
                .map(|t| (t.name.clone(), "model-00001-of-00001.safetensors".into()))
                .collect();
            let index = serde_json::json!({"metadata": {"total_size": model.len()}, "weight_map": map});
            Target {
                name,
                seeds: vec![index.to_string().into_bytes()],
                run: Box::new(move |input| {
                    if std::fs::write(dir.join("model.safetensors.index.json"), input).is_err() {
                        return "cannot write".into();
                    }
                    import(&dir)
                }),
            }
        }
        "job" => Target {
            name,
            seeds: strings(&[
                r#"{"dataset":{"dataset_size":1000,"seed":7,"consumed":96,"global_batch":32},"rng":{"seed":1,"step":3}}"#,
                r#"{"dataset":{"dataset_size":10,"seed":0,"consumed":0,"global_batch":10}}"#,
                r#"{"rng":{"seed":18446744073709551615,"step":0}}"#,
                "{}",
            ]),
            run: Box::new(run_job),
        },
        "hf-config" => Target {
            name,
            seeds: strings(&[
                r#"{"model_type":"qwen2","hidden_size":16,"intermediate_size":24,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":40,"tie_word_embeddings":true}"#,
                r#"{"model_type":"qwen3_moe","hidden_size":16,"intermediate_size":24,"moe_intermediate_size":8,"num_experts":4,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"vocab_size":40,"decoder_sparse_step":2,"mlp_only_layers":[0]}"#,
                r#"{"model_type":"deepseek_v3","hidden_size":16,"intermediate_size":24,"moe_intermediate_size":8,"n_routed_experts":4,"n_shared_experts":1,"first_k_dense_replace":1,"q_lora_rank":8,"kv_lora_rank":8,"qk_nope_head_dim":4,"qk_rope_head_dim":2,"v_head_dim":4,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":40}"#,
                r#"{"architectures":["GPT2LMHeadModel"],"n_embd":16,"n_layer":2,"n_head":4,"n_positions":8,"vocab_size":40,"n_inner":null}"#,
                r#"{"model_type":"mixtral","hidden_size":16,"intermediate_size":8,"num_local_experts":2,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":40,"attention_bias":true}"#,
            ]),
            run: Box::new(run_hf_config),
        },
        // The pickled metadata, then a data file (torch.save archives).
        "dcp-metadata" => dcp_target(name, work, ".metadata"),
        "dcp-data" => dcp_target(name, work, "__1_0.distcp"),
        _ => unreachable!("names come from NAMES"),
    }
}
