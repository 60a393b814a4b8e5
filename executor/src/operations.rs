//! Checkpoint operations as one call each: open a source (a tenplan or a
//! PyTorch DCP checkpoint), build the target layout, plan, verify and
//! perform; check a checkpoint; export one as a Hugging Face model. The
//! command line and the Python package are two faces over these calls.
//!
//! ```no_run
//! use tenplan_executor::operations::{reshard_checkpoint, ReshardRequest};
//!
//! let req = ReshardRequest::new("ckpt/tp2", "ckpt/tp4", "tp=4,dp=1").unwrap();
//! let done = reshard_checkpoint(&req, &()).unwrap();
//! println!("{} copies, {} bytes read", done.copies, done.resharded.bytes_read);
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tenplan_models::{from_config_path, from_hf_config, resolve, ModelSpec, ModelState, ParallelConfig, StateKind};
use tenplan_planner::planner;
use tenplan_ptc::{Cluster, DType, JobState, Problem, Region, TensorSpec};

use crate::checkpoint::{Checkpoint, CheckpointInfo, Destination};
use crate::dcp::{self, Dcp};
use crate::hf_export::{self, Exported};
use crate::reshard::{reshard, Resharded, Source};
use crate::{Error, Result};

/// What a long operation tells as it goes: the bytes it will write, once,
/// then each batch of bytes written. `()` tells nobody.
pub trait Progress: Sync {
    /// The bytes the operation will write.
    fn start(&self, _total: u64) {}
    /// `bytes` more written.
    fn advance(&self, _bytes: u64) {}
}

impl Progress for () {}

/// The model of a PyTorch DCP checkpoint, which does not name it: `model`
/// (a catalog name, a `config.json` or a Hugging Face model directory), or a
/// `config.json` beside the checkpoint; with the original `config.json`
/// when there is one (an export writes it back).
pub fn dcp_model(dir: &Path, model: Option<&str>) -> Result<(ModelSpec, Option<Value>)> {
    let (spec, config_dir) = match model {
        Some(m) => {
            let spec = resolve(m)?;
            let p = PathBuf::from(m);
            let config_dir = if p.is_file() { p.parent().map(Path::to_path_buf) } else { Some(p) };
            (spec, config_dir)
        }
        None if dir.join("config.json").is_file() => (from_config_path(dir)?, Some(dir.to_path_buf())),
        None => {
            return Err(Error::Request {
                what: format!(
                    "{}: a DCP checkpoint does not name its model; give --model (a name, a config.json or a Hugging Face model directory)",
                    dir.display()
                ),
            })
        }
    };
    let config = config_dir.and_then(|d| original_config(&d, &spec));
    Ok((spec, config))
}

/// The weights state a DCP checkpoint holds of `spec`, in its element type.
pub fn dcp_state(d: &Dcp, spec: &ModelSpec) -> Result<ModelState> {
    let probe = ModelState::new(spec, StateKind::Weights(DType::BF16));
    let dtype = d.dtype_of(spec, probe.tensors()).ok_or_else(|| Error::Request {
        what: format!(
            "{}: no weight of {} found in the DCP checkpoint (is it a checkpoint of this model?)",
            d.dir().display(),
            spec.name
        ),
    })?;
    Ok(ModelState::new(spec, StateKind::Weights(dtype)))
}

/// The model directory's `config.json`, when it describes `spec`: kept in
/// a manifest so that an export writes it back.
pub fn original_config(dir: &Path, spec: &ModelSpec) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let same = from_hf_config(&spec.name, &text).ok()? == *spec;
    same.then(|| serde_json::from_str(&text).ok()).flatten()
}

/// The model of a Hugging Face directory: `model`, or its `config.json`.
pub fn hf_model_spec(dir: &Path, model: Option<&str>) -> Result<ModelSpec> {
    Ok(match model {
        Some(m) => resolve(m)?,
        None if dir.join("config.json").is_file() => from_config_path(dir)?,
        None => {
            return Err(Error::Request {
                what: format!("{} has no config.json: name the model with --model", dir.display()),
            })
        }
    })
}

/// The model a tenplan checkpoint's manifest names (`why` says what it is
/// needed for, in the error when it names none).
fn manifest_model(c: &Checkpoint, why: &str) -> Result<ModelSpec> {
    let dir = c.dir();
    match c.manifest().model() {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(Error::Request {
            what: format!("{}: the manifest names no model, so {why}", dir.display()),
        }),
        Err(what) => Err(Error::Manifest {
            path: dir.join(crate::checkpoint::MANIFEST_FILE),
            what,
        }),
    }
}

/// Refuse a model given for a tenplan checkpoint, which names its own.
fn no_model_for_tenplan(dir: &Path, model: Option<&str>) -> Result<()> {
    match model {
        Some(_) => Err(Error::Request {
            what: format!(
                "--model is for DCP checkpoints: {} names its model in its manifest",
                dir.display()
            ),
        }),
        None => Ok(()),
    }
}

/// A state stored in files, opened for resharding: what is read, and what
/// the output records of it.
pub struct OpenedSource {
    /// What a plan reads.
    pub source: Box<dyn Source>,
    /// The model.
    pub model: ModelSpec,
    /// The model state it holds.
    pub state: ModelState,
    /// The cluster its devices belong to.
    pub cluster: Cluster,
    /// The state's name for a manifest (`training`, `weights:bf16`, ...).
    pub state_label: Option<String>,
    /// The job's dataset and RNG state.
    pub job: JobState,
    /// The model's original `config.json`, when known.
    pub hf_config: Option<Value>,
    /// Source tensors the model does not read.
    pub unused: Vec<String>,
    /// Its format: `tenplan` or `PyTorch DCP`.
    pub format: &'static str,
}

impl OpenedSource {
    /// A tenplan checkpoint, or a DCP checkpoint mapped onto `model` (see
    /// [`dcp_model`]).
    pub fn open(dir: &Path, model: Option<&str>) -> Result<OpenedSource> {
        if dcp::is_dcp(dir) {
            let d = Arc::new(Dcp::open(dir)?);
            let (model, config) = dcp_model(dir, model)?;
            let state = dcp_state(&d, &model)?;
            let s = d.source(&model, state.tensors())?;
            return Ok(OpenedSource {
                cluster: Cluster::parse(&format!("dgx-h100:{}", d.ranks().max(1).div_ceil(8)))?,
                state_label: Some(state.kind().to_string()),
                job: JobState::default(),
                hf_config: config,
                unused: s.unused().to_vec(),
                source: Box::new(s),
                model,
                state,
                format: "PyTorch DCP",
            });
        }
        no_model_for_tenplan(dir, model)?;
        let c = Checkpoint::open(dir)?;
        let model = manifest_model(&c, "its target layout cannot be built")?;
        let m = c.manifest();
        let label = m.state.as_deref().unwrap_or("training");
        let kind = label.parse::<StateKind>()?;
        Ok(OpenedSource {
            state: ModelState::new(&model, kind),
            cluster: m.cluster.clone(),
            state_label: m.state.clone(),
            job: m.job,
            hf_config: m.hf_config.clone(),
            unused: Vec::new(),
            source: Box::new(c),
            model,
            format: "tenplan",
        })
    }
}

/// A checkpoint reshard: from a source checkpoint to a new one under
/// another parallel layout.
#[derive(Clone, Debug)]
pub struct ReshardRequest {
    /// The source: a tenplan checkpoint, or a PyTorch DCP checkpoint; never modified.
    pub src: PathBuf,
    /// The new checkpoint directory.
    pub out: PathBuf,
    /// The target layout.
    pub to: ParallelConfig,
    /// The target layout as given (recorded in the manifest).
    pub to_label: String,
    /// Model of a DCP source (see [`dcp_model`]).
    pub model: Option<String>,
    /// Cluster (default: the source's, grown to fit the target).
    pub cluster: Option<Cluster>,
    /// Planner name (see `tenplan_planner::PLANNERS`).
    pub planner: String,
    /// Replace what `out` holds (swapped in only once the new checkpoint is complete).
    pub overwrite: bool,
}

impl ReshardRequest {
    /// A reshard of `src` into `out` under the layout `to` (e.g.
    /// `tp=4,dp=1`), planned by `lp`, on the source's cluster.
    pub fn new(src: impl Into<PathBuf>, out: impl Into<PathBuf>, to: &str) -> Result<ReshardRequest> {
        Ok(ReshardRequest {
            src: src.into(),
            out: out.into(),
            to: to.parse()?,
            to_label: to.to_string(),
            model: None,
            cluster: None,
            planner: "lp".into(),
            overwrite: false,
        })
    }
}

/// What a checkpoint reshard did.
#[derive(Clone, Debug)]
pub struct ReshardOutcome {
    /// The source's format: `tenplan` or `PyTorch DCP`.
    pub src_format: &'static str,
    /// The model.
    pub model: ModelSpec,
    /// The planner that planned it.
    pub planner: String,
    /// Copies in the plan.
    pub copies: usize,
    /// Bytes read and the new checkpoint.
    pub resharded: Resharded,
    /// Source tensors the model does not read (DCP sources).
    pub unused: Vec<String>,
    /// Seconds planning took.
    pub plan_s: f64,
    /// Seconds performing the plan took.
    pub execute_s: f64,
    /// Seconds in all.
    pub seconds: f64,
}

/// True when two paths name the same existing file or directory.
fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Reshard a checkpoint: open the source, build the target layout, plan,
/// verify with the independent checker, and write the new checkpoint
/// atomically (the manifest last; `out` appears only when complete). The
/// output's digests are checked against the source's where it records
/// them.
pub fn reshard_checkpoint(req: &ReshardRequest, progress: &dyn Progress) -> Result<ReshardOutcome> {
    let start = Instant::now();
    let src = OpenedSource::open(&req.src, req.model.as_deref())?;
    let target_devices = req.to.rank_devices()?.iter().max().map_or(1, |d| d + 1);
    let cluster = match &req.cluster {
        Some(c) => c.clone(),
        None => {
            let need = Cluster::parse(&format!("dgx-h100:{}", target_devices.div_ceil(8)))?;
            if need.num_devices() > src.cluster.num_devices() {
                need
            } else {
                src.cluster.clone()
            }
        }
    };
    src.state.check_plannable(&req.to, &cluster)?;
    if req.overwrite && same_path(&req.src, &req.out) {
        return Err(Error::Request {
            what: format!(
                "--out {} is the source checkpoint: tenplan never modifies a source",
                req.out.display()
            ),
        });
    }
    let dest = Destination::new(&req.out, req.overwrite)?;
    let target = src.state.layout(&req.to)?;
    let problem = Problem::new(src.source.layout().clone(), target, cluster.clone())
        .map_err(|source| Error::TargetLayout { source })?
        .with_job(src.job);
    let p = planner(&req.planner)?;
    let t_plan = Instant::now();
    let plan = p.plan(&problem)?;
    let plan_s = t_plan.elapsed().as_secs_f64();
    let verified = tenplan_proofs::verify(&plan).map_err(|v| Error::Rejected { verdict: v.to_string() })?;
    let info = CheckpointInfo {
        model: Some(src.model.clone()),
        config: Some(req.to_label.clone()),
        state: src.state_label.clone(),
        cluster,
        job: src.job,
        hf_config: src.hf_config.clone(),
    };
    progress.start(problem.tensors().iter().map(|t| t.bytes()).sum());
    let t_exec = Instant::now();
    let resharded = reshard(&verified, src.source.as_ref(), dest.path(), &info, &|n| {
        progress.advance(n)
    })?;
    dest.commit()?;
    Ok(ReshardOutcome {
        src_format: src.format,
        model: src.model,
        planner: plan.planner.clone(),
        copies: plan.copies.len(),
        resharded,
        unused: src.unused,
        plan_s,
        execute_s: t_exec.elapsed().as_secs_f64(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// What a check of a checkpoint found (every byte read and checked).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Checked {
    /// A tenplan checkpoint: every tensor's digest matches its manifest.
    Tenplan {
        /// Model named by the manifest.
        model: Option<String>,
        /// Layout named by the manifest.
        layout: Option<String>,
        /// Files.
        files: usize,
        /// Tensors.
        tensors: usize,
        /// Bytes read.
        bytes: u64,
    },
    /// A PyTorch DCP checkpoint: every chunk found where the metadata says,
    /// of its type and shape, the chunks of each tensor covering it.
    Dcp {
        /// Ranks that wrote it.
        ranks: u32,
        /// Files.
        files: usize,
        /// Tensors.
        tensors: usize,
        /// Chunks.
        chunks: usize,
        /// Entries that are not tensors.
        others: Vec<String>,
        /// Bytes read.
        bytes: u64,
    },
}

/// Check a tenplan or DCP checkpoint, reading every byte.
pub fn check_checkpoint(dir: &Path) -> Result<Checked> {
    if dcp::is_dcp(dir) {
        let d = Dcp::open(dir)?;
        let bytes = dcp::read_all(&d);
        return Ok(Checked::Dcp {
            ranks: d.ranks(),
            files: d.files().count(),
            tensors: d.tensors().len(),
            chunks: d.tensors().iter().map(|t| t.chunks.len()).sum(),
            others: d.others().to_vec(),
            bytes,
        });
    }
    let c = Checkpoint::open(dir)?;
    let bytes = c.verify()?;
    let m = c.manifest();
    Ok(Checked::Tenplan {
        model: m.model.clone(),
        layout: m.config.clone(),
        files: m.files.len(),
        tensors: m.tensors.len(),
        bytes,
    })
}

/// Export a tenplan or DCP checkpoint's weights as a Hugging Face model
/// directory (`model.safetensors` shards of at most `max_shard_bytes`, an
/// index, `config.json`). `model` is for DCP checkpoints (see
/// [`dcp_model`]).
pub fn export_checkpoint(
    ckpt: &Path,
    model: Option<&str>,
    hf: &Path,
    max_shard_bytes: u64,
    progress: &dyn Progress,
) -> Result<(ModelSpec, Exported)> {
    if dcp::is_dcp(ckpt) {
        let d = Arc::new(Dcp::open(ckpt)?);
        let (model, config) = dcp_model(ckpt, model)?;
        let state = dcp_state(&d, &model)?;
        let source = d.source(&model, state.tensors())?;
        progress.start(state.tensors().iter().map(|t| t.bytes()).sum());
        let e = hf_export::export_from(&source, &model, config.as_ref(), hf, max_shard_bytes, &|n| {
            progress.advance(n)
        })?;
        return Ok((model, e));
    }
    no_model_for_tenplan(ckpt, model)?;
    let source = Checkpoint::open(ckpt)?;
    let model = manifest_model(&source, "its tensors have no Hugging Face names")?;
    progress.start(model_weight_bytes(&source, &model));
    let e = hf_export::export(&source, &model, hf, max_shard_bytes, &|n| progress.advance(n))?;
    Ok((model, e))
}

/// Bytes of the model's weights in a checkpoint (what an export writes).
pub fn model_weight_bytes(source: &Checkpoint, model: &ModelSpec) -> u64 {
    let names = model.weight_names();
    source
        .layout()
        .tensors()
        .iter()
        .filter(|t| names.contains(&t.name))
        .map(|t| t.bytes())
        .sum()
}

/// What [`diff_checkpoints`] found between two checkpoints or models.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DiffReport {
    /// What the first side is (`tenplan checkpoint`, `PyTorch DCP
    /// checkpoint`, `Hugging Face model`).
    pub a_kind: &'static str,
    /// What the second side is.
    pub b_kind: &'static str,
    /// Every tensor on both sides, equal.
    pub identical: bool,
    /// Tensors equal on both sides.
    pub same: usize,
    /// Tensors on both sides that differ (type, shape or contents).
    pub different: Vec<crate::diff::Difference>,
    /// The first tensor whose contents differ, down to its first differing
    /// element.
    pub first_difference: Option<crate::diff::FirstDifference>,
    /// Where the first side keeps that element (a stored box, or a Hugging
    /// Face tensor's row).
    pub first_difference_in_a: Option<String>,
    /// Where the second side keeps it.
    pub first_difference_in_b: Option<String>,
    /// Tensors only the first side has.
    pub only_a: Vec<String>,
    /// Tensors only the second side has.
    pub only_b: Vec<String>,
    /// Bytes digested on both sides.
    pub bytes: u64,
}

/// Compare two checkpoints or models, each a tenplan checkpoint, a PyTorch
/// DCP checkpoint or a Hugging Face model directory, tensor by tensor under
/// tenplan's names (whatever their layouts): digests first, then the first
/// differing element of the first tensor that differs. `model` names the
/// model of a DCP checkpoint or of a Hugging Face directory without a
/// config.json; `weights_only` leaves optimizer state and gradients out.
pub fn diff_checkpoints(a: &Path, b: &Path, model: Option<&str>, weights_only: bool) -> Result<DiffReport> {
    let ((side_a, ma, a_kind), (side_b, mb, b_kind)) = (DiffSide::open(a, model)?, DiffSide::open(b, model)?);
    let (mut da, mut db) = (side_a.digests()?, side_b.digests()?);
    if weights_only {
        for (digests, model, dir) in [(&mut da, &ma, a), (&mut db, &mb, b)] {
            let Some(model) = model else {
                return Err(Error::Request {
                    what: format!(
                        "{}: names no model, so weights only cannot tell its weights",
                        dir.display()
                    ),
                });
            };
            let names = model.weight_names();
            digests.retain(|t| names.contains(&t.name));
        }
    }
    let d = crate::diff::compare(&da, &db);
    let first = match d.different.iter().find(|x| x.what.starts_with("contents")) {
        Some(x) => side_a.with_tensor(&x.name, |x| -> Result<_> {
            let Some((spec, fa)) = x else { return Ok(None) };
            side_b.with_tensor(&spec.name, |y| {
                let (_, fb) = y?;
                crate::diff::first_difference(spec, fa, fb)
            })
        })??,
        None => None,
    };
    let (in_a, in_b) = match &first {
        Some(f) => (side_a.locate(&f.tensor, &f.index)?, side_b.locate(&f.tensor, &f.index)?),
        None => (None, None),
    };
    let bytes = da
        .iter()
        .chain(&db)
        .map(|t| t.shape.iter().product::<u64>() * t.dtype.size())
        .sum();
    Ok(DiffReport {
        a_kind,
        b_kind,
        identical: d.identical(),
        same: d.same,
        different: d.different,
        first_difference: first,
        first_difference_in_a: in_a,
        first_difference_in_b: in_b,
        only_a: d.only_a,
        only_b: d.only_b,
        bytes,
    })
}

/// One side of a diff, open.
enum DiffSide {
    Tenplan(Box<Checkpoint>),
    Dcp(dcp::DcpSource),
    Hf(crate::hf::HfModel, ModelState),
}

impl DiffSide {
    fn open(dir: &Path, model: Option<&str>) -> Result<(DiffSide, Option<ModelSpec>, &'static str)> {
        if dir.join(crate::checkpoint::MANIFEST_FILE).is_file() {
            let c = Checkpoint::open(dir)?;
            let spec = c.manifest().model().map_err(|e| Error::file(dir, e))?;
            return Ok((DiffSide::Tenplan(Box::new(c)), spec, "tenplan checkpoint"));
        }
        if dcp::is_dcp(dir) {
            let d = Arc::new(Dcp::open(dir)?);
            let (spec, _) = dcp_model(dir, model)?;
            let state = dcp_state(&d, &spec)?;
            let source = d.source(&spec, state.tensors())?;
            return Ok((DiffSide::Dcp(source), Some(spec), "PyTorch DCP checkpoint"));
        }
        let hf = crate::hf::HfModel::open(dir).map_err(|e| {
            Error::file(
                dir,
                format!("neither a tenplan checkpoint (no tenplan.json), a DCP checkpoint (no .metadata) nor a Hugging Face model: {e}"),
            )
        })?;
        let spec = hf_model_spec(dir, model)?;
        let dtype = hf
            .dtype()
            .ok_or_else(|| Error::file(dir, "the model files hold no tensor"))?;
        let state = ModelState::new(&spec, StateKind::Weights(dtype));
        Ok((DiffSide::Hf(hf, state), Some(spec), "Hugging Face model"))
    }

    /// The stored boxes of a tenplan or DCP checkpoint.
    fn stored(&self) -> Option<&dyn Source> {
        match self {
            DiffSide::Tenplan(c) => Some(c.as_ref()),
            DiffSide::Dcp(s) => Some(s),
            DiffSide::Hf(..) => None,
        }
    }

    fn digests(&self) -> Result<Vec<crate::diff::TensorDigest>> {
        Ok(match self {
            DiffSide::Tenplan(c) => crate::diff::checkpoint_digests(c)?,
            DiffSide::Dcp(s) => crate::diff::source_digests(s),
            DiffSide::Hf(hf, state) => {
                let dtype = state.tensors().first().map_or(DType::BF16, |t| t.dtype);
                crate::diff::hf_digests(hf, state.spec(), dtype)?
            }
        })
    }

    /// Call `f` with the tensor `name`'s spec and a filler of its regions,
    /// or with `None` when this side has no such tensor.
    fn with_tensor<R>(
        &self,
        name: &str,
        f: impl FnOnce(Option<(&TensorSpec, &dyn Fn(&Region, &mut [u8]))>) -> R,
    ) -> Result<R> {
        if let Some(s) = self.stored() {
            let (tensors, boxes) = (s.layout().tensors(), s.all_boxes());
            let Some(t) = tensors.iter().position(|t| t.name == name) else {
                return Ok(f(None));
            };
            let elem = tensors[t].dtype.size() as usize;
            let fill = |r: &Region, out: &mut [u8]| {
                crate::read_box(&boxes[t], r, out, elem);
            };
            return Ok(f(Some((&tensors[t], &fill))));
        }
        let DiffSide::Hf(hf, state) = self else {
            return Ok(f(None));
        };
        let tensors = state.tensors();
        let sources = hf.sources(state.spec(), tensors)?;
        let Some(t) = tensors.iter().position(|t| t.name == name) else {
            return Ok(f(None));
        };
        let fill = |r: &Region, out: &mut [u8]| sources.fill(t as u32, &tensors[t], r, out);
        Ok(f(Some((&tensors[t], &fill))))
    }

    /// Where this side keeps element `index` of tensor `name`: the stored
    /// box holding it, or the Hugging Face tensor and row.
    fn locate(&self, name: &str, index: &[u64]) -> Result<Option<String>> {
        let point = Region::new(index.iter().map(|&i| i..i + 1))?;
        if let Some(s) = self.stored() {
            let (tensors, boxes) = (s.layout().tensors(), s.all_boxes());
            return Ok(tensors.iter().position(|t| t.name == name).and_then(|t| {
                let b = boxes[t].iter().find(|b| b.region.contains(&point))?;
                let r: Vec<String> = (0..b.region.ndim())
                    .map(|d| format!("{}..{}", b.region.range(d).start, b.region.range(d).end))
                    .collect();
                Some(format!("box [{}]", r.join(", ")))
            }));
        }
        let DiffSide::Hf(_, state) = self else { return Ok(None) };
        Ok(state.tensors().iter().find(|t| t.name == name).and_then(|t| {
            let row = *index.first()?;
            let l = crate::hf::links(state.spec(), t)
                .into_iter()
                .find(|l| l.rows.contains(&row))?;
            let at = l.at + row - l.rows.start;
            let unit = match (l.transposed, l.hf_shape.len()) {
                (true, _) => "column",
                (false, 1) => "element",
                _ => "row",
            };
            Some(format!("`{}` {unit} {at}", l.hf))
        }))
    }
}
