//! Hugging Face model directories from checkpoints: `config.json`,
//! `model.safetensors` or shards `model-0000i-of-0000n.safetensors` with
//! `model.safetensors.index.json`, as transformers' `save_pretrained` writes
//! them, so that `AutoModelForCausalLM.from_pretrained` loads the weights.
//!
//! Each Hugging Face tensor is assembled from the checkpoint's global
//! tensors through the same name mapping the import reads ([`crate::hf`]):
//! fused QKV, SwiGLU and expert weights are split back, GPT-2's `Conv1D`
//! weights transposed back. Files are filled batch by batch and appear under
//! their names only once complete; `config.json` is written last, so a
//! directory without it is an interrupted export.

use std::collections::BTreeMap;
use std::fs;
use std::ops::Range;
use std::path::Path;

use serde_json::{json, Value};
use tenplan_models::{to_hf_config, ModelSpec, ModelState, StateKind};
use tenplan_ptc::{copy_box, DType, Layout, Piece, Region, TensorId, TensorSpec};

use crate::checkpoint::{
    create_new_dir, safetensors_header, slabs, sync_dir, write_atomic, Checkpoint, HeaderEntry, INCOMPLETE_MARKER,
};
use crate::dcp::{DcpExtras, SavedAs};
use crate::hf::{links, transpose, Link};
use crate::stream::{write_files, OutFile};
use crate::{Error, Result, Source};
use tenplan_ptc::{read_box, SourceBox};

/// transformers' default largest shard: 5 GB.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// One Hugging Face tensor and where its rows (or columns) come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfTensorPlan {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its element type.
    pub dtype: DType,
    /// The runs of checkpoint tensors it is made of.
    pub parts: Vec<(TensorId, Link)>,
    /// Written with no dimension (`shape` is `[1]`): a 0-d tensor.
    pub scalar: bool,
}

impl HfTensorPlan {
    fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size()
    }
}

/// What an export wrote.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Exported {
    /// The safetensors files, in order.
    pub files: Vec<String>,
    /// Hugging Face tensors written.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub data_bytes: u64,
    /// Bytes of all safetensors files (headers included).
    pub file_bytes: u64,
    /// Whether `config.json` is the one imported with the model (else
    /// generated from the model's hyper-parameters).
    pub original_config: bool,
}

/// The Hugging Face tensors of a model's weights, in the order their first
/// parts appear, each checked to be covered exactly once. `tensors` are the
/// checkpoint's; the model's weights must be among them (a training state's
/// optimizer tensors are not exported).
pub fn plan_hf_tensors(model: &ModelSpec, tensors: &[TensorSpec]) -> Result<Vec<HfTensorPlan>> {
    let by_name: BTreeMap<&str, TensorId> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i as TensorId))
        .collect();
    let weights = ModelState::new(model, StateKind::Weights(DType::BF16));
    let mut out: Vec<HfTensorPlan> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for w in weights.tensors().iter() {
        let &id = by_name.get(w.name.as_str()).ok_or_else(|| Error::Export {
            what: format!("the checkpoint has no tensor `{}` of model {}", w.name, model.name),
        })?;
        let t = &tensors[id as usize];
        if t.shape != w.shape {
            return Err(Error::Export {
                what: format!(
                    "tensor `{}` has shape {:?}, model {} has {:?}",
                    t.name, t.shape, model.name, w.shape
                ),
            });
        }
        for link in links(model, t) {
            let at = *index.entry(link.hf.clone()).or_insert_with(|| {
                out.push(HfTensorPlan {
                    name: link.hf.clone(),
                    shape: link.hf_shape.clone(),
                    dtype: t.dtype,
                    parts: Vec::new(),
                    scalar: false,
                });
                out.len() - 1
            });
            if out[at].shape != link.hf_shape || out[at].dtype != t.dtype {
                return Err(Error::Export {
                    what: format!(
                        "`{}` is assembled from parts that disagree on its shape or type",
                        link.hf
                    ),
                });
            }
            out[at].parts.push((id, link));
        }
    }
    for h in &out {
        check_tiled(h)?;
    }
    Ok(out)
}

/// The parts of a Hugging Face tensor cover its rows (or columns) once.
fn check_tiled(h: &HfTensorPlan) -> Result<()> {
    let transposed = h.parts.iter().any(|(_, l)| l.transposed);
    let extent = if transposed { h.shape[1] } else { h.shape[0] };
    let mut runs: Vec<Range<u64>> = h
        .parts
        .iter()
        .map(|(_, l)| l.at..l.at + (l.rows.end - l.rows.start))
        .collect();
    runs.sort_by_key(|r| r.start);
    let mut next = 0;
    for r in runs {
        if r.start != next {
            return Err(Error::Export {
                what: format!("`{}`: its parts do not cover it exactly once near {next}", h.name),
            });
        }
        next = r.end;
    }
    if next != extent || h.parts.iter().any(|(_, l)| l.transposed != transposed) {
        return Err(Error::Export {
            what: format!("`{}`: its parts do not cover it exactly once", h.name),
        });
    }
    Ok(())
}

/// The `config.json` to write: the imported one, checked to describe the
/// same model, or one generated from the model's hyper-parameters; its
/// element type set to the exported one.
pub fn config_for(model: &ModelSpec, stored: Option<&Value>, dtype: DType) -> Result<(Value, bool)> {
    let bad = |what: String| Error::Export { what };
    let (mut config, original) = match stored {
        Some(c) => {
            let back = tenplan_models::from_hf_config(&model.name, &c.to_string())
                .map_err(|e| bad(format!("the manifest's hf_config: {e}")))?;
            if !back.same_model(model) {
                return Err(bad(format!(
                    "the manifest's hf_config describes another model than {} (edited manifest?)",
                    model.name
                )));
            }
            (c.clone(), true)
        }
        None => (to_hf_config(model).map_err(|e| bad(e.to_string()))?, false),
    };
    let name = match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        other => return Err(bad(format!("weights of element type {other} cannot be exported"))),
    };
    if let Some(map) = config.as_object_mut() {
        // transformers 5 reads `dtype`, 4.x `torch_dtype`.
        if map.contains_key("torch_dtype") {
            map.insert("torch_dtype".into(), json!(name));
        }
        map.insert("dtype".into(), json!(name));
    }
    Ok((config, original))
}

/// Shards of at most `max_bytes` each (a larger tensor alone in its own),
/// in tensor order, as transformers cuts them.
fn shard(plans: &[HfTensorPlan], max_bytes: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, h) in plans.iter().enumerate() {
        if i > start && bytes + h.bytes() > max_bytes {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += h.bytes();
    }
    if start < plans.len() || out.is_empty() {
        out.push(start..plans.len());
    }
    out
}

/// A safetensors header for entries in order, with `{"format": "pt"}`
/// metadata (transformers refuses files without it).
fn header(entries: &[HfTensorPlan]) -> Vec<u8> {
    let entries: Vec<HeaderEntry<'_>> = entries
        .iter()
        .map(|h| {
            let shape = if h.scalar { Vec::new() } else { h.shape.clone() };
            (h.name.as_str(), h.dtype, shape, h.bytes())
        })
        .collect();
    safetensors_header(&entries, json!({"format": "pt"})).0
}

/// Fill rows `rows` of Hugging Face tensor `h` (row-major bytes `out`) from
/// the checkpoint's boxes.
fn fill_rows(h: &HfTensorPlan, rows: &Range<u64>, boxes: &[Vec<SourceBox<'_>>], specs: &[TensorSpec], out: &mut [u8]) {
    let elem = h.dtype.size() as usize;
    let row_elems: u64 = h.shape[1..].iter().product();
    for (t, link) in &h.parts {
        let spec = &specs[*t as usize];
        let src = &boxes[*t as usize];
        let n = link.rows.end - link.rows.start;
        if link.transposed {
            // The slab's rows are columns lo..hi of the checkpoint tensor;
            // its columns at..at+n are the tensor's rows.
            let region = Region::full(&spec.shape)
                .with_range(0, link.rows.clone())
                .with_range(1, rows.clone());
            let width = (rows.end - rows.start) as usize;
            let mut tmp = vec![0u8; n as usize * width * elem];
            read_box(src, &region, &mut tmp, elem);
            transpose(
                &tmp,
                width,
                &mut out[link.at as usize * elem..],
                row_elems as usize,
                n as usize,
                width,
                elem,
            );
        } else {
            let (lo, hi) = (rows.start.max(link.at), rows.end.min(link.at + n));
            if lo >= hi {
                continue;
            }
            let from = link.rows.start + (lo - link.at);
            let region = Region::full(&spec.shape).with_range(0, from..from + (hi - lo));
            let at = ((lo - rows.start) * row_elems) as usize * elem;
            let len = ((hi - lo) * row_elems) as usize * elem;
            read_box(src, &region, &mut out[at..at + len], elem);
        }
    }
}

/// Write the model weights of `source` as a Hugging Face model directory
/// `out`, which must not exist. The checkpoint's contents are checked
/// against its digests first; `max_shard_bytes` bounds each file's tensor
/// data; `progress` gets byte counts of filled slabs. On any error the
/// directory is removed.
pub fn export(
    source: &Checkpoint,
    model: &ModelSpec,
    out: &Path,
    max_shard_bytes: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Exported> {
    let prepared = prepare(source, model, source.manifest().hf_config.as_ref(), max_shard_bytes)?;
    source.verify()?;
    write_new(source, prepared, out, max_shard_bytes, progress)
}

/// What an export writes besides the tensor data: each HF tensor's plan and
/// config.json (whether it is the original); refuses before anything is read.
type Prepared = (Vec<HfTensorPlan>, Value, bool);

fn prepare(
    source: &dyn Source,
    model: &ModelSpec,
    hf_config: Option<&Value>,
    max_shard_bytes: u64,
) -> Result<Prepared> {
    let mut plans = plan_hf_tensors(model, source.layout().tensors())?;
    // DeepSeek-V3's files hold each MTP module's embedding and output
    // layer once more (what its own loaders and vLLM's read).
    for (copy, original) in crate::hf::mtp_copies(model) {
        if let Some(own) = plans.iter().find(|h| h.name == original) {
            plans.push(HfTensorPlan {
                name: copy,
                ..own.clone()
            });
        }
    }
    let dtype = plans.first().map_or(DType::BF16, |h| h.dtype);
    let (config, original) = config_for(model, hf_config, dtype)?;
    if max_shard_bytes == 0 {
        return Err(Error::Export {
            what: "the largest shard size must be positive".into(),
        });
    }
    Ok((plans, config, original))
}

/// [`export`] from any stored state (a DCP checkpoint mapped onto the
/// model, say), whose contents the caller has checked; `hf_config` is the
/// model's original `config.json`, when known (else one is generated).
pub fn export_from(
    source: &dyn Source,
    model: &ModelSpec,
    hf_config: Option<&Value>,
    out: &Path,
    max_shard_bytes: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Exported> {
    let prepared = prepare(source, model, hf_config, max_shard_bytes)?;
    write_new(source, prepared, out, max_shard_bytes, progress)
}

/// [`export`] of a state whose tensors already carry their Hugging Face
/// names (a Hugging Face model imported as it is): every tensor of
/// `source` written whole under its own name (those of `scalars` with no
/// dimension), `config` as `config.json`.
pub fn export_named(
    source: &dyn Source,
    config: &Value,
    scalars: &[String],
    out: &Path,
    max_shard_bytes: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Exported> {
    if max_shard_bytes == 0 {
        return Err(Error::Export {
            what: "the largest shard size must be positive".into(),
        });
    }
    let plans = source
        .layout()
        .tensors()
        .iter()
        .enumerate()
        .map(|(t, spec)| HfTensorPlan {
            name: spec.name.clone(),
            shape: spec.shape.clone(),
            dtype: spec.dtype,
            parts: vec![(
                t as TensorId,
                Link::rows(spec.name.clone(), spec.shape.clone(), 0..spec.shape[0], 0),
            )],
            scalar: scalars.contains(&spec.name),
        })
        .collect();
    write_new(source, (plans, config.clone(), true), out, max_shard_bytes, progress)
}

/// Create `out` and export into it; on any error the directory is removed.
fn write_new(
    source: &dyn Source,
    (plans, config, original): Prepared,
    out: &Path,
    max_shard_bytes: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Exported> {
    create_new_dir(out)?;
    let result = export_into(source, &plans, (&config, original), out, max_shard_bytes, progress);
    if result.is_err() {
        // We created the directory, so it holds nothing of anybody else's.
        let _ = fs::remove_dir_all(out);
    }
    result
}

fn export_into(
    source: &dyn Source,
    plans: &[HfTensorPlan],
    (config, original_config): (&Value, bool),
    out: &Path,
    max_shard_bytes: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Exported> {
    let specs = source.layout().tensors();
    let boxes = source.all_boxes();
    let shards = shard(plans, max_shard_bytes);
    let n = shards.len();
    let names: Vec<String> = if n == 1 {
        vec!["model.safetensors".into()]
    } else {
        (1..=n).map(|i| format!("model-{i:05}-of-{n:05}.safetensors")).collect()
    };
    let files: Vec<OutFile<(usize, Range<u64>)>> = shards
        .iter()
        .zip(&names)
        .map(|(range, name)| {
            // Hugging Face tensors are filled in slabs of rows, in parallel.
            let items = range
                .clone()
                .flat_map(|i| {
                    let h = &plans[i];
                    slabs(&Region::full(&h.shape), h.dtype.size())
                        .into_iter()
                        .map(move |slab| {
                            let len = (slab.volume() * h.dtype.size()) as usize;
                            ((i, slab.range(0)), len)
                        })
                })
                .collect();
            OutFile {
                name: name.clone(),
                header: header(&plans[range.clone()]),
                items,
            }
        })
        .collect();
    write_files(
        out,
        &files,
        &|(i, rows), bytes| {
            fill_rows(&plans[*i], rows, &boxes, specs, bytes);
            Ok(())
        },
        progress,
    )?;
    let data_bytes: u64 = plans.iter().map(HfTensorPlan::bytes).sum();
    if n > 1 {
        let mut map = serde_json::Map::new();
        for (range, name) in shards.iter().zip(&names) {
            for h in &plans[range.clone()] {
                map.insert(h.name.clone(), json!(name));
            }
        }
        let index = json!({"metadata": {"total_size": data_bytes}, "weight_map": map});
        write_atomic(out, "model.safetensors.index.json", index.to_string().as_bytes())?;
    }
    let text = serde_json::to_string_pretty(config).expect("configs always serialise");
    write_atomic(out, "config.json", text.as_bytes())?;
    fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(Error::io("remove", &out.join(INCOMPLETE_MARKER)))?;
    sync_dir(out)?;
    Ok(Exported {
        files: names,
        tensors: plans.len(),
        data_bytes,
        file_bytes: files.iter().map(OutFile::bytes).sum(),
        original_config,
    })
}

/// The Hugging Face tensors a DCP checkpoint of the transformers model
/// holds (what an FSDP2 job on it saves with `dcp.save`, and asks
/// `dcp.load` for): the tensors of [`plan_hf_tensors`], a tied output
/// layer once more under `lm_head.weight` (the live module's state dict
/// names it), and how the live module of transformers 5 saves what its
/// files name otherwise: a MoE layer's experts in 3-D stacks, its router
/// renamed, as the DCP reader expects them.
pub fn plan_dcp_tensors(model: &ModelSpec, tensors: &[TensorSpec]) -> Result<(Vec<HfTensorPlan>, DcpExtras)> {
    let mut plans = plan_hf_tensors(model, tensors)?;
    if model.tied {
        let embedding = plans
            .iter()
            .find(|h| h.name.ends_with("embed_tokens.weight") || h.name.ends_with("wte.weight"))
            .ok_or_else(|| Error::Export {
                what: format!("model {} ties its output layer, but has no word embedding", model.name),
            })?;
        let mut lm_head = embedding.clone();
        lm_head.name = "lm_head.weight".into();
        plans.push(lm_head);
    }
    // Each stack's members: (plan, expert, first row).
    let mut stacks: BTreeMap<String, Vec<(usize, Option<u64>, u64)>> = BTreeMap::new();
    for (i, h) in plans.iter().enumerate() {
        if let Some((name, e, row0)) = crate::dcp::live_name("", &h.name, &h.shape) {
            stacks.entry(name).or_default().push((i, e, row0));
        }
    }
    let mut extras = DcpExtras::default();
    for (name, members) in stacks {
        let (first, e0, _) = members[0];
        let own = &plans[first].shape;
        let rows = members
            .iter()
            .map(|&(i, _, r)| r + plans[i].shape[0])
            .max()
            .unwrap_or(0);
        let shape: Vec<u64> = match e0 {
            Some(_) => {
                let experts = members.iter().filter_map(|m| m.1).max().map_or(0, |e| e + 1);
                [experts, rows].into_iter().chain(own[1..].iter().copied()).collect()
            }
            None => own.clone(),
        };
        // The members tile the stack: distinct places, the stack's volume.
        let places: std::collections::BTreeSet<(Option<u64>, u64)> = members.iter().map(|m| (m.1, m.2)).collect();
        let volume: u64 = members.iter().map(|m| plans[m.0].shape.iter().product::<u64>()).sum();
        let fits = members.iter().all(|&(i, e, _)| {
            plans[i].shape[1..] == own[1..] && plans[i].dtype == plans[first].dtype && e.is_some() == e0.is_some()
        });
        if !fits || places.len() != members.len() || volume != shape.iter().product::<u64>() {
            return Err(Error::Export {
                what: format!(
                    "the live module keeps `{}` in the stack `{name}`, which the model's tensors do not fill exactly",
                    plans[first].name
                ),
            });
        }
        for (i, e, row0) in members {
            extras.saved_as.insert(
                plans[i].name.clone(),
                SavedAs {
                    name: name.clone(),
                    lead: e.into_iter().collect(),
                    row0,
                    shape: shape.clone(),
                },
            );
        }
    }
    Ok((plans, extras))
}

/// The tensors of a DCP checkpoint of PyTorch's `get_state_dict(model,
/// optim)` for the transformers model and an Adam optimizer, saved as
/// `dcp.save({"model": ..., "optim": ...})`: the weights of
/// [`plan_dcp_tensors`] under `model.`, each one's `exp_avg` and
/// `exp_avg_sq` (from `tensors`' `optimizer.<moment>.<name>`, a
/// `WeightsAndAdam` state) as `optim.state.<fqn>.<moment>`, stacked as the
/// weight is, with the nesting DCP records. Returns the plans, what the
/// checkpoint holds besides, and each weight by Megatron's name with the
/// FQNs it is saved in (for the optimizer's groups and steps,
/// [`crate::dcp::torch_optimizer_entries`]). A tied output layer is
/// refused (PyTorch keeps one optimizer state for both names).
pub fn plan_dcp_training(
    model: &ModelSpec,
    tensors: &[TensorSpec],
) -> Result<(Vec<HfTensorPlan>, DcpExtras, Vec<crate::dcp::MegatronParam>)> {
    use crate::dcp::{MegatronParam, PathPart};
    if model.tied {
        return Err(Error::Export {
            what: format!(
                "model {} ties its output layer to its embedding, whose optimizer state PyTorch keeps once: its optimizer is not written (--weights-only)",
                model.name
            ),
        });
    }
    let (weights, mut extras) = plan_dcp_tensors(model, tensors)?;
    let id_of: BTreeMap<&str, TensorId> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i as TensorId))
        .collect();
    let saved = |name: &str| extras.saved_as.get(name).map_or(name.to_string(), |s| s.name.clone());
    // Each weight's FQNs: the names the live module saves its parts under.
    let mut fqns: BTreeMap<TensorId, Vec<String>> = BTreeMap::new();
    for h in &weights {
        for (id, _) in &h.parts {
            let list = fqns.entry(*id).or_default();
            let fqn = saved(&h.name);
            if !list.contains(&fqn) {
                list.push(fqn);
            }
        }
    }
    let params = fqns
        .iter()
        .map(|(&id, f)| MegatronParam {
            name: tensors[id as usize].name.clone(),
            ndim: tensors[id as usize].shape.len(),
            fqns: f.clone(),
        })
        .collect();
    let mut plans = Vec::with_capacity(3 * weights.len());
    let mut saved_as = BTreeMap::new();
    let mut planner_data = BTreeMap::new();
    let key = |k: &str| PathPart::Key(k.to_string());
    // Each Hugging Face tensor once as the weight, under `model.`, and once
    // per moment, under `optim.state.` with the moment after: the plan,
    // its stack, and its path in the nested state dict renamed alike.
    for moment in std::iter::once(None).chain(tenplan_models::ADAM_MOMENTS.map(Some)) {
        let rename = |name: &str| match moment {
            None => format!("model.{name}"),
            Some(m) => format!("optim.state.{name}.{m}"),
        };
        for h in &weights {
            let fqn = saved(&h.name);
            let path = match moment {
                None => vec![key("model"), key(&fqn)],
                Some(m) => vec![key("optim"), key("state"), key(&fqn), key(m)],
            };
            planner_data.insert(rename(&fqn), path);
            if let Some(s) = extras.saved_as.get(&h.name) {
                let name = rename(&s.name);
                saved_as.insert(rename(&h.name), SavedAs { name, ..s.clone() });
            }
            let Some(m) = moment else {
                plans.push(HfTensorPlan {
                    name: rename(&h.name),
                    ..h.clone()
                });
                continue;
            };
            let parts = h
                .parts
                .iter()
                .map(|(id, link)| {
                    let moment = format!("optimizer.{m}.{}", tensors[*id as usize].name);
                    let &mid = id_of.get(moment.as_str()).ok_or_else(|| Error::Export {
                        what: format!("the state has no `{moment}`"),
                    })?;
                    Ok((mid, link.clone()))
                })
                .collect::<Result<Vec<_>>>()?;
            plans.push(HfTensorPlan {
                name: rename(&h.name),
                shape: h.shape.clone(),
                dtype: DType::F32,
                parts,
                scalar: false,
            });
        }
    }
    extras.planner_data.extend(planner_data);
    extras.saved_as = saved_as;
    Ok((plans, extras, params))
}

/// Write the Hugging Face tensors `plans` of the model weights in `source`
/// as a new DCP checkpoint `out` laid out as `layout` (a layout of the
/// tensors `plans` name, in their order: each device's chunks in its own
/// `__<rank>_0.distcp` file), named and stacked as `extras` says, with
/// `config` as `config.json` beside it (where tenplan looks for a DCP
/// checkpoint's model). On any error the directory is removed.
pub fn export_dcp(
    source: &dyn Source,
    plans: &[HfTensorPlan],
    layout: &Layout,
    extras: &DcpExtras,
    (config, original_config): (&Value, bool),
    out: &Path,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Exported> {
    let named = layout.tensors().len() == plans.len()
        && layout
            .tensors()
            .iter()
            .zip(plans)
            .all(|(t, h)| t.name == h.name && t.shape == h.shape && t.dtype == h.dtype);
    if !named {
        return Err(Error::Export {
            what: "the DCP layout describes other tensors than the model's Hugging Face ones".into(),
        });
    }
    let specs = source.layout().tensors();
    let boxes = source.all_boxes();
    let mut extras = extras.clone();
    let text = serde_json::to_string_pretty(config).expect("configs always serialise");
    extras.side_files.insert("config.json".into(), text.into_bytes());
    let written = crate::dcp::write(
        out,
        layout,
        &extras,
        |b, slab, bytes| {
            let h = &plans[b.tensor as usize];
            let rows = slab.range(0);
            let whole = Region::full(&h.shape).with_range(0, rows.clone());
            if &whole == slab {
                fill_rows(h, &rows, &boxes, specs, bytes);
            } else {
                // A column-wise part (tensor parallelism on a later
                // dimension): its rows whole, then the part of them.
                let elem = h.dtype.size();
                let mut tmp = vec![0u8; (whole.volume() * elem) as usize];
                fill_rows(h, &rows, &boxes, specs, &mut tmp);
                let piece = |region: &Region| Piece {
                    tensor: 0,
                    region: region.clone(),
                    offset: 0,
                };
                copy_box(&tmp, &piece(&whole), bytes, &piece(slab), slab, elem as usize);
            }
            Ok(())
        },
        progress,
    )?;
    Ok(Exported {
        files: written.files,
        tensors: plans.len() + extras.literals.len(),
        data_bytes: written.data_bytes,
        file_bytes: written.file_bytes,
        original_config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenplan_models::{find, MODELS};

    #[test]
    fn every_catalog_model_plans_its_hugging_face_tensors() {
        for m in MODELS.iter().filter(|m| m.layers <= 8) {
            let state = ModelState::new(m, StateKind::Training);
            let plans = plan_hf_tensors(m, state.tensors()).unwrap();
            let hf: u64 = plans.iter().map(|h| h.shape.iter().product::<u64>()).sum();
            assert_eq!(
                hf,
                ModelState::new(m, StateKind::Weights(DType::BF16)).parameter_count()
            );
        }
    }

    #[test]
    fn dcp_tensors_are_the_live_modules() {
        // Mixtral: experts in 3-D stacks (gate then up), the router renamed.
        let m = find("mixtral-tiny").unwrap();
        let state = ModelState::new(m, StateKind::Weights(DType::F32));
        let (plans, extras) = plan_dcp_tensors(m, state.tensors()).unwrap();
        assert_eq!(plans.len(), plan_hf_tensors(m, state.tensors()).unwrap().len());
        let up = &extras.saved_as["model.layers.1.block_sparse_moe.experts.3.w3.weight"];
        assert_eq!(up.name, "model.layers.1.mlp.experts.gate_up_proj");
        assert_eq!(
            (up.lead.clone(), up.row0, up.shape.clone()),
            (vec![3], 16, vec![4, 32, 16])
        );
        let down = &extras.saved_as["model.layers.0.block_sparse_moe.experts.0.w2.weight"];
        assert_eq!(
            (down.name.as_str(), down.shape.clone()),
            ("model.layers.0.mlp.experts.down_proj", vec![4, 16, 16])
        );
        let router = &extras.saved_as["model.layers.0.block_sparse_moe.gate.weight"];
        assert_eq!(
            (router.name.as_str(), router.lead.len()),
            ("model.layers.0.mlp.gate.weight", 0)
        );
        // A tied model's output layer is saved once more, as the embedding.
        let mut tied = find("llama-tiny").unwrap().clone();
        tied.tied = true;
        let state = ModelState::new(&tied, StateKind::Weights(DType::F32));
        let (plans, extras) = plan_dcp_tensors(&tied, state.tensors()).unwrap();
        let head = plans.iter().find(|h| h.name == "lm_head.weight").unwrap();
        let embed = plans.iter().find(|h| h.name == "model.embed_tokens.weight").unwrap();
        assert_eq!(head.parts, embed.parts);
        assert!(extras.saved_as.is_empty());
    }

    #[test]
    fn shards_follow_the_size_bound() {
        let m = find("llama-tiny").unwrap();
        let state = ModelState::new(m, StateKind::Weights(DType::F32));
        let plans = plan_hf_tensors(m, state.tensors()).unwrap();
        let total: u64 = plans.iter().map(HfTensorPlan::bytes).sum();
        assert_eq!(shard(&plans, u64::MAX), vec![0..plans.len()]);
        let cut = shard(&plans, 2_000);
        assert!(cut.len() > 3);
        for r in &cut {
            let b: u64 = plans[r.clone()].iter().map(HfTensorPlan::bytes).sum();
            assert!(b <= 2_000 || r.len() == 1, "{b}");
        }
        assert_eq!(cut.last().unwrap().end, plans.len());
        assert!(total > 2_000);
    }
}
