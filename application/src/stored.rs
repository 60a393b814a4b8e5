//! States stored in files, opened for an operation: which model they hold,
//! in which format, and what the output records of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tenplan_formats::checkpoint::{MANIFEST_FILE, NAMED_STATE};
use tenplan_formats::dcp::{self, Dcp, MegatronParam, TorchOptimizer};
use tenplan_formats::{Checkpoint, Source};
use tenplan_models::{
    adam_moment, family_beyond_catalog, from_config_path, from_hf_config, hf_family, hf_layout, resolve, HfFamily,
    ModelSpec, ModelState, ParallelConfig, StateKind,
};
use tenplan_ptc::{Cluster, DType, JobState, Layout, TensorId, TensorSpec};

use crate::cluster::default_cluster;
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

/// A model a user named: a catalog name, a Hugging Face `config.json`, or
/// a model directory holding one; with the directory of that
/// `config.json`, whose original text an export writes back.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArg {
    /// What describes the model.
    pub described: Described,
    /// The directory of the `config.json` it was read from, if any.
    pub config_dir: Option<PathBuf>,
}

/// What describes a model's tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Described {
    /// tenplan's catalog: the model's state under Megatron's names.
    Catalog(ModelSpec),
    /// A transformers family beyond the catalog: the state is the model
    /// files' tensors under their own names, laid out by the family's
    /// tensor-parallel plan.
    Family {
        /// The family.
        family: &'static HfFamily,
        /// The `config.json`.
        config: Value,
    },
}

impl ModelArg {
    /// The model `name` names (see [`tenplan_models::resolve`]); a
    /// `config.json` of a transformers family beyond the catalog is
    /// described by that family.
    pub fn resolve(name: &str) -> Result<ModelArg> {
        let p = PathBuf::from(name);
        let config_dir = if p.is_file() {
            p.parent().map(Path::to_path_buf)
        } else if p.is_dir() {
            Some(p.clone())
        } else {
            None
        };
        let described = match resolve(name) {
            Ok(spec) => Described::Catalog(spec),
            Err(e) => match beyond_catalog(&p) {
                Some(family) => family,
                None => return Err(e.into()),
            },
        };
        Ok(ModelArg { described, config_dir })
    }

    /// The model a directory's `config.json` describes.
    fn of_dir(dir: &Path) -> Result<ModelArg> {
        let described = match from_config_path(dir) {
            Ok(spec) => Described::Catalog(spec),
            Err(e) => beyond_catalog(dir).ok_or(e)?,
        };
        Ok(ModelArg {
            described,
            config_dir: Some(dir.to_path_buf()),
        })
    }

    /// The catalog's description; `for_what` says what needs it, in the
    /// error for a family beyond the catalog.
    pub fn catalog(&self, for_what: &str) -> Result<&ModelSpec> {
        match &self.described {
            Described::Catalog(spec) => Ok(spec),
            Described::Family { family, .. } => Err(Error::request(format!(
                "a {} model ({}) is laid out under its own names, not tenplan's catalog: {for_what}",
                family.model_type, family.config_class
            ))),
        }
    }

    /// Its original `config.json`, when it describes the model.
    pub fn original_config(&self) -> Option<Value> {
        match &self.described {
            Described::Catalog(spec) => original_config(self.config_dir.as_deref()?, spec),
            Described::Family { config, .. } => Some(config.clone()),
        }
    }
}

/// Largest `config.json` read: real ones are a few kB.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// A `config.json` (or a directory holding one) of a transformers family
/// beyond the catalog.
fn beyond_catalog(path: &Path) -> Option<Described> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if std::fs::metadata(&file).ok()?.len() > MAX_CONFIG_BYTES {
        return None;
    }
    let config: Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
    let family = family_beyond_catalog(&config)?;
    Some(Described::Family { family, config })
}

/// The model of a PyTorch DCP checkpoint, which does not name it: `model`,
/// or a `config.json` beside the checkpoint.
pub fn dcp_model(dir: &Path, model: Option<&ModelArg>) -> Result<ModelArg> {
    match model {
        Some(m) => Ok(m.clone()),
        None if dir.join("config.json").is_file() => ModelArg::of_dir(dir),
        None => Err(Error::request(format!(
            "{}: a DCP checkpoint does not name its model; give --model (a name, a config.json or a Hugging Face model directory)",
            dir.display()
        ))),
    }
}

/// The weights state a DCP checkpoint holds of `spec`, in its element type
/// (the model found under the one prefix `exclude` leaves).
pub fn dcp_state(d: &Dcp, spec: &ModelSpec, exclude: &[String]) -> Result<ModelState> {
    let probe = ModelState::new(spec, StateKind::Weights(DType::BF16));
    let dtype = d.dtype_of(spec, probe.tensors(), exclude)?;
    // The state is what the checkpoint holds: MTP modules too.
    let spec = spec.with_mtp_layers(d.mtp_layers(spec, exclude));
    Ok(ModelState::new(&spec, StateKind::Weights(dtype)))
}

/// [`dcp_state`]; with `adam`, the weights and their Adam moments
/// ([`StateKind::WeightsAndAdam`]) where the checkpoint holds the moments,
/// with the prefix it keeps them under.
pub fn dcp_state_as(d: &Dcp, spec: &ModelSpec, exclude: &[String], adam: bool) -> Result<(ModelState, Option<String>)> {
    let state = dcp_state(d, spec, exclude)?;
    let moments = match adam {
        true => d.adam_moments_of(state.spec(), state.tensors(), exclude)?,
        false => None,
    };
    Ok(match (moments, state.kind()) {
        (Some(prefix), StateKind::Weights(dtype)) => (
            ModelState::new(state.spec(), StateKind::WeightsAndAdam(dtype)),
            Some(prefix),
        ),
        _ => (state, None),
    })
}

/// The model directory's `config.json`, when it describes `spec`: kept in
/// a manifest so that an export writes it back.
pub fn original_config(dir: &Path, spec: &ModelSpec) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let same = from_hf_config(&spec.name, &text).ok()?.same_model(spec);
    same.then(|| serde_json::from_str(&text).ok()).flatten()
}

/// The model of a Hugging Face directory: `model`, or its `config.json`.
pub fn hf_model(dir: &Path, model: Option<&ModelArg>) -> Result<ModelArg> {
    match model {
        Some(m) => Ok(m.clone()),
        None if dir.join("config.json").is_file() => ModelArg::of_dir(dir),
        None => Err(Error::request(format!(
            "{} has no config.json: name the model with --model",
            dir.display()
        ))),
    }
}

/// The model a tenplan checkpoint's manifest names (`why` says what it is
/// needed for, in the error when it names none).
pub(crate) fn manifest_model(c: &Checkpoint, why: &str) -> Result<ModelSpec> {
    let dir = c.dir();
    match c.manifest().model() {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(Error::request(format!(
            "{}: the manifest names no model, so {why}",
            dir.display()
        ))),
        Err(what) => Err(tenplan_formats::Error::Manifest {
            path: dir.join(MANIFEST_FILE),
            what,
        }
        .into()),
    }
}

/// Refuse a model given for a tenplan checkpoint, which names its own.
pub(crate) fn no_model_for_tenplan(dir: &Path, model: Option<&ModelArg>) -> Result<()> {
    match model {
        Some(_) => Err(Error::request(format!(
            "--model is for DCP checkpoints: {} names its model in its manifest",
            dir.display()
        ))),
        None => Ok(()),
    }
}

/// A state stored in files, opened for resharding: what is read, and what
/// the output records of it.
pub struct OpenedSource {
    /// What a plan reads.
    pub source: Box<dyn Source>,
    /// What lays its tensors out.
    pub model: OpenedModel,
    /// The cluster its devices belong to.
    pub cluster: Cluster,
    /// The state's name for a manifest (`training`, `weights:bf16`, `hf`, ...).
    pub state_label: Option<String>,
    /// The job's dataset and RNG state.
    pub job: JobState,
    /// The model's original `config.json`, when known.
    pub hf_config: Option<Value>,
    /// Tensors saved with no dimension.
    pub scalars: Vec<String>,
    /// Source entries the model's state does not read (tensors, and the
    /// entries that are not tensors).
    pub unused: Vec<String>,
    /// The source's entries that are not tensors.
    pub others: Vec<String>,
    /// Its format: `tenplan` or `PyTorch DCP`.
    pub format: &'static str,
    /// A DCP state opened with its Adam moments: the optimizer's groups and
    /// steps, and each parameter by Megatron's name with the FQNs it is
    /// made of.
    pub adam: Option<(TorchOptimizer, Vec<MegatronParam>)>,
}

/// What lays out the tensors of an opened state.
pub enum OpenedModel {
    /// A catalog model's state, under Megatron's names.
    Catalog(ModelState),
    /// A transformers family's weights under their own names.
    Family {
        /// The family.
        family: &'static HfFamily,
        /// The model's `config.json`.
        config: Value,
    },
}

impl OpenedModel {
    /// The model's name for a summary.
    pub fn name(&self) -> String {
        match self {
            OpenedModel::Catalog(state) => state.spec().name.to_string(),
            OpenedModel::Family { family, .. } => family.model_type.clone(),
        }
    }

    /// The layout of `tensors` (the source's) under `cfg` on `cluster`.
    pub fn layout(&self, tensors: Arc<[TensorSpec]>, cfg: &ParallelConfig, cluster: &Cluster) -> Result<Layout> {
        match self {
            OpenedModel::Catalog(state) => {
                state.check_plannable(cfg, cluster)?;
                Ok(state.layout(cfg)?)
            }
            OpenedModel::Family { family, config } => {
                cfg.check_cluster(cluster)?;
                Ok(hf_layout(family, config, tensors, cfg)?)
            }
        }
    }
}

impl OpenedSource {
    /// A tenplan checkpoint, or a DCP checkpoint mapped onto `model` (see
    /// [`dcp_model`]; entries whose names contain a pattern of `exclude`
    /// are not candidates for it).
    pub fn open(dir: &Path, model: Option<&ModelArg>, exclude: &[String]) -> Result<OpenedSource> {
        OpenedSource::open_as(dir, model, exclude, false)
    }

    /// [`open`](Self::open); with `adam`, a DCP checkpoint of PyTorch's
    /// `get_state_dict(model, optim)` that holds the model's Adam moments
    /// is opened with them ([`StateKind::WeightsAndAdam`]), its parameter
    /// groups and steps read beside ([`OpenedSource::adam`]) and no longer
    /// among the entries the state leaves unread.
    pub fn open_as(dir: &Path, model: Option<&ModelArg>, exclude: &[String], adam: bool) -> Result<OpenedSource> {
        if dcp::is_dcp(dir) {
            let d = Arc::new(Dcp::open(dir)?);
            let model = dcp_model(dir, model)?;
            let spec = model.catalog(
                "a DCP checkpoint of it reshards to a mesh, keeping its names (--to dp_shard=N[,dp_replicate=M])",
            )?;
            let (state, moments) = dcp_state_as(&d, spec, exclude, adam && d.megatron().is_none())?;
            let s = d.source(state.spec(), state.tensors(), exclude)?;
            let mut unused = s.unused().to_vec();
            let adam = match moments {
                Some(prefix) => {
                    let optimizer = d.torch_optimizer(&prefix)?;
                    unused.retain(|n| optimizer.entries.binary_search(n).is_err());
                    let params = megatron_params(state.tensors(), &s, &prefix);
                    Some((optimizer, params))
                }
                None => None,
            };
            return Ok(OpenedSource {
                cluster: default_cluster(d.ranks())?,
                state_label: Some(state.kind().to_string()),
                job: JobState::default(),
                hf_config: model.original_config(),
                scalars: Vec::new(),
                unused,
                others: d.other_entries(),
                source: Box::new(s),
                model: OpenedModel::Catalog(state),
                format: d.format_name(),
                adam,
            });
        }
        no_model_for_tenplan(dir, model)?;
        let c = Checkpoint::open(dir)?;
        let m = c.manifest();
        let opened = if m.state.as_deref() == Some(NAMED_STATE) {
            // The manifest's claims were checked on opening: its config
            // names a family.
            let config = m.hf_config.clone().unwrap_or_default();
            let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
            let family = hf_family(model_type).ok_or_else(|| {
                Error::request(format!("{}: `{model_type}` is no transformers family", dir.display()))
            })?;
            OpenedModel::Family { family, config }
        } else {
            let model = manifest_model(&c, "its target layout cannot be built")?;
            let label = m.state.as_deref().unwrap_or("training");
            OpenedModel::Catalog(ModelState::new(&model, label.parse::<StateKind>()?))
        };
        Ok(OpenedSource {
            model: opened,
            cluster: m.cluster.clone(),
            state_label: m.state.clone(),
            job: m.job,
            hf_config: m.hf_config.clone(),
            scalars: m.scalars.clone(),
            unused: Vec::new(),
            others: Vec::new(),
            source: Box::new(c),
            format: "tenplan",
            adam: None,
        })
    }
}

/// Each weight of `tensors` (a `WeightsAndAdam` state read by `source`)
/// by Megatron's name, with the optimizer FQNs its first moment is read
/// from (saved under `prefix`, the FQN, `.exp_avg`).
pub(crate) fn megatron_params(tensors: &[TensorSpec], source: &dcp::DcpSource, prefix: &str) -> Vec<MegatronParam> {
    let moment_of: BTreeMap<&str, usize> = tensors
        .iter()
        .enumerate()
        .filter_map(|(t, spec)| match adam_moment(&spec.name) {
            Some(("exp_avg", p)) => Some((p, t)),
            _ => None,
        })
        .collect();
    tensors
        .iter()
        .filter_map(|spec| {
            let &t = moment_of.get(spec.name.as_str())?;
            let fqns = source
                .reads(t as TensorId)
                .iter()
                .filter_map(|n| n.strip_prefix(prefix)?.strip_suffix(".exp_avg").map(String::from))
                .collect();
            Some(MegatronParam {
                name: spec.name.clone(),
                ndim: spec.shape.len(),
                fqns,
            })
        })
        .collect()
}
