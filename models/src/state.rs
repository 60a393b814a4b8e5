//! A model's state (its weights, and with them optimizer state or
//! gradients) and that state's layouts: Megatron-LM's under `tp, pp, dp,
//! zero, ep`, and inference engines' serving layouts.

use std::collections::BTreeMap;
use std::sync::Arc;

use tenplan_ptc::{Buffer, Cluster, DType, Layout, Piece, Region, Shard, TensorId, TensorSpec};

use crate::{Error, ModelSpec, ParallelConfig, Result};

/// Which part of a job's state the PTC holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StateKind {
    /// The weights alone, in one dtype.
    Weights(DType),
    /// Mixed-precision training state: bf16 weights, fp32 master weights,
    /// fp32 Adam moments (`exp_avg`, `exp_avg_sq`) and the i64 step counter.
    Training,
    /// bf16 weights and their fp32 gradients (`grad.<name>`), the gradients
    /// laid out like the weights: what hot switching moves. Mark the
    /// gradients partial (`Layout::with_partial`) where each rank holds its
    /// own, not yet reduced, accumulation.
    WeightsAndGrads,
    /// Weights in one dtype and their fp32 Adam moments
    /// (`optimizer.exp_avg.<name>`, `optimizer.exp_avg_sq.<name>`), each
    /// moment laid out like its weight: an optimizer that keeps its state
    /// per parameter (PyTorch's AdamW under FSDP2, Megatron's distributed
    /// optimizer in its `fully_reshardable` checkpoint format). Its step
    /// and hyperparameters are no tensors of this state.
    WeightsAndAdam(DType),
}

impl std::fmt::Display for StateKind {
    /// `weights:bf16`, `training` or `weights+grads`, as checkpoint manifests name them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateKind::Weights(d) => write!(f, "weights:{d}"),
            StateKind::Training => f.write_str("training"),
            StateKind::WeightsAndGrads => f.write_str("weights+grads"),
            StateKind::WeightsAndAdam(d) => write!(f, "weights+adam:{d}"),
        }
    }
}

impl std::str::FromStr for StateKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<StateKind> {
        match s.split_once(':') {
            Some(("weights", d)) => d.parse::<DType>().map(StateKind::Weights).map_err(Error::from),
            Some(("weights+adam", d)) => d.parse::<DType>().map(StateKind::WeightsAndAdam).map_err(Error::from),
            None if s == "training" => Ok(StateKind::Training),
            None if s == "weights+grads" => Ok(StateKind::WeightsAndGrads),
            _ => Err(Error::UnknownState { name: s.to_string() }),
        }
    }
}

/// How a parameter is split by tensor parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// Every TP rank holds all of it (norms, row-parallel biases, router).
    Replicated,
    /// Column-parallel: split on dimension 0.
    Dim0,
    /// The fused QKV weight or bias, rows in Megatron's per-group order
    /// (for each query group: its query heads, its key head, its value
    /// head). Training layouts split it like `Dim0` (a shard is a
    /// contiguous block of groups); serving layouts regroup each rank's
    /// rows as `[q; k; v]` (see [`ModelState::serving_layout`]).
    Qkv,
    /// Row-parallel: split on dimension 1.
    Dim1,
    /// Vocabulary-parallel: split on dimension 0 after padding the rows to a
    /// multiple of 128·tp; padding rows have no source and are zero.
    Vocab,
    /// SwiGLU's stacked `[W; V]` (rows `2·ffn`): TP rank k holds W's k-th
    /// chunk followed by V's k-th chunk (two pieces).
    SwiGlu,
}

/// How fused parameters are laid out on a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fusion {
    /// As Megatron-LM trains: the fused QKV split by whole groups.
    Megatron,
    /// As an inference engine serves: each rank's QKV as `[q; k; v]`.
    Serving,
}

/// Which pipeline stage holds a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Layer(u32),
    First,
    Last,
    /// The tied word embedding: the first stage, and a replica on the last.
    Tied,
    /// The first stage and, under its own name, the last (the embedding
    /// of a model with MTP modules).
    FirstAndLast,
}

#[derive(Clone, Debug)]
pub(crate) struct Param {
    pub(crate) name: String,
    pub(crate) shape: Vec<u64>,
    split: Split,
    place: Place,
    expert: Option<u32>,
}

/// A model's state: its tensors, and the layouts of those tensors under any
/// parallel configuration.
///
/// Tensor order: the parameters in model order (embeddings, then each layer,
/// then the final norm and output layer); for [`StateKind::Training`], then
/// `optimizer.master.*`, `optimizer.exp_avg.*`, `optimizer.exp_avg_sq.*` in
/// the same order, and `optimizer.step`; for [`StateKind::WeightsAndAdam`],
/// `optimizer.exp_avg.*` and `optimizer.exp_avg_sq.*` in the same order.
#[derive(Clone, Debug)]
pub struct ModelState {
    spec: ModelSpec,
    kind: StateKind,
    params: Vec<Param>,
    tensors: Arc<[TensorSpec]>,
}

const OPTIMIZER_KINDS: [&str; 3] = ["master", "exp_avg", "exp_avg_sq"];
/// The moments of [`StateKind::WeightsAndAdam`], in tensor order.
pub const ADAM_MOMENTS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// The fp32 optimizer tensors a state keeps for every parameter, in
/// tensor order (`optimizer.<kind>.<name>`, each of its parameter's shape).
fn per_param_kinds(kind: StateKind) -> &'static [&'static str] {
    match kind {
        StateKind::Training => &OPTIMIZER_KINDS,
        StateKind::WeightsAndAdam(_) => &ADAM_MOMENTS,
        _ => &[],
    }
}

/// The Adam moment a tensor of a [`StateKind::WeightsAndAdam`] state is,
/// and its parameter's name: `optimizer.exp_avg_sq.output_layer.weight` →
/// (`exp_avg_sq`, `output_layer.weight`).
pub fn adam_moment(name: &str) -> Option<(&'static str, &str)> {
    let rest = name.strip_prefix("optimizer.")?;
    ADAM_MOMENTS
        .iter()
        .find_map(|m| Some((*m, rest.strip_prefix(m)?.strip_prefix('.')?)))
}

pub(crate) fn params_of(m: &ModelSpec) -> Vec<Param> {
    let h = m.hidden;
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<u64>, split: Split, place: Place, expert: Option<u32>| {
        out.push(Param {
            name,
            shape,
            split,
            place,
            expert,
        })
    };
    let gpt = m.family.is_gpt();
    // The MTP modules embed their input too: the last stage keeps a replica.
    let emb = match (m.tied, m.mtp_layers > 0) {
        (true, _) => Place::Tied,
        (false, true) => Place::FirstAndLast,
        (false, false) => Place::First,
    };
    add(
        "embedding.word_embeddings.weight".into(),
        vec![m.vocab, h],
        Split::Vocab,
        emb,
        None,
    );
    if gpt {
        add(
            "embedding.position_embeddings.weight".into(),
            vec![m.seq_len, h],
            Split::Replicated,
            Place::First,
            None,
        );
    }
    for l in 0..m.layers {
        layer_params(m, &format!("decoder.layers.{l}."), l, Place::Layer(l), &mut add);
    }
    add(
        "decoder.final_layernorm.weight".into(),
        vec![h],
        Split::Replicated,
        Place::Last,
        None,
    );
    if gpt {
        add(
            "decoder.final_layernorm.bias".into(),
            vec![h],
            Split::Replicated,
            Place::Last,
            None,
        );
    }
    for k in 0..m.mtp_layers {
        // Megatron-Core's MultiTokenPredictionLayer, on the last stage:
        // `eh_proj` is column-parallel, its input the normed embedding and
        // hidden state side by side.
        let p = |s: &str| format!("mtp.layers.{k}.{s}");
        for norm in ["enorm", "hnorm"] {
            add(
                p(&format!("{norm}.weight")),
                vec![h],
                Split::Replicated,
                Place::Last,
                None,
            );
        }
        add(p("eh_proj.weight"), vec![h, 2 * h], Split::Dim0, Place::Last, None);
        layer_params(m, &p("transformer_layer."), m.layers + k, Place::Last, &mut add);
        add(
            p("final_layernorm.weight"),
            vec![h],
            Split::Replicated,
            Place::Last,
            None,
        );
    }
    if !m.tied {
        add(
            "output_layer.weight".into(),
            vec![m.vocab, h],
            Split::Vocab,
            Place::Last,
            None,
        );
    }
    out
}

/// The parameters of one transformer layer under `prefix` (`decoder.layers.L.`,
/// or an MTP module's `mtp.layers.K.transformer_layer.`); `l` says whether it
/// has experts, `at` which pipeline stage holds it.
fn layer_params(
    m: &ModelSpec,
    prefix: &str,
    l: u32,
    at: Place,
    add: &mut dyn FnMut(String, Vec<u64>, Split, Place, Option<u32>),
) {
    let h = m.hidden;
    let hd = m.head_dim;
    let heads = m.heads as u64;
    let gpt = m.family.is_gpt();
    let qkv_rows = (heads + 2 * m.groups as u64) * hd;
    let p = |s: &str| format!("{prefix}{s}");
    // Names follow Megatron-core's (MLA's norms as its fused
    // `layer_norm_weight`s).
    let norm = |add: &mut dyn FnMut(String, Vec<u64>, Split, Place, Option<u32>), s: &str| {
        add(p(&format!("{s}.weight")), vec![h], Split::Replicated, at, None);
        if gpt {
            add(p(&format!("{s}.bias")), vec![h], Split::Replicated, at, None);
        }
    };
    norm(&mut *add, "input_layernorm");
    match m.mla {
        None => {
            add(
                p("self_attention.linear_qkv.weight"),
                vec![qkv_rows, h],
                Split::Qkv,
                at,
                None,
            );
            if m.qkv_bias {
                add(
                    p("self_attention.linear_qkv.bias"),
                    vec![qkv_rows],
                    Split::Qkv,
                    at,
                    None,
                );
            }
            if m.qk_norm {
                add(
                    p("self_attention.q_layernorm.weight"),
                    vec![hd],
                    Split::Replicated,
                    at,
                    None,
                );
                add(
                    p("self_attention.k_layernorm.weight"),
                    vec![hd],
                    Split::Replicated,
                    at,
                    None,
                );
            }
            add(
                p("self_attention.linear_proj.weight"),
                vec![h, heads * hd],
                Split::Dim1,
                at,
                None,
            );
        }
        Some(a) => {
            let qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
            if a.q_lora_rank > 0 {
                let r = a.q_lora_rank;
                add(
                    p("self_attention.linear_q_down_proj.weight"),
                    vec![r, h],
                    Split::Replicated,
                    at,
                    None,
                );
                if m.qkv_bias {
                    add(
                        p("self_attention.linear_q_down_proj.bias"),
                        vec![r],
                        Split::Replicated,
                        at,
                        None,
                    );
                }
                add(
                    p("self_attention.linear_q_up_proj.layer_norm_weight"),
                    vec![r],
                    Split::Replicated,
                    at,
                    None,
                );
                add(
                    p("self_attention.linear_q_up_proj.weight"),
                    vec![heads * qk, r],
                    Split::Dim0,
                    at,
                    None,
                );
            } else {
                add(
                    p("self_attention.linear_q_proj.weight"),
                    vec![heads * qk, h],
                    Split::Dim0,
                    at,
                    None,
                );
            }
            let kv = a.kv_lora_rank + a.qk_rope_head_dim;
            add(
                p("self_attention.linear_kv_down_proj.weight"),
                vec![kv, h],
                Split::Replicated,
                at,
                None,
            );
            if m.qkv_bias {
                add(
                    p("self_attention.linear_kv_down_proj.bias"),
                    vec![kv],
                    Split::Replicated,
                    at,
                    None,
                );
            }
            let r = a.kv_lora_rank;
            add(
                p("self_attention.linear_kv_up_proj.layer_norm_weight"),
                vec![r],
                Split::Replicated,
                at,
                None,
            );
            let rows = heads * (a.qk_nope_head_dim + a.v_head_dim);
            add(
                p("self_attention.linear_kv_up_proj.weight"),
                vec![rows, r],
                Split::Dim0,
                at,
                None,
            );
            add(
                p("self_attention.linear_proj.weight"),
                vec![h, heads * a.v_head_dim],
                Split::Dim1,
                at,
                None,
            );
        }
    }
    if m.proj_bias {
        add(
            p("self_attention.linear_proj.bias"),
            vec![h],
            Split::Replicated,
            at,
            None,
        );
    }
    norm(&mut *add, "pre_mlp_layernorm");
    if gpt {
        add(p("mlp.linear_fc1.weight"), vec![m.ffn, h], Split::Dim0, at, None);
        add(p("mlp.linear_fc1.bias"), vec![m.ffn], Split::Dim0, at, None);
        add(p("mlp.linear_fc2.weight"), vec![h, m.ffn], Split::Dim1, at, None);
        add(p("mlp.linear_fc2.bias"), vec![h], Split::Replicated, at, None);
    } else if m.is_moe_layer(l) {
        let e = m.experts as u64;
        add(p("mlp.router.weight"), vec![e, h], Split::Replicated, at, None);
        if m.router_bias {
            add(p("mlp.router.expert_bias"), vec![e], Split::Replicated, at, None);
        }
        for x in 0..m.experts {
            let n = |s: &str| p(&format!("mlp.experts.local_experts.{x}.{s}"));
            let f = m.expert_ffn;
            add(n("linear_fc1.weight"), vec![2 * f, h], Split::SwiGlu, at, Some(x));
            add(n("linear_fc2.weight"), vec![h, f], Split::Dim1, at, Some(x));
        }
        if m.shared_ffn > 0 {
            let f = m.shared_ffn;
            add(
                p("mlp.shared_experts.linear_fc1.weight"),
                vec![2 * f, h],
                Split::SwiGlu,
                at,
                None,
            );
            add(
                p("mlp.shared_experts.linear_fc2.weight"),
                vec![h, f],
                Split::Dim1,
                at,
                None,
            );
            if m.shared_gate {
                add(
                    p("mlp.shared_experts.gate_weight"),
                    vec![1, h],
                    Split::Replicated,
                    at,
                    None,
                );
            }
        }
    } else {
        add(p("mlp.linear_fc1.weight"), vec![2 * m.ffn, h], Split::SwiGlu, at, None);
        if m.mlp_bias {
            add(p("mlp.linear_fc1.bias"), vec![2 * m.ffn], Split::SwiGlu, at, None);
        }
        add(p("mlp.linear_fc2.weight"), vec![h, m.ffn], Split::Dim1, at, None);
        if m.mlp_bias {
            add(p("mlp.linear_fc2.bias"), vec![h], Split::Replicated, at, None);
        }
    }
}

/// One parameter's buffer on one rank, before dtypes are applied.
struct Local {
    name: String,
    param: usize,
    len: u64,
    pieces: Vec<(Region, u64)>,
    expert: bool,
}

impl ModelSpec {
    /// The names of the model's weight tensors (what a training state holds
    /// besides optimizer state and gradients).
    pub fn weight_names(&self) -> std::collections::BTreeSet<String> {
        params_of(self).into_iter().map(|p| p.name).collect()
    }
}

impl ModelState {
    /// The state of a model.
    pub fn new(spec: &ModelSpec, kind: StateKind) -> ModelState {
        let params = params_of(spec);
        let mut tensors = Vec::new();
        let pdtype = match kind {
            StateKind::Weights(d) | StateKind::WeightsAndAdam(d) => d,
            StateKind::Training | StateKind::WeightsAndGrads => DType::BF16,
        };
        for p in &params {
            tensors.push(TensorSpec::new(p.name.clone(), pdtype, p.shape.clone()));
        }
        // fp32 optimizer tensors of every parameter's shape, kind by kind.
        for k in per_param_kinds(kind) {
            for p in &params {
                tensors.push(TensorSpec::new(
                    format!("optimizer.{k}.{}", p.name),
                    DType::F32,
                    p.shape.clone(),
                ));
            }
        }
        if kind == StateKind::Training {
            tensors.push(TensorSpec::new("optimizer.step", DType::I64, [1]));
        }
        if kind == StateKind::WeightsAndGrads {
            for p in &params {
                tensors.push(TensorSpec::new(format!("grad.{}", p.name), DType::F32, p.shape.clone()));
            }
        }
        ModelState {
            spec: spec.clone(),
            kind,
            params,
            tensors: tensors.into(),
        }
    }

    /// The model.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The state kind.
    pub fn kind(&self) -> StateKind {
        self.kind
    }

    /// The tensors (the same for every layout of this state).
    pub fn tensors(&self) -> &Arc<[TensorSpec]> {
        &self.tensors
    }

    /// Number of parameter tensors (the model's weights, whatever else the
    /// state holds).
    pub fn parameter_tensors(&self) -> usize {
        self.params.len()
    }

    /// Number of model parameters.
    pub fn parameter_count(&self) -> u64 {
        self.params.iter().map(|p| p.shape.iter().product::<u64>()).sum()
    }

    /// Check a configuration against the model without building the layout.
    pub fn validate(&self, cfg: &ParallelConfig) -> Result<Vec<u32>> {
        self.check_config(cfg, Fusion::Megatron)
    }

    fn check_config(&self, cfg: &ParallelConfig, fusion: Fusion) -> Result<Vec<u32>> {
        let m = &self.spec;
        cfg.rank_devices()?;
        let model = m.name.to_string();
        if !m.heads.is_multiple_of(cfg.tp) {
            return Err(Error::TpHeads {
                model,
                tp: cfg.tp,
                heads: m.heads,
            });
        }
        // A serving engine with more ranks than key/value heads replicates
        // each head on tp / groups ranks.
        let replicated_kv = fusion == Fusion::Serving && m.mla.is_none() && cfg.tp.is_multiple_of(m.groups);
        if fusion == Fusion::Serving && !m.groups.is_multiple_of(cfg.tp) && !replicated_kv {
            return Err(Error::Serving {
                model,
                what: format!(
                    "tp={} and the {} key/value heads: one must divide the other (each rank serves whole heads)",
                    cfg.tp, m.groups
                ),
            });
        }
        if !m.groups.is_multiple_of(cfg.tp) && !replicated_kv {
            return Err(Error::TpGroups {
                model,
                tp: cfg.tp,
                groups: m.groups,
            });
        }
        if cfg.zero > 1 {
            return Err(Error::Zero { zero: cfg.zero });
        }
        if cfg.zero == 1 && self.kind != StateKind::Training {
            return Err(Error::ZeroWithoutOptimizer {
                state: self.kind.to_string(),
            });
        }
        if cfg.ep > 1 {
            if m.experts == 0 {
                return Err(Error::EpDense { model, ep: cfg.ep });
            }
            if !m.experts.is_multiple_of(cfg.ep) && cfg.experts.is_none() {
                return Err(Error::EpExperts {
                    model,
                    ep: cfg.ep,
                    experts: m.experts,
                });
            }
            // Trainers spread experts over data-parallel ranks; engines over
            // their own tensor-parallel ranks (checked by serving_layout).
            if fusion == Fusion::Megatron && !cfg.dp.is_multiple_of(cfg.ep) {
                return Err(Error::EpDp { ep: cfg.ep, dp: cfg.dp });
            }
        }
        if cfg.pp > m.layers {
            return Err(Error::PpLayers {
                model,
                pp: cfg.pp,
                layers: m.layers,
            });
        }
        let split = match &cfg.split {
            Some(s) => {
                if s.len() != cfg.pp as usize || s.contains(&0) || s.iter().sum::<u32>() != m.layers {
                    return Err(Error::BadSplit {
                        split: s.clone(),
                        pp: cfg.pp,
                        layers: m.layers,
                    });
                }
                s.clone()
            }
            None if !m.layers.is_multiple_of(cfg.pp) => {
                let base = m.layers / cfg.pp;
                let extra = m.layers % cfg.pp;
                let example: Vec<String> = (0..cfg.pp).map(|i| (base + u32::from(i < extra)).to_string()).collect();
                return Err(Error::PpUneven {
                    model,
                    pp: cfg.pp,
                    layers: m.layers,
                    example: example.join(":"),
                });
            }
            None => vec![m.layers / cfg.pp; cfg.pp as usize],
        };
        for p in &self.params {
            if p.split == Split::Qkv && fusion == Fusion::Serving {
                continue; // checked above: whole heads per rank
            }
            let dim = match p.split {
                Split::Dim0 | Split::Qkv | Split::SwiGlu => 0,
                Split::Dim1 => 1,
                Split::Replicated | Split::Vocab => continue,
            };
            let size = if p.split == Split::SwiGlu {
                p.shape[0] / 2
            } else {
                p.shape[dim]
            };
            let tp = expert_tp(cfg, fusion, p.expert.is_some());
            if size % tp as u64 != 0 {
                return Err(Error::TpDim {
                    tensor: p.name.clone(),
                    tp,
                    dim,
                    size,
                });
            }
        }
        Ok(split)
    }

    /// An upper estimate of the pieces (boxes placed in buffers) the devices
    /// of the layout of `cfg` hold, every replica counted: what the memory of
    /// building, planning, checking and simulating a problem grows with (each
    /// device's pieces become fragments and copies). Computed in time linear
    /// in the model's parameters, without building the layout; validates
    /// `cfg` first. Within 1.0–1.8× of the exact count on the catalog's
    /// models.
    pub fn estimate_pieces(&self, cfg: &ParallelConfig) -> Result<u64> {
        self.validate(cfg)?;
        let (tp, pp, dp, ep) = (cfg.tp as u64, cfg.pp as u64, cfg.dp as u64, cfg.ep as u64);
        // Parameters held per (stage, expert group), summed over both.
        let mut locals = 0u64;
        for p in &self.params {
            let stages = match p.place {
                Place::Tied | Place::FirstAndLast if pp > 1 => 2,
                _ => 1,
            };
            let groups = if p.expert.is_some() { 1 } else { ep };
            // SwiGLU halves are two pieces.
            let pieces = if p.split == Split::SwiGlu { 2 } else { 1 };
            locals += stages * groups * pieces;
        }
        let per_local = match self.kind {
            StateKind::Weights(_) => 1,
            StateKind::WeightsAndGrads => 2,
            StateKind::WeightsAndAdam(_) => 3,
            _ if cfg.zero == 0 => 4,
            _ => 1,
        };
        let pieces = if self.kind == StateKind::Training && cfg.zero == 1 {
            // Every rank is its own shard and holds its weights; three flat
            // buffers per rank (dense and expert) hold every local once in
            // all, plus at most 2·(2·ndim − 1) pieces cut at each range's ends.
            let ranks = tp * pp * dp;
            tp * (dp / ep) * locals + 3 * (tp * locals + ranks * 2 * 12)
        } else {
            // Data-parallel replicas hold the same pieces: count each.
            tp * (dp / ep) * locals * per_local
        };
        // Device entries of the shards.
        Ok(pieces + cfg.world())
    }

    /// Refuse, before building it, a layout that does not fit `cluster` or
    /// whose problem would need more memory than this machine has available
    /// ([`estimate_pieces`](Self::estimate_pieces) at
    /// [`BYTES_PER_PIECE`](tenplan_ptc::limits::BYTES_PER_PIECE) each).
    pub fn check_plannable(&self, cfg: &ParallelConfig, cluster: &Cluster) -> Result<()> {
        cfg.check_cluster(cluster)?;
        let pieces = self.estimate_pieces(cfg)?;
        let need = pieces.saturating_mul(tenplan_ptc::limits::BYTES_PER_PIECE);
        match tenplan_ptc::limits::available_memory() {
            Some(available) if need > available => Err(Error::TooLarge {
                layout: cfg.to_string(),
                model: self.spec().name.to_string(),
                pieces,
                need,
                available,
            }),
            _ => Ok(()),
        }
    }

    /// The layout of this state under a parallel configuration.
    ///
    /// Ranks follow Megatron-LM's order (tp fastest, then dp, then pp); rank
    /// `r` runs on `cfg.devices[r]`. Ranks whose state is identical (data-
    /// parallel replicas without ZeRO, expert-data-parallel replicas) form one
    /// shard with several devices.
    ///
    /// With `zero=1` (distributed optimizer) the fp32 master weights and Adam
    /// moments of a model-parallel rank are flat buffers: the rank's local
    /// parameter buffers (padding included) concatenated in tensor order,
    /// dense parameters in `optimizer.<kind>.flat` and expert parameters in
    /// `optimizer.<kind>.expert_flat`; each flat buffer is padded to a
    /// multiple of its sharding degree (dp for dense, dp/ep for experts) and
    /// the rank with (expert-)data-parallel index i owns the i-th contiguous range.
    pub fn layout(&self, cfg: &ParallelConfig) -> Result<Layout> {
        if cfg.experts.is_some() {
            return Err(Error::Serving {
                model: self.spec.name.to_string(),
                what: "experts= lists place experts on an inference engine's ranks; a training layout spreads them with ep=E".into(),
            });
        }
        self.build(cfg, Fusion::Megatron)
    }

    /// The first tensor of expert `x` (to name it in errors).
    fn expert_tensor(&self, x: u32) -> String {
        self.params
            .iter()
            .find(|p| p.expert == Some(x))
            .map_or_else(|| format!("expert {x}"), |p| p.name.clone())
    }

    /// The weights of this model as an inference engine keeps them
    /// (vLLM/SGLang-style), under `cfg`: `tp` ranks per engine, `dp`
    /// engine replicas (each a full copy, on its own devices), `pp` 1.
    /// Every parameter is split as in training except the fused QKV, whose
    /// rows each rank keeps as `[q; k; v]` (its query heads, then its key
    /// heads, then its value heads); with more ranks than key/value heads
    /// (`tp` a multiple of them), each key/value head is replicated on
    /// `tp / groups` ranks. SwiGLU's `[gate; up]` per rank is Megatron's
    /// stacking already, and MLA projections split by head as in training.
    /// Without `ep`, every expert is split over all `tp` ranks. With `ep=E`
    /// (E dividing tp: vLLM's expert parallelism when E = tp), an engine's
    /// ranks form E groups of tp/E consecutive ranks; group g serves the
    /// g-th contiguous E-th of the experts, each expert split over its
    /// group's ranks (whole when E = tp). `experts=` lists give each group
    /// its experts instead (EPLB's placements: any experts per group,
    /// redundant replicas in several groups; every expert in some group, no
    /// expert twice in one). Attention stays tensor-parallel.
    /// The state must be weights only (`StateKind::Weights`). Documented in
    /// `docs/serving-layouts.md`.
    pub fn serving_layout(&self, cfg: &ParallelConfig) -> Result<Layout> {
        let model = self.spec.name.to_string();
        let refuse = |what: String| {
            Err(Error::Serving {
                model: model.clone(),
                what,
            })
        };
        if !matches!(self.kind, StateKind::Weights(_)) {
            return refuse(format!("serving layouts hold weights only, not `{}` state", self.kind));
        }
        if cfg.pp != 1 || cfg.zero != 0 || cfg.split.is_some() {
            return refuse(format!(
                "a serving layout is tp=N,dp=REPLICAS[,ep=E][,devices=..] (no pp, zero or split): got {cfg}"
            ));
        }
        if cfg.ep > 1 && !cfg.tp.is_multiple_of(cfg.ep) {
            return refuse(format!(
                "ep={} must divide an engine's tp={} ranks (each group of tp/ep ranks serves experts/ep experts)",
                cfg.ep, cfg.tp
            ));
        }
        if let Some(groups) = &cfg.experts {
            let n = self.spec.experts;
            if n == 0 {
                return refuse("experts= lists need a mixture-of-experts model".into());
            }
            if groups.len() != cfg.ep as usize {
                return refuse(format!(
                    "experts= gives {} group(s), ep={} needs one list per group",
                    groups.len(),
                    cfg.ep
                ));
            }
            let mut served = vec![false; n as usize];
            for (g, list) in groups.iter().enumerate() {
                let mut mine = vec![false; n as usize];
                for &x in list {
                    if x >= n {
                        return refuse(format!("expert {x} in group {g}: the model has experts 0-{}", n - 1));
                    }
                    if std::mem::replace(&mut mine[x as usize], true) {
                        return refuse(format!("group {g} lists expert {x} twice"));
                    }
                    served[x as usize] = true;
                }
            }
            if let Some(x) = served.iter().position(|s| !s) {
                return refuse(format!(
                    "expert {x} is in no group's list, so no engine would hold its weights (`{}`)",
                    self.expert_tensor(x as u32)
                ));
            }
        }
        self.build(cfg, Fusion::Serving)
    }

    fn build(&self, cfg: &ParallelConfig, fusion: Fusion) -> Result<Layout> {
        let split = self.check_config(cfg, fusion)?;
        let devices = cfg.rank_devices()?;
        let (tp, pp, dp) = (cfg.tp as u64, cfg.pp as u64, cfg.dp as u64);
        let mut shards: Vec<Shard> = Vec::new();
        let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
        for rank in 0..tp * pp * dp {
            let (t, d, p) = (rank % tp, (rank / tp) % dp, rank / (tp * dp));
            // Expert group: along dp in a trainer (Megatron), along an
            // engine's own ranks in a server (groups of tp/ep ranks).
            let e = match fusion {
                Fusion::Megatron => d % cfg.ep as u64,
                Fusion::Serving => t / (tp / cfg.ep as u64),
            };
            let mut name = match fusion {
                Fusion::Megatron => format!("tp{t}.pp{p}"),
                Fusion::Serving => format!("engine.tp{t}"),
            };
            if cfg.ep > 1 && fusion == Fusion::Megatron {
                name += &format!(".ep{e}");
            }
            if cfg.zero == 1 {
                name += &format!(".dp{d}");
            }
            let device = devices[rank as usize];
            if let Some(&i) = by_name.get(&name) {
                shards[i].devices.push(device);
                continue;
            }
            let buffers = self.rank_buffers(cfg, &split, (t, p, d, e), fusion);
            by_name.insert(name.clone(), shards.len());
            shards.push(Shard {
                name,
                devices: vec![device],
                buffers,
            });
        }
        Ok(Layout::new(self.tensors.clone(), shards)?)
    }

    fn rank_buffers(
        &self,
        cfg: &ParallelConfig,
        split: &[u32],
        rank: (u64, u64, u64, u64),
        fusion: Fusion,
    ) -> Vec<Buffer> {
        let (t, p, d, e) = rank;
        let first_layer: u32 = split[..p as usize].iter().sum();
        let layers = first_layer..first_layer + split[p as usize];
        let (first, last) = (p == 0, p == cfg.pp as u64 - 1);
        let experts_per_rank = self.spec.experts.max(1) / cfg.ep;
        // An explicit list is looked up once per expert parameter: made a
        // membership table once per rank, not searched each time.
        let listed: Option<Vec<bool>> = match (&cfg.experts, fusion) {
            (Some(groups), Fusion::Serving) => {
                let mut mine = vec![false; self.spec.experts as usize];
                for &x in &groups[e as usize] {
                    mine[x as usize] = true;
                }
                Some(mine)
            }
            _ => None,
        };
        let serves = |x: u32| match &listed {
            Some(mine) => mine[x as usize],
            None => (x / experts_per_rank) as u64 == e,
        };
        let mut locals = Vec::new();
        for (i, prm) in self.params.iter().enumerate() {
            if let Some(x) = prm.expert {
                if !serves(x) {
                    continue;
                }
            }
            let mut names = Vec::new();
            match prm.place {
                Place::Layer(l) if layers.contains(&l) => names.push(prm.name.clone()),
                Place::First if first => names.push(prm.name.clone()),
                Place::Last if last => names.push(prm.name.clone()),
                Place::FirstAndLast if first || last => names.push(prm.name.clone()),
                Place::Tied => {
                    if first {
                        names.push(prm.name.clone());
                    }
                    if last && cfg.pp > 1 {
                        names.push("output_layer.weight".into());
                    }
                }
                _ => {}
            }
            for name in names {
                let (len, pieces) = match (prm.split, fusion) {
                    (Split::Qkv, Fusion::Serving) => serving_qkv_pieces(&self.spec, prm, cfg.tp as u64, t),
                    _ if prm.expert.is_some() => {
                        let tp = expert_tp(cfg, fusion, true) as u64;
                        local_pieces(prm, tp, t % tp)
                    }
                    _ => local_pieces(prm, cfg.tp as u64, t),
                };
                locals.push(Local {
                    name,
                    param: i,
                    len,
                    pieces,
                    expert: prm.expert.is_some(),
                });
            }
        }
        let np = self.params.len() as TensorId;
        let tensor_of = |kind: usize, param: usize| kind as TensorId * np + param as TensorId;
        let mut buffers: Vec<Buffer> = locals
            .iter()
            .map(|l| to_buffer(&self.tensors, l, &l.name, 0, tensor_of))
            .collect();
        if self.kind == StateKind::WeightsAndGrads {
            for l in &locals {
                buffers.push(to_buffer(&self.tensors, l, &format!("grad.{}", l.name), 1, tensor_of));
            }
        }
        // Optimizer tensors laid out like their parameters (without ZeRO).
        if cfg.zero == 0 {
            for (k, kind) in per_param_kinds(self.kind).iter().enumerate() {
                for l in &locals {
                    let name = format!("optimizer.{kind}.{}", l.name);
                    buffers.push(to_buffer(&self.tensors, l, &name, k + 1, tensor_of));
                }
            }
        }
        if self.kind != StateKind::Training {
            return buffers;
        }
        if cfg.zero != 0 {
            let ep = cfg.ep as u64;
            for (expert, suffix, degree, index) in [
                (false, "flat", cfg.dp as u64, d),
                (true, "expert_flat", cfg.dp as u64 / ep, d / ep),
            ] {
                let group: Vec<&Local> = locals.iter().filter(|l| l.expert == expert).collect();
                if group.is_empty() {
                    continue;
                }
                for (k, kind) in OPTIMIZER_KINDS.iter().enumerate() {
                    buffers.push(flat_shard(
                        &group,
                        &format!("optimizer.{kind}.{suffix}"),
                        degree,
                        index,
                        |param| tensor_of(k + 1, param),
                    ));
                }
            }
        }
        buffers.push(Buffer {
            name: "optimizer.step".into(),
            dtype: DType::I64,
            len: 1,
            pieces: vec![Piece {
                tensor: 4 * np,
                region: Region::full(&[1]),
                offset: 0,
            }],
            partial: false,
        });
        buffers
    }
}

fn to_buffer(
    tensors: &[TensorSpec],
    l: &Local,
    name: &str,
    kind: usize,
    tensor_of: impl Fn(usize, usize) -> TensorId,
) -> Buffer {
    let tensor = tensor_of(kind, l.param);
    Buffer {
        name: name.to_string(),
        dtype: tensors[tensor as usize].dtype,
        len: l.len,
        pieces: l
            .pieces
            .iter()
            .map(|(region, offset)| Piece {
                tensor,
                region: region.clone(),
                offset: *offset,
            })
            .collect(),
        partial: false,
    }
}

/// Index `index` of `degree` contiguous ranges of the concatenation of the
/// group's local buffers, as an fp32 buffer of pieces.
fn flat_shard(group: &[&Local], name: &str, degree: u64, index: u64, tensor: impl Fn(usize) -> TensorId) -> Buffer {
    let total: u64 = group.iter().map(|l| l.len).sum();
    let share = total.div_ceil(degree);
    let (a, b) = (index * share, (index + 1) * share);
    let mut pieces = Vec::new();
    let mut seg = 0;
    for l in group {
        let (s, e) = (seg, seg + l.len);
        seg = e;
        let (lo, hi) = (a.max(s), b.min(e));
        if lo >= hi {
            continue;
        }
        // Local positions [lo - s, hi - s) of this parameter's buffer.
        for (region, off) in &l.pieces {
            let (ps, pe) = (*off, off + region.volume());
            let (x0, x1) = ((lo - s).max(ps), (hi - s).min(pe));
            if x0 >= x1 {
                continue;
            }
            let mut at = s + x0 - a;
            for r in region.flat_range(x0 - ps, x1 - ps) {
                let v = r.volume();
                pieces.push(Piece {
                    tensor: tensor(l.param),
                    region: r,
                    offset: at,
                });
                at += v;
            }
        }
    }
    Buffer {
        name: name.to_string(),
        dtype: DType::F32,
        len: share,
        pieces,
        partial: false,
    }
}

/// Length and pieces (box, offset) of parameter `p` on TP rank `k` of `tp`.
/// Rank `k`'s rows of a fused QKV parameter (Megatron's per-group order:
/// each group's query heads, key head, value head) as a serving engine
/// keeps them: `[q; k; v]`, each part the rank's heads in order. With more
/// ranks than groups, rank `k` holds `heads / tp` query heads of group
/// `k / (tp / groups)` and that group's key and value heads.
fn serving_qkv_pieces(m: &ModelSpec, p: &Param, tp: u64, k: u64) -> (u64, Vec<(Region, u64)>) {
    let full = Region::full(&p.shape);
    let rest: u64 = p.shape[1..].iter().product();
    let (groups, hd) = (m.groups as u64, m.head_dim);
    let per_group = m.heads as u64 / groups;
    let group_rows = (per_group + 2) * hd;
    // (groups of this rank, first query head within each, query heads each)
    let (first_group, n_groups, q_from, q_heads) = if tp <= groups {
        let g = groups / tp;
        (k * g, g, 0, per_group)
    } else {
        let r = tp / groups;
        let q = per_group / r;
        (k / r, 1, (k % r) * q, q)
    };
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut push = |lo: u64, rows: u64| {
        pieces.push((full.with_range(0, lo..lo + rows), at));
        at += rows * rest;
    };
    for g in first_group..first_group + n_groups {
        push(g * group_rows + q_from * hd, q_heads * hd);
    }
    for g in first_group..first_group + n_groups {
        push(g * group_rows + per_group * hd, hd);
    }
    for g in first_group..first_group + n_groups {
        push(g * group_rows + (per_group + 1) * hd, hd);
    }
    (at, pieces)
}

/// Ranks that split one expert: all of tp in a trainer (Megatron's expert
/// tensor parallelism equals tp here); tp/ep in a server, whose ep groups
/// of ranks each serve a share of the experts.
fn expert_tp(cfg: &ParallelConfig, fusion: Fusion, expert: bool) -> u32 {
    match fusion {
        Fusion::Serving if expert => cfg.tp / cfg.ep,
        _ => cfg.tp,
    }
}

fn local_pieces(p: &Param, tp: u64, k: u64) -> (u64, Vec<(Region, u64)>) {
    let full = Region::full(&p.shape);
    let rest: u64 = p.shape[1..].iter().product();
    match p.split {
        Split::Replicated => (full.volume(), vec![(full, 0)]),
        Split::Dim0 | Split::Qkv => {
            let c = p.shape[0] / tp;
            (c * rest, vec![(full.with_range(0, k * c..(k + 1) * c), 0)])
        }
        Split::Dim1 => {
            let c = p.shape[1] / tp;
            (p.shape[0] * c, vec![(full.with_range(1, k * c..(k + 1) * c), 0)])
        }
        Split::Vocab => {
            let v = p.shape[0];
            let c = v.div_ceil(128 * tp) * 128;
            let (lo, hi) = (k * c, ((k + 1) * c).min(v));
            let pieces = if lo < hi {
                vec![(full.with_range(0, lo..hi), 0)]
            } else {
                vec![]
            };
            (c * rest, pieces)
        }
        Split::SwiGlu => {
            let f = p.shape[0] / 2;
            let c = f / tp;
            let w = full.with_range(0, k * c..(k + 1) * c);
            let v = full.with_range(0, f + k * c..f + (k + 1) * c);
            (2 * c * rest, vec![(w, 0), (v, c * rest)])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::find;

    fn cfg(s: &str) -> ParallelConfig {
        s.parse().unwrap()
    }

    #[test]
    fn adam_moments_are_laid_out_like_their_weights() {
        let kind = StateKind::WeightsAndAdam(DType::F32);
        assert_eq!(kind.to_string().parse::<StateKind>().unwrap(), kind);
        let s = ModelState::new(find("llama-tiny").unwrap(), kind);
        let np = s.parameter_tensors();
        assert_eq!(s.tensors().len(), 3 * np);
        assert_eq!(
            adam_moment(&s.tensors()[2 * np].name),
            Some(("exp_avg_sq", s.tensors()[0].name.as_str()))
        );
        let l = s.layout(&cfg("tp=2,pp=2,dp=2")).unwrap();
        for shard in l.shards() {
            let boxes = |prefix: &str| -> Vec<(String, Vec<Region>)> {
                let mut v: Vec<_> = shard
                    .buffers
                    .iter()
                    .filter_map(|b| {
                        let name = b.name.strip_prefix(prefix)?;
                        (!name.starts_with("optimizer.") || !prefix.is_empty())
                            .then(|| (name.to_string(), b.pieces.iter().map(|p| p.region.clone()).collect()))
                    })
                    .collect();
                v.sort();
                v
            };
            let weights = boxes("");
            assert!(!weights.is_empty());
            assert_eq!(boxes("optimizer.exp_avg."), weights);
            assert_eq!(boxes("optimizer.exp_avg_sq."), weights);
        }
        let e = s.layout(&cfg("tp=2,dp=2,zero=1")).unwrap_err().to_string();
        assert!(e.contains("weights+adam:f32"), "{e}");
    }

    #[test]
    fn parameter_counts_match_published_sizes() {
        let count = |n: &str| ModelState::new(find(n).unwrap(), StateKind::Weights(DType::BF16)).parameter_count();
        let close = |n: &str, want: f64| {
            let got = count(n) as f64;
            assert!((got / want - 1.0).abs() < 0.03, "{n}: {got} vs {want}");
        };
        close("gpt3-1.3b", 1.3e9);
        close("gpt3-6.7b", 6.7e9);
        close("gpt3-175b", 175e9);
        close("llama2-7b", 6.74e9);
        close("llama2-70b", 68.98e9);
        close("mixtral-8x7b", 46.7e9);
    }

    #[test]
    fn gpt_layout_pads_vocab_and_ties_embeddings() {
        let s = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Training);
        let l = s.layout(&cfg("tp=4,pp=2,dp=2")).unwrap();
        assert_eq!(l.shards().len(), 8);
        let last = l.shard_of(4 + 8).unwrap();
        assert_eq!(last.name, "tp0.pp1");
        let out = last.buffers.iter().find(|b| b.name == "output_layer.weight").unwrap();
        // 50257 padded to a multiple of 128*4 = 50688: 12672 rows per rank.
        assert_eq!(out.len, 12672 * 2048);
        let tail = l
            .shard_of(3)
            .unwrap()
            .buffers
            .iter()
            .find(|b| b.name == "embedding.word_embeddings.weight")
            .unwrap();
        assert_eq!(tail.padding(), vec![(50257 - 3 * 12672) * 2048..12672 * 2048]);
    }

    #[test]
    fn swiglu_is_two_pieces_and_zero_shards_optimizer() {
        let s = ModelState::new(find("llama-tiny").unwrap(), StateKind::Training);
        let l = s.layout(&cfg("tp=2,dp=2,zero=1")).unwrap();
        assert_eq!(l.shards().len(), 4);
        let b = l
            .shard_of(1)
            .unwrap()
            .buffers
            .iter()
            .find(|b| b.name.ends_with("0.mlp.linear_fc1.weight"))
            .unwrap();
        assert_eq!(b.pieces.len(), 2);
        assert_eq!(b.pieces[1].region.range(0), 24 + 12..24 + 24);
        assert!(l
            .shard_of(0)
            .unwrap()
            .buffers
            .iter()
            .any(|b| b.name == "optimizer.master.flat"));
    }

    #[test]
    fn mtp_modules_run_on_the_last_stage_with_a_copy_of_the_embedding() {
        let spec = find("deepseek-v3").unwrap().with_mtp_layers(1);
        let plain = ModelState::new(find("deepseek-v3").unwrap(), StateKind::Weights(DType::BF16));
        let s = ModelState::new(&spec, StateKind::Weights(DType::BF16));
        // DeepSeek's published 685B: 671B and 14B of the module (its
        // embedding and head are the model's).
        let extra = s.parameter_count() - plain.parameter_count();
        assert_eq!(
            (plain.parameter_count() / 1_000_000_000, extra / 100_000_000),
            (671, 116)
        );
        let l = s.layout(&cfg("tp=2,pp=2,split=31:30,ep=2,dp=2")).unwrap();
        let holds = |shard: usize, name: &str| l.shards()[shard].buffers.iter().find(|b| b.name == name).cloned();
        let (first, last) = (0, l.shards().len() - 1);
        assert!(holds(first, "mtp.layers.0.enorm.weight").is_none());
        let eh = holds(last, "mtp.layers.0.eh_proj.weight").unwrap();
        // Column-parallel: half the rows, all 2·hidden columns.
        assert_eq!(eh.pieces[0].region.range(1), 0..2 * 7168);
        assert_eq!(
            eh.pieces[0].region.range(0).end - eh.pieces[0].region.range(0).start,
            7168 / 2
        );
        assert!(holds(last, "mtp.layers.0.transformer_layer.mlp.router.weight").is_some());
        for shard in [first, last] {
            assert!(holds(shard, "embedding.word_embeddings.weight").is_some(), "{shard}");
        }
        assert!(s.estimate_pieces(&cfg("tp=2,pp=2,split=31:30,ep=2,dp=2")).is_ok());
    }

    #[test]
    fn invalid_configurations_name_their_numbers() {
        let s = ModelState::new(find("gpt3-6.7b").unwrap(), StateKind::Training);
        let e = s.layout(&cfg("tp=3")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "tp=3 does not divide the 32 attention heads (num_attention_heads) of gpt3-6.7b"
        );
        assert!(matches!(s.layout(&cfg("pp=64")), Err(Error::PpLayers { pp: 64, .. })));
        assert!(matches!(s.layout(&cfg("pp=3")), Err(Error::PpUneven { .. })));
        assert!(s.layout(&cfg("pp=3,split=10:11:11")).is_ok());
        assert!(matches!(s.layout(&cfg("ep=2,dp=2")), Err(Error::EpDense { .. })));
        let moe = ModelState::new(find("mixtral-8x7b").unwrap(), StateKind::Weights(DType::BF16));
        assert!(matches!(moe.layout(&cfg("ep=3,dp=3")), Err(Error::EpExperts { .. })));
        assert!(matches!(moe.layout(&cfg("ep=4,dp=2")), Err(Error::EpDp { .. })));
        let l70 = ModelState::new(find("llama2-70b").unwrap(), StateKind::Weights(DType::BF16));
        assert!(matches!(
            l70.validate(&cfg("tp=16")),
            Err(Error::TpGroups { groups: 8, .. })
        ));
    }

    #[test]
    fn moe_experts_follow_expert_parallelism() {
        let s = ModelState::new(find("mixtral-tiny").unwrap(), StateKind::Training);
        let l = s.layout(&cfg("tp=1,dp=4,ep=2,zero=1")).unwrap();
        let names: Vec<_> = l.shard_of(1).unwrap().buffers.iter().map(|b| b.name.clone()).collect();
        assert!(names.iter().any(|n| n.contains("local_experts.2.")));
        assert!(!names.iter().any(|n| n.contains("local_experts.0.")));
        assert!(names.iter().any(|n| n == "optimizer.exp_avg.expert_flat"));
    }

    /// The rows of `linear_qkv.weight` (layer 0) on the serving rank that
    /// device `d` holds, in buffer order.
    fn qkv_rows(layout: &Layout, d: u32) -> Vec<std::ops::Range<u64>> {
        let shard = layout.shard_of(d).unwrap();
        let buf = shard
            .buffers
            .iter()
            .find(|b| b.name == "decoder.layers.0.self_attention.linear_qkv.weight")
            .unwrap();
        let mut pieces: Vec<_> = buf.pieces.iter().collect();
        pieces.sort_by_key(|p| p.offset);
        pieces.iter().map(|p| p.region.range(0)).collect()
    }

    #[test]
    fn serving_layouts_regroup_qkv_and_replicate_kv_heads() {
        // llama-tiny: 8 query heads in 4 groups, head_dim 2: a group's rows
        // are [q q k v] x 2 = 8 rows.
        let s = ModelState::new(find("llama-tiny").unwrap(), StateKind::Weights(DType::BF16));
        // tp=2: rank 1 serves groups 2 and 3 as [q2 q3; k2 k3; v2 v3].
        let l = s.serving_layout(&cfg("tp=2")).unwrap();
        assert_eq!(qkv_rows(&l, 1), vec![16..20, 24..28, 20..22, 28..30, 22..24, 30..32]);
        // tp=8 > 4 groups: rank 3 serves query head 1 of group 1 and that
        // group's key and value heads, which rank 2 holds too.
        let l = s.serving_layout(&cfg("tp=8")).unwrap();
        assert_eq!(qkv_rows(&l, 3), vec![10..12, 12..14, 14..16]);
        assert_eq!(qkv_rows(&l, 2), vec![8..10, 12..14, 14..16]);
        // Two replicas of a tp=4 engine on devices 8-15: one shard per rank,
        // each on two devices.
        let l = s.serving_layout(&cfg("tp=4,dp=2,devices=8-15")).unwrap();
        assert_eq!(l.shards().len(), 4);
        assert_eq!(l.shards()[1].devices, vec![9, 13]);
        // Whatever the engine, every element of every weight is held.
        for c in ["tp=1", "tp=2", "tp=4", "tp=8", "tp=4,dp=3"] {
            let l = s.serving_layout(&cfg(c)).unwrap();
            assert_eq!(l.tensors().len(), s.parameter_tensors(), "{c}");
        }
    }

    #[test]
    fn expert_lists_place_any_experts_on_each_group() {
        // mixtral-tiny: 4 experts. Group 0 serves experts 0 and 3, group 1
        // serves 1-3: expert 3 is a redundant replica on both.
        let s = ModelState::new(find("mixtral-tiny").unwrap(), StateKind::Weights(DType::BF16));
        let c = cfg("tp=2,ep=2,experts=0+3:1-3");
        assert_eq!(c.experts, Some(vec![vec![0, 3], vec![1, 2, 3]]));
        assert_eq!(c.to_string().parse::<ParallelConfig>().unwrap(), c);
        let l = s.serving_layout(&c).unwrap();
        let experts_of = |d: u32| -> Vec<u32> {
            let mut v: Vec<u32> = l
                .shard_of(d)
                .unwrap()
                .buffers
                .iter()
                .filter_map(|b| b.name.split("local_experts.").nth(1))
                .filter_map(|rest| rest.split('.').next()?.parse().ok())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        assert_eq!(experts_of(0), vec![0, 3]);
        assert_eq!(experts_of(1), vec![1, 2, 3]);
        assert_eq!(l.tensors().len(), s.parameter_tensors());
        // Bad lists, each named.
        for (c, want) in [
            ("tp=2,ep=2,experts=0-1+1:2-3", "group 0 lists expert 1 twice"),
            ("tp=2,ep=2,experts=0-1:3", "expert 2 is in no group's list"),
            (
                "tp=2,ep=2,experts=0-3",
                "gives 1 group(s), ep=2 needs one list per group",
            ),
            (
                "tp=2,ep=2,experts=0-1:2-4",
                "expert 4 in group 1: the model has experts 0-3",
            ),
        ] {
            let e = s.serving_layout(&cfg(c)).unwrap_err().to_string();
            assert!(e.contains(want), "{c}: {e}");
        }
        let e = s
            .serving_layout(&cfg("tp=2,ep=2,experts=0-1:3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("local_experts.2."), "names a tensor of the expert: {e}");
        let e = s
            .layout(&cfg("tp=2,dp=2,ep=2,experts=0-1:2-3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a training layout spreads them with ep=E"), "{e}");
        let llama = ModelState::new(find("llama-tiny").unwrap(), StateKind::Weights(DType::BF16));
        let e = llama.serving_layout(&cfg("tp=2,experts=0")).unwrap_err().to_string();
        assert!(e.contains("need a mixture-of-experts model"), "{e}");
    }

    #[test]
    fn expert_parallel_engines_serve_whole_experts_per_group() {
        // mixtral-tiny: 4 experts. tp=2,ep=2: rank 0 serves experts 0-1
        // whole, rank 1 experts 2-3; attention stays split over both.
        let s = ModelState::new(find("mixtral-tiny").unwrap(), StateKind::Weights(DType::BF16));
        let l = s.serving_layout(&cfg("tp=2,ep=2")).unwrap();
        let fc1 = |l: &Layout, d: u32, x: u32| {
            let name = format!("decoder.layers.0.mlp.experts.local_experts.{x}.linear_fc1.weight");
            l.shard_of(d)
                .unwrap()
                .buffers
                .iter()
                .find(|b| b.name == name)
                .map(|b| b.pieces.iter().map(|p| p.region.volume()).sum::<u64>())
        };
        let whole = s
            .tensors()
            .iter()
            .find(|t| t.name.ends_with("local_experts.0.linear_fc1.weight"))
            .unwrap()
            .numel();
        assert_eq!(fc1(&l, 0, 0), Some(whole));
        assert_eq!(fc1(&l, 0, 1), Some(whole));
        assert_eq!(fc1(&l, 0, 2), None);
        assert_eq!(fc1(&l, 1, 3), Some(whole));
        assert_eq!(qkv_rows(&l, 1).len(), 3, "attention split over the engine's ranks");
        // tp=4,ep=2: two groups of two ranks, each expert split over its group.
        let l = s.serving_layout(&cfg("tp=4,ep=2")).unwrap();
        assert_eq!(fc1(&l, 1, 1), Some(whole / 2));
        assert_eq!(fc1(&l, 2, 1), None);
        assert_eq!(fc1(&l, 3, 2), Some(whole / 2));
        for c in ["tp=2,ep=2", "tp=4,ep=4", "tp=4,ep=2,dp=2"] {
            let l = s.serving_layout(&cfg(c)).unwrap();
            assert_eq!(l.tensors().len(), s.parameter_tensors(), "{c}");
        }
        let err = |c: &str| s.serving_layout(&cfg(c)).unwrap_err().to_string();
        assert!(err("tp=2,ep=4").contains("ep=4 must divide"), "{}", err("tp=2,ep=4"));
        assert!(err("tp=4,ep=3").contains("must divide"), "{}", err("tp=4,ep=3"));
    }

    #[test]
    fn serving_layouts_refuse_what_an_engine_cannot_serve() {
        let w = ModelState::new(find("llama-tiny").unwrap(), StateKind::Weights(DType::BF16));
        let err = |s: &ModelState, c: &str| s.serving_layout(&cfg(c)).unwrap_err().to_string();
        assert!(
            err(&w, "tp=3").contains("does not divide the 8 attention heads"),
            "{}",
            err(&w, "tp=3")
        );
        assert!(err(&w, "tp=2,pp=2").contains("no pp"));
        assert!(err(&w, "tp=2,ep=2").contains("no experts"), "{}", err(&w, "tp=2,ep=2"));
        let t = ModelState::new(find("llama-tiny").unwrap(), StateKind::Training);
        assert!(err(&t, "tp=2").contains("weights only"));
        // 6 query heads in 2 groups under tp=... a model whose groups and tp
        // do not divide each other.
        let mut odd = find("llama-tiny").unwrap().clone();
        odd.heads = 12;
        odd.groups = 3;
        odd.head_dim = 2;
        let o = ModelState::new(&odd, StateKind::Weights(DType::BF16));
        assert!(
            err(&o, "tp=2").contains("one must divide the other"),
            "{}",
            err(&o, "tp=2")
        );
    }
}
