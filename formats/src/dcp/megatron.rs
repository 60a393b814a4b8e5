//! Megatron-Core's `torch_dist` checkpoints: what
//! `megatron.core.dist_checkpointing.save` writes with its default
//! `torch_dist` strategy — a DCP checkpoint (`.metadata`, `__<rank>_<n>.distcp`)
//! beside `metadata.json` (`{"sharded_backend": "torch_dist", ...}`) and
//! `common.pt` (the state that is not sharded, saved by rank 0 with
//! `torch.save`).
//!
//! Megatron stacks a transformer block's homogeneous layers under one key
//! with the global layer index as a leading axis
//! (`decoder.layers.self_attention.linear_qkv.weight` of shape `[L, rows,
//! hidden]`, one chunk per layer and tensor-parallel shard), and a MoE
//! layer's local experts under a second one. tenplan's catalog names each
//! layer's tensor as the live module does (`decoder.layers.3.…`): the
//! tensor is the stacked one at its layer (and expert) index, so
//! [`stacked_name`] is the whole mapping. A block whose layers differ
//! (dense layers before MoE ones) is saved layer by layer instead, each
//! under its global index, only the experts stacked ([`per_layer_name`]).
//! Fused tensors (QKV in per-group
//! order, SwiGLU's `[W; V]`) are saved as their global tensors, the order
//! tenplan's catalog uses; the vocabulary tensors may carry Megatron's
//! padding rows past the model's vocabulary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value as Json;
use tenplan_ptc::TensorSpec;

use super::torch_save::object_archive;
use super::write::{DcpExtras, SavedAs};
use crate::pickle;
use crate::pickle_writer::PickleWriter;
use crate::{Error, Result};

/// The file that names the backend of a Megatron-Core distributed checkpoint.
pub const METADATA_JSON: &str = "metadata.json";
/// The file that holds a Megatron-Core checkpoint's common (not sharded) state.
pub const COMMON_FILE: &str = "common.pt";

/// What a Megatron-Core `torch_dist` checkpoint says of itself beyond its
/// DCP metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MegatronInfo {
    /// `metadata.json`'s `sharded_backend_version`, when given.
    pub backend_version: Option<i64>,
    /// The top-level keys of the state dict in `common.pt` (what a
    /// training job keeps there: `args`, `iteration`, `rng_state`, ...).
    pub common_keys: Vec<String>,
}

impl MegatronInfo {
    /// The entries `common.pt` holds, under the names tenplan reports them
    /// by (`common.pt:<key>`).
    pub fn common_entries(&self) -> Vec<String> {
        self.common_keys.iter().map(|k| format!("{COMMON_FILE}:{k}")).collect()
    }
}

/// Whether `dir` is a Megatron-Core distributed checkpoint (it has a
/// `metadata.json` naming a `sharded_backend`).
pub fn is_megatron(dir: &Path) -> bool {
    dir.join(METADATA_JSON).is_file()
}

/// Read what a Megatron-Core checkpoint says of itself: `None` for a plain
/// DCP directory; an error for another backend than `torch_dist`, an
/// unreadable `metadata.json`, or a missing or unreadable `common.pt`.
pub fn read_info(dir: &Path) -> Result<Option<MegatronInfo>> {
    let meta = dir.join(METADATA_JSON);
    if !meta.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&meta).map_err(|e| Error::Io {
        op: "read",
        path: meta.clone(),
        source: e,
    })?;
    let json: Json = serde_json::from_str(&text).map_err(|e| Error::file(&meta, format!("not JSON: {e}")))?;
    let backend = json
        .get("sharded_backend")
        .and_then(Json::as_str)
        .ok_or_else(|| Error::file(&meta, "names no sharded_backend (not a Megatron-Core checkpoint?)"))?;
    if backend != "torch_dist" {
        return Err(Error::file(
            &meta,
            format!(
                "sharded_backend `{backend}`: tenplan reads Megatron-Core's torch_dist checkpoints (re-save with --ckpt-format torch_dist)"
            ),
        ));
    }
    let common = dir.join(COMMON_FILE);
    let bytes = std::fs::read(&common).map_err(|e| Error::Io {
        op: "read",
        path: common.clone(),
        source: e,
    })?;
    let common_keys = common_keys(&bytes).map_err(|what| Error::file(&common, what))?;
    Ok(Some(MegatronInfo {
        backend_version: json.get("sharded_backend_version").and_then(Json::as_i64),
        common_keys,
    }))
}

/// The top-level keys of the dict a `torch.save` archive holds.
pub(crate) fn common_keys(bytes: &[u8]) -> std::result::Result<Vec<String>, String> {
    let root = archive_value(bytes)?;
    let entries = root
        .entries()
        .ok_or_else(|| format!("holds a {}, not a dict", root.kind()))?;
    let keys: BTreeSet<String> = entries
        .iter()
        .map(|(k, _)| {
            k.as_str()
                .map(String::from)
                .or_else(|| k.as_int().map(|i| i.to_string()))
                .ok_or_else(|| format!("a key is a {}", k.kind()))
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok(keys.into_iter().collect())
}

/// Leave the top-level keys `drop` out of the `common.pt` that `extras`
/// carries from the Megatron-Core checkpoint `src` (its pickle written again);
/// nothing to do without one or with nothing to drop.
pub fn drop_common_keys(extras: &mut DcpExtras, src: &Path, drop: &BTreeSet<String>) -> Result<()> {
    if drop.is_empty() {
        return Ok(());
    }
    if let Some(bytes) = extras.side_files.get_mut(COMMON_FILE) {
        *bytes = common_without(bytes, drop).map_err(|what| Error::file(src.join(COMMON_FILE), what))?;
    }
    Ok(())
}

/// A `torch.save` archive of a dict (a Megatron-Core checkpoint's
/// `common.pt`) without the top-level keys in `drop`: its pickle written
/// again from the dict that is left (every object as the same call, every
/// storage by the same persistent id), the storages it still names copied
/// byte for byte and aligned as `torch.save` aligns them, the others left
/// out. A pickle whose graph is not a tree (a container inside itself) is
/// refused rather than written wrong.
pub(crate) fn common_without(bytes: &[u8], drop: &BTreeSet<String>) -> std::result::Result<Vec<u8>, String> {
    use std::io::{Read, Write};

    let root = archive_value(bytes)?;
    let entries = root
        .entries()
        .ok_or_else(|| format!("holds a {}, not a dict", root.kind()))?;
    let kept: Vec<(pickle::Value, pickle::Value)> = entries
        .into_iter()
        .filter(|(k, _)| k.as_str().is_none_or(|k| !drop.contains(k)))
        .collect();
    let dict = pickle::Value::Dict(std::rc::Rc::new(std::cell::RefCell::new(kept)));
    if !dict.is_tree(256) {
        return Err("its pickle refers to itself (or nests deeper than 256 levels); it cannot be rewritten".into());
    }
    // The storages the rest still names: persistent ids
    // ('storage', class, key, location, numel).
    fn storages(v: &pickle::Value, out: &mut BTreeSet<String>) {
        match v {
            pickle::Value::Persistent(p) => {
                if let Some(key) = p
                    .items()
                    .and_then(|t| t.get(2).and_then(|k| k.as_str().map(String::from)))
                {
                    out.insert(key);
                }
            }
            pickle::Value::Object(o) => {
                storages(&o.class, out);
                o.args.iter().for_each(|a| storages(a, out));
                if let pickle::Built::NewObjEx(kw) = &o.built {
                    storages(kw, out);
                }
                if let Some(state) = o.state.borrow().as_ref() {
                    storages(state, out);
                }
            }
            other => {
                for x in other.items().unwrap_or_default() {
                    storages(&x, out);
                }
                for (k, x) in other.entries().unwrap_or_default() {
                    storages(&k, out);
                    storages(&x, out);
                }
            }
        }
    }
    let mut named = BTreeSet::new();
    storages(&dict, &mut named);
    let mut w = PickleWriter::new(2);
    w.value(&dict);
    let pkl = w.finish();

    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format!("not a torch.save archive ({e}): truncated or corrupt"))?;
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|e| format!("entry {i}: {e}"))?;
        let name = f.name().map_err(|e| format!("entry {i}: {e}"))?.to_string();
        let (dir, file) = name.rsplit_once('/').unwrap_or(("", name.as_str()));
        let storage = dir == "data" || dir.ends_with("/data");
        if storage && !named.contains(file) {
            continue;
        }
        let data = if file == "data.pkl" {
            pkl.clone()
        } else {
            let mut data = Vec::new();
            f.read_to_end(&mut data).map_err(|e| format!("{name}: {e}"))?;
            data
        };
        let options = if storage { stored.with_alignment(64) } else { stored };
        out.start_file(name.as_str(), options)
            .and_then(|_| out.write_all(&data).map_err(Into::into))
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(out.finish().map_err(|e| e.to_string())?.into_inner())
}

/// The name Megatron-Core's `torch_dist` saves a per-layer tensor under,
/// and the indices it takes on the saved tensor's leading axes: a
/// transformer layer's index (after `layers.`) and a local expert's (after
/// `local_experts.`, which its MoE layers save as `experts.experts`, the
/// name grouped GEMM experts save under too) are stacked axes, in that
/// order.
///
/// `decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight` →
/// (`decoder.layers.mlp.experts.experts.linear_fc1.weight`, [3, 5]).
pub fn stacked_name(name: &str) -> (String, Vec<u64>) {
    saved_name(name, true)
}

/// The name a block whose layers differ (dense layers before MoE ones, as
/// `moe_layer_freq` or `hetereogenous_dist_checkpoint` make them) saves a
/// per-layer tensor under: Megatron-Core saves such a block layer by
/// layer, under each layer's global index, and stacks only a MoE layer's
/// experts.
///
/// `decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight` →
/// (`decoder.layers.3.mlp.experts.experts.linear_fc1.weight`, `[5]`).
pub fn per_layer_name(name: &str) -> (String, Vec<u64>) {
    saved_name(name, false)
}

fn saved_name(name: &str, stack_layers: bool) -> (String, Vec<u64>) {
    let mut kept = Vec::new();
    let mut lead = Vec::new();
    let mut previous = "";
    // MTP modules (`mtp.layers.K.`) are saved one by one, never stacked.
    let stack_layers = stack_layers && !name.starts_with("mtp.");
    for part in name.split('.') {
        let stacked = (stack_layers && previous == "layers") || previous == "local_experts";
        match stacked.then(|| part.parse::<u64>().ok()).flatten() {
            Some(i) => lead.push(i),
            None if part == "local_experts" => kept.push("experts"),
            None => kept.push(part),
        }
        previous = part;
    }
    (kept.join("."), lead)
}

/// What `dist_checkpointing.save` writes in `metadata.json` with the
/// torch_dist strategy.
const TORCH_DIST_METADATA: &str = r#"{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1}"#;

/// What writing a model's weights (tenplan's catalog names them as
/// Megatron-Core's live modules do, one tensor per layer) as a
/// Megatron-Core `torch_dist` checkpoint adds to its tensors: each layer's
/// tensor saved as its index of the stacked tensor Megatron saves
/// ([`stacked_name`]), or, where the block's layers differ (dense layers
/// before MoE ones), under its own layer as Megatron saves such blocks
/// ([`per_layer_name`]); layer norms under the names the layer
/// implementation `imp` saves them by ([`TransformerImpl`]); each linear
/// layer's `_extra_state` objects,
/// holding nothing, as Megatron's own layers save them; and
/// `metadata.json` and an empty `common.pt` beside the DCP files.
///
/// Adam moments (`optimizer.exp_avg.<name>`, a `WeightsAndAdam` state)
/// are saved as Megatron's distributed optimizer saves them in its
/// `fully_reshardable` format, like their parameter under
/// `optimizer.state.exp_avg.<saved name>`, beside its fp32 main
/// parameters (`optimizer.state.param.<saved name>`: the weights
/// themselves, which must be fp32, named a second time); the optimizer's
/// groups and step go into `common.pt`, which the caller writes
/// ([`super::distributed_optimizer_common`]).
///
/// Refuses other optimizer state and gradients (Megatron keeps them under
/// its own names and formats) and experts that not every MoE layer has
/// alike.
pub fn torch_dist_extras(tensors: &[TensorSpec], imp: TransformerImpl) -> Result<DcpExtras> {
    if let Some(t) = tensors.iter().find(|t| {
        (t.name.starts_with("optimizer.") && tenplan_models::adam_moment(&t.name).is_none())
            || t.name.starts_with("grad.")
    }) {
        return Err(Error::Coverage {
            tensor: t.name.clone(),
            what: "a Megatron-Core torch_dist checkpoint is written from a model's weights and Adam moments; this optimizer state has names and formats of Megatron's own (reshard the weights: --weights-only)".into(),
        });
    }
    // The parameters whose moments are saved: their weights are the
    // optimizer's main parameters, which Megatron keeps in fp32.
    let with_moments: BTreeSet<&str> = tensors
        .iter()
        .filter_map(|t| tenplan_models::adam_moment(&t.name).map(|(_, p)| p))
        .collect();
    if let Some(t) = tensors
        .iter()
        .find(|t| with_moments.contains(t.name.as_str()) && t.dtype != tenplan_ptc::DType::F32)
    {
        return Err(Error::Coverage {
            tensor: t.name.clone(),
            what: format!(
                "is {}: Megatron's distributed optimizer keeps fp32 main parameters, and the state holds no fp32 copy of this weight (reshard the weights: --weights-only)",
                t.dtype
            ),
        });
    }
    // Megatron stacks a block's layers when they are all alike, and saves
    // them one by one otherwise (the whole block: `moe_layer_freq` makes
    // every layer's names per-layer).
    // What each layer holds (by its catalog prefix, `decoder.layers.3.`).
    let mut kinds: BTreeMap<&str, LayerKind> = BTreeMap::new();
    for t in tensors.iter().filter(|t| !t.name.starts_with("optimizer.")) {
        if let Some((layer, rest)) = split_layer(&t.name) {
            let kind = kinds.entry(layer).or_default();
            kind.mla |= rest.starts_with("self_attention.linear_kv_down_proj.");
            kind.moe |= rest.starts_with("mlp.router.");
        }
    }
    let saved_as = match saved_stacks(tensors, stacked_name, imp, &kinds) {
        Ok(saved_as) => saved_as,
        Err(_) => saved_stacks(tensors, per_layer_name, imp, &kinds).map_err(|(tensor, name, dims, members)| Error::Coverage {
            tensor,
            what: format!(
                "Megatron-Core stacks it as `{name}` of {dims:?} experts, which {members} of the model's tensors fill unevenly; torch_dist output needs every expert of a layer alike"
            ),
        })?,
    };
    // Megatron's own linear layers keep an `_extra_state` that holds
    // nothing (`None`; Transformer Engine's keep FP8 metadata there) and
    // its loader asks for it: one object per layer (and expert), saved as
    // `dist_checkpointing` saves a ShardedObject.
    let mut nothing = PickleWriter::new(2);
    nothing.empty_list().mark().none().appends();
    let nothing = object_archive(&nothing.finish());
    let mut others = BTreeMap::new();
    for t in tensors.iter().filter(|t| !t.name.starts_with("optimizer.")) {
        let (name, lead, stacked) = match saved_as.get(&t.name) {
            Some(s) => (s.name.as_str(), s.lead.as_slice(), &s.shape[..s.lead.len()]),
            None => (t.name.as_str(), &[][..], &[][..]),
        };
        let Some(module) = name.strip_suffix(".weight").filter(|m| {
            m.contains("layers.")
                && m.rsplit('.')
                    .next()
                    .is_some_and(|last| last.starts_with("linear_") || last == "eh_proj")
        }) else {
            continue;
        };
        // A ShardedObject's key: its offset and shape on the stacked axes,
        // `0` of `1` for a layer saved on its own.
        let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
        let key = match lead.is_empty() {
            true => format!("{module}._extra_state/shard_0_1"),
            false => format!("{module}._extra_state/shard_{}_{}", join(lead), join(stacked)),
        };
        others.insert(key, nothing.clone());
    }
    let mut common = PickleWriter::new(2);
    common.empty_dict();
    let saved = |name: &str| saved_as.get(name).map_or(name.to_string(), |s| s.name.clone());
    let mirrors = with_moments
        .iter()
        .map(|p| (saved(p), format!("optimizer.state.param.{}", saved(p))))
        .collect();
    Ok(DcpExtras {
        others,
        side_files: BTreeMap::from([
            (METADATA_JSON.to_string(), TORCH_DIST_METADATA.as_bytes().to_vec()),
            (COMMON_FILE.to_string(), object_archive(&common.finish())),
        ]),
        saved_as,
        mirrors,
        main_replica_only: true,
        ..DcpExtras::default()
    })
}

/// How each per-layer tensor of `tensors` is saved when `name_of` names
/// it ([`stacked_name`] or [`per_layer_name`]; norms under their fused
/// names): every stack must be filled, each index once by tensors of one
/// shape and type. A stack filled unevenly is returned as (a member, the
/// stack's name, its stacked sizes, its number of members).
type Uneven = (String, String, Vec<u64>, usize);

fn saved_stacks(
    tensors: &[TensorSpec],
    name_of: fn(&str) -> (String, Vec<u64>),
    imp: TransformerImpl,
    kinds: &BTreeMap<&str, LayerKind>,
) -> std::result::Result<BTreeMap<String, SavedAs>, Uneven> {
    let mut stacks: BTreeMap<String, Vec<(&TensorSpec, Vec<u64>)>> = BTreeMap::new();
    for t in tensors {
        // An Adam moment is saved like its parameter, under the
        // distributed optimizer's prefix.
        let (moment, param) = match tenplan_models::adam_moment(&t.name) {
            Some((m, p)) => (Some(m), p),
            None => (None, t.name.as_str()),
        };
        let (mut saved, lead) = name_of(param);
        // Norms under the names the layer implementation saves them by.
        let kind = split_layer(param)
            .and_then(|(layer, _)| kinds.get(layer).copied())
            .unwrap_or_default();
        if let Some(renamed) = saved_norm_name(&saved, imp, kind) {
            saved = renamed;
        }
        if let Some(m) = moment {
            saved = format!("optimizer.state.{m}.{saved}");
        }
        if lead.is_empty() && saved == t.name {
            continue;
        }
        stacks.entry(saved).or_default().push((t, lead));
    }
    let mut saved_as = BTreeMap::new();
    for (name, members) in stacks {
        let k = members[0].1.len();
        let dims: Vec<u64> = (0..k)
            .map(|a| members.iter().map(|(_, l)| l[a] + 1).max().unwrap_or(0))
            .collect();
        let distinct: BTreeSet<&Vec<u64>> = members.iter().map(|(_, l)| l).collect();
        let full: u64 = dims.iter().product();
        let (first, _) = members[0];
        if members
            .iter()
            .any(|(t, l)| l.len() != k || t.shape != first.shape || t.dtype != first.dtype)
            || distinct.len() as u64 != full
            || members.len() as u64 != full
        {
            return Err((first.name.clone(), name, dims, members.len()));
        }
        for (t, lead) in members {
            saved_as.insert(
                t.name.clone(),
                SavedAs {
                    name: name.clone(),
                    lead,
                    row0: 0,
                    shape: dims.iter().copied().chain(t.shape.iter().copied()).collect(),
                },
            );
        }
    }
    Ok(saved_as)
}

/// The value a `torch.save` archive holds.
pub(crate) fn archive_value(bytes: &[u8]) -> std::result::Result<pickle::Value, String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format!("not a torch.save archive ({e}): truncated or corrupt"))?;
    let name = (0..zip.len())
        .filter_map(|i| {
            zip.by_index_raw(i)
                .ok()
                .and_then(|f| f.name().ok().map(|n| n.to_string()))
        })
        .find(|n| n.ends_with("/data.pkl") || n == "data.pkl")
        .ok_or("the archive has no data.pkl")?;
    let mut f = zip.by_name(&name).map_err(|e| format!("{name}: {e}"))?;
    let mut pkl = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut pkl).map_err(|e| format!("{name}: {e}"))?;
    pickle::load(&pkl).map_err(|e| format!("{name}: {e}"))
}

/// Whether a `torch.save` archive holds nothing: `None`, an empty dict, or
/// lists of those. Megatron's own linear layers save `None` as their
/// `_extra_state` (Transformer Engine's keep FP8 metadata there), which a
/// `torch_dist` checkpoint stores as an archive of a list of them; a bare
/// model's `common.pt` is an empty dict. Two such entries are the same
/// state whatever their archives' bytes.
pub fn holds_nothing(bytes: &[u8]) -> bool {
    fn empty(v: &pickle::Value) -> bool {
        match v {
            pickle::Value::None => true,
            other => {
                other.items().is_some_and(|items| items.iter().all(empty))
                    || other.entries().is_some_and(|e| e.is_empty())
            }
        }
    }
    archive_value(bytes).is_ok_and(|v| empty(&v))
}

/// Whether `saved` rows are a vocabulary of `rows` padded as Megatron-LM
/// pads it: up to a multiple of `make_vocab_size_divisible_by` (128 by
/// default) times the tensor-parallel size (a power of two up to 1024
/// here). Any other difference is another model's vocabulary, not padding.
pub(crate) fn is_vocab_padding(rows: u64, saved: u64) -> bool {
    saved > rows && (0..=10).any(|k| rows.div_ceil(128 << k) * (128 << k) == saved)
}

/// Which of Megatron-Core's layer implementations a `torch_dist`
/// checkpoint is written for (Megatron-LM's `--transformer-impl`): they
/// save some norms under different names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TransformerImpl {
    /// Transformer Engine's layers (Megatron-LM's default): norms fused
    /// into the linear layer after them where TE fuses them (QKV, a dense
    /// MLP's first linear layer, MLA's up projections); a MoE layer's
    /// pre-MLP norm and MLA's input norm on their own.
    #[default]
    TransformerEngine,
    /// Megatron-Core's own layers (`get_gpt_layer_local_spec`): every
    /// input and pre-MLP norm saved under the fused names of a standard
    /// attention layer, MoE layers' included; an MLA layer's norms under
    /// their own names (`q_layernorm`, `kv_layernorm`, `input_layernorm`,
    /// `pre_mlp_layernorm`).
    Local,
}

impl TransformerImpl {
    /// Megatron-LM's name of it (`transformer_engine`, `local`).
    pub fn name(self) -> &'static str {
        match self {
            TransformerImpl::TransformerEngine => "transformer_engine",
            TransformerImpl::Local => "local",
        }
    }
}

impl std::str::FromStr for TransformerImpl {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "transformer_engine" | "te" => Ok(TransformerImpl::TransformerEngine),
            "local" => Ok(TransformerImpl::Local),
            other => Err(format!(
                "unknown transformer implementation `{other}` (transformer_engine or local, as Megatron-LM's --transformer-impl)"
            )),
        }
    }
}

impl std::fmt::Display for TransformerImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a layer holds that decides how its norms are saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LayerKind {
    /// Multi-latent attention (`linear_kv_down_proj`).
    pub(crate) mla: bool,
    /// A MoE MLP (`mlp.router`).
    pub(crate) moe: bool,
}

/// The name `imp` saves a norm of a layer of `kind` under, where it is not
/// tenplan's catalog name; `name` is the layer's tensor as stacked or per
/// layer (`decoder.layers.[3.]input_layernorm.weight`).
pub(crate) fn saved_norm_name(name: &str, imp: TransformerImpl, kind: LayerKind) -> Option<String> {
    let local = imp == TransformerImpl::Local;
    let (layer, rest) = split_layer(name)?;
    let renamed = match rest.split_once('.')? {
        ("input_layernorm", p) if !kind.mla => format!("self_attention.linear_qkv.layer_norm_{p}"),
        ("pre_mlp_layernorm", p) if (local && !kind.mla) || (!local && !kind.moe) => {
            format!("mlp.linear_fc1.layer_norm_{p}")
        }
        ("self_attention", "linear_q_up_proj.layer_norm_weight") if local => "self_attention.q_layernorm.weight".into(),
        ("self_attention", "linear_kv_up_proj.layer_norm_weight") if local => {
            "self_attention.kv_layernorm.weight".into()
        }
        _ => return None,
    };
    Some(format!("{layer}{renamed}"))
}

/// The names any of Megatron-Core's layer implementations may save the
/// layer tensor `name` under besides its own (how a reader finds it):
/// what [`saved_norm_name`] gives under every implementation and kind of
/// layer.
pub(crate) fn norm_aliases(name: &str) -> Vec<String> {
    let kinds = [false, true]
        .into_iter()
        .flat_map(|mla| [false, true].map(|moe| LayerKind { mla, moe }));
    let aliases: BTreeSet<String> = [TransformerImpl::TransformerEngine, TransformerImpl::Local]
        .into_iter()
        .flat_map(|imp| kinds.clone().filter_map(move |kind| saved_norm_name(name, imp, kind)))
        .collect();
    aliases.into_iter().collect()
}

/// The layer implementation whose names a checkpoint's tensors (`names`,
/// as saved) use, where its norms tell (a dense model with standard
/// attention saves the same names under both: `None`).
pub(crate) fn implementation_of<'a>(names: impl Iterator<Item = &'a str>) -> Option<TransformerImpl> {
    let mut layers: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for name in names {
        if let Some((layer, rest)) = split_layer(name) {
            layers.entry(layer).or_default().insert(rest);
        }
    }
    let (te, local) = (Some(TransformerImpl::TransformerEngine), Some(TransformerImpl::Local));
    layers.values().find_map(|has| {
        let mla = has.contains("self_attention.linear_kv_down_proj.weight");
        let moe = has.contains("mlp.router.weight");
        let fused_mlp_norm = has.contains("mlp.linear_fc1.layer_norm_weight");
        let own_mlp_norm = has.contains("pre_mlp_layernorm.weight");
        // TE fuses MLA's up-projection norms and a dense layer's pre-MLP
        // norm, and keeps a MoE layer's on its own; the local spec does the
        // opposite for both kinds of layer.
        let te_names = has.contains("self_attention.linear_q_up_proj.layer_norm_weight")
            || has.contains("self_attention.linear_kv_up_proj.layer_norm_weight")
            || (moe && !mla && own_mlp_norm)
            || (!moe && mla && fused_mlp_norm);
        let local_names = has.contains("self_attention.kv_layernorm.weight")
            || (moe && !mla && fused_mlp_norm)
            || (!moe && mla && own_mlp_norm);
        match (te_names, local_names) {
            (true, _) => te,
            (false, true) => local,
            (false, false) => None,
        }
    })
}

/// A layer tensor's name as (its block's layers and, saved per layer, the
/// layer's index, with the dot after; the rest): `decoder.layers.3.` and
/// `input_layernorm.weight`.
fn split_layer(name: &str) -> Option<(&str, &str)> {
    let at = name.find("layers.")? + "layers.".len();
    let rest = &name[at..];
    let mut skip = match rest.split_once('.') {
        Some((index, _)) if index.parse::<u64>().is_ok() => index.len() + 1,
        _ => 0,
    };
    // An MTP module's layer: `mtp.layers.K.transformer_layer.`.
    if rest[skip..].starts_with("transformer_layer.") {
        skip += "transformer_layer.".len();
    }
    Some(name.split_at(at + skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_and_experts_are_stacked_axes() {
        assert_eq!(
            stacked_name("decoder.layers.3.self_attention.linear_qkv.weight"),
            ("decoder.layers.self_attention.linear_qkv.weight".into(), vec![3])
        );
        assert_eq!(
            stacked_name("decoder.layers.10.mlp.experts.local_experts.5.linear_fc1.weight"),
            (
                "decoder.layers.mlp.experts.experts.linear_fc1.weight".into(),
                vec![10, 5]
            )
        );
        assert_eq!(
            stacked_name("embedding.word_embeddings.weight"),
            ("embedding.word_embeddings.weight".into(), vec![])
        );
        let te = TransformerImpl::TransformerEngine;
        let dense = LayerKind::default();
        let moe = LayerKind { moe: true, mla: false };
        let mla = LayerKind { moe: false, mla: true };
        let saved = |n: &str, imp, kind| saved_norm_name(n, imp, kind);
        assert_eq!(
            saved("decoder.layers.input_layernorm.weight", te, dense).as_deref(),
            Some("decoder.layers.self_attention.linear_qkv.layer_norm_weight")
        );
        assert_eq!(
            saved("decoder.layers.pre_mlp_layernorm.bias", te, dense).as_deref(),
            Some("decoder.layers.mlp.linear_fc1.layer_norm_bias")
        );
        // Transformer Engine keeps a MoE layer's pre-MLP norm on its own;
        // Megatron's local spec saves it under the fused name.
        assert_eq!(saved("decoder.layers.pre_mlp_layernorm.weight", te, moe), None);
        assert_eq!(
            saved("decoder.layers.pre_mlp_layernorm.weight", TransformerImpl::Local, moe).as_deref(),
            Some("decoder.layers.mlp.linear_fc1.layer_norm_weight")
        );
        // MLA: the input norm on its own; the up projections' norms fused
        // (TE) or on their own (local).
        assert_eq!(saved("decoder.layers.3.input_layernorm.weight", te, mla), None);
        assert_eq!(
            saved(
                "decoder.layers.3.self_attention.linear_q_up_proj.layer_norm_weight",
                te,
                mla
            ),
            None
        );
        assert_eq!(
            saved(
                "decoder.layers.3.self_attention.linear_kv_up_proj.layer_norm_weight",
                TransformerImpl::Local,
                mla
            )
            .as_deref(),
            Some("decoder.layers.3.self_attention.kv_layernorm.weight")
        );
        assert_eq!(
            saved("decoder.layers.3.pre_mlp_layernorm.weight", TransformerImpl::Local, mla),
            None
        );
        assert_eq!(saved("decoder.final_layernorm.weight", te, dense), None);
        assert_eq!(
            norm_aliases("decoder.layers.3.input_layernorm.weight"),
            ["decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"]
        );
        assert!(norm_aliases("decoder.x3.input_layernorm.weight").is_empty());
        assert_eq!("local".parse::<TransformerImpl>(), Ok(TransformerImpl::Local));
        // What a checkpoint's names tell of its layers.
        let of = |names: &[&str]| implementation_of(names.iter().copied());
        assert_eq!(
            of(&[
                "decoder.layers.mlp.router.weight",
                "decoder.layers.mlp.linear_fc1.layer_norm_weight"
            ]),
            Some(TransformerImpl::Local)
        );
        assert_eq!(
            of(&[
                "decoder.layers.mlp.router.weight",
                "decoder.layers.pre_mlp_layernorm.weight"
            ]),
            Some(TransformerImpl::TransformerEngine)
        );
        assert_eq!(
            of(&["decoder.layers.3.self_attention.kv_layernorm.weight"]),
            Some(TransformerImpl::Local)
        );
        assert_eq!(of(&["decoder.layers.mlp.linear_fc1.layer_norm_weight"]), None);
        assert!("apex".parse::<TransformerImpl>().is_err());
        // Llama 3's 128,256 tokens padded for tp=8 (to a multiple of 1,024); GPT-2's for tp=1.
        assert!(is_vocab_padding(128_256, 129_024));
        assert!(is_vocab_padding(50_257, 50_304));
        assert!(!is_vocab_padding(50_257, 50_257));
        assert!(!is_vocab_padding(100, 128 + 1));
        assert!(!is_vocab_padding(32_000, 64_000));
        let f = tenplan_ptc::DType::F32;
        let tensors = [
            TensorSpec::new("embedding.word_embeddings.weight", f, [8, 4]),
            TensorSpec::new("decoder.layers.0.input_layernorm.weight", f, [4]),
            TensorSpec::new("decoder.layers.0.self_attention.linear_qkv.weight", f, [8, 4]),
            TensorSpec::new("decoder.layers.1.input_layernorm.weight", f, [4]),
            TensorSpec::new("decoder.layers.1.self_attention.linear_qkv.weight", f, [8, 4]),
        ];
        let e = torch_dist_extras(&tensors, TransformerImpl::TransformerEngine).unwrap();
        let norm = &e.saved_as["decoder.layers.1.input_layernorm.weight"];
        assert_eq!(norm.name, "decoder.layers.self_attention.linear_qkv.layer_norm_weight");
        assert_eq!((norm.lead.clone(), norm.shape.clone()), (vec![1], vec![2, 4]));
        assert!(!e.saved_as.contains_key("embedding.word_embeddings.weight"));
        assert!(e.side_files.contains_key(COMMON_FILE) && e.side_files.contains_key(METADATA_JSON));
        let extra = &e.others["decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2"];
        assert!(holds_nothing(extra));
        assert_eq!(e.others.len(), 2);
        assert_eq!(stacked_name("a.0.b"), ("a.0.b".into(), vec![]));
        assert_eq!(
            per_layer_name("decoder.layers.10.mlp.experts.local_experts.5.linear_fc1.weight"),
            (
                "decoder.layers.10.mlp.experts.experts.linear_fc1.weight".into(),
                vec![5]
            )
        );
    }

    #[test]
    fn a_block_whose_layers_differ_is_saved_layer_by_layer() {
        let f = tenplan_ptc::DType::F32;
        // Layer 0 dense, layer 1 two experts.
        let tensors = [
            TensorSpec::new("decoder.layers.0.input_layernorm.weight", f, [4]),
            TensorSpec::new("decoder.layers.0.mlp.linear_fc1.weight", f, [16, 4]),
            TensorSpec::new("decoder.layers.1.input_layernorm.weight", f, [4]),
            TensorSpec::new(
                "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight",
                f,
                [8, 4],
            ),
            TensorSpec::new(
                "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight",
                f,
                [8, 4],
            ),
        ];
        let e = torch_dist_extras(&tensors, TransformerImpl::TransformerEngine).unwrap();
        let norm = &e.saved_as["decoder.layers.1.input_layernorm.weight"];
        assert_eq!(
            norm.name,
            "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"
        );
        assert_eq!((norm.lead.clone(), norm.shape.clone()), (vec![], vec![4]));
        let expert = &e.saved_as["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"];
        assert_eq!(expert.name, "decoder.layers.1.mlp.experts.experts.linear_fc1.weight");
        assert_eq!((expert.lead.clone(), expert.shape.clone()), (vec![1], vec![2, 8, 4]));
        // Saved under its own name: nothing to rename.
        assert!(!e.saved_as.contains_key("decoder.layers.0.mlp.linear_fc1.weight"));
        let keys: Vec<&str> = e.others.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "decoder.layers.0.mlp.linear_fc1._extra_state/shard_0_1",
                "decoder.layers.1.mlp.experts.experts.linear_fc1._extra_state/shard_0_2",
                "decoder.layers.1.mlp.experts.experts.linear_fc1._extra_state/shard_1_2",
            ]
        );
        // Experts a layer does not have alike: refused.
        let uneven = [
            tensors[3].clone(),
            TensorSpec::new(
                "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight",
                f,
                [6, 4],
            ),
        ];
        assert!(torch_dist_extras(&uneven, TransformerImpl::Local).is_err());
    }
}
