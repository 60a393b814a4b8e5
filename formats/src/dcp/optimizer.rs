//! What an optimizer keeps beside its moments, read from one framework's
//! checkpoint and written as another's: PyTorch's `get_state_dict(model,
//! optim)` (FSDP2, DTensor and plain jobs) keeps each parameter group's
//! hyperparameters and the FQNs of its parameters (`optim.param_groups.
//! <i>.<key>`, pickled) and one `step` per parameter (`optim.state.<fqn>.
//! step`, 0-d); Megatron-Core's distributed optimizer keeps one step and its
//! own parameter groups in `common.pt`, matched on load by the keys
//! Megatron groups parameters by.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use tenplan_ptc::DType;

use super::megatron::archive_value;
use super::torch_save::object_archive;
use super::Dcp;
use crate::pickle::Value;
use crate::pickle_writer::PickleWriter;
use crate::{Error, Result};

/// A hyperparameter of a parameter group, as PyTorch keeps it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Hyper {
    /// `None`.
    None,
    /// A bool (`amsgrad`, `maximize`, ...).
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (`lr`, `eps`, `weight_decay`, ...).
    Float(f64),
    /// A string.
    Str(String),
    /// A tuple (`betas`).
    Tuple(Vec<Hyper>),
}

impl std::fmt::Display for Hyper {
    /// As Python writes the value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hyper::None => f.write_str("None"),
            Hyper::Bool(true) => f.write_str("True"),
            Hyper::Bool(false) => f.write_str("False"),
            Hyper::Int(i) => write!(f, "{i}"),
            Hyper::Float(x) => write!(f, "{x:?}"),
            Hyper::Str(s) => write!(f, "'{s}'"),
            Hyper::Tuple(items) => {
                let inner: Vec<String> = items.iter().map(ToString::to_string).collect();
                match inner.len() {
                    1 => write!(f, "({},)", inner[0]),
                    _ => write!(f, "({})", inner.join(", ")),
                }
            }
        }
    }
}

impl Hyper {
    fn of(v: &Value) -> Option<Hyper> {
        Some(match v {
            Value::None => Hyper::None,
            Value::Bool(b) => Hyper::Bool(*b),
            Value::Int(i) => Hyper::Int(*i),
            Value::Float(x) => Hyper::Float(*x),
            Value::Str(s) => Hyper::Str(s.to_string()),
            Value::Tuple(items) => Hyper::Tuple(items.iter().map(Hyper::of).collect::<Option<_>>()?),
            _ => return None,
        })
    }

    fn value(&self) -> Value {
        match self {
            Hyper::None => Value::None,
            Hyper::Bool(b) => Value::Bool(*b),
            Hyper::Int(i) => Value::Int(*i),
            Hyper::Float(x) => Value::Float(*x),
            Hyper::Str(s) => Value::Str(s.as_str().into()),
            Hyper::Tuple(items) => Value::Tuple(items.iter().map(Hyper::value).collect()),
        }
    }
}

/// A parameter group of a PyTorch optimizer's state dict.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchParamGroup {
    /// Its parameters, by FQN (as `get_state_dict` names them).
    pub params: Vec<String>,
    /// Its hyperparameters, by key (`lr`, `betas`, ...).
    pub hyper: BTreeMap<String, Hyper>,
}

/// What a DCP checkpoint of `get_state_dict(model, optim)` keeps of an
/// Adam optimizer besides its moments.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchOptimizer {
    /// The parameter groups, in order.
    pub groups: Vec<TorchParamGroup>,
    /// Each parameter's step, by FQN.
    pub steps: BTreeMap<String, f64>,
    /// The checkpoint's entries these were read from.
    pub entries: Vec<String>,
}

impl Dcp {
    /// The parameter groups and steps beside the moments saved under
    /// `moments_prefix` (`optim.state.`): the groups under
    /// `optim.param_groups.`, each parameter's `step` beside its moments.
    pub fn torch_optimizer(&self, moments_prefix: &str) -> Result<TorchOptimizer> {
        let bad = |what: String| Error::file(self.dir(), what);
        let base = moments_prefix
            .strip_suffix("state.")
            .ok_or_else(|| bad(format!("moments under `{moments_prefix}`, not an optimizer's `state.`")))?;
        let groups_prefix = format!("{base}param_groups.");
        // Each group's parameters (once read) and hyperparameters, by index.
        type Read = (Option<Vec<String>>, BTreeMap<String, Hyper>);
        let mut groups: BTreeMap<u64, Read> = BTreeMap::new();
        let mut entries = Vec::new();
        for name in self.others() {
            let Some(rest) = name.strip_prefix(&groups_prefix) else {
                continue;
            };
            let Some((index, key)) = rest
                .split_once('.')
                .and_then(|(i, k)| Some((i.parse::<u64>().ok()?, k)))
            else {
                return Err(bad(format!("`{name}` is no `param_groups.<index>.<key>` entry")));
            };
            let bytes = self.bytes_entry(name)?;
            let value = archive_value(&bytes).map_err(|what| bad(format!("`{name}`: {what}")))?;
            let group = groups.entry(index).or_default();
            if key == "params" {
                let fqns = value
                    .items()
                    .and_then(|items| {
                        items
                            .iter()
                            .map(|v| v.as_str().map(String::from))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| bad(format!("`{name}` is a {}, not a list of parameter names", value.kind())))?;
                group.0 = Some(fqns);
            } else {
                let hyper = Hyper::of(&value).ok_or_else(|| {
                    bad(format!(
                        "`{name}` is a {}; tenplan carries hyperparameters that are numbers, bools, strings or tuples of them",
                        value.kind()
                    ))
                })?;
                group.1.insert(key.to_string(), hyper);
            }
            entries.push(name.clone());
        }
        let groups = groups
            .into_iter()
            .map(|(i, (params, hyper))| {
                let params = params.ok_or_else(|| bad(format!("`{groups_prefix}{i}` has no `params` entry")))?;
                Ok(TorchParamGroup { params, hyper })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut steps = BTreeMap::new();
        for t in self.tensors() {
            let Some(fqn) = t
                .name
                .strip_prefix(moments_prefix)
                .and_then(|r| r.strip_suffix(".step"))
            else {
                continue;
            };
            let value = match (t.shape.iter().product::<u64>(), t.chunks.first()) {
                (1, Some(c)) => {
                    let b = self.chunk_bytes(c);
                    match t.dtype {
                        DType::F32 => b.try_into().ok().map(|b| f32::from_le_bytes(b) as f64),
                        DType::F64 => b.try_into().ok().map(f64::from_le_bytes),
                        DType::I64 => b.try_into().ok().map(|b| i64::from_le_bytes(b) as f64),
                        _ => None,
                    }
                }
                _ => None,
            }
            .ok_or_else(|| {
                bad(format!(
                    "`{}` ({} of shape {:?}) is not one step count",
                    t.name, t.dtype, t.shape
                ))
            })?;
            steps.insert(fqn.to_string(), value);
            entries.push(t.name.clone());
        }
        entries.sort();
        Ok(TorchOptimizer { groups, steps, entries })
    }
}

/// A parameter of a model as Megatron-Core's distributed optimizer groups
/// it, with the FQNs a PyTorch optimizer of the same model keeps it under.
#[derive(Clone, Debug)]
pub struct MegatronParam {
    /// Megatron's name (`decoder.layers.0.self_attention.linear_qkv.weight`).
    pub name: String,
    /// Its number of dimensions.
    pub ndim: usize,
    /// The PyTorch FQNs it is made of (a fused QKV: three).
    pub fqns: Vec<String>,
}

impl MegatronParam {
    /// Megatron's default weight-decay multiplier: none for biases and
    /// vectors (`get_standard_config_overrides`).
    pub fn wd_mult(&self) -> f64 {
        match self.ndim == 1 || self.name.ends_with(".bias") {
            true => 0.0,
            false => 1.0,
        }
    }

    /// Whether Megatron keeps it out of the data-parallel all-reduce (a
    /// routed expert's weight), which puts it in a group of its own.
    pub fn is_expert_parallel(&self) -> bool {
        self.name.contains(".experts.")
    }

    /// The index of its group among Megatron's saved `groups`.
    fn group_in(&self, groups: &[MegatronGroup]) -> Option<usize> {
        groups
            .iter()
            .position(|g| g.wd_mult == self.wd_mult() && g.is_expert_parallel == self.is_expert_parallel())
    }
}

impl TorchOptimizer {
    /// The index of each parameter's group, by FQN.
    fn group_of_fqn(&self) -> BTreeMap<&str, usize> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, group)| group.params.iter().map(move |p| (p.as_str(), g)))
            .collect()
    }
}

/// The `common.pt` of a Megatron-Core checkpoint whose distributed
/// optimizer state (`fully_reshardable`) comes from the PyTorch optimizer
/// `torch`: Megatron's parameter groups, one per (weight-decay multiplier,
/// expert-parallel) of its default grouping, each with the hyperparameters
/// of the PyTorch groups its parameters were in and the one step all
/// parameters share.
///
/// Megatron's loader finds each of the job's groups by `wd_mult`,
/// `lr_mult`, `is_expert_parallel` and `is_decoupled_lr` and takes the
/// saved group's hyperparameters; a group no parameter of `params` falls
/// in (a dense model's expert groups are not written; a model without
/// vectors still gets its `wd_mult` 0 group) takes those of the first one.
/// `max_lr` is the source's `lr`, `min_lr` none. Refused, naming the
/// parameters: a parameter in no group or without a step, parameters of
/// one Megatron group with different hyperparameters, steps that differ.
pub fn distributed_optimizer_common(params: &[MegatronParam], torch: &TorchOptimizer) -> Result<Vec<u8>> {
    let refuse = |tensor: &str, what: String| Error::Coverage {
        tensor: tensor.to_string(),
        what,
    };
    let group_of = torch.group_of_fqn();
    let mut step: Option<(f64, &str)> = None;
    // Megatron's groups, by (is_expert_parallel, wd_mult as bits, so that
    // 1.0 comes before 0.0 as Megatron orders them): the PyTorch group that
    // decides it, and the parameter that was first in it.
    let mut megatron: BTreeMap<(bool, std::cmp::Reverse<u64>), (usize, &str)> = BTreeMap::new();
    for p in params {
        let mut own: Option<(usize, &str)> = None;
        for fqn in &p.fqns {
            let g = *group_of.get(fqn.as_str()).ok_or_else(|| {
                refuse(
                    fqn,
                    "is in no parameter group of the optimizer (its param_groups do not list it)".into(),
                )
            })?;
            let s = *torch
                .steps
                .get(fqn)
                .ok_or_else(|| refuse(fqn, "has Adam moments but no step in the optimizer's state".into()))?;
            match step {
                None => step = Some((s, fqn)),
                Some((first, name)) if first != s => {
                    return Err(refuse(
                        fqn,
                        format!(
                        "at step {s}, `{name}` at step {first}: Megatron's optimizer keeps one step for all parameters"
                    ),
                    ))
                }
                _ => {}
            }
            match own {
                None => own = Some((g, fqn)),
                Some((first, name)) if torch.groups[first].hyper != torch.groups[g].hyper => {
                    return Err(refuse(
                        &p.name,
                        format!("Megatron fuses `{name}` and `{fqn}` into it, whose parameter groups have different hyperparameters"),
                    ))
                }
                _ => {}
            }
        }
        let Some((g, fqn)) = own else { continue };
        let key = (p.is_expert_parallel(), std::cmp::Reverse(p.wd_mult().to_bits()));
        match megatron.get(&key) {
            None => {
                megatron.insert(key, (g, fqn));
            }
            Some(&(first, name)) if torch.groups[first].hyper != torch.groups[g].hyper => {
                return Err(refuse(
                    fqn,
                    format!(
                        "Megatron puts it in one parameter group with `{name}` (wd_mult {}, is_expert_parallel {}), but their hyperparameters differ",
                        p.wd_mult(),
                        p.is_expert_parallel()
                    ),
                ))
            }
            _ => {}
        }
    }
    let (step, _) = step.ok_or_else(|| refuse("?", "no parameter has optimizer state".into()))?;
    let first = *megatron.values().next().expect("a parameter had a step, so a group");
    let mut groups = Vec::new();
    let expert_flags: Vec<bool> = match megatron.keys().any(|(e, _)| *e) {
        true => vec![false, true],
        false => vec![false],
    };
    let s = |x: &str| Value::Str(x.into());
    for expert in expert_flags {
        for wd_mult in [1.0f64, 0.0] {
            let (g, _) = megatron
                .get(&(expert, std::cmp::Reverse(wd_mult.to_bits())))
                .copied()
                .unwrap_or(first);
            let hyper = &torch.groups[g].hyper;
            let lr = hyper.get("lr").map_or(Value::None, Hyper::value);
            let mut entries = vec![
                (s("is_expert_parallel"), Value::Bool(expert)),
                (s("default_config"), Value::Bool(true)),
                (s("wd_mult"), Value::Float(wd_mult)),
                (s("lr_mult"), Value::Float(1.0)),
                (s("is_decoupled_lr"), Value::Bool(false)),
                (s("max_lr"), lr),
                (s("min_lr"), Value::None),
            ];
            entries.extend(hyper.iter().map(|(k, v)| (s(k), v.value())));
            entries.push((s("step"), Value::Float(step)));
            groups.push(dict(entries));
        }
    }
    let common = dict(vec![(
        s("optimizer"),
        dict(vec![
            (
                s("optimizer"),
                dict(vec![(s("param_groups"), Value::List(Rc::new(RefCell::new(groups))))]),
            ),
            (s("param_state_sharding_type"), s("fully_reshardable")),
        ]),
    )]);
    let mut w = PickleWriter::new(2);
    w.value(&common);
    Ok(object_archive(&w.finish()))
}

/// A parameter group of Megatron-Core's distributed optimizer, as a
/// `torch_dist` checkpoint's `common.pt` keeps it
/// (`optimizer.optimizer.param_groups`).
#[derive(Clone, Debug, PartialEq)]
pub struct MegatronGroup {
    /// Megatron's weight-decay multiplier of the group.
    pub wd_mult: f64,
    /// Whether it holds routed experts' parameters.
    pub is_expert_parallel: bool,
    /// The inner optimizer's hyperparameters (`lr`, `betas`, ...), without
    /// Megatron's own keys and the step.
    pub hyper: BTreeMap<String, Hyper>,
    /// The step.
    pub step: f64,
}

/// Megatron's own keys of a parameter group, which no PyTorch optimizer
/// has.
const MEGATRON_GROUP_KEYS: [&str; 8] = [
    "wd_mult",
    "lr_mult",
    "is_expert_parallel",
    "is_decoupled_lr",
    "default_config",
    "max_lr",
    "min_lr",
    "step",
];

/// PyTorch AdamW's hyperparameters and their defaults: what a job's
/// `get_state_dict` asks a checkpoint for besides `lr`, `betas`, `eps`
/// and `weight_decay`. Megatron's fused Adam (Transformer Engine, Apex)
/// saves none of these implementation flags.
fn adamw_defaults() -> [(&'static str, Hyper); 7] {
    [
        ("amsgrad", Hyper::Bool(false)),
        ("foreach", Hyper::None),
        ("maximize", Hyper::Bool(false)),
        ("capturable", Hyper::Bool(false)),
        ("differentiable", Hyper::Bool(false)),
        ("fused", Hyper::None),
        ("decoupled_weight_decay", Hyper::Bool(true)),
    ]
}

impl Dcp {
    /// A Megatron-Core checkpoint's distributed-optimizer main parameters
    /// (`optimizer.state.param.<name>`), each with whether it holds
    /// exactly the weight `<name>` (by digest; no other tensor is read):
    /// an fp32 job's main parameters are its weights.
    pub fn main_params(self: &std::sync::Arc<Self>) -> Result<Vec<(String, bool)>> {
        const MAIN: &str = "optimizer.state.param.";
        let mains: BTreeSet<&str> = self
            .tensors()
            .iter()
            .filter_map(|t| t.name.strip_prefix(MAIN))
            .collect();
        if mains.is_empty() {
            return Ok(Vec::new());
        }
        let state = self.state()?;
        let digests: BTreeMap<String, String> =
            crate::diff::source_digests_where(&state, |n| n.starts_with(MAIN) || mains.contains(&n))
                .into_iter()
                .map(|t| (t.name, t.digest))
                .collect();
        Ok(mains
            .iter()
            .map(|weight| {
                let name = format!("{MAIN}{weight}");
                let equal = digests.get(*weight).is_some_and(|w| digests.get(&name) == Some(w));
                (name, equal)
            })
            .collect())
    }

    /// The parameter groups of a Megatron-Core checkpoint's distributed
    /// optimizer (`None` where `common.pt` holds none).
    pub fn megatron_optimizer(&self) -> Result<Option<Vec<MegatronGroup>>> {
        if self.megatron().is_none() {
            return Ok(None);
        }
        let path = self.dir().join(super::COMMON_FILE);
        let bytes = std::fs::read(&path).map_err(Error::io("read", &path))?;
        let bad = |what: String| Error::file(&path, what);
        let root = archive_value(&bytes).map_err(bad)?;
        let Some(groups) = root
            .get("optimizer")
            .and_then(|o| o.get("optimizer"))
            .and_then(|o| o.get("param_groups"))
        else {
            return Ok(None);
        };
        let groups = groups
            .items()
            .ok_or_else(|| bad(format!("optimizer param_groups is a {}", groups.kind())))?;
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let entries = g
                    .entries()
                    .ok_or_else(|| bad(format!("param group {i} is a {}", g.kind())))?;
                let mut hyper = BTreeMap::new();
                let (mut wd_mult, mut expert, mut step) = (None, None, None);
                for (k, v) in entries {
                    let k = k.as_str().ok_or_else(|| bad(format!("param group {i} has a key of type {}", k.kind())))?;
                    let h = Hyper::of(&v)
                        .ok_or_else(|| bad(format!("param group {i}: `{k}` is a {}", v.kind())))?;
                    let number = match &h {
                        Hyper::Float(x) => Some(*x),
                        Hyper::Int(x) => Some(*x as f64),
                        _ => None,
                    };
                    match k {
                        "wd_mult" | "pre_wd_mult" => wd_mult = number,
                        "is_expert_parallel" => expert = Some(h == Hyper::Bool(true)),
                        "step" => step = number,
                        _ if MEGATRON_GROUP_KEYS.contains(&k) || k == "params" => {}
                        _ => {
                            hyper.insert(k.to_string(), h);
                        }
                    }
                }
                match (wd_mult, expert, step) {
                    (Some(wd_mult), Some(is_expert_parallel), Some(step)) => Ok(MegatronGroup {
                        wd_mult,
                        is_expert_parallel,
                        hyper,
                        step,
                    }),
                    _ => Err(bad(format!(
                        "param group {i} lacks wd_mult, is_expert_parallel or step (not Megatron-Core's distributed optimizer?)"
                    ))),
                }
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// What a DCP checkpoint of PyTorch's `get_state_dict(model, optim)` (an
/// AdamW under `optim.`) holds besides the moments, made from Megatron's
/// parameter groups `groups`: each FQN's `step` (a 0-d float32 tensor,
/// Megatron's one step) and the parameter groups — one per distinct set
/// of hyperparameters, each FQN in the group of the Megatron group its
/// parameters are in (`params`: every parameter's FQN, `fqns` of
/// `params`), PyTorch AdamW's flags added where Megatron's optimizer
/// saved none. Written into `extras` (entries, tensors given by value,
/// their nesting under `optim`).
///
/// Refused, naming it: a parameter whose Megatron group is not saved, an
/// FQN made of parameters of groups with different hyperparameters, and
/// groups whose steps differ.
pub fn torch_optimizer_entries(
    params: &[MegatronParam],
    groups: &[MegatronGroup],
    extras: &mut super::DcpExtras,
) -> Result<()> {
    use super::{Literal, PathPart};
    let refuse = |tensor: &str, what: String| Error::Coverage {
        tensor: tensor.to_string(),
        what,
    };
    let step = groups
        .first()
        .map(|g| g.step)
        .ok_or_else(|| refuse("?", "Megatron's optimizer has no parameter groups".into()))?;
    if let Some(g) = groups.iter().find(|g| g.step != step) {
        return Err(refuse(
            "common.pt:optimizer",
            format!(
                "param groups at steps {step} and {}: one step is written for every parameter",
                g.step
            ),
        ));
    }
    // Each FQN's Megatron group, in the order the FQNs come.
    let mut order: Vec<&str> = Vec::new();
    let mut group_of: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for p in params {
        let g = p.group_in(groups).ok_or_else(|| {
            refuse(
                &p.name,
                format!(
                    "Megatron's optimizer saved no parameter group of wd_mult {}, is_expert_parallel {}",
                    p.wd_mult(),
                    p.is_expert_parallel()
                ),
            )
        })?;
        for fqn in &p.fqns {
            match group_of.get(fqn.as_str()) {
                None => {
                    order.push(fqn);
                    group_of.insert(fqn, (g, &p.name));
                }
                Some(&(h, other)) if groups[h].hyper != groups[g].hyper => {
                    return Err(refuse(
                        fqn,
                        format!(
                            "is made of `{other}` and `{}`, whose parameter groups have different hyperparameters",
                            p.name
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
    // PyTorch's groups: one per distinct set of hyperparameters.
    let mut torch_groups: Vec<(BTreeMap<String, Hyper>, Vec<&str>)> = Vec::new();
    for fqn in order {
        let mut hyper = groups[group_of[fqn].0].hyper.clone();
        for (k, v) in adamw_defaults() {
            hyper.entry(k.to_string()).or_insert(v);
        }
        match torch_groups.iter_mut().find(|(h, _)| *h == hyper) {
            Some((_, fqns)) => fqns.push(fqn),
            None => torch_groups.push((hyper, vec![fqn])),
        }
        let name = format!("optim.state.{fqn}.step");
        extras.planner_data.insert(
            name.clone(),
            ["optim", "state", fqn, "step"]
                .map(|k| PathPart::Key(k.into()))
                .to_vec(),
        );
        extras.literals.insert(
            name,
            Literal {
                dtype: DType::F32,
                shape: Vec::new(),
                data: (step as f32).to_le_bytes().to_vec(),
            },
        );
    }
    let archive = |v: &Value| {
        let mut w = PickleWriter::new(2);
        w.value(v);
        object_archive(&w.finish())
    };
    for (i, (hyper, fqns)) in torch_groups.iter().enumerate() {
        let list = Value::List(Rc::new(RefCell::new(
            fqns.iter().map(|f| Value::Str((*f).into())).collect(),
        )));
        let values = hyper
            .iter()
            .map(|(k, v)| (k.as_str(), v.value()))
            .chain([("params", list)]);
        for (key, value) in values {
            let name = format!("optim.param_groups.{i}.{key}");
            extras.planner_data.insert(
                name.clone(),
                vec![
                    PathPart::Key("optim".into()),
                    PathPart::Key("param_groups".into()),
                    PathPart::Index(i as i64),
                    PathPart::Key(key.into()),
                ],
            );
            extras.others.insert(name, archive(&value));
        }
    }
    Ok(())
}

/// Where a PyTorch optimizer's state (`torch`, of the parameters
/// `params`, their FQNs as it keeps them) and Megatron's distributed
/// optimizer's parameter groups `groups` say different things: each
/// parameter's step against Megatron's, and the hyperparameters of its
/// PyTorch group against those of its Megatron group (the keys both
/// keep). Empty when they hold the same optimizer.
pub fn optimizer_differences(
    torch: &TorchOptimizer,
    params: &[MegatronParam],
    groups: &[MegatronGroup],
) -> Vec<String> {
    let mut out = Vec::new();
    let group_of = torch.group_of_fqn();
    for p in params {
        let Some(m) = p.group_in(groups).map(|g| &groups[g]) else {
            out.push(format!("{}: no Megatron parameter group holds it", p.name));
            continue;
        };
        for fqn in &p.fqns {
            match torch.steps.get(fqn) {
                Some(&s) if s == m.step => {}
                Some(&s) => out.push(format!("{fqn}: step {s}, Megatron's {}", m.step)),
                None => out.push(format!("{fqn}: no step")),
            }
            let Some(g) = group_of.get(fqn.as_str()).map(|&g| &torch.groups[g]) else {
                out.push(format!("{fqn}: in no parameter group"));
                continue;
            };
            for (k, v) in &g.hyper {
                if m.hyper.get(k).is_some_and(|w| w != v) {
                    out.push(format!("{fqn}: `{k}` {v}, Megatron's {}", m.hyper[k]));
                }
            }
        }
    }
    out
}

fn dict(entries: Vec<(Value, Value)>) -> Value {
    Value::Dict(Rc::new(RefCell::new(entries)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle;

    fn adamw(lr: f64) -> BTreeMap<String, Hyper> {
        BTreeMap::from([
            ("lr".to_string(), Hyper::Float(lr)),
            (
                "betas".to_string(),
                Hyper::Tuple(vec![Hyper::Float(0.9), Hyper::Float(0.999)]),
            ),
            ("fused".to_string(), Hyper::None),
        ])
    }

    fn param(name: &str, ndim: usize, fqns: &[&str]) -> MegatronParam {
        MegatronParam {
            name: name.into(),
            ndim,
            fqns: fqns.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn optimizer(groups: Vec<(Vec<&str>, f64)>, steps: &[(&str, f64)]) -> TorchOptimizer {
        TorchOptimizer {
            groups: groups
                .into_iter()
                .map(|(params, lr)| TorchParamGroup {
                    params: params.into_iter().map(String::from).collect(),
                    hyper: adamw(lr),
                })
                .collect(),
            steps: steps.iter().map(|(f, s)| (f.to_string(), *s)).collect(),
            entries: Vec::new(),
        }
    }

    /// The param_groups of a common.pt archive.
    fn groups_of(bytes: &[u8]) -> Vec<pickle::Value> {
        let root = crate::dcp::megatron::archive_value(bytes).unwrap();
        root.get("optimizer")
            .and_then(|o| o.get("optimizer"))
            .and_then(|o| o.get("param_groups"))
            .and_then(|g| g.items())
            .unwrap()
    }

    #[test]
    fn megatron_groups_by_weight_decay_and_experts_with_the_sources_hyperparameters() {
        let params = [
            param("decoder.layers.0.self_attention.linear_qkv.weight", 2, &["q", "k", "v"]),
            param("decoder.layers.0.input_layernorm.weight", 1, &["norm"]),
            param(
                "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
                2,
                &["e0"],
            ),
        ];
        let torch = optimizer(
            vec![(vec!["q", "k", "v", "e0"], 0.01), (vec!["norm"], 0.02)],
            &[("q", 7.0), ("k", 7.0), ("v", 7.0), ("norm", 7.0), ("e0", 7.0)],
        );
        let groups = groups_of(&distributed_optimizer_common(&params, &torch).unwrap());
        // (dense, wd 1), (dense, wd 0), (expert, wd 1), (expert, wd 0).
        let keys: Vec<(bool, f64, Option<f64>)> = groups
            .iter()
            .map(|g| {
                let f = |k: &str| match g.get(k) {
                    Some(pickle::Value::Float(x)) => Some(x),
                    _ => None,
                };
                let expert = matches!(g.get("is_expert_parallel"), Some(pickle::Value::Bool(true)));
                (expert, f("wd_mult").unwrap(), f("lr"))
            })
            .collect();
        assert_eq!(
            keys,
            [
                (false, 1.0, Some(0.01)),
                (false, 0.0, Some(0.02)),
                (true, 1.0, Some(0.01)),
                // No expert vector: the first group's hyperparameters.
                (true, 0.0, Some(0.01)),
            ]
        );
        assert!(groups
            .iter()
            .all(|g| matches!(g.get("step"), Some(pickle::Value::Float(s)) if s == 7.0)));
    }

    #[test]
    fn what_megatron_cannot_keep_is_refused_naming_it() {
        let qkv = [param(
            "decoder.layers.0.self_attention.linear_qkv.weight",
            2,
            &["q", "k"],
        )];
        let steps = [("q", 3.0), ("k", 3.0)];
        // Fused parts from groups with different hyperparameters.
        let e = distributed_optimizer_common(&qkv, &optimizer(vec![(vec!["q"], 0.1), (vec!["k"], 0.2)], &steps))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`q`") && e.contains("`k`"), "{e}");
        // Steps that differ.
        let e = distributed_optimizer_common(&qkv, &optimizer(vec![(vec!["q", "k"], 0.1)], &[("q", 3.0), ("k", 4.0)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one step"), "{e}");
        // A parameter in no group, and one without a step.
        let e = distributed_optimizer_common(&qkv, &optimizer(vec![(vec!["q"], 0.1)], &steps))
            .unwrap_err()
            .to_string();
        assert!(e.contains("k") && e.contains("no parameter group"), "{e}");
        let e = distributed_optimizer_common(&qkv, &optimizer(vec![(vec!["q", "k"], 0.1)], &[("q", 3.0)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no step"), "{e}");
    }

    #[test]
    fn megatron_groups_become_pytorch_groups_by_their_hyperparameters() {
        let group = |wd_mult: f64, lr: f64, step: f64| MegatronGroup {
            wd_mult,
            is_expert_parallel: false,
            hyper: adamw(lr),
            step,
        };
        let params = [
            param("decoder.layers.0.self_attention.linear_qkv.weight", 2, &["q", "k", "v"]),
            param("decoder.layers.0.input_layernorm.weight", 1, &["norm"]),
        ];
        // Groups with the same hyperparameters are one PyTorch group.
        let mut extras = crate::dcp::DcpExtras::default();
        torch_optimizer_entries(&params, &[group(1.0, 0.01, 5.0), group(0.0, 0.01, 5.0)], &mut extras).unwrap();
        let groups: BTreeSet<&str> = extras
            .others
            .keys()
            .filter_map(|k| k.strip_prefix("optim.param_groups.")?.split('.').next())
            .collect();
        assert_eq!(groups.into_iter().collect::<Vec<_>>(), ["0"]);
        let params_of = |e: &crate::dcp::DcpExtras, g: u32| -> Vec<String> {
            let v = crate::dcp::megatron::archive_value(&e.others[&format!("optim.param_groups.{g}.params")]).unwrap();
            v.items()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(params_of(&extras, 0), ["q", "k", "v", "norm"]);
        // One 0-d float32 step per FQN, nested under optim.state.
        assert_eq!(extras.literals.len(), 4);
        assert_eq!(extras.literals["optim.state.norm.step"].data, 5.0f32.to_le_bytes());
        assert!(extras.literals["optim.state.norm.step"].shape.is_empty());
        // Torch AdamW's flags where Megatron saved none.
        assert!(extras
            .others
            .contains_key("optim.param_groups.0.decoupled_weight_decay"));
        // Different hyperparameters: two groups.
        let mut extras = crate::dcp::DcpExtras::default();
        torch_optimizer_entries(&params, &[group(1.0, 0.01, 5.0), group(0.0, 0.02, 5.0)], &mut extras).unwrap();
        assert_eq!(params_of(&extras, 1), ["norm"]);
        // Steps that differ, or a group not saved: refused.
        let e = torch_optimizer_entries(
            &params,
            &[group(1.0, 0.01, 5.0), group(0.0, 0.01, 6.0)],
            &mut Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("steps"), "{e}");
        let e = torch_optimizer_entries(&params, &[group(1.0, 0.01, 5.0)], &mut Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("input_layernorm") && e.contains("wd_mult 0"), "{e}");
    }
}
