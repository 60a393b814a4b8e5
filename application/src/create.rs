//! New checkpoints: with deterministic contents (`init`, for demos, tests
//! and benchmarks) or from a Hugging Face model (`import`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_executor::generate::{fill_region, tensor_key};
use tenplan_formats::checkpoint::{self, StoredBox, Written, NAMED_STATE};
use tenplan_formats::hf::HfModel;
use tenplan_formats::{CheckpointInfo, Destination, Source};
use tenplan_models::{hf_family, hf_layout, to_hf_config, HfFamily, ModelSpec, ModelState, StateKind};
use tenplan_ptc::{read_box, Cluster, DType, JobState, Layout, Problem, Region, TensorId, TensorSpec};

use crate::cluster::default_cluster;
use crate::problem::Config;
use crate::stored::{hf_model, original_config, Described, ModelArg, Progress};
use crate::{Error, Result};

/// The cluster a new checkpoint's layout lives on: the one given, or
/// enough DGX-H100 nodes for the configuration's devices. The
/// configuration is checked against it, and against this machine's
/// memory, before any layout is built.
fn cluster_of(given: Option<&Cluster>, state: &ModelState, cfg: &Config) -> Result<Cluster> {
    let cluster = match given {
        Some(c) => c.clone(),
        None => default_cluster(cfg.parsed().rank_devices()?.iter().max().map_or(1, |d| d + 1))?,
    };
    state
        .check_plannable(cfg.parsed(), &cluster)
        .map_err(|source| Error::Layout {
            layout: cfg.to_string(),
            source,
        })?;
    Ok(cluster)
}

/// The layout of `state` under `cfg`, checked to fit `cluster`.
fn layout_on(state: &ModelState, cfg: &Config, cluster: &Cluster) -> Result<Layout> {
    let layout = state.layout(cfg.parsed()).map_err(|source| Error::Layout {
        layout: cfg.to_string(),
        source,
    })?;
    Problem::new(layout.clone(), layout.clone(), cluster.clone())
        .map_err(|e| Error::request(format!("the layout does not fit the cluster: {e}")))?;
    Ok(layout)
}

/// Write a new checkpoint through `dest`, telling `progress`.
fn write<F>(
    dest: Destination,
    layout: &Layout,
    info: &CheckpointInfo,
    progress: &dyn Progress,
    fill: F,
) -> Result<Written>
where
    F: Fn(&StoredBox, &Region, &mut [u8]) -> tenplan_formats::Result<()> + Sync,
{
    progress.start(layout.tensors().iter().map(|t| t.bytes()).sum());
    let w = checkpoint::write(dest.path(), layout, info, None, fill, &|n| progress.advance(n))?;
    dest.commit()?;
    Ok(w)
}

/// A checkpoint with deterministic contents.
#[derive(Clone, Debug)]
pub struct InitRequest {
    /// The model.
    pub model: ModelSpec,
    /// The part of its state to write (`training`: bf16 weights and fp32
    /// optimizer state; or the weights alone in one type).
    pub state: StateKind,
    /// The parallel layout.
    pub layout: Config,
    /// The new checkpoint directory.
    pub out: PathBuf,
    /// Seed of the contents.
    pub seed: u64,
    /// The cluster the layout's devices belong to (default: enough DGX-H100 nodes).
    pub cluster: Option<Cluster>,
    /// The job's dataset and RNG state, kept in the manifest.
    pub job: JobState,
    /// Replace what `out` holds (swapped in only once the new checkpoint is complete).
    pub overwrite: bool,
}

/// What `init` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Initialized {
    /// The new checkpoint.
    pub out: PathBuf,
    /// The model's name.
    pub model: String,
    /// The layout, as given.
    pub layout: String,
    /// The state written (`training`, `weights:bf16`, ...).
    pub state: String,
    /// Files written.
    pub files: usize,
    /// Tensors.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub data_bytes: u64,
    /// Bytes of the files.
    pub file_bytes: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Write a checkpoint whose every tensor holds deterministic contents of
/// the seed (the same values whatever the layout).
pub fn init(req: &InitRequest, progress: &dyn Progress) -> Result<Initialized> {
    let state = ModelState::new(&req.model, req.state);
    let cluster = cluster_of(req.cluster.as_ref(), &state, &req.layout)?;
    let dest = Destination::new(&req.out, req.overwrite)?;
    let layout = layout_on(&state, &req.layout, &cluster)?;
    let info = CheckpointInfo {
        model: Some(req.model.clone()),
        config: Some(req.layout.to_string()),
        state: Some(req.state.to_string()),
        cluster,
        job: req.job,
        hf_config: None,
        scalars: Vec::new(),
    };
    let tensors = layout.tensors().clone();
    let keys: Vec<u64> = tensors.iter().map(|t| tensor_key(req.seed, t)).collect();
    let start = Instant::now();
    let w = write(dest, &layout, &info, progress, |b, slab, buf| {
        fill_region(keys[b.tensor as usize], &tensors[b.tensor as usize], slab, buf);
        Ok(())
    })?;
    Ok(Initialized {
        out: req.out.clone(),
        model: req.model.name.to_string(),
        layout: req.layout.to_string(),
        state: req.state.to_string(),
        files: w.manifest.files.len(),
        tensors: tensors.len(),
        data_bytes: w.data_bytes,
        file_bytes: w.file_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// A Hugging Face model sharded into a new checkpoint.
#[derive(Clone, Debug)]
pub struct ImportRequest {
    /// The model directory (`model.safetensors`, or an index and shards).
    pub hf: PathBuf,
    /// The model, when the directory's `config.json` should not decide it;
    /// names and shapes must match it.
    pub model: Option<ModelArg>,
    /// The parallel layout.
    pub layout: Config,
    /// The new checkpoint directory.
    pub out: PathBuf,
    /// Element type (default: the model files').
    pub dtype: Option<DType>,
    /// The cluster the layout's devices belong to (default: enough DGX-H100 nodes).
    pub cluster: Option<Cluster>,
    /// Leave out, on purpose, the model files' tensors whose names contain
    /// one of these (a tensor the model does not read is refused otherwise).
    pub exclude: Vec<String>,
    /// Replace what `out` holds (swapped in only once the new checkpoint is complete).
    pub overwrite: bool,
}

/// What `import` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Imported {
    /// The model directory.
    pub hf: PathBuf,
    /// The new checkpoint.
    pub out: PathBuf,
    /// The model's name.
    pub model: String,
    /// The layout, as given.
    pub layout: String,
    /// Element type written.
    pub dtype: String,
    /// Files written.
    pub files: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Tensors in the model files.
    pub hf_tensors: usize,
    /// Tensors of the model files left out on purpose (`exclude`).
    pub excluded: Vec<String>,
    /// The files' tensors kept under their own names (a family beyond
    /// tenplan's catalog, or files that mix element types), not Megatron's.
    pub files_names: bool,
    /// Bytes of tensor data.
    pub data_bytes: u64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Shard a Hugging Face safetensors model into a checkpoint. A model of
/// tenplan's catalog is laid out under Megatron's names (fused where
/// Megatron fuses); any other transformers family, and a file that mixes
/// element types, keeps the files' tensors under their own names, laid out
/// by the family's tensor-parallel plan.
pub fn import(req: &ImportRequest, progress: &dyn Progress) -> Result<Imported> {
    let start = Instant::now();
    let hf = Arc::new(HfModel::open(&req.hf)?);
    let model = hf_model(&req.hf, req.model.as_ref())?;
    let named = match &model.described {
        Described::Family { family, config } => Some((*family, config.clone())),
        // Mixed element types (DeepSeek-V3's f32 router bias in a bf16
        // model) are kept as they are, under the files' names.
        Described::Catalog(spec) if req.dtype.is_none() && hf.dtypes().len() > 1 => {
            let family = hf_family(spec.family.model_type()).ok_or_else(|| {
                Error::request(format!(
                    "{}: the files mix element types ({}); give --dtype to convert them",
                    req.hf.display(),
                    type_list(&hf)
                ))
            })?;
            let config = match model.original_config() {
                Some(c) => c,
                None => to_hf_config(spec)?,
            };
            Some((family, config))
        }
        Described::Catalog(_) => None,
    };
    match named {
        Some((family, config)) => import_named(req, &hf, family, config, start, progress),
        None => import_catalog(req, &hf, model.catalog("")?, start, progress),
    }
}

fn type_list(hf: &HfModel) -> String {
    hf.dtypes().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// [`import`] of a model beyond the catalog: the files' tensors under their
/// own names, each in its own element type.
fn import_named(
    req: &ImportRequest,
    hf: &Arc<HfModel>,
    family: &'static HfFamily,
    config: serde_json::Value,
    start: Instant,
    progress: &dyn Progress,
) -> Result<Imported> {
    if let Some(d) = req.dtype.filter(|&d| hf.dtypes() != BTreeSet::from([d])) {
        return Err(Error::request(format!(
            "--dtype {d}: the files hold {}; a model is imported under its files' names in their own element types",
            type_list(hf)
        )));
    }
    let state = hf.state()?;
    let all = state.layout().tensors().clone();
    let (excluded, kept): (Vec<TensorId>, Vec<TensorId>) = (0..all.len() as TensorId)
        .partition(|&t| req.exclude.iter().any(|p| all[t as usize].name.contains(p.as_str())));
    let tensors: Arc<[TensorSpec]> = kept.iter().map(|&t| all[t as usize].clone()).collect::<Vec<_>>().into();
    let cfg = req.layout.parsed();
    let cluster = match &req.cluster {
        Some(c) => c.clone(),
        None => default_cluster(cfg.rank_devices()?.iter().max().map_or(1, |d| d + 1))?,
    };
    cfg.check_cluster(&cluster)?;
    let layout = hf_layout(family, &config, tensors.clone(), cfg).map_err(|source| Error::Layout {
        layout: req.layout.to_string(),
        source,
    })?;
    let dest = Destination::new(&req.out, req.overwrite)?;
    let scalars: Vec<String> = tensors
        .iter()
        .filter(|t| state.scalars().contains(&t.name))
        .map(|t| t.name.clone())
        .collect();
    let info = CheckpointInfo {
        model: None,
        config: Some(req.layout.to_string()),
        state: Some(NAMED_STATE.to_string()),
        cluster,
        job: JobState::default(),
        hf_config: Some(config),
        scalars,
    };
    let boxes = state.all_boxes();
    let w = write(dest, &layout, &info, progress, |b, slab, buf| {
        let t = kept[b.tensor as usize] as usize;
        read_box(&boxes[t], slab, buf, all[t].dtype.size() as usize);
        Ok(())
    })?;
    let dtypes: BTreeSet<DType> = tensors.iter().map(|t| t.dtype).collect();
    Ok(Imported {
        hf: req.hf.clone(),
        out: req.out.clone(),
        model: family.model_type.clone(),
        layout: req.layout.to_string(),
        dtype: dtypes.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("+"),
        files: w.manifest.files.len(),
        tensors: tensors.len(),
        hf_tensors: hf.len(),
        excluded: excluded.iter().map(|&t| all[t as usize].name.clone()).collect(),
        files_names: true,
        data_bytes: w.data_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// [`import`] of a catalog model: its state under Megatron's names.
fn import_catalog(
    req: &ImportRequest,
    hf: &HfModel,
    spec: &ModelSpec,
    start: Instant,
    progress: &dyn Progress,
) -> Result<Imported> {
    // The state is what the files hold: DeepSeek-V3's MTP modules too.
    let spec = hf.held(spec, &req.exclude);
    let dtype = match req.dtype {
        Some(d) => d,
        None => hf
            .dtype()
            .ok_or_else(|| Error::request(format!("{}: the model files hold no tensor", req.hf.display())))?,
    };
    let kind = StateKind::Weights(dtype);
    let state = ModelState::new(&spec, kind);
    let cluster = cluster_of(req.cluster.as_ref(), &state, &req.layout)?;
    let dest = Destination::new(&req.out, req.overwrite)?;
    let layout = layout_on(&state, &req.layout, &cluster)?;
    let tensors = layout.tensors().clone();
    let sources = hf.sources(&spec, &tensors)?;
    let (excluded, lost): (Vec<String>, Vec<String>) = sources
        .unused()
        .iter()
        .cloned()
        .partition(|n| req.exclude.iter().any(|p| n.contains(p.as_str())));
    if !lost.is_empty() {
        let why = match sources.differing_copies() {
            [] => "is it another model (--model)?".to_string(),
            d => format!(
                "{} (an MTP module shares the model's embedding and output layer; tenplan keeps them once);",
                d.join(", ")
            ),
        };
        return Err(Error::request(format!(
            "{}: {} tensor{} of the model files {} not part of {} ({}{}): {why} leave {} out on purpose with --exclude PATTERN",
            req.hf.display(),
            lost.len(),
            if lost.len() == 1 { "" } else { "s" },
            if lost.len() == 1 { "is" } else { "are" },
            spec.name,
            lost.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            if lost.len() > 3 { ", ..." } else { "" },
            if lost.len() == 1 { "it" } else { "them" },
        )));
    }
    let info = CheckpointInfo {
        model: Some(spec.clone()),
        config: Some(req.layout.to_string()),
        state: Some(kind.to_string()),
        cluster,
        job: JobState::default(),
        hf_config: original_config(&req.hf, &spec),
        scalars: Vec::new(),
    };
    let w = write(dest, &layout, &info, progress, |b, slab, buf| {
        sources.fill(b.tensor, &tensors[b.tensor as usize], slab, buf);
        Ok(())
    })?;
    Ok(Imported {
        hf: req.hf.clone(),
        out: req.out.clone(),
        model: spec.name.to_string(),
        layout: req.layout.to_string(),
        dtype: dtype.to_string(),
        files: w.manifest.files.len(),
        tensors: tensors.len(),
        hf_tensors: hf.len(),
        excluded,
        files_names: false,
        data_bytes: w.data_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}
