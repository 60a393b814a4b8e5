//! Compare two states tensor by tensor, whatever their layouts and
//! formats: tenplan checkpoints, PyTorch DCP checkpoints and Hugging Face
//! model directories.
//!
//! Two checkpoints of one format are compared as they are: every tensor
//! under its own name (optimizer state included) and, for DCP, every entry
//! that is not a tensor, by its bytes. Checkpoints of two formats are
//! compared through the model, under tenplan's names; what either side
//! holds that the model does not read is counted on that side only. Two
//! DCP checkpoints that both hold the model's Adam moments (a PyTorch
//! job's `get_state_dict`, Megatron's distributed optimizer) compare them
//! too, like their parameters; a PyTorch optimizer's steps and
//! hyperparameters against Megatron's parameter groups, and Megatron's
//! main parameters against the weights they must equal. Either
//! way, "identical" means both sides hold the same entries, equal; options
//! restrict the comparison only explicitly (`weights_only`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_formats::checkpoint::{MANIFEST_FILE, NAMED_STATE};
use tenplan_formats::dcp::{self, Dcp};
use tenplan_formats::diff::{
    checkpoint_digests, compare, first_difference, hf_digests, source_digests, Difference, FirstDifference,
    TensorDigest,
};
use tenplan_formats::hf::{links, HfModel, HfState};
use tenplan_formats::{Checkpoint, Source};
use tenplan_models::{ModelSpec, ModelState, StateKind};
use tenplan_ptc::{read_box, DType, Region, TensorSpec};

use crate::reshard::is_optimizer_state;
use crate::stored::{dcp_model, dcp_state_as, hf_model, megatron_params, Described, ModelArg};
use crate::Result;

/// What [`diff`] found between two checkpoints or models.
#[derive(Clone, Debug, Serialize)]
pub struct Diffed {
    /// The first side.
    pub a: PathBuf,
    /// The second side.
    pub b: PathBuf,
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
    pub different: Vec<Difference>,
    /// The first tensor whose contents differ, down to its first differing
    /// element.
    pub first_difference: Option<FirstDifference>,
    /// Where the first side keeps that element (a stored box, or a Hugging
    /// Face tensor's row).
    pub first_difference_in_a: Option<String>,
    /// Where the second side keeps it.
    pub first_difference_in_b: Option<String>,
    /// Tensors only the first side has.
    pub only_a: Vec<String>,
    /// Tensors only the second side has.
    pub only_b: Vec<String>,
    /// Entries left out of the comparison on purpose (`weights_only`).
    pub left_out: Vec<String>,
    /// Bytes digested on both sides.
    pub bytes: u64,
    /// Seconds the comparison took.
    pub seconds: f64,
}

/// Compare two checkpoints or models, each a tenplan checkpoint, a PyTorch
/// DCP checkpoint or a Hugging Face model directory, tensor by tensor
/// (whatever their layouts): digests first, then the first differing
/// element of the first tensor that differs. `model` names the model of a
/// DCP checkpoint or of a Hugging Face directory without a config.json
/// where the two sides are of two formats; `weights_only` leaves optimizer
/// state, master weights, gradients and entries that are not tensors out,
/// and says so.
pub fn diff(a: &Path, b: &Path, model: Option<&ModelArg>, weights_only: bool) -> Result<Diffed> {
    let start = Instant::now();
    let own = kind_of(a) == kind_of(b) || own_names(a, model) || own_names(b, model);
    // Two DCP checkpoints that both hold the model's Adam moments (a
    // PyTorch job's, Megatron's distributed optimizer's) compare them too.
    let (dcp_a, dcp_b) = (open_dcp(a)?, open_dcp(b)?);
    let adam = !own && !weights_only && holds_adam(&dcp_a, a, model)? && holds_adam(&dcp_b, b, model)?;
    let ((side_a, ma, a_kind), (side_b, mb, b_kind)) = (
        DiffSide::open(a, dcp_a, model, own, adam)?,
        DiffSide::open(b, dcp_b, model, own, adam)?,
    );
    let (mut da, mut db) = (side_a.digests()?, side_b.digests()?);
    let (mut oa, mut ob) = (side_a.others(), side_b.others());
    let (mut ua, mut ub) = (side_a.unused(), side_b.unused());
    let mut left_out = Vec::new();
    if weights_only {
        for (side, digests, others, unused, model) in [
            (&side_a, &mut da, &mut oa, &mut ua, &ma),
            (&side_b, &mut db, &mut ob, &mut ub, &mb),
        ] {
            // Tensors under tenplan's names are weights when the model says
            // so; a checkpoint read as it is tells optimizer state by name.
            let weights = model.as_ref().map(|m| m.weight_names());
            let is_weight = |n: &str| weights.as_ref().map_or(!is_optimizer_state(n), |w| w.contains(n));
            left_out.extend(digests.iter().filter(|t| !is_weight(&t.name)).map(|t| t.name.clone()));
            digests.retain(|t| is_weight(&t.name));
            left_out.extend(others.keys().cloned());
            others.clear();
            let not_tensors = side.other_names();
            let dropped = |n: &String| is_optimizer_state(n) || not_tensors.contains(n);
            left_out.extend(unused.iter().filter(|n| dropped(n)).cloned());
            unused.retain(|n| !dropped(n));
        }
        left_out.sort();
        left_out.dedup();
    }
    let mut d = compare(&da, &db);
    // Entries that are not tensors, by their bytes; what only one side
    // holds, on that side.
    for (name, bytes) in &oa {
        match ob.get(name) {
            // Archives that hold nothing (`_extra_state` None, an empty
            // common.pt) are the same state whatever their bytes.
            Some(other) if other == bytes || (dcp::holds_nothing(other) && dcp::holds_nothing(bytes)) => d.same += 1,
            Some(_) => d.different.push(Difference {
                name: name.clone(),
                what: "bytes of an entry that is not a tensor".into(),
            }),
            None => d.only_a.push(name.clone()),
        }
    }
    d.only_b.extend(ob.keys().filter(|n| !oa.contains_key(*n)).cloned());
    // A PyTorch optimizer's steps and parameter groups against Megatron's
    // (in common.pt), and Megatron's main parameters against the weights
    // (the PyTorch job's parameters are its weights).
    if let (Some(x), Some(y)) = (side_a.optimizer(), side_b.optimizer()) {
        let pair = match (x, y) {
            (SideOptimizer::Torch(t, p), SideOptimizer::Megatron(g, m)) => Some((t, p, g, m, &mut ua, &mut ub)),
            (SideOptimizer::Megatron(g, m), SideOptimizer::Torch(t, p)) => Some((t, p, g, m, &mut ub, &mut ua)),
            _ => None,
        };
        if let Some((torch, params, groups, mains, torch_unused, megatron_unused)) = pair {
            let differences = dcp::optimizer_differences(torch, params, groups);
            match differences.is_empty() {
                true => d.same += 1,
                false => d.different.push(Difference {
                    name: "optimizer steps and hyperparameters".into(),
                    what: differences.iter().take(3).cloned().collect::<Vec<_>>().join("; "),
                }),
            }
            torch_unused.retain(|n| torch.entries.binary_search(n).is_err());
            let common = format!("{}:optimizer", dcp::COMMON_FILE);
            megatron_unused.retain(|n| *n != common);
            for (name, equal) in mains {
                megatron_unused.retain(|n| n != name);
                match equal {
                    true => d.same += 1,
                    false => d.different.push(Difference {
                        name: name.clone(),
                        what: "main parameters other than the weights".into(),
                    }),
                }
            }
        }
    }
    d.only_a.extend(ua);
    d.only_b.extend(ub);
    d.only_a.sort();
    d.only_b.sort();
    let first = match d.different.iter().find(|x| x.what.starts_with("contents")) {
        Some(x) => side_a.with_tensor(&x.name, |x| -> Result<_> {
            let Some((spec, fa)) = x else { return Ok(None) };
            side_b.with_tensor(&spec.name, |y| {
                let (_, fb) = y?;
                first_difference(spec, fa, fb)
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
        .sum::<u64>()
        + oa.values().chain(ob.values()).map(|b| b.len() as u64).sum::<u64>();
    Ok(Diffed {
        a: a.to_path_buf(),
        b: b.to_path_buf(),
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
        left_out,
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The format of a directory.
#[derive(PartialEq, Eq)]
enum Kind {
    Tenplan,
    Dcp,
    /// Megatron-Core's torch_dist: a DCP checkpoint under Megatron's names.
    Megatron,
    Hf,
}

fn kind_of(dir: &Path) -> Kind {
    if dir.join(MANIFEST_FILE).is_file() {
        Kind::Tenplan
    } else if dcp::is_dcp(dir) && dcp::is_megatron(dir) {
        Kind::Megatron
    } else if dcp::is_dcp(dir) {
        Kind::Dcp
    } else {
        Kind::Hf
    }
}

/// Whether `dir` keeps its tensors under the names of the files they came
/// from whatever its format: a tenplan checkpoint of a transformers family
/// beyond the catalog, or a model such a family describes.
fn own_names(dir: &Path, model: Option<&ModelArg>) -> bool {
    let described = match model {
        Some(m) => Some(m.described.clone()),
        None if !dir.join(MANIFEST_FILE).is_file() && dir.join("config.json").is_file() => {
            ModelArg::resolve(&dir.to_string_lossy()).ok().map(|m| m.described)
        }
        None => None,
    };
    if matches!(described, Some(Described::Family { .. })) {
        return true;
    }
    Checkpoint::open(dir).is_ok_and(|c| c.manifest().state.as_deref() == Some(NAMED_STATE))
}

/// What one side's optimizer keeps besides its Adam moments.
enum SideOptimizer {
    /// A PyTorch optimizer's groups and steps, and the model's parameters
    /// with their FQNs.
    Torch(dcp::TorchOptimizer, Vec<dcp::MegatronParam>),
    /// Megatron's parameter groups, and its main parameters, each with
    /// whether it is the weight itself.
    Megatron(Vec<dcp::MegatronGroup>, Vec<(String, bool)>),
}

/// `dir` opened as a DCP checkpoint, where it is one (and no tenplan
/// checkpoint).
fn open_dcp(dir: &Path) -> Result<Option<Arc<Dcp>>> {
    match !dir.join(MANIFEST_FILE).is_file() && dcp::is_dcp(dir) {
        true => Ok(Some(Arc::new(Dcp::open(dir)?))),
        false => Ok(None),
    }
}

/// Whether `d` (`dir` opened, where it is a DCP checkpoint) holds the Adam
/// moments of its model.
fn holds_adam(d: &Option<Arc<Dcp>>, dir: &Path, model: Option<&ModelArg>) -> Result<bool> {
    let Some(d) = d else { return Ok(false) };
    let spec = dcp_model(dir, model)?.catalog("compared by its own names")?.clone();
    Ok(dcp_state_as(d, &spec, &[], true)?.1.is_some())
}

/// One side of a diff, open.
enum DiffSide {
    /// A tenplan checkpoint: its own tensors.
    Tenplan(Box<Checkpoint>),
    /// A DCP checkpoint mapped onto a model, its entries that are not
    /// tensors, and what its optimizer keeps besides the moments (where
    /// they are compared).
    Dcp(dcp::DcpSource, Vec<String>, Option<SideOptimizer>),
    /// A DCP checkpoint as it is.
    DcpState(dcp::DcpState),
    /// A Hugging Face directory read as a model's state.
    Hf(HfModel, ModelState),
    /// A Hugging Face directory as it is.
    HfState(HfState),
}

impl DiffSide {
    /// Open `dir` (`dcp`: opened, where it is a DCP checkpoint) as it is
    /// (`own`), or read through the model.
    fn open(
        dir: &Path,
        dcp: Option<Arc<Dcp>>,
        model: Option<&ModelArg>,
        own: bool,
        adam: bool,
    ) -> Result<(DiffSide, Option<ModelSpec>, &'static str)> {
        if dir.join(MANIFEST_FILE).is_file() {
            let c = Checkpoint::open(dir)?;
            let spec = c.manifest().model().map_err(|e| tenplan_formats::Error::File {
                path: dir.to_path_buf(),
                what: e,
            })?;
            return Ok((DiffSide::Tenplan(Box::new(c)), spec, "tenplan checkpoint"));
        }
        if let Some(d) = dcp {
            let kind = match d.megatron() {
                Some(_) => "Megatron-Core torch_dist checkpoint",
                None => "PyTorch DCP checkpoint",
            };
            if own {
                return Ok((DiffSide::DcpState(d.state()?), None, kind));
            }
            let spec = dcp_model(dir, model)?.catalog("compared by its own names")?.clone();
            let (state, moments) = dcp_state_as(&d, &spec, &[], adam)?;
            let spec = state.spec().clone();
            let source = d.source(&spec, state.tensors(), &[])?;
            let optimizer = match (moments, d.megatron()) {
                (None, _) => None,
                (Some(prefix), None) => Some(SideOptimizer::Torch(
                    d.torch_optimizer(&prefix)?,
                    megatron_params(state.tensors(), &source, &prefix),
                )),
                (Some(_), Some(_)) => Some(SideOptimizer::Megatron(
                    d.megatron_optimizer()?.unwrap_or_default(),
                    d.main_params()?,
                )),
            };
            return Ok((DiffSide::Dcp(source, d.other_entries(), optimizer), Some(spec), kind));
        }
        let hf = HfModel::open(dir).map_err(|e| tenplan_formats::Error::File {
            path: dir.to_path_buf(),
            what: format!("neither a tenplan checkpoint (no tenplan.json), a DCP checkpoint (no .metadata) nor a Hugging Face model: {e}"),
        })?;
        if own {
            let hf = Arc::new(hf);
            return Ok((DiffSide::HfState(hf.state()?), None, "Hugging Face model"));
        }
        let spec = hf.held(hf_model(dir, model)?.catalog("compared by its own names")?, &[]);
        let dtype = hf.dtype().ok_or_else(|| tenplan_formats::Error::File {
            path: dir.to_path_buf(),
            what: "the model files hold no tensor".into(),
        })?;
        let state = ModelState::new(&spec, StateKind::Weights(dtype));
        Ok((DiffSide::Hf(hf, state), Some(spec), "Hugging Face model"))
    }

    /// What the side's optimizer keeps besides the moments it compares.
    fn optimizer(&self) -> Option<&SideOptimizer> {
        match self {
            DiffSide::Dcp(_, _, o) => o.as_ref(),
            _ => None,
        }
    }

    /// The stored boxes of a side read as it is stored.
    fn stored(&self) -> Option<&dyn Source> {
        match self {
            DiffSide::Tenplan(c) => Some(c.as_ref()),
            DiffSide::Dcp(s, _, _) => Some(s),
            DiffSide::DcpState(s) => Some(s),
            DiffSide::HfState(s) => Some(s),
            DiffSide::Hf(..) => None,
        }
    }

    /// The entries that are not tensors, with their bytes (a DCP
    /// checkpoint read as it is).
    fn others(&self) -> BTreeMap<String, Vec<u8>> {
        match self {
            DiffSide::DcpState(s) => {
                let extras = s.extras();
                let mut all = extras.others.clone();
                // A Megatron-Core checkpoint's common state is state too.
                if let Some(common) = extras.side_files.get(dcp::COMMON_FILE) {
                    all.insert(dcp::COMMON_FILE.to_string(), common.clone());
                }
                all
            }
            _ => BTreeMap::new(),
        }
    }

    /// The names of the side's entries that are not tensors.
    fn other_names(&self) -> Vec<String> {
        match self {
            DiffSide::Dcp(_, others, _) => others.clone(),
            DiffSide::DcpState(_) => self.others().into_keys().collect(),
            _ => Vec::new(),
        }
    }

    /// What the side holds that reading it through the model left out.
    fn unused(&self) -> Vec<String> {
        match self {
            DiffSide::Dcp(s, _, _) => s.unused().to_vec(),
            DiffSide::Hf(hf, state) => hf
                .sources(state.spec(), state.tensors())
                .map(|s| s.unused().to_vec())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn digests(&self) -> Result<Vec<TensorDigest>> {
        Ok(match self {
            DiffSide::Tenplan(c) => checkpoint_digests(c)?,
            DiffSide::Dcp(s, _, _) => source_digests(s),
            DiffSide::DcpState(s) => source_digests(s),
            DiffSide::HfState(s) => source_digests(s),
            DiffSide::Hf(hf, state) => {
                let dtype = state.tensors().first().map_or(DType::BF16, |t| t.dtype);
                hf_digests(hf, state.spec(), dtype)?
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
                read_box(&boxes[t], r, out, elem);
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
            let l = links(state.spec(), t).into_iter().find(|l| l.rows.contains(&row))?;
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
