//! Export a checkpoint's weights for the transformers model: as a Hugging
//! Face model directory, or as the PyTorch DCP checkpoint an FSDP2 job on
//! that model saves and loads (Hugging Face names, sharded on a mesh).
//! Both hold weights only: a checkpoint that holds more (optimizer state,
//! master weights, other entries) is refused naming what would be lost,
//! unless the request leaves it out on purpose (`weights_only`,
//! `exclude`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;
use tenplan_formats::checkpoint::NAMED_STATE;
use tenplan_formats::dcp::{self, Dcp};
use tenplan_formats::hf_export::{self, Exported};
use tenplan_formats::{Checkpoint, Source};
use tenplan_models::{MeshConfig, ModelSpec, StateKind};
use tenplan_ptc::{DType, TensorSpec};

use crate::reshard::{is_optimizer_state, placements};
use crate::stored::{dcp_model, dcp_state_as, manifest_model, no_model_for_tenplan, Described, ModelArg, Progress};
use crate::{Error, Result};

/// Largest safetensors shard an export writes unless told (transformers'
/// default `max_shard_size`, 5 GB).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = hf_export::DEFAULT_MAX_SHARD_BYTES;

/// An export: a checkpoint's weights to a new Hugging Face model directory,
/// or to a new DCP checkpoint of the transformers model.
#[derive(Clone, Debug)]
pub struct ExportRequest {
    /// The checkpoint: tenplan's, or a PyTorch DCP checkpoint (never modified).
    pub ckpt: PathBuf,
    /// The model of a DCP checkpoint (default: a `config.json` beside it).
    pub model: Option<ModelArg>,
    /// The new directory: a Hugging Face model, or (`dcp`) a DCP checkpoint.
    pub out: PathBuf,
    /// Write a DCP checkpoint of the transformers model, sharded as an
    /// FSDP2 (or HSDP, FSDP2×TP) job on this mesh holds it, instead of
    /// Hugging Face files.
    pub dcp: Option<MeshConfig>,
    /// Largest safetensors shard, in bytes.
    pub max_shard_bytes: u64,
    /// Leave out, on purpose, what is not a model weight (optimizer state,
    /// master weights, entries that are not tensors).
    pub weights_only: bool,
    /// Leave out, on purpose, the entries whose names contain one of these.
    pub exclude: Vec<String>,
}

/// What an export wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ExportOutcome {
    /// The checkpoint.
    pub ckpt: PathBuf,
    /// The new directory.
    pub out: PathBuf,
    /// What it is: `Hugging Face` or `PyTorch DCP` (under Hugging Face names).
    pub format: &'static str,
    /// The model's name.
    pub model: String,
    /// The files, tensors and bytes written.
    #[serde(flatten)]
    pub exported: Exported,
    /// Entries of the checkpoint left out on purpose.
    pub excluded: Vec<String>,
    /// Seconds the export took.
    pub seconds: f64,
}

/// Export a tenplan or DCP checkpoint's weights as a Hugging Face model
/// directory (`model.safetensors` shards of at most `max_shard_bytes`, an
/// index, `config.json`), or as a DCP checkpoint of the transformers model
/// (`dcp`).
pub fn export(req: &ExportRequest, progress: &dyn Progress) -> Result<ExportOutcome> {
    let start = Instant::now();
    let (model, exported, excluded) = if dcp::is_dcp(&req.ckpt) {
        let d = Arc::new(Dcp::open(&req.ckpt)?);
        let model = dcp_model(&req.ckpt, req.model.as_ref())?;
        let spec = model.catalog(
            "its DCP checkpoint exports after a reshard into a tenplan checkpoint of it (tenplan import of the original files gives one)",
        )?;
        // A Megatron-Core job's distributed optimizer (fully_reshardable)
        // goes along into a DCP checkpoint as PyTorch's AdamW state.
        let adam = req.dcp.is_some() && !req.weights_only && d.megatron().is_some();
        let (state, _) = dcp_state_as(&d, spec, &req.exclude, adam)?;
        let spec = state.spec();
        let optimizer = match state.kind() {
            StateKind::WeightsAndAdam(dtype) => Some(megatron_optimizer(&d, dtype)?),
            _ => None,
        };
        let source = d.source(spec, state.tensors(), &req.exclude)?;
        let mut unused = source.unused().to_vec();
        if let Some((_, arrived)) = &optimizer {
            unused.retain(|n| !arrived.contains(n));
        }
        let excluded = kept_out(req, &unused, &d.other_entries())?;
        progress.start(state.tensors().iter().map(|t| t.bytes()).sum());
        let config = model.original_config();
        let groups = optimizer.as_ref().map(|(g, _)| g.as_slice());
        let e = write_weights(req, &source, spec, config.as_ref(), groups, progress)?;
        (spec.name.to_string(), e, excluded)
    } else {
        no_model_for_tenplan(&req.ckpt, req.model.as_ref())?;
        let source = Checkpoint::open(&req.ckpt)?;
        let m = source.manifest();
        if m.state.as_deref() == Some(NAMED_STATE) {
            if req.dcp.is_some() {
                return Err(Error::request(format!(
                    "{}: a model imported under its own names exports as Hugging Face files (--hf); a DCP checkpoint is written from a state of tenplan's catalog models",
                    req.ckpt.display()
                )));
            }
            // The files' own tensors, under their own names: every one is
            // a weight of the model files it came from.
            let config = m.hf_config.clone().unwrap_or_default();
            let excluded = kept_out(req, &[], &[])?;
            progress.start(source.layout().tensors().iter().map(|t| t.bytes()).sum());
            let e = hf_export::export_named(&source, &config, &m.scalars, &req.out, req.max_shard_bytes, &|n| {
                progress.advance(n)
            })?;
            let name = config
                .get("model_type")
                .and_then(|t| t.as_str())
                .unwrap_or("model")
                .to_string();
            (name, e, excluded)
        } else {
            let model = manifest_model(&source, "its tensors have no Hugging Face names")?;
            let weights = model.weight_names();
            let rest: Vec<String> = source
                .layout()
                .tensors()
                .iter()
                .filter(|t| !weights.contains(&t.name))
                .map(|t| t.name.clone())
                .collect();
            // A training state's master weights and Adam moments are what
            // `weights_only` leaves out.
            let excluded = kept_out(req, &rest, &rest)?;
            progress.start(model_weight_bytes(&source, &model));
            let e = match req.dcp {
                None => hf_export::export(&source, &model, &req.out, req.max_shard_bytes, &|n| progress.advance(n))?,
                Some(_) => {
                    source.verify()?;
                    let config = m.hf_config.clone();
                    write_weights(req, &source, &model, config.as_ref(), None, progress)?
                }
            };
            (model.name.to_string(), e, excluded)
        }
    };
    Ok(ExportOutcome {
        ckpt: req.ckpt.clone(),
        out: req.out.clone(),
        format: if req.dcp.is_some() {
            "PyTorch DCP"
        } else {
            "Hugging Face"
        },
        model,
        exported,
        excluded,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// A Megatron-Core checkpoint's distributed optimizer as a PyTorch AdamW
/// takes it: its parameter groups, and the source entries that arrive
/// through them (`common.pt:optimizer`, and the main parameters, which
/// must be the fp32 weights themselves: an FSDP2 job steps its fp32
/// parameters).
fn megatron_optimizer(d: &Arc<Dcp>, dtype: DType) -> Result<(Vec<dcp::MegatronGroup>, Vec<String>)> {
    let refuse = |what: String| Error::request(format!("{}: {what}", d.dir().display()));
    if dtype != DType::F32 {
        return Err(refuse(format!(
            "its weights are {dtype}; its optimizer's fp32 main parameters would be what a PyTorch AdamW steps, which this export does not write: export the weights alone (--weights-only)"
        )));
    }
    let groups = d
        .megatron_optimizer()?
        .ok_or_else(|| refuse("holds Adam moments but no optimizer param_groups in common.pt".into()))?;
    let mut arrived = vec![format!("{}:optimizer", dcp::COMMON_FILE)];
    for (name, equal) in d.main_params()? {
        if !equal {
            return Err(refuse(format!(
                "`{name}` (the optimizer's main parameters) differs from its weight: an fp32 job's are its weights; export the weights alone (--weights-only)"
            )));
        }
        arrived.push(name);
    }
    Ok((groups, arrived))
}

/// Write the weights of `spec` in `source` (checked) as the request asks:
/// Hugging Face files, or a DCP checkpoint of the transformers model on
/// the request's mesh. `hf_config` is the model's original `config.json`.
/// With Megatron's optimizer `groups` (the source a `WeightsAndAdam`
/// state), the DCP checkpoint holds PyTorch's AdamW state too.
fn write_weights(
    req: &ExportRequest,
    source: &dyn Source,
    spec: &ModelSpec,
    hf_config: Option<&Value>,
    groups: Option<&[dcp::MegatronGroup]>,
    progress: &dyn Progress,
) -> Result<Exported> {
    let advance = |n| progress.advance(n);
    let Some(mesh) = &req.dcp else {
        return Ok(hf_export::export_from(
            source,
            spec,
            hf_config,
            &req.out,
            req.max_shard_bytes,
            &advance,
        )?);
    };
    if mesh.ep > 1 {
        // The export lays out each expert's tensors, which the live
        // module stacks; ep splits the stacks.
        return Err(Error::request(format!(
            "`{mesh}`: an export lays out each expert's tensors, not the stacks ep splits; export with ep=1, then `tenplan reshard` the export to the mesh with ep"
        )));
    }
    let (plans, extras) = match groups {
        None => hf_export::plan_dcp_tensors(spec, source.layout().tensors())?,
        Some(groups) => {
            let (plans, mut extras, params) = hf_export::plan_dcp_training(spec, source.layout().tensors())?;
            dcp::torch_optimizer_entries(&params, groups, &mut extras)?;
            (plans, extras)
        }
    };
    let dtype = plans.first().map_or(DType::BF16, |h| h.dtype);
    let config = hf_export::config_for(spec, hf_config, dtype)?;
    let tensors: Arc<[TensorSpec]> = plans
        .iter()
        .map(|h| TensorSpec::new(h.name.clone(), h.dtype, h.shape.clone()))
        .collect();
    // Tensor parallelism splits each tensor as the transformers model's
    // plan says, as on a reshard's mesh target.
    let model = ModelArg {
        described: Described::Catalog(spec.clone()),
        config_dir: None,
    };
    let mut placed = placements(mesh, &tensors, &Default::default(), Some(&model), &[])?;
    // An expert of a stack the live module holds as one tensor (its
    // experts' 3-D stacks) is sharded as FSDP2 shards that stack: whole,
    // on the rank whose chunk of the experts holds it.
    for (p, h) in placed.iter_mut().zip(&plans) {
        if let Some(s) = extras.saved_as.get(&h.name).filter(|s| s.lead.len() == 1) {
            p.stack = Some((s.lead[0], s.shape[0]));
        }
    }
    let layout = mesh.layout(tensors, &|t, _| Ok(placed[t as usize]))?;
    Ok(hf_export::export_dcp(
        source,
        &plans,
        &layout,
        &extras,
        (&config.0, config.1),
        &req.out,
        &advance,
    )?)
}

/// What the export leaves out of `rest` (the entries that are not the
/// model's weights), or an error naming what would be lost without being
/// asked: `weights_only` leaves out optimizer state and `not_weights`,
/// `exclude` what it names.
fn kept_out(req: &ExportRequest, rest: &[String], not_weights: &[String]) -> Result<Vec<String>> {
    let (excluded, lost): (Vec<String>, Vec<String>) = rest.iter().cloned().partition(|n| {
        req.exclude.iter().any(|p| n.contains(p.as_str()))
            || (req.weights_only && (is_optimizer_state(n) || not_weights.contains(n)))
    });
    if lost.is_empty() {
        return Ok(excluded);
    }
    // A Megatron distributed optimizer's Adam state reaches a DCP export.
    let adam = match req.dcp.is_none() && lost.iter().any(|n| n.starts_with("optimizer.state.exp_avg.")) {
        true => " (its Adam state reaches a DCP export, --dcp, as PyTorch's AdamW state)",
        false => "",
    };
    Err(Error::request(format!(
        "{}: {} entr{} would not reach the {} ({}{}){adam}: \
         leave {} out on purpose with --weights-only (optimizer state, master weights, entries that are not tensors) or --exclude PATTERN",
        req.ckpt.display(),
        lost.len(),
        if lost.len() == 1 { "y" } else { "ies" },
        match req.dcp {
            Some(_) => "DCP checkpoint",
            None => "Hugging Face files, which hold the model's weights only",
        },
        lost.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
        if lost.len() > 3 { ", ..." } else { "" },
        if lost.len() == 1 { "it" } else { "them" },
    )))
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
