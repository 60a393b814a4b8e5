//! Reshard a checkpoint (tenplan's, or a PyTorch DCP checkpoint) into a new
//! one under another layout: plan, check with the independent checker,
//! perform through memory maps, verify digests.
//!
//! Two kinds of target. A DTensor mesh (`dp_shard=2`, `dp_replicate=2,
//! dp_shard=2`, torchtitan's names) takes the state as the source holds it:
//! every tensor under its own name — model weights, optimizer moments and
//! steps alike — and every other entry carried as it is; the output is in
//! the source's format, so a DCP checkpoint loads back into the job that
//! wrote it with `dcp.load`. A Megatron configuration (`tp=4,dp=2`) lays
//! out the model's state as tenplan's catalog describes it; a source entry
//! that state has no place for is refused by name unless the request
//! leaves it out explicitly (`weights_only`, `exclude`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_executor::{reshard as perform, reshard_to_dcp};
use tenplan_formats::dcp::{self, Dcp, DcpExtras, TransformerImpl};
use tenplan_formats::{Checkpoint, CheckpointInfo, Destination, Source};
use tenplan_models::{is_mesh, is_unsharded_buffer, torch_dist_layout, MeshConfig, TensorPlacement, TpPlacement};
use tenplan_planner::PlannerSpec;
use tenplan_ptc::{Cluster, Layout, Problem, TensorId, TensorSpec};

use crate::assess::plan;
use crate::cluster::default_cluster;
use crate::problem::Config;
use crate::stored::{no_model_for_tenplan, Described, ModelArg, OpenedModel, OpenedSource, Progress};
use crate::{Error, Result};

/// A DTensor mesh as it was given: parsed, and spelled as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    parsed: MeshConfig,
    text: String,
}

impl Mesh {
    /// The mesh.
    pub fn parsed(&self) -> &MeshConfig {
        &self.parsed
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Where a reshard puts the state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The model's state under a Megatron configuration (`tp=4,pp=2,dp=2`).
    Megatron(Config),
    /// The state as the source holds it, on a DTensor mesh (`dp_shard=2`).
    Mesh(Mesh),
}

impl FromStr for Target {
    type Err = tenplan_models::Error;

    /// A mesh when the string names torchtitan's `dp_shard` or
    /// `dp_replicate`, else a Megatron configuration.
    fn from_str(s: &str) -> std::result::Result<Target, Self::Err> {
        if is_mesh(s) {
            Ok(Target::Mesh(Mesh {
                parsed: s.parse()?,
                text: s.to_string(),
            }))
        } else {
            s.parse().map(Target::Megatron).map_err(|e| match e {
                // Either kind of target may follow --to: say the mesh's keys too.
                tenplan_models::Error::ParseLayout { input, why } if why.starts_with("unknown key") => {
                    tenplan_models::Error::ParseLayout {
                        input,
                        why: format!("{why}; or, for a DTensor mesh, pp, pp_schedule, pp_layers_per_stage, dp_replicate, dp_shard, cp, tp, ep, devices"),
                    }
                }
                e => e,
            })
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Megatron(c) => c.fmt(f),
            Target::Mesh(m) => m.fmt(f),
        }
    }
}

/// The format a reshard writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum Format {
    /// A tenplan checkpoint (safetensors files and a manifest).
    #[serde(rename = "tenplan")]
    Tenplan,
    /// A PyTorch DCP checkpoint (`.metadata` and `.distcp` files).
    #[serde(rename = "PyTorch DCP")]
    Dcp,
    /// A Megatron-Core `torch_dist` checkpoint (a DCP checkpoint beside
    /// `metadata.json` and `common.pt`).
    #[serde(rename = "Megatron-Core torch_dist")]
    TorchDist,
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Format> {
        match s {
            "tenplan" => Ok(Format::Tenplan),
            "dcp" => Ok(Format::Dcp),
            "torch_dist" => Ok(Format::TorchDist),
            other => Err(Error::request(format!(
                "unknown format `{other}` (expected tenplan, dcp or torch_dist)"
            ))),
        }
    }
}

/// A checkpoint reshard: from a source checkpoint to a new one under
/// another layout.
#[derive(Clone, Debug)]
pub struct ReshardRequest {
    /// The source: a tenplan checkpoint, or a PyTorch DCP checkpoint; never modified.
    pub src: PathBuf,
    /// The new checkpoint directory.
    pub out: PathBuf,
    /// The target layout (recorded as given).
    pub to: Target,
    /// Model of a DCP source under a Megatron target (default: a
    /// `config.json` beside it).
    pub model: Option<ModelArg>,
    /// Cluster (default: the source's, grown to fit the target).
    pub cluster: Option<Cluster>,
    /// The planner.
    pub planner: PlannerSpec,
    /// The format to write (default: the source's for a mesh target,
    /// tenplan's for a Megatron one).
    pub format: Option<Format>,
    /// Leave out, on purpose, source entries the target has no place for
    /// that are not model weights (optimizer state, other entries).
    pub weights_only: bool,
    /// Leave out, on purpose, the source entries whose names contain one of
    /// these.
    pub exclude: Vec<String>,
    /// A mesh target's tensor-parallel placements by name pattern (the last
    /// that matches a tensor decides), over the model's plan.
    pub place: Vec<TpPlacement>,
    /// A mesh target's FSDP2 placements by name pattern (`Shard(d)`, as a
    /// job's `shard_placement_fn` says; the last that matches decides),
    /// over FSDP2's default `Shard(0)`.
    pub fsdp_place: Vec<TpPlacement>,
    /// The layer implementation a Megatron-Core `torch_dist` output of a
    /// model is written for (the names of some norms; default Transformer
    /// Engine's, Megatron-LM's default). A Megatron-Core source keeps its
    /// own names.
    pub transformer_impl: Option<TransformerImpl>,
    /// Replace what `out` holds (swapped in only once the new checkpoint is complete).
    pub overwrite: bool,
}

impl ReshardRequest {
    /// A reshard of `src` into `out` under the layout `to`, planned by
    /// `lp`, on the source's cluster.
    pub fn new(src: impl Into<PathBuf>, out: impl Into<PathBuf>, to: Target) -> ReshardRequest {
        ReshardRequest {
            src: src.into(),
            out: out.into(),
            to,
            model: None,
            cluster: None,
            planner: PlannerSpec::named("lp").expect("lp is a planner"),
            format: None,
            weights_only: false,
            exclude: Vec::new(),
            place: Vec::new(),
            fsdp_place: Vec::new(),
            transformer_impl: None,
            overwrite: false,
        }
    }

    /// Whether the request leaves the entry `name` out on purpose.
    fn excludes(&self, name: &str) -> bool {
        self.exclude.iter().any(|p| name.contains(p.as_str()))
    }
}

/// What a checkpoint reshard did.
#[derive(Clone, Debug, Serialize)]
pub struct Resharded {
    /// The source.
    pub src: PathBuf,
    /// The source's format: `tenplan` or `PyTorch DCP`.
    pub src_format: &'static str,
    /// The new checkpoint.
    pub out: PathBuf,
    /// Its format.
    pub format: Format,
    /// The target layout, as given.
    pub to: String,
    /// The model's name (for a mesh target: none is needed).
    pub model: Option<String>,
    /// The planner that planned it.
    pub planner: String,
    /// Copies in the plan.
    pub copies: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Entries that are not tensors, carried.
    pub other_entries: usize,
    /// Bytes read from the source (tensor data).
    pub bytes_read: u64,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
    /// Bytes of the new files.
    pub file_bytes: u64,
    /// Files of the new checkpoint.
    pub files: usize,
    /// Source entries left out on purpose (`weights_only`, `exclude`).
    pub excluded: Vec<String>,
    /// Seconds planning took.
    pub plan_seconds: f64,
    /// Seconds performing the plan took.
    pub execute_seconds: f64,
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

/// Whether a source entry is optimizer state (as PyTorch's
/// `get_state_dict` and optimizers' own state dicts name it), which
/// `weights_only` leaves out.
pub fn is_optimizer_state(name: &str) -> bool {
    name.contains("optim")
        || [
            ".exp_avg",
            ".exp_avg_sq",
            ".step",
            ".momentum_buffer",
            ".max_exp_avg_sq",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// Refuse source entries the target has no place for, unless the request
/// leaves them out on purpose (`weights_only` leaves out optimizer state
/// and `others`, the entries that are not tensors; `exclude` what it
/// names); returns those it leaves out.
fn nothing_lost(req: &ReshardRequest, unused: &[String], others: &[String]) -> Result<Vec<String>> {
    let (excluded, lost): (Vec<String>, Vec<String>) = unused
        .iter()
        .cloned()
        .partition(|n| req.excludes(n) || (req.weights_only && (is_optimizer_state(n) || others.contains(n))));
    if lost.is_empty() {
        return Ok(excluded);
    }
    let shown: Vec<&str> = lost.iter().take(3).map(String::as_str).collect();
    // A PyTorch optimizer's Adam state reaches a Megatron layout as
    // Megatron's distributed optimizer state.
    let adam = match req.format != Some(Format::TorchDist) && lost.iter().any(|n| n.ends_with(".exp_avg")) {
        true => "; Adam moments reach it as Megatron's distributed optimizer state with --format torch_dist",
        false => "",
    };
    Err(Error::request(format!(
        "{}: {} entr{} of the source would not reach the output ({}{}): `{}` lays out the model's weights only{adam}; \
         keep everything with a mesh target (--to dp_shard=N), or leave entries out on purpose with --weights-only \
         (optimizer state and entries that are not tensors) or --exclude PATTERN",
        req.src.display(),
        lost.len(),
        if lost.len() == 1 { "y" } else { "ies" },
        shown.join(", "),
        if lost.len() > 3 { ", ..." } else { "" },
        req.to
    )))
}

/// Reshard a checkpoint: open the source, build the target layout, plan,
/// verify with the independent checker, and write the new checkpoint
/// atomically (the metadata last; `out` appears only when complete).
pub fn reshard(req: &ReshardRequest, progress: &dyn Progress) -> Result<Resharded> {
    if req.overwrite && same_path(&req.src, &req.out) {
        return Err(Error::request(format!(
            "--out {} is the source checkpoint: tenplan never modifies a source",
            req.out.display()
        )));
    }
    match &req.to {
        // A Megatron-Core checkpoint moves to another configuration as it
        // is, in its own format, unless a tenplan checkpoint is asked for.
        Target::Megatron(cfg) if !req.place.is_empty() || !req.fsdp_place.is_empty() => Err(Error::request(format!(
            "--place / --fsdp-place {} places tensors on a mesh; `{cfg}` is a Megatron layout, which splits as Megatron does",
            req.place.first().or(req.fsdp_place.first()).map(ToString::to_string).unwrap_or_default()
        ))),
        Target::Megatron(cfg) if is_torch_dist(&req.src) && req.format != Some(Format::Tenplan) => {
            reshard_state(req, StateTarget::TorchDist(cfg.parsed()), progress)
        }
        Target::Megatron(cfg) => reshard_model(req, cfg, progress),
        Target::Mesh(mesh) => reshard_state(req, StateTarget::Mesh(mesh.parsed()), progress),
    }
}

/// Whether `dir` is a Megatron-Core distributed checkpoint.
fn is_torch_dist(dir: &Path) -> bool {
    dcp::is_dcp(dir) && dcp::is_megatron(dir)
}

/// A target that takes the state as the source holds it.
#[derive(Clone, Copy)]
enum StateTarget<'a> {
    /// A DTensor mesh: FSDP2's and HSDP's placements.
    Mesh(&'a MeshConfig),
    /// A Megatron-Core configuration of a `torch_dist` checkpoint's state.
    TorchDist(&'a tenplan_models::ParallelConfig),
}

impl StateTarget<'_> {
    fn rank_devices(&self) -> Result<Vec<u32>> {
        Ok(match self {
            StateTarget::Mesh(m) => m.rank_devices()?,
            StateTarget::TorchDist(c) => c.rank_devices()?,
        })
    }

    fn check_cluster(&self, cluster: &Cluster) -> Result<()> {
        match self {
            StateTarget::Mesh(m) => m.check_cluster(cluster)?,
            StateTarget::TorchDist(c) => c.check_cluster(cluster)?,
        }
        Ok(())
    }

    /// The layout of `tensors` (the state kept), whose 0-d tensors are `scalars`.
    fn layout(
        &self,
        tensors: Arc<[TensorSpec]>,
        scalars: &std::collections::BTreeSet<String>,
        model: Option<&ModelArg>,
        place: &[TpPlacement],
        fsdp_place: &[TpPlacement],
    ) -> Result<Layout> {
        Ok(match self {
            StateTarget::Mesh(m) => {
                let placed = placements(m, &tensors, scalars, model, place)?;
                let placed = with_fsdp_placements(placed, &tensors, fsdp_place)?;
                m.layout(tensors, &|t, _| Ok(placed[t as usize]))?
            }
            StateTarget::TorchDist(c) => torch_dist_layout(tensors, c)?,
        })
    }
}

/// The cluster a target on `devices` devices runs on: the one asked, or
/// the source's grown to fit.
fn cluster_for(req: &ReshardRequest, source: &Cluster, devices: u32) -> Result<Cluster> {
    Ok(match &req.cluster {
        Some(c) => c.clone(),
        None => {
            let need = default_cluster(devices)?;
            if need.num_devices() > source.num_devices() {
                need
            } else {
                source.clone()
            }
        }
    })
}

/// A Megatron target: the model's state as the catalog lays it out.
fn reshard_model(req: &ReshardRequest, cfg: &Config, progress: &dyn Progress) -> Result<Resharded> {
    let start = Instant::now();
    if req.format == Some(Format::Dcp) {
        return Err(Error::request(format!(
            "a Megatron target (`{cfg}`) is written as a tenplan checkpoint or (--format torch_dist) a Megatron-Core one; DCP output needs a mesh target such as dp_shard=N"
        )));
    }
    let format = req.format.unwrap_or(Format::Tenplan);
    // A torch_dist output carries a PyTorch optimizer's Adam moments as
    // Megatron's distributed optimizer state.
    let adam = format == Format::TorchDist && !req.weights_only;
    let src = OpenedSource::open_as(&req.src, req.model.as_ref(), &req.exclude, adam)?;
    // A torch_dist output holds a model's weights: a training state's
    // optimizer and gradients stay behind when the request says so.
    let all = src.source.layout();
    let kept: Vec<TensorId> = (0..all.tensors().len() as TensorId)
        .filter(|&t| {
            let name = &all.tensors()[t as usize].name;
            !(format == Format::TorchDist
                && req.weights_only
                && (name.starts_with("optimizer.") || name.starts_with("grad.")))
        })
        .collect();
    let everything = kept.len() == all.tensors().len();
    let source_layout = match everything {
        true => all.clone(),
        false => all.restricted(&kept)?,
    };
    // Megatron-Core's saved names for the model's tensors, decided (or
    // refused) before anything is planned or written.
    let torch_dist = match format {
        Format::TorchDist => {
            let mut extras = dcp::torch_dist_extras(source_layout.tensors(), req.transformer_impl.unwrap_or_default())?;
            if let Some((optimizer, params)) = &src.adam {
                extras.side_files.insert(
                    dcp::COMMON_FILE.to_string(),
                    dcp::distributed_optimizer_common(params, optimizer)?,
                );
            }
            Some(extras)
        }
        _ if req.transformer_impl.is_some() => {
            return Err(not_named_by_impl(req, "is written as a tenplan checkpoint"))
        }
        _ => None,
    };
    let mut excluded = nothing_lost(req, &src.unused, &src.others)?;
    excluded.extend(
        all.tensors()
            .iter()
            .enumerate()
            .filter(|(t, _)| kept.binary_search(&(*t as TensorId)).is_err())
            .map(|(_, spec)| spec.name.clone()),
    );
    let to = cfg.parsed();
    let cluster = cluster_for(req, &src.cluster, to.rank_devices()?.iter().max().map_or(1, |d| d + 1))?;
    let mut target = src.model.layout(all.tensors().clone(), to, &cluster)?;
    if !everything {
        target = target.restricted(&kept)?;
    }
    let dest = Destination::new(&req.out, req.overwrite)?;
    let problem = Problem::new(source_layout, target, cluster.clone())
        .map_err(|source| Error::TargetLayout { source })?
        .with_job(src.job);
    let restricted;
    let reading: &dyn Source = match everything {
        true => src.source.as_ref(),
        false => {
            restricted = Restricted {
                inner: src.source.as_ref(),
                layout: problem.source(),
                kept: &kept,
            };
            &restricted
        }
    };
    let planned = plan(&problem, &req.planner)?;
    let plan = planned.plan;
    let verified = tenplan_proofs::verify(&plan).map_err(|v| Error::PlanRejected { verdict: v.to_string() })?;
    let info = CheckpointInfo {
        model: match &src.model {
            OpenedModel::Catalog(state) => Some(state.spec().clone()),
            OpenedModel::Family { .. } => None,
        },
        config: Some(cfg.to_string()),
        state: src.state_label.clone(),
        cluster,
        job: src.job,
        hf_config: src.hf_config.clone(),
        scalars: src.scalars.clone(),
    };
    progress.start(problem.tensors().iter().map(|t| t.bytes()).sum());
    let t_exec = Instant::now();
    // (bytes read, data bytes, file bytes, files, tensors saved, other entries)
    let (bytes_read, data_bytes, file_bytes, files, tensors, other_entries) = if let Some(extras) = &torch_dist {
        // The model's weights as Megatron-Core saves them: layers stacked.
        let (written, read) = reshard_to_dcp(&verified, reading, dest.path(), extras, &|n| progress.advance(n))?;
        let saved: std::collections::BTreeSet<&str> = problem
            .tensors()
            .iter()
            .map(|t| {
                extras
                    .saved_as
                    .get(&t.name)
                    .map_or(t.name.as_str(), |s| s.name.as_str())
            })
            .collect();
        let w = written;
        (read, w.data_bytes, w.file_bytes, w.files.len(), saved.len(), w.others)
    } else {
        let done = perform(&verified, reading, dest.path(), &info, &|n| progress.advance(n))?;
        let w = done.written;
        (
            done.bytes_read,
            w.data_bytes,
            w.file_bytes,
            w.manifest.files.len(),
            problem.tensors().len(),
            0,
        )
    };
    dest.commit()?;
    Ok(Resharded {
        src: req.src.clone(),
        src_format: src.format,
        out: req.out.clone(),
        format,
        to: cfg.to_string(),
        model: Some(src.model.name()),
        planner: plan.planner.clone(),
        copies: plan.copies.len(),
        tensors,
        other_entries,
        bytes_read,
        data_bytes,
        file_bytes,
        files,
        excluded,
        plan_seconds: planned.planning_time_s,
        execute_seconds: t_exec.elapsed().as_secs_f64(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The state a source holds, opened as it is.
enum StateSource {
    Dcp(Box<dcp::DcpState>),
    Tenplan(Box<Checkpoint>),
}

impl StateSource {
    fn source(&self) -> &dyn Source {
        match self {
            StateSource::Dcp(s) => s.as_ref(),
            StateSource::Tenplan(c) => c.as_ref(),
        }
    }
}

/// The placement of every tensor on a mesh: FSDP2 shards every tensor but
/// a scalar and a module buffer ([`is_unsharded_buffer`]); tensor parallelism splits each tensor (an optimizer moment
/// like its parameter) as the user's placement for its name says, else as
/// the model's family plan, transformers' `base_model_tp_plan`, places its
/// module under torch's DTensor styles, else not at all.
pub(crate) fn placements(
    mesh: &MeshConfig,
    tensors: &[TensorSpec],
    scalars: &std::collections::BTreeSet<String>,
    model: Option<&ModelArg>,
    place: &[TpPlacement],
) -> Result<Vec<TensorPlacement>> {
    if let Some(p) = place.first().filter(|_| mesh.tp == 1) {
        return Err(Error::request(format!(
            "--place {p} places tensors on the mesh's tp dimension, and `{mesh}` has tp=1"
        )));
    }
    names_a_tensor("--place", place, tensors)?;
    let family = match model {
        _ if mesh.tp == 1 => None,
        None if !place.is_empty() => None,
        None => {
            return Err(Error::request(format!(
                "`{mesh}`: tensor parallelism on a mesh splits each tensor as its model's tensor-parallel plan says; give --model (a Hugging Face config.json) or each tensor's placement (--place PATTERN=Shard(d))"
            )))
        }
        Some(m) => Some(tp_family(m)?),
    };
    let model_type = family.map(|f| f.model_type.as_str());
    let placed = tensors
        .iter()
        .map(|t| {
            // A torchtitan checkpoint's tensors split as their Hugging
            // Face counterparts (torchtitan's plan splits them alike).
            let name = tenplan_formats::torchtitan::hf_name(model_type, &t.name).unwrap_or_else(|| t.name.clone());
            let tp_dim = match (TpPlacement::of(place, &t.name), family) {
                // A scalar (an optimizer's step) is whole on every rank,
                // whatever a pattern that also names its parameter says.
                _ if scalars.contains(&t.name) => None,
                (Some(p), _) => p.dim,
                (None, Some(f)) => f.dtensor_tp_dim(&name, t.shape.len()).map_err(|style| {
                    Error::request(format!(
                        "tensor `{}`: {} splits it {style:?} (a fused weight, half by half), which no DTensor placement describes; use tp=1 on the mesh, or a Megatron target",
                        t.name, f.model_type
                    ))
                })?,
                (None, None) => None,
            };
            Ok(TensorPlacement {
                tp_dim,
                fsdp: !scalars.contains(&t.name) && !is_unsharded_buffer(&t.name),
                fsdp_dim: None,
                experts: is_expert_stack(t),
                stack: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(f) = family.filter(|_| place.is_empty() && placed.iter().all(|p| p.tp_dim.is_none())) {
        return Err(Error::request(format!(
            "`{mesh}`: no tensor of the state is one that {}'s tensor-parallel plan splits (do its names match the model?)",
            f.model_type
        )));
    }
    Ok(placed)
}

/// Refuse a placement (given with `flag`) whose pattern names no tensor.
fn names_a_tensor(flag: &str, placements: &[TpPlacement], tensors: &[TensorSpec]) -> Result<()> {
    match placements.iter().find(|p| !tensors.iter().any(|t| p.matches(&t.name))) {
        Some(p) => Err(Error::request(format!("{flag} {p} names no tensor of the state"))),
        None => Ok(()),
    }
}

/// `placed` with FSDP2's dimension of every tensor a pattern of
/// `fsdp_place` names (an optimizer moment by its parameter): `Shard(d)`
/// only, as FSDP2's `shard_placement_fn` may return; scalars and buffers
/// stay whole.
fn with_fsdp_placements(
    mut placed: Vec<TensorPlacement>,
    tensors: &[TensorSpec],
    fsdp_place: &[TpPlacement],
) -> Result<Vec<TensorPlacement>> {
    if let Some(p) = fsdp_place.iter().find(|p| p.dim.is_none()) {
        return Err(Error::request(format!(
            "--fsdp-place {p}: FSDP2 shards every parameter; its placement is Shard(d)"
        )));
    }
    names_a_tensor("--fsdp-place", fsdp_place, tensors)?;
    for (t, p) in tensors.iter().zip(placed.iter_mut()) {
        if let Some(f) = TpPlacement::of(fsdp_place, &t.name).filter(|_| p.fsdp) {
            p.fsdp_dim = f.dim;
        }
    }
    Ok(placed)
}

/// Whether a tensor stacks a MoE layer's experts on its first dimension,
/// as transformers 5 (`mlp.experts.gate_up_proj`) and torchtitan
/// (`moe.routed_experts.inner_experts.w1_EFD`) keep them, an optimizer
/// moment like its parameter: a 3-D tensor under an `…experts` module (a
/// shared expert is dense).
fn is_expert_stack(t: &TensorSpec) -> bool {
    t.shape.len() == 3
        && t.name
            .split('.')
            .any(|part| part.ends_with("experts") && !part.starts_with("shared"))
}

/// The transformers family whose plan splits a model's tensors on a mesh.
fn tp_family(model: &ModelArg) -> Result<&'static tenplan_models::HfFamily> {
    let model_type = match &model.described {
        Described::Family { family, .. } => return Ok(family),
        Described::Catalog(spec) => spec.family.model_type(),
    };
    tenplan_models::hf_family(model_type).ok_or_else(|| {
        Error::request(format!(
            "{model_type} is not a transformers family: a mesh with tp needs a Hugging Face model's tensor-parallel plan"
        ))
    })
}

/// A target that takes the state as the source holds it, every entry
/// carried: a mesh, or a Megatron-Core checkpoint's own configuration.
/// `transformer_impl` given where it decides no name (`written`: what
/// the output is instead).
fn not_named_by_impl(req: &ReshardRequest, written: &str) -> Error {
    Error::request(format!(
        "--transformer-impl names the norms of a model written as a Megatron-Core torch_dist checkpoint (--format torch_dist); `{}` {written}",
        req.to
    ))
}

fn reshard_state(req: &ReshardRequest, to: StateTarget<'_>, progress: &dyn Progress) -> Result<Resharded> {
    let start = Instant::now();
    if req.transformer_impl.is_some() {
        return Err(not_named_by_impl(
            req,
            &format!("keeps the names {} holds", req.src.display()),
        ));
    }
    let (opened, src_format, source_cluster, job) = if dcp::is_dcp(&req.src) {
        let d = Arc::new(Dcp::open(&req.src)?);
        let ranks = d.ranks();
        (
            StateSource::Dcp(Box::new(d.state()?)),
            d.format_name(),
            default_cluster(ranks)?,
            Default::default(),
        )
    } else {
        if matches!(to, StateTarget::Mesh(m) if m.tp > 1) && req.place.is_empty() {
            return Err(Error::request(format!(
                "`{}`: tensor parallelism on a mesh is for DCP checkpoints of a Hugging Face model (with --model); {} is a tenplan checkpoint, which moves to a mesh with dp_replicate and dp_shard, or to a Megatron layout with tp",
                req.to,
                req.src.display()
            )));
        }
        no_model_for_tenplan(&req.src, req.model.as_ref())?;
        let c = Checkpoint::open(&req.src)?;
        let cluster = c.manifest().cluster.clone();
        let job = c.manifest().job;
        (StateSource::Tenplan(Box::new(c)), "tenplan", cluster, job)
    };
    // A model named for a mesh target guides the placement only; it must
    // still be the checkpoint's.
    if let (StateSource::Dcp(s), StateTarget::Mesh(_), Some(Described::Catalog(spec))) =
        (&opened, &to, req.model.as_ref().map(|m| &m.described))
    {
        if s.dcp().megatron().is_none() {
            s.dcp().check_model(spec)?;
        }
    }
    let source = opened.source();
    let mut extras = match &opened {
        StateSource::Dcp(s) => s.extras().clone(),
        StateSource::Tenplan(_) => DcpExtras::default(),
    };
    // Entries left out on purpose: the kept tensors form the state; a
    // Megatron-Core checkpoint's common.pt loses the keys left out.
    let all = source.layout();
    let common_keys: Vec<String> = match &opened {
        StateSource::Dcp(s) => s.dcp().megatron().map(|m| m.common_keys.clone()).unwrap_or_default(),
        StateSource::Tenplan(_) => Vec::new(),
    };
    let common_dropped: std::collections::BTreeSet<String> = common_keys
        .iter()
        .filter(|k| req.excludes(&format!("{}:{k}", dcp::COMMON_FILE)))
        .cloned()
        .collect();
    let excluded: Vec<String> = all
        .tensors()
        .iter()
        .map(|t| t.name.clone())
        .chain(extras.others.keys().cloned())
        .filter(|n| req.excludes(n))
        .chain(common_dropped.iter().map(|k| format!("{}:{k}", dcp::COMMON_FILE)))
        .collect();
    dcp::drop_common_keys(&mut extras, &req.src, &common_dropped)?;
    if req.weights_only {
        return Err(Error::request(
            "--weights-only needs a model to tell its weights; with a mesh target every entry is carried: leave entries out with --exclude PATTERN",
        ));
    }
    extras.others.retain(|n, _| !req.excludes(n));
    let kept: Vec<TensorId> = (0..all.tensors().len() as TensorId)
        .filter(|&t| !req.excludes(&all.tensors()[t as usize].name))
        .collect();
    let source_layout: Layout = if kept.len() == all.tensors().len() {
        all.clone()
    } else {
        all.restricted(&kept)?
    };
    let megatron = matches!(&opened, StateSource::Dcp(s) if s.dcp().megatron().is_some());
    let native = match opened {
        StateSource::Dcp(_) if megatron => Format::TorchDist,
        StateSource::Dcp(_) => Format::Dcp,
        StateSource::Tenplan(_) => Format::Tenplan,
    };
    let format = req.format.unwrap_or(native);
    match (format, native) {
        (Format::Tenplan, _) => {
            return Err(Error::request(format!(
            "`{}` is written in the source's own format ({}); tenplan checkpoints hold the model layouts of --model",
            req.to,
            if megatron {
                "--format torch_dist"
            } else {
                "--format dcp"
            }
        )))
        }
        (Format::Dcp, Format::TorchDist) | (Format::TorchDist, Format::Dcp) => {
            return Err(Error::request(format!(
                "{} is a {} checkpoint: its state is written in that format (--format {})",
                req.src.display(),
                src_format,
                if megatron { "torch_dist" } else { "dcp" }
            )))
        }
        _ => {}
    }
    if matches!(to, StateTarget::TorchDist(_)) && !megatron {
        return Err(Error::request(format!(
            "`{}` lays out a Megatron-Core checkpoint's state; {} is not one (a mesh target such as dp_shard=N keeps its names)",
            req.to,
            req.src.display()
        )));
    }
    let cluster = cluster_for(
        req,
        &source_cluster,
        to.rank_devices()?.iter().max().map_or(1, |d| d + 1),
    )?;
    to.check_cluster(&cluster)?;
    let target = to.layout(
        source_layout.tensors().clone(),
        &extras.scalars,
        req.model.as_ref(),
        &req.place,
        &req.fsdp_place,
    )?;
    let dest = Destination::new(&req.out, req.overwrite)?;
    let problem = Problem::new(source_layout, target, cluster)
        .map_err(|source| Error::TargetLayout { source })?
        .with_job(job);
    let planned = plan(&problem, &req.planner)?;
    let plan = planned.plan;
    let verified = tenplan_proofs::verify(&plan).map_err(|v| Error::PlanRejected { verdict: v.to_string() })?;
    progress.start(problem.tensors().iter().map(|t| t.bytes()).sum());
    let t_exec = Instant::now();
    let restricted;
    let reading: &dyn Source = if kept.len() == all.tensors().len() {
        source
    } else {
        restricted = Restricted {
            inner: source,
            layout: problem.source(),
            kept: &kept,
        };
        &restricted
    };
    let (written, bytes_read) = reshard_to_dcp(&verified, reading, dest.path(), &extras, &|n| progress.advance(n))?;
    dest.commit()?;
    Ok(Resharded {
        src: req.src.clone(),
        src_format,
        out: req.out.clone(),
        format,
        to: req.to.to_string(),
        model: None,
        planner: plan.planner.clone(),
        copies: plan.copies.len(),
        tensors: written.tensors,
        other_entries: written.others,
        bytes_read,
        data_bytes: written.data_bytes,
        file_bytes: written.file_bytes,
        files: written.files.len(),
        excluded,
        plan_seconds: planned.planning_time_s,
        execute_seconds: t_exec.elapsed().as_secs_f64(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// A source with some of its tensors left out: the kept tensors' boxes,
/// renumbered as the restricted layout numbers them.
struct Restricted<'a> {
    inner: &'a dyn Source,
    layout: &'a Layout,
    kept: &'a [TensorId],
}

impl Source for Restricted<'_> {
    fn location(&self) -> &Path {
        self.inner.location()
    }

    fn layout(&self) -> &Layout {
        self.layout
    }

    fn all_boxes(&self) -> Vec<Vec<tenplan_ptc::SourceBox<'_>>> {
        let mut all = self.inner.all_boxes();
        self.kept
            .iter()
            .enumerate()
            .map(|(new, &old)| {
                std::mem::take(&mut all[old as usize])
                    .into_iter()
                    .map(|b| tenplan_ptc::SourceBox {
                        tensor: new as TensorId,
                        ..b
                    })
                    .collect()
            })
            .collect()
    }

    fn prefetch(&self) {
        self.inner.prefetch()
    }

    fn digests(&self) -> Option<Vec<String>> {
        let all = self.inner.digests()?;
        Some(self.kept.iter().map(|&t| all[t as usize].clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_key_names_both_kinds_of_target() {
        let err = "dp_shrad=2".parse::<Target>().unwrap_err().to_string();
        assert!(err.contains("unknown key `dp_shrad`"), "{err}");
        assert!(err.contains("expected tp, pp, dp"), "{err}");
        assert!(err.contains("for a DTensor mesh, pp, pp_schedule"), "{err}");
        assert!(matches!("dp_shard=2".parse::<Target>(), Ok(Target::Mesh(_))));
        assert!(matches!("tp=2".parse::<Target>(), Ok(Target::Megatron(_))));
    }
}
