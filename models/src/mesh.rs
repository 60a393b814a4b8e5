//! Layouts as DTensor jobs describe themselves: a device mesh of named
//! dimensions — torchtitan's `pp`, `dp_replicate` (HSDP's replicas),
//! `dp_shard` (FSDP2's sharding), `cp` (context parallelism), `tp` and
//! `ep` — and each tensor's placement on it.
//!
//! FSDP2 shards a tensor's first dimension over `dp_shard`·`cp` (torchtitan
//! folds context parallelism into FSDP's mesh) as `torch.chunk` does
//! (chunks of ⌈n/k⌉ rows, the last ones shorter or empty), HSDP replicates
//! over `dp_replicate`, and tensor parallelism shards the dimension a
//! tensor's rule names (or replicates it). Under FSDP2 × TP the
//! tensor-parallel shard is split first and FSDP2 shards what each
//! tensor-parallel rank holds (DTensor's `_StridedShard`). A MoE layer's
//! expert stacks are split over `ep`, which borrows its ranks from
//! `dp_shard`·`cp`·`tp`, and FSDP2 shards each expert-parallel part over the
//! ranks left (torchtitan's `efsdp`), on the experts' dimension, or on the
//! next one when there are more such ranks than experts. Ranks are
//! numbered row-major over (`pp`, `dp_replicate`, `dp_shard`, `cp`, `tp`),
//! torchtitan's order. The tensors keep their names: the layout is the
//! state as the framework that wrote it would hold it on another mesh.
//!
//! ```
//! use tenplan_models::{MeshConfig, TensorPlacement};
//! use tenplan_ptc::{DType, TensorSpec};
//!
//! let mesh: MeshConfig = "dp_replicate=2,dp_shard=2".parse().unwrap();
//! let tensors = vec![TensorSpec::new("w", DType::F32, [5, 4]), TensorSpec::new("step", DType::F32, [1])];
//! let layout = mesh
//!     .layout(tensors.into(), &|_, t| {
//!         Ok(TensorPlacement { tp_dim: None, fsdp: t.name != "step", fsdp_dim: None, experts: false, stack: None })
//!     })
//!     .unwrap();
//! // torch.chunk's rule: rows 0..3 and 3..5, each on both replicas.
//! assert_eq!(layout.sub_tensors(0).len(), 2);
//! assert_eq!(layout.devices().count(), 4);
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use tenplan_ptc::{limits, Buffer, Cluster, DeviceId, Layout, Region, Shard, TensorId, TensorSpec};

use crate::config::{device_range, key_values, layout_number};
use crate::{Error, Result};

/// A device mesh with torchtitan's parallel dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshConfig {
    /// Pipeline-parallel ranks: each holds the layers' tensors of its
    /// stages (torchtitan's split, [`pipeline_stages`]), the first stage
    /// the embedding, the last the rest.
    pub pp: u32,
    /// The pipeline schedule, by torchtitan's (torch's) name: how many
    /// stages each pp rank runs and which (`1F1B` and `GPipe`: one;
    /// `Interleaved1F1B`, `LoopedBFS`, `InterleavedZeroBubble`: stage `s`
    /// on rank `s mod pp`; `ZBVZeroBubble`, `DualPipeV`: two per rank, in
    /// a V). `None`: torchtitan's default, `1F1B`.
    pub pp_schedule: Option<String>,
    /// torchtitan's `pipeline_parallel_layers_per_stage`: the stages hold
    /// this many layers each (the embedding and the output weigh one), so
    /// their number follows; `None`: one stage per rank for a single-stage
    /// schedule, two for the others.
    pub pp_layers_per_stage: Option<u32>,
    /// Replicas of the sharded state (HSDP).
    pub dp_replicate: u32,
    /// Ranks FSDP2 shards every tensor's first dimension over.
    pub dp_shard: u32,
    /// Context-parallel ranks: they split the sequence, not the weights,
    /// and FSDP2 shards over them as over `dp_shard`.
    pub cp: u32,
    /// Tensor-parallel ranks.
    pub tp: u32,
    /// Expert-parallel ranks, borrowed from `dp_shard`·`cp`·`tp`: each holds
    /// its share of every MoE layer's experts.
    pub ep: u32,
    /// Global device ids of the ranks; `None` means `0..world`.
    pub devices: Option<Vec<DeviceId>>,
}

/// How one tensor is placed on the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorPlacement {
    /// The dimension tensor parallelism shards (`None`: replicated over `tp`).
    pub tp_dim: Option<usize>,
    /// Whether FSDP2 shards it over `dp_shard` (scalars such as an
    /// optimizer's `step` are not).
    pub fsdp: bool,
    /// The dimension FSDP2 shards, as a job's `shard_placement_fn` says
    /// (`Shard(d)`); `None`: FSDP2's default, dimension 0 (an expert
    /// stack's next dimension once its ranks outnumber the experts).
    pub fsdp_dim: Option<usize>,
    /// Whether its first dimension stacks a MoE layer's experts (split
    /// over `ep`; FSDP2 moves to the next dimension when the ranks it
    /// shards over outnumber the experts).
    pub experts: bool,
    /// Where the tensor is one entry of a stack that the framework holds
    /// and saves as one tensor (an expert of transformers' 3-D expert
    /// stacks): its index and the stack's size. FSDP2 shards the stack on
    /// its first dimension, so the tensor lies whole on the rank whose
    /// chunk of the stack holds its index (`fsdp_dim` is not used).
    pub stack: Option<(u64, u64)>,
}

/// Whether a tensor is one that MoE models register as a module buffer
/// (not a parameter), which FSDP2 leaves whole on every rank and DCP saves
/// once: a router's routing bias (torchtitan's `moe.expert_bias_E`,
/// transformers' DeepSeek-V3 `mlp.gate.e_score_correction_bias`).
pub fn is_unsharded_buffer(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    matches!(last, "expert_bias_E" | "e_score_correction_bias")
}

/// A user's tensor-parallel placement for the tensors whose names match a
/// pattern (`*.mlp.down_proj.weight=Shard(1)`, `*norm*=Replicate()`):
/// DTensor's placement of the tensor on the mesh's `tp` dimension. An
/// optimizer moment (`...weight.exp_avg`) matches by its parameter's name.
/// Where no model says how to split a tensor, or to split it otherwise than
/// the model's plan, the user says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpPlacement {
    /// The pattern: `*` matches any run of characters, the rest itself.
    pub pattern: String,
    /// `Shard(d)`'s dimension; `None` for `Replicate()`.
    pub dim: Option<usize>,
}

impl TpPlacement {
    /// Whether the tensor `name` (a parameter, or an optimizer moment of
    /// one) is one the pattern names.
    pub fn matches(&self, name: &str) -> bool {
        let param = crate::families::OPTIMIZER_MOMENTS
            .iter()
            .find_map(|m| name.strip_suffix(m))
            .unwrap_or(name);
        glob(&self.pattern, param)
    }

    /// The placement the last of `placements` that names `name` gives it,
    /// if any does.
    pub fn of<'a>(placements: &'a [TpPlacement], name: &str) -> Option<&'a TpPlacement> {
        placements.iter().rev().find(|p| p.matches(name))
    }
}

/// `*`-only glob matching: `*` matches any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == text;
    }
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

impl FromStr for TpPlacement {
    type Err = Error;

    /// `PATTERN=Shard(d)` or `PATTERN=Replicate()`.
    fn from_str(s: &str) -> Result<TpPlacement> {
        let bad = |why: &str| Error::ParseLayout {
            input: s.to_string(),
            why: format!("{why} (expected PATTERN=Shard(d) or PATTERN=Replicate())"),
        };
        let (pattern, placement) = s.rsplit_once('=').ok_or_else(|| bad("no `=`"))?;
        if pattern.is_empty() {
            return Err(bad("an empty pattern"));
        }
        let placement = placement.trim().replace(' ', "");
        let dim = match placement.as_str() {
            "Replicate()" => None,
            p => Some(
                p.strip_prefix("Shard(")
                    .and_then(|r| r.strip_suffix(')'))
                    .and_then(|d| d.parse::<usize>().ok())
                    .ok_or_else(|| bad(&format!("`{p}` is not a placement")))?,
            ),
        };
        Ok(TpPlacement {
            pattern: pattern.to_string(),
            dim,
        })
    }
}

impl fmt::Display for TpPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dim {
            Some(d) => write!(f, "{}=Shard({d})", self.pattern),
            None => write!(f, "{}=Replicate()", self.pattern),
        }
    }
}

/// torchtitan's split of `layers` transformer layers over `pp` pipeline
/// stages, one per rank (`_generate_llm_fqn_per_model_part` with its
/// defaults: the embedding and the output each weigh one layer): the
/// layer range of each stage. An error says why no split exists.
pub fn pipeline_stages(layers: u64, pp: u32) -> std::result::Result<Vec<std::ops::Range<u64>>, String> {
    let pp = u64::from(pp);
    if pp <= 1 {
        return Ok(std::iter::once(0..layers).collect());
    }
    let effective = layers + 2;
    let per = effective / pp;
    if per < 1 {
        return Err(format!(
            "{pp} pipeline stages for {layers} layers (and the embedding and the output, one layer each) leave a stage empty"
        ));
    }
    let extra = effective % pp;
    let mut at = 0;
    Ok((0..pp)
        .map(|stage| {
            let mut n = per + u64::from(stage < extra);
            if stage == 0 || stage == pp - 1 {
                n -= 1;
            }
            let lo = at.min(layers);
            at = (at + n).min(layers);
            lo..at
        })
        .collect())
}

/// How a schedule runs its stages, by torch's schedule names
/// (case-insensitive, as `get_schedule_class` reads them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScheduleKind {
    /// One stage per rank.
    Single,
    /// Several per rank, stage `s` on rank `s mod pp`.
    Loop,
    /// Two per rank, rank `r` running stages `r` and `2·pp − 1 − r`.
    V,
}

/// The schedules [`schedule_kind`] knows, for messages.
const SCHEDULES: &str = "1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV";

fn schedule_kind(name: &str) -> Option<ScheduleKind> {
    let lower = name.to_ascii_lowercase();
    match lower.as_str() {
        "1f1b" | "gpipe" | "pipelineschedulesingle" => Some(ScheduleKind::Single),
        "interleaved1f1b" | "loopedbfs" | "interleavedzerobubble" | "pipelineschedulemulti" => Some(ScheduleKind::Loop),
        "zbvzerobubble" | "dualpipev" => Some(ScheduleKind::V),
        _ => None,
    }
}

/// torchtitan's pipeline for `layers` layers on `pp` ranks under a
/// schedule: for each stage, its layer range and the pp rank that runs it
/// (`_get_pipeline_metadata`, `_generate_llm_fqn_per_model_part` and
/// `_get_pp_rank_to_stage_indices_mapping`). An error says why none
/// exists.
pub fn pipeline_schedule(
    layers: u64,
    pp: u32,
    schedule: Option<&str>,
    layers_per_stage: Option<u32>,
) -> std::result::Result<Vec<(std::ops::Range<u64>, u32)>, String> {
    let name = schedule.unwrap_or("1F1B");
    let kind = schedule_kind(name).ok_or_else(|| format!("unknown pipeline schedule `{name}` ({SCHEDULES})"))?;
    let per_rank = match layers_per_stage {
        None => u64::from(kind != ScheduleKind::Single) + 1,
        Some(0) => return Err("pp_layers_per_stage must be at least 1".into()),
        Some(n) => {
            let stages = (layers + 2).div_ceil(u64::from(n));
            if !stages.is_multiple_of(u64::from(pp)) {
                return Err(format!(
                    "{stages} stages of {n} layers (for {layers} layers, the embedding and the output) do not divide over pp={pp}"
                ));
            }
            stages / u64::from(pp)
        }
    };
    match kind {
        ScheduleKind::Single if per_rank != 1 => return Err(format!("{name} runs one stage per rank, not {per_rank}")),
        ScheduleKind::Loop if per_rank < 2 => return Err(format!("{name} runs at least two stages per rank")),
        ScheduleKind::V if per_rank != 2 => return Err(format!("{name} runs two stages per rank, not {per_rank}")),
        _ => {}
    }
    let stages = u32::try_from(per_rank * u64::from(pp)).map_err(|_| "too many pipeline stages".to_string())?;
    let ranges = pipeline_stages(layers, stages)?;
    Ok(ranges
        .into_iter()
        .zip(0..stages)
        .map(|(r, s)| {
            let rank = match kind {
                ScheduleKind::V if s >= pp => 2 * pp - 1 - s,
                _ => s % pp,
            };
            (r, rank)
        })
        .collect())
}

/// The transformer layer a tensor (or its optimizer state) belongs to:
/// the number after `layers.` in its name.
fn layer_of(name: &str) -> Option<u64> {
    let mut rest = name;
    while let Some(i) = rest.find("layers.") {
        let before_ok = i == 0 || rest.as_bytes()[i - 1] == b'.';
        let after = &rest[i + "layers.".len()..];
        let digits = after.split('.').next().unwrap_or("");
        if before_ok && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return digits.parse().ok();
        }
        rest = after;
    }
    None
}

/// Whether a tensor outside the layers is the input's (the first stage's):
/// a token or position embedding.
fn is_embedding(name: &str) -> bool {
    [
        "embed_tokens",
        "tok_embeddings",
        "wte.",
        "wpe.",
        "word_embeddings",
        "position_embeddings",
    ]
    .iter()
    .any(|e| name.contains(e))
}

/// `torch.chunk`'s `k`-th of `n` chunks of `range`: ⌈len/n⌉ elements each,
/// the last ones shorter or empty.
pub fn chunk(range: std::ops::Range<u64>, n: u32, k: u32) -> std::ops::Range<u64> {
    let len = range.end - range.start;
    let size = len.div_ceil(u64::from(n.max(1)));
    let lo = (range.start + size * u64::from(k)).min(range.end);
    let hi = (lo + size).min(range.end);
    lo..hi
}

impl MeshConfig {
    /// Ranks in all.
    pub fn world(&self) -> u64 {
        [self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp]
            .iter()
            .map(|&d| u64::from(d))
            .product()
    }

    /// The global device of every rank, checked against the device limit.
    pub fn rank_devices(&self) -> Result<Vec<DeviceId>> {
        for (what, v) in [
            ("pp", self.pp),
            ("dp_replicate", self.dp_replicate),
            ("dp_shard", self.dp_shard),
            ("cp", self.cp),
            ("tp", self.tp),
            ("ep", self.ep),
        ] {
            if v == 0 {
                return Err(Error::ZeroDegree { what });
            }
        }
        let borrowed = u64::from(self.dp_shard) * u64::from(self.cp) * u64::from(self.tp);
        if !borrowed.is_multiple_of(u64::from(self.ep)) {
            return Err(Error::ParseLayout {
                input: self.to_string(),
                why: format!(
                    "ep={} borrows its ranks from dp_shard·cp·tp = {borrowed}, which it does not divide",
                    self.ep
                ),
            });
        }
        let needed = self.world();
        limits::check(
            "ranks (pp·dp_replicate·dp_shard·cp·tp)",
            needed,
            limits::MAX_DEVICES.into(),
        )?;
        match &self.devices {
            None => Ok((0..needed as u32).collect()),
            Some(d) if d.len() as u64 == needed => Ok(d.clone()),
            Some(d) => Err(Error::ParseLayout {
                input: self.to_string(),
                why: format!("the mesh has {needed} ranks, `devices` names {}", d.len()),
            }),
        }
    }

    /// Check that the mesh's ranks fit the cluster.
    pub fn check_cluster(&self, cluster: &Cluster) -> Result<()> {
        let have = cluster.compute_nodes() as u64 * cluster.gpus_per_node() as u64;
        let last = self.rank_devices()?.into_iter().max().map_or(0, |d| u64::from(d) + 1);
        if last > have {
            return Err(Error::ClusterTooSmall {
                layout: self.to_string(),
                ranks: last,
                cluster: cluster.name().to_string(),
                devices: have,
            });
        }
        Ok(())
    }

    /// The layout of `tensors` on this mesh, each placed as `place` says
    /// (given the tensor's index and spec). A tensor whose tensor-parallel
    /// dimension does not exist, or is shorter than `tp`, is refused by
    /// name.
    pub fn layout(
        &self,
        tensors: Arc<[TensorSpec]>,
        place: &dyn Fn(TensorId, &TensorSpec) -> Result<TensorPlacement>,
    ) -> Result<Layout> {
        let devices = self.rank_devices()?;
        let placements: Vec<TensorPlacement> = tensors
            .iter()
            .enumerate()
            .map(|(t, spec)| {
                let p = place(t as TensorId, spec)?;
                if let Some(d) = p.tp_dim.filter(|_| self.tp > 1) {
                    let n = spec.shape.get(d).copied().ok_or_else(|| Error::ParseLayout {
                        input: self.to_string(),
                        why: format!(
                            "tensor `{}` of shape {:?} has no dimension {d} to shard over tp",
                            spec.name, spec.shape
                        ),
                    })?;
                    if n < u64::from(self.tp) && !(p.experts && self.ep > 1) {
                        return Err(Error::ParseLayout {
                            input: self.to_string(),
                            why: format!(
                                "tensor `{}` has {n} elements in dimension {d}, fewer than tp={}",
                                spec.name, self.tp
                            ),
                        });
                    }
                }
                if let Some(d) = p.fsdp_dim.filter(|&d| d >= spec.shape.len()) {
                    return Err(Error::ParseLayout {
                        input: self.to_string(),
                        why: format!(
                            "tensor `{}` of shape {:?} has no dimension {d} for FSDP2 to shard",
                            spec.name, spec.shape
                        ),
                    });
                }
                if p.experts {
                    let e = spec.shape.first().copied().unwrap_or(0);
                    if spec.shape.len() < 2 || (self.ep > 1 && !e.is_multiple_of(u64::from(self.ep))) {
                        return Err(Error::ParseLayout {
                            input: self.to_string(),
                            why: format!(
                                "tensor `{}` of shape {:?} stacks experts that ep={} cannot split evenly",
                                spec.name, spec.shape, self.ep
                            ),
                        });
                    }
                }
                Ok(p)
            })
            .collect::<Result<_>>()?;
        if self.ep > 1 && !placements.iter().any(|p| p.experts) {
            return Err(Error::ParseLayout {
                input: self.to_string(),
                why: "ep > 1, but the state has no MoE expert stacks to split".into(),
            });
        }
        // Each tensor's pipeline-parallel rank: the one running its stage.
        let stage_of: Vec<u32> = if self.pp > 1 {
            // Multi-token-prediction modules (DeepSeek-V3's files keep them
            // as the layers after the last, each with an `eh_proj`) run
            // after the model: on the last stage, as Megatron-Core puts them.
            let mtp: BTreeSet<u64> = tensors
                .iter()
                .filter(|t| t.name.ends_with("eh_proj.weight"))
                .filter_map(|t| layer_of(&t.name))
                .collect();
            let layers = tensors
                .iter()
                .filter_map(|t| layer_of(&t.name))
                .filter(|l| !mtp.contains(l))
                .max()
                .map_or(0, |l| l + 1);
            let stages = pipeline_schedule(layers, self.pp, self.pp_schedule.as_deref(), self.pp_layers_per_stage)
                .map_err(|why| Error::ParseLayout {
                    input: self.to_string(),
                    why,
                })?;
            let (first, last) = (stages[0].1, stages[stages.len() - 1].1);
            tensors
                .iter()
                .map(|t| match layer_of(&t.name) {
                    Some(l) if mtp.contains(&l) => last,
                    Some(l) => {
                        stages
                            .iter()
                            .find(|(r, _)| r.contains(&l))
                            .expect("the stages cover every layer")
                            .1
                    }
                    None if is_embedding(&t.name) => first,
                    None => last,
                })
                .collect()
        } else {
            vec![0; tensors.len()]
        };
        // One shard per (pp, dp_shard, cp, tp) coordinate, on its
        // dp_replicate replicas; ranks row-major over (pp, dp_replicate,
        // dp_shard, cp, tp).
        let (p_n, r_n, s_n, c_n, t_n) = (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp);
        // FSDP2's mesh: dp_shard and cp flattened; experts' efsdp: what ep
        // leaves of dp_shard·cp·tp.
        let fsdp_n = s_n * c_n;
        let efsdp_n = fsdp_n * t_n / self.ep;
        let mut shards = Vec::with_capacity((p_n * fsdp_n * t_n) as usize);
        for (stage, local) in (0..p_n).flat_map(|g| (0..fsdp_n * t_n).map(move |l| (g, l))) {
            let (fsdp_k, t) = (local / t_n, local % t_n);
            let mut buffers = Vec::new();
            for (ti, (spec, p)) in tensors.iter().zip(&placements).enumerate() {
                if stage_of[ti] != stage {
                    continue;
                }
                let mut ranges: Vec<std::ops::Range<u64>> = spec.shape.iter().map(|&n| 0..n).collect();
                // The ranks FSDP2 shards this tensor over, and this rank's
                // index among them.
                let (fsdp_ranks, fsdp_index) = if p.experts && self.ep > 1 {
                    // torchtitan: ep rank = local rank mod ep, the experts
                    // not split over tp; FSDP2 over efsdp.
                    ranges[0] = chunk(ranges[0].clone(), self.ep, local % self.ep);
                    (efsdp_n, local / self.ep)
                } else {
                    if let Some(d) = p.tp_dim.filter(|_| t_n > 1) {
                        ranges[d] = chunk(ranges[d].clone(), t_n, t);
                    }
                    (fsdp_n, fsdp_k)
                };
                if p.fsdp && fsdp_ranks > 1 {
                    match p.stack {
                        // Whole, on the rank of its index of the stack.
                        Some((index, size)) => {
                            if !chunk(0..size, fsdp_ranks, fsdp_index).contains(&index) {
                                continue;
                            }
                        }
                        None => {
                            // Experts move to their next dimension when the
                            // ranks sharding them (with ep) outnumber them.
                            let d = p.fsdp_dim.unwrap_or_else(|| {
                                usize::from(p.experts && u64::from(fsdp_ranks * self.ep) > spec.shape[0])
                            });
                            ranges[d] = chunk(ranges[d].clone(), fsdp_ranks, fsdp_index);
                        }
                    }
                }
                let region = Region::new(ranges)?;
                if region.is_empty() {
                    continue;
                }
                buffers.push(Buffer::of_box(spec.name.clone(), spec.dtype, ti as TensorId, region));
            }
            let replicas = (0..r_n)
                .map(|r| devices[((stage * r_n + r) * fsdp_n * t_n + local) as usize])
                .collect();
            let (s, c) = (fsdp_k / c_n, fsdp_k % c_n);
            let mut name = String::new();
            if p_n > 1 {
                name += &format!("pp{stage}.");
            }
            name += &format!("dp_shard{s}.");
            if c_n > 1 {
                name += &format!("cp{c}.");
            }
            name += &format!("tp{t}");
            shards.push(Shard {
                name,
                devices: replicas,
                buffers,
            });
        }
        Ok(Layout::new(tensors, shards)?)
    }
}

impl fmt::Display for MeshConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pp > 1 {
            write!(f, "pp={},", self.pp)?;
        }
        if let Some(s) = &self.pp_schedule {
            write!(f, "pp_schedule={s},")?;
        }
        if let Some(n) = self.pp_layers_per_stage {
            write!(f, "pp_layers_per_stage={n},")?;
        }
        write!(f, "dp_replicate={},dp_shard={}", self.dp_replicate, self.dp_shard)?;
        if self.cp > 1 {
            write!(f, ",cp={}", self.cp)?;
        }
        write!(f, ",tp={}", self.tp)?;
        if self.ep > 1 {
            write!(f, ",ep={}", self.ep)?;
        }
        if let Some(d) = &self.devices {
            if let (Some(a), Some(b)) = (d.first(), d.last()) {
                write!(f, ",devices={a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// Whether a layout string names a mesh (a key only torchtitan's meshes
/// have: `dp_shard`, `dp_replicate`, `cp`, `pp_schedule`,
/// `pp_layers_per_stage`) rather than Megatron's `tp,pp,dp`.
pub fn is_mesh(input: &str) -> bool {
    input
        .split(',')
        .filter_map(|p| p.split_once('=').map(|(k, _)| k.trim()))
        .any(|k| ["dp_shard", "dp_replicate", "cp", "pp_schedule", "pp_layers_per_stage"].contains(&k))
}

impl FromStr for MeshConfig {
    type Err = Error;

    fn from_str(input: &str) -> Result<MeshConfig> {
        let bad = |why: String| Error::ParseLayout {
            input: input.to_string(),
            why,
        };
        let mut c = MeshConfig {
            pp: 1,
            pp_schedule: None,
            pp_layers_per_stage: None,
            dp_replicate: 1,
            dp_shard: 1,
            cp: 1,
            tp: 1,
            ep: 1,
            devices: None,
        };
        for (k, v) in key_values(input)? {
            let num = |v: &str| layout_number(input, k, v);
            match k {
                "dp_replicate" => c.dp_replicate = num(v)?,
                "dp_shard" => c.dp_shard = num(v)?,
                "tp" => c.tp = num(v)?,
                "pp" => c.pp = num(v)?,
                "cp" => c.cp = num(v)?,
                "pp_schedule" => {
                    schedule_kind(v).ok_or_else(|| bad(format!("unknown pipeline schedule `{v}` ({SCHEDULES})")))?;
                    c.pp_schedule = Some(v.to_string())
                }
                "pp_layers_per_stage" => c.pp_layers_per_stage = Some(num(v)?),
                "ep" => c.ep = num(v)?,
                "devices" => c.devices = Some(device_range(input, v)?),
                _ => {
                    return Err(bad(format!(
                        "unknown key `{k}` (expected pp, pp_schedule, pp_layers_per_stage, dp_replicate, dp_shard, cp, tp, ep, devices)"
                    )))
                }
            }
        }
        if c.pp == 1 && (c.pp_schedule.is_some() || c.pp_layers_per_stage.is_some()) {
            return Err(bad("a pipeline schedule needs pp > 1".into()));
        }
        c.rank_devices()?;
        Ok(c)
    }
}

#[cfg(test)]
mod placement_tests {
    use super::*;

    #[test]
    fn placements_parse_and_match_by_parameter() {
        let p: TpPlacement = "*.mlp.down_proj.weight=Shard(1)".parse().unwrap();
        assert_eq!(p.dim, Some(1));
        assert!(p.matches("model.layers.3.mlp.down_proj.weight"));
        assert!(p.matches("optim.state.model.layers.3.mlp.down_proj.weight.exp_avg_sq"));
        assert!(!p.matches("model.layers.3.mlp.down_proj.weight_scale"));
        let r: TpPlacement = "*norm*= Replicate()".parse().unwrap();
        assert_eq!(r.dim, None);
        assert!(r.matches("model.norm.weight") && !r.matches("lm_head.weight"));
        assert_eq!(r.to_string(), "*norm*=Replicate()");
        let all = [p.clone(), "model.layers.3.*=Replicate()".parse().unwrap()];
        assert_eq!(
            TpPlacement::of(&all, "model.layers.3.mlp.down_proj.weight")
                .unwrap()
                .dim,
            None
        );
        assert_eq!(TpPlacement::of(&all, "model.layers.2.mlp.down_proj.weight"), Some(&p));
        for bad in ["x", "=Shard(0)", "x=Shard(-1)", "x=Partial()", "x=Shard(a)"] {
            assert!(bad.parse::<TpPlacement>().is_err(), "{bad}");
        }
        assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxc") && glob("*", "") && !glob("ab", "abc"));
    }
}

#[cfg(test)]
mod tests {
    use tenplan_ptc::DType;

    use super::*;

    /// Sharded by FSDP2 only.
    const FSDP_ONLY: TensorPlacement = TensorPlacement {
        tp_dim: None,
        fsdp: true,
        fsdp_dim: None,
        experts: false,
        stack: None,
    };

    #[test]
    fn torch_chunk_is_uneven_at_the_end() {
        let parts: Vec<_> = (0..4).map(|k| chunk(0..10, 4, k)).collect();
        assert_eq!(parts, [0..3, 3..6, 6..9, 9..10]);
        let parts: Vec<_> = (0..4).map(|k| chunk(0..5, 4, k)).collect();
        assert_eq!(parts, [0..2, 2..4, 4..5, 5..5]);
        assert_eq!(chunk(2..8, 2, 1), 5..8);
    }

    #[test]
    fn fsdp_over_tp_shards_the_tensor_parallel_shard() {
        let mesh: MeshConfig = "dp_shard=2,tp=2".parse().unwrap();
        let tensors: Arc<[TensorSpec]> = vec![TensorSpec::new("w", DType::BF16, [8, 6])].into();
        let layout = mesh
            .layout(tensors, &|_, _| {
                Ok(TensorPlacement {
                    tp_dim: Some(0),
                    fsdp: true,
                    fsdp_dim: None,
                    experts: false,
                    stack: None,
                })
            })
            .unwrap();
        // Rank (dp_shard s, tp t): rows of tp shard t, then FSDP's half of them.
        let boxes: Vec<(Vec<DeviceId>, Vec<u64>)> = layout
            .shards()
            .iter()
            .map(|s| (s.devices.clone(), s.buffers[0].pieces[0].region.lo()))
            .collect();
        assert_eq!(
            boxes,
            [
                (vec![0], vec![0, 0]),
                (vec![1], vec![4, 0]),
                (vec![2], vec![2, 0]),
                (vec![3], vec![6, 0])
            ]
        );
    }

    #[test]
    fn an_entry_of_a_stack_lies_whole_on_the_rank_of_its_index() {
        // Three experts of a stack of 3 on dp_shard=2: torch.chunk gives
        // rank 0 experts 0 and 1, rank 1 expert 2.
        let mesh: MeshConfig = "dp_shard=2".parse().unwrap();
        let tensors: Arc<[TensorSpec]> = (0..3)
            .map(|e| TensorSpec::new(format!("experts.{e}.w"), DType::BF16, [4, 6]))
            .collect();
        let layout = mesh
            .layout(tensors, &|t, _| {
                Ok(TensorPlacement {
                    stack: Some((u64::from(t), 3)),
                    ..FSDP_ONLY
                })
            })
            .unwrap();
        let held: Vec<Vec<(TensorId, Vec<u64>)>> = layout
            .shards()
            .iter()
            .map(|s| {
                s.buffers
                    .iter()
                    .map(|b| (b.pieces[0].tensor, b.pieces[0].region.shape()))
                    .collect()
            })
            .collect();
        assert_eq!(held, [vec![(0, vec![4, 6]), (1, vec![4, 6])], vec![(2, vec![4, 6])]]);
    }

    #[test]
    fn interleaved_schedules_place_several_stages_per_rank() {
        // 6 layers, 4 stages on 2 ranks: [emb, 0], [1, 2], [3, 4], [5, out].
        let loop_ = pipeline_schedule(6, 2, Some("Interleaved1F1B"), None).unwrap();
        assert_eq!(loop_, [(0..1, 0), (1..3, 1), (3..5, 0), (5..6, 1)]);
        let v = pipeline_schedule(6, 2, Some("ZBVZeroBubble"), None).unwrap();
        assert_eq!(v, [(0..1, 0), (1..3, 1), (3..5, 1), (5..6, 0)]);
        // 3 layers per stage: (6 + 2) / 3 -> 3 stages, not a multiple of 2.
        assert!(pipeline_schedule(6, 2, Some("LoopedBFS"), Some(3)).is_err());
        assert!(pipeline_schedule(6, 2, Some("1F1B"), Some(2)).is_err());
        assert_eq!(
            pipeline_schedule(6, 2, Some("gpipe"), None).unwrap(),
            [(0..3, 0), (3..6, 1)]
        );
        // The output layer's rank under a V: the first.
        let mesh: MeshConfig = "pp=2,pp_schedule=ZBVZeroBubble,dp_shard=1".parse().unwrap();
        assert_eq!(
            mesh.to_string(),
            "pp=2,pp_schedule=ZBVZeroBubble,dp_replicate=1,dp_shard=1,tp=1"
        );
        let tensors: Vec<TensorSpec> = ["tok_embeddings.weight", "layers.5.w", "lm_head.weight"]
            .iter()
            .map(|n| TensorSpec::new(*n, DType::F32, [4]))
            .collect();
        let layout = mesh.layout(tensors.into(), &|_, _| Ok(FSDP_ONLY)).unwrap();
        for t in 0..3 {
            assert_eq!(layout.sub_tensors(t)[0].holders, [0], "tensor {t}");
        }
    }

    #[test]
    fn pipeline_stages_split_as_torchtitan_does() {
        // torchtitan: 2 stages, 3 layers -> [tok_embeddings, layers.0,
        // layers.1], [layers.2, norm, lm_head].
        assert_eq!(pipeline_stages(3, 2).unwrap(), [0..2, 2..3]);
        assert_eq!(pipeline_stages(6, 4).unwrap(), [0..1, 1..3, 3..5, 5..6]);
        assert_eq!(pipeline_stages(32, 1).unwrap(), vec![(0..32)]);
        assert!(pipeline_stages(1, 4).is_err());
        assert_eq!(
            layer_of("optim.state.model.layers.12.mlp.up_proj.weight.exp_avg"),
            Some(12)
        );
        assert_eq!(layer_of("layers.3.attention.wq.weight"), Some(3));
        assert_eq!(layer_of("model.norm.weight"), None);
        assert_eq!(layer_of("model.sublayers.2.w"), None);
        // Each stage's ranks hold its layers, the first the embedding, the
        // last the norm and the output layer.
        let mesh: MeshConfig = "pp=2,dp_shard=2".parse().unwrap();
        assert_eq!(mesh.to_string(), "pp=2,dp_replicate=1,dp_shard=2,tp=1");
        let tensors: Vec<TensorSpec> = [
            "model.embed_tokens.weight",
            "model.layers.0.w",
            "model.layers.1.w",
            "model.layers.2.w",
            "lm_head.weight",
        ]
        .iter()
        .map(|n| TensorSpec::new(*n, tenplan_ptc::DType::F32, [4, 2]))
        .collect();
        let layout = mesh.layout(tensors.into(), &|_, _| Ok(FSDP_ONLY)).unwrap();
        let holders =
            |t: TensorId| -> Vec<DeviceId> { layout.sub_tensors(t).iter().flat_map(|s| s.holders.clone()).collect() };
        assert_eq!(holders(0), [0, 1]);
        assert_eq!(holders(2), [0, 1]);
        assert_eq!(holders(3), [2, 3]);
        assert_eq!(holders(4), [2, 3]);
    }

    #[test]
    fn meshes_parse_and_refuse() {
        assert!(is_mesh("dp_shard=4"));
        assert!(is_mesh("tp=2,cp=2") && is_mesh("pp=2,pp_schedule=GPipe"));
        assert!(!is_mesh("tp=2,dp=2"));
        let m: MeshConfig = "dp_replicate=2,dp_shard=2,devices=4-7".parse().unwrap();
        assert_eq!(m.rank_devices().unwrap(), [4, 5, 6, 7]);
        for (bad, why) in [
            ("dp_shard=0", "must be at least 1"),
            ("dp_shard=2,ep=4", "does not divide"),
            ("dp_shard=2,cp=2,tp=1,ep=3", "does not divide"),
            ("dp_shard=2,sp=2", "unknown key"),
            ("dp_shard=2,pp_schedule=Interleaved1F1B", "needs pp > 1"),
            ("pp=2,pp_schedule=Zigzag", "unknown pipeline schedule"),
            ("dp_shard=2,pp=0", "must be at least 1"),
            ("dp_shard=2,devices=0-2", "names 3"),
            ("dp_shard=x", "non-negative integer"),
        ] {
            let e = bad.parse::<MeshConfig>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
