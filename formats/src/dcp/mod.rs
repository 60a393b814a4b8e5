//! PyTorch Distributed Checkpoint (DCP) directories as sources: what
//! `torch.distributed.checkpoint.save` writes with its default
//! `FileSystemWriter` — a pickled `.metadata` and `__<rank>_<n>.distcp` files
//! holding each saved chunk as a `torch.save` archive at a byte range, or,
//! under `SerializationFormat.SAFETENSORS`, each file's chunks as one
//! safetensors blob.
//!
//! [`Dcp::open`] reads the metadata (with [`crate::pickle`], nothing of
//! Python runs), maps the files and finds every chunk's elements inside its
//! archive, checking types, shapes, strides and byte ranges against the
//! files; no tensor data is read. [`Dcp::state`] is the checkpoint as it
//! is: every tensor under its own name (model weights, optimizer moments
//! and steps alike), each chunk a piece on the rank that wrote it, and the
//! entries that are not tensors carried as their bytes ([`write()`] writes a
//! state back in this format). [`Dcp::source`] maps the chunks onto a
//! model's tensors under tenplan's names through the model family's Hugging
//! Face names ([`crate::hf::links`]), as FSDP2 and DTensor jobs on
//! transformers models save them (fused 3-D expert stacks of transformers 5
//! included): each chunk's rows become pieces of a source [`Layout`] whose
//! devices are the ranks that wrote them, so a plan reads only the bytes it
//! needs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Cursor;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use tenplan_models::{adam_moment, ModelSpec};
use tenplan_ptc::{Buffer, DType, DeviceId, Layout, Piece, Region, Shard, TensorId, TensorSpec};

mod megatron;
mod optimizer;
mod torch_save;
mod write;

pub use megatron::{
    drop_common_keys, holds_nothing, is_megatron, per_layer_name, read_info, stacked_name, torch_dist_extras,
    MegatronInfo, TransformerImpl, COMMON_FILE, METADATA_JSON,
};
pub use optimizer::{
    distributed_optimizer_common, optimizer_differences, torch_optimizer_entries, Hyper, MegatronGroup, MegatronParam,
    TorchOptimizer, TorchParamGroup,
};
pub use write::{write, DcpExtras, DcpWritten, Literal, PathPart, SavedAs};

use crate::checkpoint::map;
use crate::hf::links;
use crate::pickle::{self, Value};
use crate::torchtitan;
use crate::Source;
use crate::{Error, Result};
use tenplan_ptc::box_io::BoxRuns;
use tenplan_ptc::SourceBox;

/// The metadata file of a DCP checkpoint.
pub const METADATA_FILE: &str = ".metadata";

/// Whether `dir` looks like a DCP checkpoint (it has a `.metadata`).
pub fn is_dcp(dir: &Path) -> bool {
    dir.join(METADATA_FILE).is_file()
}

/// A Megatron-Core checkpoint's parallel configuration, as far as its
/// chunks tell: tensor-parallel size from the shards of the attention
/// output projection (row-parallel), pipeline-parallel size from the
/// distinct layer ranges the ranks wrote, expert-parallel size from the
/// distinct expert ranges. Data-parallel replicas write nothing of their
/// own, so the checkpoint does not tell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MegatronParallelism {
    /// Tensor-parallel size.
    pub tp: u32,
    /// Pipeline-parallel size.
    pub pp: u32,
    /// Expert-parallel size (1 without experts).
    pub ep: u32,
}

/// One saved chunk of a tensor: its box and where its elements are.
#[derive(Clone, Debug)]
pub struct DcpChunk {
    /// The box of the global tensor.
    pub region: Region,
    /// Index of its file in [`Dcp::files`].
    pub file: usize,
    /// Byte range of its row-major elements in the file.
    pub data: Range<usize>,
}

/// One tensor of a DCP checkpoint.
#[derive(Clone, Debug)]
pub struct DcpTensor {
    /// Its fully qualified name (the state-dict key, flattened).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Global shape.
    pub shape: Vec<u64>,
    /// Its chunks, as saved (disjoint, covering the tensor).
    pub chunks: Vec<DcpChunk>,
}

/// An open DCP checkpoint.
#[derive(Debug)]
pub struct Dcp {
    dir: PathBuf,
    files: Vec<(PathBuf, DeviceId, Mmap)>,
    /// The files beside their maps, for positioned reads of long runs.
    handles: Vec<std::fs::File>,
    tensors: Vec<DcpTensor>,
    others: Vec<String>,
    /// Where each entry that is not a tensor is stored (file, byte range).
    bytes_entries: BTreeMap<String, (PathBuf, Range<u64>)>,
    /// The state dict's nesting, as the planner recorded it.
    planner_data: BTreeMap<String, Vec<PathPart>>,
    /// What a Megatron-Core `torch_dist` checkpoint says of itself; `None`
    /// for a plain DCP checkpoint.
    megatron: Option<MegatronInfo>,
}

fn bad(dir: &Path, what: impl Into<String>) -> Error {
    Error::file(dir.join(METADATA_FILE), what)
}

fn ints(v: &Value) -> Option<Vec<u64>> {
    v.items()?
        .iter()
        .map(|x| x.as_int().and_then(|i| u64::try_from(i).ok()))
        .collect()
}

/// A `torch.Size` (a call of the class on a tuple), or a plain tuple.
fn size(v: &Value) -> Option<Vec<u64>> {
    match v {
        Value::Object(o) if o.class_name().as_deref() == Some("torch.Size") => ints(o.args.first()?),
        other => ints(other),
    }
}

fn torch_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "torch.float32" | "torch.float" => DType::F32,
        "torch.float16" | "torch.half" => DType::F16,
        "torch.bfloat16" => DType::BF16,
        "torch.float64" | "torch.double" => DType::F64,
        "torch.int64" | "torch.long" => DType::I64,
        "torch.int32" | "torch.int" => DType::I32,
        "torch.uint8" => DType::U8,
        _ => return None,
    })
}

fn storage_dtype(class: &str) -> Option<DType> {
    Some(match class.strip_prefix("torch.")? {
        "FloatStorage" => DType::F32,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "DoubleStorage" => DType::F64,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ByteStorage" => DType::U8,
        _ => return None,
    })
}

/// `planner_data` as DCP's default planner records it: each flattened key's
/// path in the nested state dict (`"optim.state.w.step"` came from
/// `sd["optim"]["state"]["w"]["step"]`). Missing or unreadable: empty.
fn planner_paths(v: Option<Value>) -> BTreeMap<String, Vec<PathPart>> {
    let mut out = BTreeMap::new();
    for (k, path) in v.and_then(|v| v.entries()).unwrap_or_default() {
        let (Some(k), Some(items)) = (k.as_str(), path.items()) else {
            continue;
        };
        let parts: Option<Vec<PathPart>> = items
            .iter()
            .map(|p| match p {
                Value::Str(s) => Some(PathPart::Key(s.to_string())),
                Value::Int(i) => Some(PathPart::Index(*i)),
                _ => None,
            })
            .collect();
        if let Some(parts) = parts {
            out.insert(k.to_string(), parts);
        }
    }
    out
}

/// Where one chunk's storage entry says its bytes are.
struct Stored {
    path: String,
    offset: u64,
    length: u64,
}

/// The rank of a `__<rank>_<n>.distcp` file.
fn rank_of(name: &str) -> Option<DeviceId> {
    let rest = name.strip_prefix("__")?.strip_suffix(".distcp")?;
    rest.split_once('_')?.0.parse().ok()
}

impl Dcp {
    /// Open a DCP checkpoint: parse `.metadata`, map every file it names and
    /// locate every chunk's elements, checking them against the files.
    pub fn open(dir: &Path) -> Result<Dcp> {
        let megatron = megatron::read_info(dir)?;
        let meta_path = dir.join(METADATA_FILE);
        let bytes = std::fs::read(&meta_path).map_err(|e| Error::Io {
            op: "read",
            path: meta_path.clone(),
            source: e,
        })?;
        let root = pickle::load(&bytes).map_err(|e| bad(dir, format!("not a readable pickle: {e}")))?;
        let root = root
            .as_object()
            .filter(|o| {
                o.class_name()
                    .is_some_and(|c| c.ends_with("checkpoint.metadata.Metadata"))
            })
            .ok_or_else(|| bad(dir, "does not hold a torch.distributed.checkpoint Metadata"))?;
        let sd = root
            .field("state_dict_metadata")
            .and_then(|v| v.entries())
            .ok_or_else(|| bad(dir, "no state_dict_metadata"))?;
        let storage = root
            .field("storage_data")
            .and_then(|v| v.entries())
            .ok_or_else(|| bad(dir, "no storage_data (not written by FileSystemWriter?)"))?;
        let mut where_: HashMap<(String, Vec<u64>), Stored> = HashMap::new();
        let mut bytes_stored: HashMap<String, Stored> = HashMap::new();
        for (k, v) in storage {
            let key = k
                .as_object()
                .ok_or_else(|| bad(dir, "a storage key is not a MetadataIndex"))?;
            let fqn = key.field("fqn").and_then(|f| f.as_str().map(String::from));
            let offset = key.field("offset").as_ref().and_then(size);
            let info = v
                .as_object()
                .ok_or_else(|| bad(dir, "a storage entry is not a _StorageInfo"))?;
            let Some(fqn) = fqn else {
                return Err(bad(dir, "a storage key has no fqn"));
            };
            let path = info.field("relative_path").and_then(|p| p.as_str().map(String::from));
            let (start, length) = (info.field("offset"), info.field("length"));
            let num = |x: Option<Value>| x.and_then(|x| x.as_int()).and_then(|i| u64::try_from(i).ok());
            let Some(offset) = offset else {
                // An entry that is not a tensor: its pickled bytes, keyed
                // without an offset.
                if let (Some(path), Some(start), Some(length)) = (path, num(start), num(length)) {
                    bytes_stored.insert(
                        fqn,
                        Stored {
                            path,
                            offset: start,
                            length,
                        },
                    );
                }
                continue;
            };
            let (Some(path), Some(start), Some(length)) = (path, num(start), num(length)) else {
                return Err(bad(
                    dir,
                    format!("storage entry of `{fqn}` lacks its file, offset or length"),
                ));
            };
            if let Some(t) = info.field("transform_descriptors") {
                if let Some(t) = t.items().filter(|t| !t.is_empty()) {
                    let names: Vec<&str> = t.iter().filter_map(|x| x.as_str()).collect();
                    return Err(bad(
                        dir,
                        format!("`{fqn}` is stored through transforms {names:?} (compression or an extension), which tenplan does not read"),
                    ));
                }
            }
            where_.insert(
                (fqn, offset),
                Stored {
                    path,
                    offset: start,
                    length,
                },
            );
        }
        let mut files: Vec<(PathBuf, DeviceId, Mmap)> = Vec::new();
        let mut handles = Vec::new();
        let mut file_index: HashMap<String, usize> = HashMap::new();
        // DCP's SAFETENSORS serialization: one safetensors blob per file,
        // at the offset every tensor entry of the file names; parsed once.
        let mut blobs: HashMap<(usize, u64), SafetensorsBlob> = HashMap::new();
        let mut tensors = Vec::new();
        let mut others = Vec::new();
        for (k, v) in sd {
            let name = k
                .as_str()
                .ok_or_else(|| bad(dir, "a state-dict key is not a string"))?
                .to_string();
            let Some(md) = v.as_object() else {
                return Err(bad(dir, format!("`{name}`: metadata is not an object")));
            };
            if !md.class_name().is_some_and(|c| c.ends_with("TensorStorageMetadata")) {
                others.push(name);
                continue;
            }
            let props = md
                .field("properties")
                .ok_or_else(|| bad(dir, format!("`{name}` has no properties")))?;
            let dtype_value = props.as_object().and_then(|p| {
                // TensorProperties pickles its state as a tuple, dtype first;
                // older versions as a dict.
                p.field("dtype").or_else(|| {
                    let state = p.state.borrow();
                    match state.as_ref()? {
                        Value::Tuple(t) => t.first().cloned(),
                        _ => None,
                    }
                })
            });
            let dtype_name = dtype_value
                .and_then(|d| d.global())
                .ok_or_else(|| bad(dir, format!("`{name}` has no element type")))?;
            let Some(dtype) = torch_dtype(&dtype_name) else {
                others.push(name);
                continue;
            };
            let shape = md
                .field("size")
                .as_ref()
                .and_then(size)
                .ok_or_else(|| bad(dir, format!("`{name}` has no size")))?;
            let chunk_list = md
                .field("chunks")
                .and_then(|c| c.items())
                .ok_or_else(|| bad(dir, format!("`{name}` has no chunks")))?;
            let mut chunks = Vec::new();
            for c in chunk_list {
                let c = c
                    .as_object()
                    .ok_or_else(|| bad(dir, format!("`{name}`: a chunk is not an object")))?;
                let (Some(offsets), Some(sizes)) = (
                    c.field("offsets").as_ref().and_then(size),
                    c.field("sizes").as_ref().and_then(size),
                ) else {
                    return Err(bad(dir, format!("`{name}`: a chunk lacks offsets or sizes")));
                };
                let region = (offsets.len() == shape.len() && sizes.len() == shape.len())
                    .then(|| Region::new(offsets.iter().zip(&sizes).map(|(&o, &s)| o..o.saturating_add(s))).ok())
                    .flatten()
                    .filter(|r| r.fits(&shape))
                    .ok_or_else(|| {
                        bad(
                            dir,
                            format!(
                                "`{name}`: chunk at {offsets:?} of size {sizes:?} lies outside its shape {shape:?}"
                            ),
                        )
                    })?;
                if region.is_empty() {
                    continue;
                }
                let stored = where_
                    .get(&(name.clone(), offsets.clone()))
                    .ok_or_else(|| bad(dir, format!("`{name}`: the chunk at {offsets:?} has no storage entry")))?;
                let file = match file_index.get(&stored.path) {
                    Some(&f) => f,
                    None => {
                        let plain = !stored.path.is_empty()
                            && !stored.path.contains(['/', '\\'])
                            && stored.path != ".."
                            && stored.path != ".";
                        let rank = rank_of(&stored.path).filter(|_| plain).ok_or_else(|| {
                            bad(
                                dir,
                                format!(
                                    "`{name}` is stored in `{}`, not a __<rank>_<n>.distcp file of this directory",
                                    stored.path
                                ),
                            )
                        })?;
                        let path = dir.join(&stored.path);
                        let f = std::fs::File::open(&path).map_err(|e| Error::Io {
                            op: "open",
                            path: path.clone(),
                            source: e,
                        })?;
                        let m = map(&f).map_err(|e| Error::Io {
                            op: "map",
                            path: path.clone(),
                            source: e,
                        })?;
                        files.push((path, rank, m));
                        handles.push(f);
                        file_index.insert(stored.path.clone(), files.len() - 1);
                        files.len() - 1
                    }
                };
                let (path, _, bytes) = &files[file];
                let data = if is_archive_at(bytes, stored.offset) {
                    chunk_data(path, bytes, stored, &name, dtype, &region)?
                } else {
                    let blob = match blobs.entry((file, stored.offset)) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(SafetensorsBlob::parse(path, bytes, stored.offset)?)
                        }
                    };
                    blob.chunk(path, &name, dtype, &region)?
                };
                chunks.push(DcpChunk { region, file, data });
            }
            let volume: u64 = shape.iter().product();
            let covered: u64 = chunks.iter().map(|c| c.region.volume()).sum();
            if covered != volume {
                return Err(Error::Coverage {
                    tensor: name,
                    what: format!(
                        "the DCP chunks hold {covered} of its {volume} elements ({}): a chunk is missing or repeated",
                        meta_path.display()
                    ),
                });
            }
            tensors.push(DcpTensor {
                name,
                dtype,
                shape,
                chunks,
            });
        }
        let mut bytes_entries = BTreeMap::new();
        for name in &others {
            if let Some(st) = bytes_stored.get(name) {
                let plain = !st.path.is_empty() && !st.path.contains(['/', '\\']) && st.path != ".." && st.path != ".";
                if !plain {
                    return Err(bad(
                        dir,
                        format!("`{name}` is stored in `{}`, not a file of this directory", st.path),
                    ));
                }
                bytes_entries.insert(name.clone(), (dir.join(&st.path), st.offset..st.offset + st.length));
            }
        }
        let planner_data = planner_paths(root.field("planner_data"));
        Ok(Dcp {
            dir: dir.to_path_buf(),
            files,
            handles,
            tensors,
            others,
            bytes_entries,
            planner_data,
            megatron,
        })
    }

    /// What a Megatron-Core `torch_dist` checkpoint says of itself (`None`
    /// for a plain DCP checkpoint). Its model tensors are found by
    /// Megatron's names, stacked layers included ([`stacked_name`]).
    pub fn megatron(&self) -> Option<&MegatronInfo> {
        self.megatron.as_ref()
    }

    /// The checkpoint's format, for people: `PyTorch DCP` or
    /// `Megatron-Core torch_dist`.
    pub fn format_name(&self) -> &'static str {
        if self.megatron.is_some() {
            "Megatron-Core torch_dist"
        } else {
            "PyTorch DCP"
        }
    }

    /// The bytes of the entry `name`, which is not a tensor.
    pub(crate) fn bytes_entry(&self, name: &str) -> Result<Vec<u8>> {
        let (path, range) = self
            .bytes_entries
            .get(name)
            .ok_or_else(|| Error::file(&self.dir, format!("`{name}` is no entry of bytes")))?;
        read_range(path, range).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::file(
                path,
                format!("`{name}`: bytes {range:?} lie past the end of the file: truncated"),
            ),
            _ => Error::io("read", path)(e),
        })
    }

    /// Whether the entry `name` of a Megatron-Core checkpoint is an
    /// `_extra_state` object that holds nothing (no state of the model's is
    /// in it; see [`megatron::holds_nothing`]).
    fn is_empty_extra_state(&self, name: &str) -> bool {
        if self.megatron.is_none() || !name.contains("._extra_state") {
            return false;
        }
        let Some((path, range)) = self.bytes_entries.get(name) else {
            return false;
        };
        read_range(path, range).is_ok_and(|b| megatron::holds_nothing(&b))
    }

    /// The parallel configuration a Megatron-Core checkpoint's chunks tell
    /// (see [`MegatronParallelism`]); `None` where the checkpoint does not
    /// say (no attention output projection).
    pub fn megatron_parallelism(&self) -> Option<MegatronParallelism> {
        self.megatron.as_ref()?;
        // Each tensor of one kind with its layer: a stacked block's one
        // tensor (the layer a chunk's leading index), or a per-layer
        // block's tensors (the layer in the name).
        let of_layers = |suffix: &str, ndim: usize| -> Vec<(&DcpTensor, Option<u64>)> {
            let stacked = format!("decoder.layers.{suffix}");
            self.tensors
                .iter()
                .filter_map(|t| {
                    if t.name == stacked && t.shape.len() == ndim + 1 {
                        return Some((t, None));
                    }
                    let layer = t
                        .name
                        .strip_prefix("decoder.layers.")?
                        .strip_suffix(suffix)?
                        .strip_suffix('.')?
                        .parse()
                        .ok()?;
                    (t.shape.len() == ndim).then_some((t, Some(layer)))
                })
                .collect()
        };
        let projs = of_layers("self_attention.linear_proj.weight", 2);
        let &(first, first_layer) = projs.first()?;
        let axis = usize::from(first_layer.is_none());
        // Row-parallel: tensor-parallel shards split the input dimension
        // (counted on one layer).
        let tp = first
            .chunks
            .iter()
            .filter(|c| axis == 0 || c.region.range(0).start == 0)
            .map(|c| c.region.range(axis + 1).start)
            .collect::<BTreeSet<_>>()
            .len();
        // The distinct sets of indices (of layers, or experts) the ranks
        // wrote.
        let groups = |tensors: &[(&DcpTensor, Option<u64>)], index_axis: Option<usize>| {
            let mut of_rank: BTreeMap<DeviceId, BTreeSet<u64>> = BTreeMap::new();
            for (t, layer) in tensors {
                for c in &t.chunks {
                    let held = of_rank.entry(self.files[c.file].1).or_default();
                    match (index_axis, layer) {
                        (Some(a), _) => held.extend(c.region.range(a)),
                        (None, Some(l)) => {
                            held.insert(*l);
                        }
                        (None, None) => held.extend(c.region.range(0)),
                    }
                }
            }
            of_rank.into_values().collect::<BTreeSet<_>>().len() as u32
        };
        let experts = of_layers("mlp.experts.experts.linear_fc2.weight", 3);
        let ep = match experts.first() {
            None => 1,
            Some((_, layer)) => groups(&experts, Some(usize::from(layer.is_none()))),
        };
        Some(MegatronParallelism {
            tp: tp as u32,
            pp: groups(&projs, None),
            ep,
        })
    }

    /// The Megatron-Core layer implementation a `torch_dist` checkpoint's
    /// names were saved by (Transformer Engine's or Megatron's local
    /// layers), where its norms tell; `None` for a plain DCP checkpoint
    /// and for a dense model with standard attention, whose names are the
    /// same under both.
    pub fn megatron_impl(&self) -> Option<TransformerImpl> {
        self.megatron.as_ref()?;
        megatron::implementation_of(self.tensors.iter().map(|t| t.name.as_str()))
    }

    /// The checkpoint's state as it is (see [`DcpState`]).
    pub fn state(self: &Arc<Self>) -> Result<DcpState> {
        DcpState::of(self.clone())
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tensors, in the metadata's order.
    pub fn tensors(&self) -> &[DcpTensor] {
        &self.tensors
    }

    /// Entries that are not tensors of a type tenplan reads (bytes, other
    /// element types).
    pub fn others(&self) -> &[String] {
        &self.others
    }

    /// Every entry that is not a tensor: [`Dcp::others`], and a
    /// Megatron-Core checkpoint's `common.pt` entries
    /// ([`MegatronInfo::common_entries`]).
    pub fn other_entries(&self) -> Vec<String> {
        self.others
            .iter()
            .cloned()
            .chain(self.megatron.iter().flat_map(MegatronInfo::common_entries))
            .collect()
    }

    /// The data files, with the rank that wrote each.
    pub fn files(&self) -> impl Iterator<Item = (&Path, DeviceId)> {
        self.files.iter().map(|(p, r, _)| (p.as_path(), *r))
    }

    /// Number of ranks that wrote data (the highest rank plus one).
    pub fn ranks(&self) -> u32 {
        self.files.iter().map(|(_, r, _)| r + 1).max().unwrap_or(0)
    }

    /// A chunk's elements, row-major.
    pub fn chunk_bytes(&self, c: &DcpChunk) -> &[u8] {
        &self.files[c.file].2[c.data.clone()]
    }

    /// The element type of the model's first weight as saved (the type of
    /// the state to build), found under any prefix (entries whose names
    /// contain a pattern of `exclude` are not candidates).
    pub fn dtype_of(&self, model: &ModelSpec, tensors: &[TensorSpec], exclude: &[String]) -> Result<DType> {
        let (prefix, first) = self.model_prefix(model, tensors, exclude)?;
        Ok(self
            .tensors
            .iter()
            .find(|t| t.name == format!("{prefix}{first}"))
            .map(|t| t.dtype)
            .expect("the prefix was found on this tensor"))
    }

    /// How many multi-token-prediction modules the checkpoint holds after
    /// the layers of `model`: Megatron-Core's `mtp.layers.K`, torchtitan's
    /// `mtp_layers.K`, or under Hugging Face names layer `layers + K` with
    /// an `eh_proj`, as DeepSeek-V3's files keep them.
    pub fn mtp_layers(&self, model: &ModelSpec, exclude: &[String]) -> u32 {
        // Megatron-Core's names, or Hugging Face's or torchtitan's.
        let names = |k: u32| match self.megatron {
            Some(_) => vec![format!("mtp.layers.{k}.eh_proj.weight")],
            None => vec![
                crate::hf::mtp_eh_proj(model, k),
                format!("mtp_layers.{k}.eh_proj.weight"),
            ],
        };
        // Under any prefix (`model.` of `{"model": ...}`, say).
        let holds = |name: &str| {
            self.tensors.iter().any(|t| {
                !exclude.iter().any(|p| t.name.contains(p.as_str()))
                    && t.name
                        .strip_suffix(name)
                        .is_some_and(|p| p.is_empty() || p.ends_with('.'))
            })
        };
        crate::hf::mtp_modules_held(model, names, holds)
    }

    /// The prefix under which the state dict holds the model (`""` for
    /// `model.state_dict()`, `"model."` for `{"model": ...}`): the one
    /// before the Hugging Face (or torchtitan) name of the model's first
    /// weight, returned with that name. Several
    /// candidates (`{"ema": ..., "model": ...}`) are refused, naming them,
    /// unless `exclude` leaves one.
    fn model_prefix(&self, model: &ModelSpec, tensors: &[TensorSpec], exclude: &[String]) -> Result<(String, String)> {
        let first = tensors
            .first()
            .map(|t| match self.megatron {
                Some(_) => stacked_name(&t.name).0,
                None => links(model, t).into_iter().next().map(|l| l.hf).unwrap_or_default(),
            })
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::Coverage {
                tensor: "?".into(),
                what: format!("{} has no tensors", model.name),
            })?;
        // The name a checkpoint may save it under: Hugging Face's, or
        // torchtitan's.
        let names: Vec<String> = match self.megatron {
            Some(_) => vec![first.clone()],
            None => std::iter::once(first.clone())
                .chain(torchtitan::titan_names(model, &first))
                .collect(),
        };
        let found: Vec<(&str, &String)> = self
            .tensors
            .iter()
            .filter(|t| !exclude.iter().any(|p| t.name.contains(p.as_str())))
            .filter_map(|t| names.iter().find_map(|n| Some((t.name.strip_suffix(n.as_str())?, n))))
            // Megatron keeps optimizer state under the parameter's name.
            .filter(|(p, _)| self.megatron.is_none() || !p.contains("optimizer"))
            .filter(|(p, _)| p.is_empty() || p.ends_with('.'))
            .collect();
        let candidates: Vec<&str> = found.iter().map(|(p, _)| *p).collect();
        match candidates[..] {
            [] => Err(Error::Coverage {
                tensor: first.clone(),
                what: format!(
                    "not in DCP checkpoint {} under any prefix: is it a checkpoint of {}?",
                    self.dir.display(),
                    model.name
                ),
            }),
            [prefix] => Ok((prefix.to_string(), found[0].1.clone())),
            ref many => Err(Error::Coverage {
                tensor: first.clone(),
                what: format!(
                    "DCP checkpoint {} holds {} under {} prefixes ({}): choose one by leaving the others out (--exclude PREFIX)",
                    self.dir.display(),
                    model.name,
                    many.len(),
                    many.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// The prefix under which the checkpoint keeps the model's Adam moments
    /// (`None` where it keeps none), the model being under `prefix` with
    /// its first weight saved as `first`: Megatron-Core's distributed
    /// optimizer keeps them under `optimizer.state.<moment>.` and the
    /// parameter's name; PyTorch's `get_state_dict` under `optim.state.`,
    /// the parameter's FQN and `.<moment>`. Several candidates are refused
    /// unless `exclude` leaves one.
    pub fn moments_prefix(&self, prefix: &str, first: &str, exclude: &[String]) -> Result<Option<String>> {
        if self.megatron.is_some() {
            let p = format!("{prefix}optimizer.state.");
            let holds = self.tensors.iter().any(|t| t.name == format!("{p}exp_avg.{first}"));
            return Ok(holds.then_some(p));
        }
        let own = format!("{first}.exp_avg");
        let found: Vec<&str> = self
            .tensors
            .iter()
            .filter(|t| !exclude.iter().any(|p| t.name.contains(p.as_str())))
            .filter_map(|t| t.name.strip_suffix(own.as_str()))
            .filter(|p| p.is_empty() || p.ends_with('.'))
            .collect();
        match found[..] {
            [] => Ok(None),
            [p] => Ok(Some(p.to_string())),
            ref many => Err(Error::Coverage {
                tensor: own,
                what: format!(
                    "DCP checkpoint {} holds Adam moments of the model under {} prefixes ({}): choose one by leaving the others out (--exclude PREFIX)",
                    self.dir.display(),
                    many.len(),
                    many.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// The prefix under which the checkpoint keeps Adam moments of `model`
    /// (whose weights are `tensors`), or `None`.
    pub fn adam_moments_of(
        &self,
        model: &ModelSpec,
        tensors: &[TensorSpec],
        exclude: &[String],
    ) -> Result<Option<String>> {
        let (prefix, first) = self.model_prefix(model, tensors, exclude)?;
        self.moments_prefix(&prefix, &first, exclude)
    }

    /// Where the parts of `spec` (a tensor of `model`) are saved.
    ///
    /// A Megatron-Core checkpoint saves each tensor under Megatron's name,
    /// layers (and experts) stacked ([`stacked_name`]); its vocabulary
    /// tensors may carry padding rows past the model's vocabulary, which
    /// the model does not read. A DCP checkpoint of a transformers model
    /// saves the Hugging Face tensors [`links`] names, or a live module's
    /// 3-D expert stacks ([`live_name`]).
    fn locate(
        &self,
        model: &ModelSpec,
        spec: &TensorSpec,
        prefix: &str,
        suffix: &str,
        index: &HashMap<&str, usize>,
    ) -> Result<Vec<Located>> {
        if self.megatron.is_some() {
            // A block's layers stacked, or saved one by one (a block whose
            // layers differ); a norm under its own name or the one a
            // layer implementation saves it by.
            let candidates: Vec<(String, Vec<u64>, String)> = [stacked_name(&spec.name), per_layer_name(&spec.name)]
                .into_iter()
                .flat_map(|(name, lead)| {
                    let aliases = megatron::norm_aliases(&name);
                    std::iter::once(name.clone())
                        .chain(aliases)
                        .map(move |saved| (name.clone(), lead.clone(), format!("{prefix}{saved}")))
                })
                .collect();
            let Some((name, lead, saved, di)) = candidates
                .iter()
                .find_map(|(n, l, saved)| Some((n.clone(), l.clone(), saved.clone(), *index.get(saved.as_str())?)))
            else {
                return Err(Error::Coverage {
                    tensor: spec.name.clone(),
                    what: format!(
                        "not in Megatron-Core checkpoint {} (looked for `{}`): is it a checkpoint of {}?",
                        self.dir.display(),
                        candidates[0].2,
                        model.name
                    ),
                });
            };
            let d = &self.tensors[di];
            let rows = spec.shape[0];
            let mut shape = spec.shape.clone();
            let vocabulary = matches!(
                name.as_str(),
                "embedding.word_embeddings.weight" | "output_layer.weight"
            );
            if vocabulary
                && lead.is_empty()
                && d.shape.len() == shape.len()
                && megatron::is_vocab_padding(rows, d.shape[0])
            {
                shape[0] = d.shape[0];
            }
            let link = crate::hf::Link::rows(saved, shape, 0..rows, 0);
            return Ok(vec![Located {
                link,
                saved: di,
                lead,
                row0: None,
            }]);
        }
        let mut located = Vec::new();
        for link in links(model, spec) {
            let direct = format!("{prefix}{}{suffix}", link.hf);
            if let Some(&di) = index.get(direct.as_str()) {
                located.push(Located {
                    link,
                    saved: di,
                    lead: Vec::new(),
                    row0: None,
                });
            } else if let Some((name, e, row0)) = live_name(prefix, &link.hf, &link.hf_shape)
                .map(|(name, e, row0)| (format!("{name}{suffix}"), e, row0))
                .and_then(|(name, e, row0)| index.contains_key(name.as_str()).then_some((name, e, row0)))
            {
                located.push(Located {
                    link,
                    saved: index[name.as_str()],
                    lead: e.into_iter().collect(),
                    row0: e.map(|_| row0),
                });
            } else if let Some((di, e)) = torchtitan::titan_expert(model, &link.hf)
                .and_then(|(name, e)| Some((*index.get(format!("{prefix}{name}{suffix}").as_str())?, e)))
            {
                // torchtitan's grouped experts: the expert's whole tensor
                // at its index.
                located.push(Located {
                    link,
                    saved: di,
                    lead: vec![e],
                    row0: None,
                });
            } else if let Some(di) = torchtitan::titan_names(model, &link.hf)
                .iter()
                .find_map(|n| index.get(format!("{prefix}{n}{suffix}").as_str()).copied())
            {
                // torchtitan's name; its query and key rows in its rotary
                // order, each read from where torchtitan keeps it.
                match torchtitan::rotary_rows(model, &link.hf) {
                    None => located.push(Located {
                        link,
                        saved: di,
                        lead: Vec::new(),
                        row0: None,
                    }),
                    Some(titan_row) => {
                        for i in 0..link.rows.end - link.rows.start {
                            let row = link.rows.start + i;
                            let at = titan_row(link.at + i);
                            located.push(Located {
                                link: crate::hf::Link::rows(link.hf.clone(), link.hf_shape.clone(), row..row + 1, at),
                                saved: di,
                                lead: Vec::new(),
                                row0: None,
                            });
                        }
                    }
                }
            } else {
                return Err(Error::Coverage {
                    tensor: link.hf.clone(),
                    what: format!("not in DCP checkpoint {} (looked for `{direct}`)", self.dir.display()),
                });
            }
        }
        Ok(located)
    }

    /// Map the chunks onto `tensors` of `model` (a weights state: names,
    /// shapes and element type must match what was saved): the source
    /// layout, one device per rank, and the stored box of every piece.
    /// The model is found under the one prefix `exclude` leaves.
    pub fn source(
        self: &Arc<Self>,
        model: &ModelSpec,
        tensors: &Arc<[TensorSpec]>,
        exclude: &[String],
    ) -> Result<DcpSource> {
        let index: HashMap<&str, usize> = self
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let (prefix, first) = self.model_prefix(model, tensors, exclude)?;
        // Adam moments (a `WeightsAndAdam` state) are found where the
        // optimizer keeps them, under their parameter's saved name.
        let moments = match tensors.iter().any(|t| adam_moment(&t.name).is_some()) {
            true => Some(
                self.moments_prefix(&prefix, &first, exclude)?
                    .ok_or_else(|| Error::Coverage {
                        tensor: first.clone(),
                        what: format!(
                            "has no Adam moments (`exp_avg`) in DCP checkpoint {}",
                            self.dir.display()
                        ),
                    })?,
            ),
            false => None,
        };
        let mut used = BTreeSet::new();
        let mut reads: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); tensors.len()];
        // Per rank: (chunk, pieces) with the chunk's DCP tensor and index.
        // Per rank: (saved tensor, chunk, part) -> pieces; part 0 is the
        // chunk as saved, part 1 + k a transposed copy of its columns from
        // k on (GPT-2's Conv1D).
        type ChunkPart = (usize, usize, u64);
        let mut per_rank: BTreeMap<DeviceId, BTreeMap<ChunkPart, Vec<Piece>>> = BTreeMap::new();
        let mut stored: Vec<Vec<(Region, Origin, Range<usize>)>> = vec![Vec::new(); tensors.len()];
        let mut converted: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut converted_index: HashMap<usize, usize> = HashMap::new();
        // The stacked indices each saved stack gives the model.
        let mut stacked_used: BTreeMap<usize, BTreeSet<Vec<u64>>> = BTreeMap::new();
        // The saved word embedding, which a tied output layer must equal.
        let mut embedding = None;
        for (t, spec) in tensors.iter().enumerate() {
            // A moment is located as its parameter is, under the
            // optimizer's prefix (Megatron) or with its own suffix.
            let (param, at, suffix) = match (adam_moment(&spec.name), &moments) {
                (Some((m, param)), Some(p)) => {
                    let param = TensorSpec::new(param, spec.dtype, spec.shape.clone());
                    match self.megatron {
                        Some(_) => (param, format!("{p}{m}."), String::new()),
                        None => (param, p.clone(), format!(".{m}")),
                    }
                }
                _ => (spec.clone(), prefix.clone(), String::new()),
            };
            for Located {
                link,
                saved: di,
                lead,
                row0,
            } in self.locate(model, &param, &at, &suffix, &index)?
            {
                let d = &self.tensors[di];
                used.insert(di);
                reads[t].insert(di);
                if spec.name == "embedding.word_embeddings.weight" {
                    embedding = Some(di);
                }
                if !lead.is_empty() {
                    stacked_used.entry(di).or_default().insert(lead.clone());
                }
                // The saved tensor's shape, as the link sees it: its leading
                // (stacked) axes, then the link's shape, whole or (`row0`:
                // a stack of several along rows) from a row on.
                let k = lead.len();
                let shape_ok = d.shape.len() == k + link.hf_shape.len()
                    && lead.iter().zip(&d.shape).all(|(i, n)| i < n)
                    && match row0 {
                        None => d.shape[k..] == link.hf_shape[..],
                        Some(r) => d.shape[k + 1..] == link.hf_shape[1..] && r + link.hf_shape[0] <= d.shape[k],
                    };
                if !shape_ok {
                    return Err(Error::Coverage {
                        tensor: d.name.clone(),
                        what: format!(
                            "shape {:?} in DCP checkpoint {}, but {} needs {:?} there",
                            d.shape,
                            self.dir.display(),
                            model.name,
                            link.hf_shape
                        ),
                    });
                }
                if link.transposed {
                    // GPT-2's Conv1D saves [in, out]: each chunk's columns
                    // the link reads, transposed into memory, are a box of
                    // the model's tensor.
                    for (ci, region, bytes) in self.transposed_parts(d, spec, &link)? {
                        let len = bytes.len();
                        converted.push(vec![bytes]);
                        per_rank
                            .entry(self.files[d.chunks[ci].file].1)
                            .or_default()
                            .entry((di, ci, 1 + link.at))
                            .or_default()
                            .push(Piece {
                                tensor: t as TensorId,
                                region: region.clone(),
                                offset: 0,
                            });
                        stored[t].push((region, Origin::Converted(converted.len() - 1, 0), 0..len));
                    }
                    continue;
                }
                // A tensor saved in another type (transformers keeps some
                // buffers in f32) is converted once into memory, exactly.
                let converted_at = if d.dtype != spec.dtype {
                    match converted_index.get(&di) {
                        Some(&i) => Some(i),
                        None => {
                            let bufs = d
                                .chunks
                                .iter()
                                .map(|c| convert(self.chunk_bytes(c), d.dtype, spec.dtype))
                                .collect::<Option<Vec<_>>>()
                                .ok_or_else(|| self.inexact(d, spec.dtype))?;
                            converted.push(bufs);
                            converted_index.insert(di, converted.len() - 1);
                            Some(converted.len() - 1)
                        }
                    }
                } else {
                    None
                };
                let elem = spec.dtype.size();
                // Rows of the saved tensor (in its row dimension) this link reads.
                let rdim = k;
                let n = link.rows.end - link.rows.start;
                let row0 = row0.unwrap_or(0);
                let hf_rows = row0 + link.at..row0 + link.at + n;
                for (ci, c) in d.chunks.iter().enumerate() {
                    if !lead.iter().enumerate().all(|(a, i)| c.region.range(a).contains(i)) {
                        continue;
                    }
                    let cr = c.region.range(rdim);
                    let (a, b) = (cr.start.max(hf_rows.start), cr.end.min(hf_rows.end));
                    if a >= b {
                        continue;
                    }
                    // Elements per row of the chunk, and where row `a` starts.
                    let row_elems: u64 = c.region.shape()[rdim + 1..].iter().product();
                    // Where the stacked index's block starts in the chunk.
                    let chunk_shape = c.region.shape();
                    let lead_off: u64 = lead
                        .iter()
                        .enumerate()
                        .map(|(a, &i)| (i - c.region.range(a).start) * chunk_shape[a + 1..].iter().product::<u64>())
                        .sum();
                    let start = lead_off + (a - cr.start) * row_elems;
                    let rows = link.rows.start + (a - hf_rows.start)..link.rows.start + (b - hf_rows.start);
                    let region = Region::new(
                        std::iter::once(rows).chain((rdim + 1..c.region.ndim()).map(|k| c.region.range(k))),
                    )
                    .map_err(|e| Error::Coverage {
                        tensor: d.name.clone(),
                        what: format!("{e} ({})", self.dir.display()),
                    })?;
                    let len = region.volume() * elem;
                    let (origin, base) = match converted_at {
                        Some(i) => (Origin::Converted(i, ci), 0),
                        None => (Origin::File(c.file), c.data.start),
                    };
                    let bytes = base + (start * elem) as usize..base + (start * elem + len) as usize;
                    let rank = self.files[c.file].1;
                    per_rank
                        .entry(rank)
                        .or_default()
                        .entry((di, ci, 0))
                        .or_default()
                        .push(Piece {
                            tensor: t as TensorId,
                            region: region.clone(),
                            offset: start,
                        });
                    stored[t].push((region, origin, bytes));
                }
            }
        }
        // A Megatron stack holds every layer (and expert) of the model: one
        // the model reads only part of is another model's.
        if self.megatron.is_some() {
            for (&di, leads) in &stacked_used {
                let d = &self.tensors[di];
                let k = leads.first().map_or(0, Vec::len);
                let stacked: u64 = d.shape[..k].iter().product();
                if leads.len() as u64 != stacked {
                    return Err(Error::Coverage {
                        tensor: d.name.clone(),
                        what: format!(
                            "stacks {} in Megatron-Core checkpoint {}, {} reads {} of them: is it a checkpoint of this model?",
                            match d.shape[..k] {
                                [l, e] => format!("{l} layers x {e} experts"),
                                _ => format!("{stacked} layers"),
                            },
                            self.dir.display(),
                            model.name,
                            leads.len()
                        ),
                    });
                }
            }
        }
        let shards = per_rank
            .into_iter()
            .map(|(rank, chunks)| Shard {
                name: format!("rank{rank}"),
                devices: vec![rank],
                buffers: chunks
                    .into_iter()
                    .map(|((di, ci, part), pieces)| {
                        let d = &self.tensors[di];
                        let c = &d.chunks[ci];
                        let (name, len) = match part {
                            0 => (format!("{}@{:?}", d.name, c.region.lo()), c.region.volume()),
                            k => (
                                format!("{}@{:?}^T{}", d.name, c.region.lo(), k - 1),
                                pieces.iter().map(|p| p.offset + p.region.volume()).max().unwrap_or(0),
                            ),
                        };
                        Buffer {
                            name,
                            dtype: tensors[pieces[0].tensor as usize].dtype,
                            len,
                            pieces,
                            partial: false,
                        }
                    })
                    .collect(),
            })
            .collect();
        let layout = Layout::new(tensors.clone(), shards).map_err(|e| Error::Coverage {
            tensor: "?".into(),
            what: format!(
                "DCP checkpoint {} does not give a valid layout: {e}",
                self.dir.display()
            ),
        })?;
        // A tied output layer is the word embedding the model reads: saved
        // twice, it is not left behind — if its values are the embedding's.
        // One that differs is a checkpoint of an untied model, whose output
        // layer a tied model would lose.
        let tied = model.tied.then(|| format!("{prefix}lm_head.weight"));
        if let (Some(name), Some(e)) = (&tied, embedding) {
            let saved = self.tensors.iter().position(|t| &t.name == name);
            let excluded = exclude.iter().any(|p| name.contains(p.as_str()));
            if let Some(l) = saved.filter(|_| !excluded) {
                if !self.same_values(l, e) {
                    return Err(Error::Coverage {
                        tensor: name.clone(),
                        what: format!(
                            "differs from `{}` in DCP checkpoint {}, but {} ties its output layer to the word embedding \
                             (tie_word_embeddings): is it a checkpoint of this model? (--exclude {name} leaves it out)",
                            self.tensors[e].name,
                            self.dir.display(),
                            model.name
                        ),
                    });
                }
            }
        }
        let mut unused: Vec<String> = self
            .tensors
            .iter()
            .enumerate()
            .filter(|(i, t)| !used.contains(i) && tied.as_deref() != Some(t.name.as_str()))
            .map(|(_, t)| t.name.clone())
            .chain(self.others.iter().filter(|n| !self.is_empty_extra_state(n)).cloned())
            .chain(self.megatron.iter().flat_map(MegatronInfo::common_entries))
            .collect();
        unused.sort();
        let reads = reads
            .into_iter()
            .map(|r| r.into_iter().map(|di| self.tensors[di].name.clone()).collect())
            .collect();
        Ok(DcpSource {
            dcp: self.clone(),
            layout,
            stored,
            converted,
            unused,
            reads,
        })
    }
}

impl Dcp {
    /// The parts of a transposed link (GPT-2's Conv1D saves `[in, out]`,
    /// the model's rows are its columns): for each chunk of `d` holding
    /// some of the columns the link reads, the chunk's index, the box of
    /// the model's tensor they are, and its bytes, row-major (transposed,
    /// and converted to `spec`'s element type).
    fn transposed_parts(
        &self,
        d: &DcpTensor,
        spec: &TensorSpec,
        link: &crate::hf::Link,
    ) -> Result<Vec<(usize, Region, Vec<u8>)>> {
        let elem = d.dtype.size() as usize;
        let n = link.rows.end - link.rows.start;
        let mut parts = Vec::new();
        for (ci, c) in d.chunks.iter().enumerate() {
            let (rows, cols) = (c.region.range(0), c.region.range(1));
            let (a, b) = (cols.start.max(link.at), cols.end.min(link.at + n));
            if a >= b || rows.is_empty() {
                continue;
            }
            let (height, width) = ((rows.end - rows.start) as usize, (cols.end - cols.start) as usize);
            let mut flipped = vec![0u8; height * (b - a) as usize * elem];
            let src = &self.chunk_bytes(c)[(a - cols.start) as usize * elem..];
            crate::hf::transpose(src, width, &mut flipped, height, height, (b - a) as usize, elem);
            let bytes = match d.dtype == spec.dtype {
                true => flipped,
                false => convert(&flipped, d.dtype, spec.dtype).ok_or_else(|| self.inexact(d, spec.dtype))?,
            };
            let first = link.rows.start + (a - link.at);
            let region = Region::new([first..first + (b - a), rows]).map_err(|e| Error::Coverage {
                tensor: d.name.clone(),
                what: format!("{e} ({})", self.dir.display()),
            })?;
            parts.push((ci, region, bytes));
        }
        Ok(parts)
    }

    /// A saved tensor whose values do not all convert exactly into the
    /// state's element type `to`.
    fn inexact(&self, d: &DcpTensor, to: DType) -> Error {
        Error::Coverage {
            tensor: d.name.clone(),
            what: format!(
                "saved as {} in DCP checkpoint {}, the state is {to}, and not every value converts exactly",
                d.dtype,
                self.dir.display(),
            ),
        }
    }

    /// Check that `model` is the model whose state the checkpoint holds,
    /// under whatever else it holds (a state kept as it is, whose
    /// placement the model only guides): under every prefix where the
    /// model's word embedding is found (in Hugging Face's, the live
    /// module's or torchtitan's names), every tensor of the model is there
    /// with the model's shape, and every tensor there under a model's root
    /// (`model.`, `lm_head`, `layers.`, ...) is one of the model's. Names
    /// the first tensor that differs: another size, another family, more
    /// or fewer layers.
    pub fn check_model(&self, model: &ModelSpec) -> Result<()> {
        let model = &model.with_mtp_layers(self.mtp_layers(model, &[]));
        let weights = tenplan_models::ModelState::new(model, tenplan_models::StateKind::Weights(DType::F32));
        let (plans, extras) = crate::hf_export::plan_dcp_tensors(model, weights.tensors())?;
        // Each tensor's names as a checkpoint may save it, with their shapes.
        let names: Vec<Vec<(String, Vec<u64>)>> = plans
            .iter()
            .map(|h| {
                let mut v = vec![(h.name.clone(), h.shape.clone())];
                if let Some(s) = extras.saved_as.get(&h.name) {
                    v.push((s.name.clone(), s.shape.clone()));
                }
                v.extend(
                    torchtitan::titan_names(model, &h.name)
                        .into_iter()
                        .map(|n| (n, h.shape.clone())),
                );
                if let Some((stack, _)) = torchtitan::titan_expert(model, &h.name) {
                    let shape = std::iter::once(u64::from(model.experts)).chain(h.shape.iter().copied());
                    v.push((stack, shape.collect()));
                }
                v
            })
            .collect();
        // torchtitan's MoE routing biases are its model's too (a mesh
        // target carries them; a model target names them).
        let buffers = torchtitan::titan_buffers(model);
        let known: HashMap<&str, &[u64]> = names
            .iter()
            .flatten()
            .chain(&buffers)
            .map(|(n, shape)| (n.as_str(), shape.as_slice()))
            .collect();
        let saved: HashMap<&str, &DcpTensor> = self.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let embedding = plans
            .iter()
            .position(|h| h.name.ends_with("embed_tokens.weight") || h.name.ends_with("wte.weight"))
            .unwrap_or(0);
        let mut prefixes: Vec<&str> = self
            .tensors
            .iter()
            .filter_map(|t| {
                names[embedding]
                    .iter()
                    .find_map(|(n, _)| t.name.strip_suffix(n.as_str()))
            })
            .filter(|p| (p.is_empty() || p.ends_with('.')) && !p.contains("optim"))
            .collect();
        prefixes.sort();
        prefixes.dedup();
        let mismatch = |tensor: &str, what: String| Error::Coverage {
            tensor: tensor.to_string(),
            what: format!(
                "{what} in DCP checkpoint {}: is it a checkpoint of {}?",
                self.dir.display(),
                model.name
            ),
        };
        if prefixes.is_empty() {
            return Err(mismatch(&plans[embedding].name, "not found under any prefix".into()));
        }
        for p in &prefixes {
            for (h, alternatives) in plans.iter().zip(&names) {
                let found = alternatives
                    .iter()
                    .find_map(|(n, shape)| Some((saved.get(format!("{p}{n}").as_str())?, shape)));
                match found {
                    None => {
                        return Err(mismatch(
                            &format!("{p}{}", h.name),
                            format!("{} has it, but it is not", model.name),
                        ))
                    }
                    Some((t, shape)) if &t.shape != shape => {
                        return Err(mismatch(
                            &t.name,
                            format!("shape {:?}, where {} has {:?},", t.shape, model.name, shape),
                        ))
                    }
                    Some(_) => {}
                }
            }
            // What lies under the prefix in a model's name space: the
            // model's, or another model's (a layer, a bias, a block more).
            const ROOTS: [&str; 8] = [
                "model.",
                "lm_head.",
                "transformer.",
                "layers.",
                "mtp_layers.",
                "tok_embeddings.",
                "norm.",
                "output.",
            ];
            let longer: Vec<&str> = prefixes
                .iter()
                .copied()
                .filter(|q| q.len() > p.len() && q.starts_with(p))
                .collect();
            for t in &self.tensors {
                let Some(rest) = t.name.strip_prefix(p) else { continue };
                if longer.iter().any(|q| t.name.starts_with(q)) || t.name.contains("optim") {
                    continue;
                }
                if ROOTS.iter().any(|r| rest.starts_with(r)) && !known.contains_key(rest) {
                    return Err(mismatch(&t.name, format!("not a tensor of {}, but saved", model.name)));
                }
            }
        }
        Ok(())
    }

    /// Whether two saved tensors hold the same values: the same element
    /// type and shape, and equal bytes wherever their chunks meet (the
    /// chunks of each tile its tensor).
    fn same_values(&self, a: usize, b: usize) -> bool {
        let (ta, tb) = (&self.tensors[a], &self.tensors[b]);
        if ta.dtype != tb.dtype || ta.shape != tb.shape {
            return false;
        }
        let elem = ta.dtype.size() as usize;
        let piece = |region: &Region| Piece {
            tensor: 0,
            region: region.clone(),
            offset: 0,
        };
        ta.chunks.iter().all(|ca| {
            tb.chunks.iter().all(|cb| {
                let Some(common) = ca.region.intersect(&cb.region) else {
                    return true;
                };
                let runs = BoxRuns::new(&piece(&ca.region), &piece(&cb.region), &common);
                let n = runs.run_elems() as usize * elem;
                let (da, db) = (self.chunk_bytes(ca), self.chunk_bytes(cb));
                let mut same = true;
                runs.for_each_start(runs.k, |f, t| {
                    let (f, t) = (f as usize * elem, t as usize * elem);
                    same &= da[f..f + n] == db[t..t + n];
                });
                same
            })
        })
    }
}

/// Where one part of a model's tensor is saved (see `Dcp::locate`).
struct Located {
    /// The rows of the model's tensor it gives, and the saved tensor's
    /// shape past its stacked axes as the part sees it.
    link: crate::hf::Link,
    /// The saved tensor (its index in [`Dcp::tensors`]).
    saved: usize,
    /// Its indices on the saved tensor's leading (stacked) axes.
    lead: Vec<u64>,
    /// For a stack of several along rows, the row the part starts at;
    /// `None`: the saved tensor past its leading axes is the link's shape.
    row0: Option<u64>,
}

/// The name a live transformers 5 module gives a tensor its files name
/// otherwise: a MoE layer keeps its experts as 3-D stacks
/// (`mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj`
/// [E, H, F]) and Mixtral's router as `mlp.gate`. Returns the saved name, the
/// expert (the stack's first index) and the first row.
pub(crate) fn live_name(prefix: &str, hf: &str, hf_shape: &[u64]) -> Option<(String, Option<u64>, u64)> {
    if let Some(layer) = hf.strip_suffix(".block_sparse_moe.gate.weight") {
        return Some((format!("{prefix}{layer}.mlp.gate.weight"), None, 0));
    }
    let (layer, rest) = hf
        .split_once(".mlp.experts.")
        .or_else(|| hf.split_once(".block_sparse_moe.experts."))?;
    let (e, w) = rest.split_once('.')?;
    let e: u64 = e.parse().ok()?;
    let f = *hf_shape.first()?;
    let (stack, row0) = match w {
        "gate_proj.weight" | "w1.weight" => ("gate_up_proj", 0),
        "up_proj.weight" | "w3.weight" => ("gate_up_proj", f),
        "down_proj.weight" | "w2.weight" => ("down_proj", 0),
        _ => return None,
    };
    Some((format!("{prefix}{layer}.mlp.experts.{stack}"), Some(e), row0))
}

/// The bytes of a file at `range` (an entry that is not a tensor: small,
/// in a file that may be large), read without reading the rest.
fn read_range(path: &Path, range: &Range<u64>) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek};
    let mut f = std::fs::File::open(path)?;
    f.seek(std::io::SeekFrom::Start(range.start))?;
    let mut b = vec![0; (range.end - range.start) as usize];
    f.read_exact(&mut b)?;
    Ok(b)
}

/// Whether the bytes at `offset` open a zip archive (`torch.save`'s
/// default format) rather than a safetensors header.
fn is_archive_at(file: &[u8], offset: u64) -> bool {
    usize::try_from(offset)
        .ok()
        .and_then(|o| file.get(o..o.checked_add(4)?))
        .is_some_and(|magic| magic == b"PK\x03\x04")
}

/// The tensors of a file DCP wrote with `SerializationFormat.SAFETENSORS`:
/// its `FileSystemWriter` writes the entries that are not tensors first and
/// then one safetensors blob holding the rank's chunks, keyed by their
/// flattened names, with each chunk's offsets in the blob's
/// `DCP_SHARDING_INFO`; every tensor's storage entry names the blob's start.
struct SafetensorsBlob {
    entries: HashMap<String, (DType, Vec<u64>, Range<usize>)>,
    saved_offsets: HashMap<String, Vec<u64>>,
}

impl SafetensorsBlob {
    fn parse(path: &Path, file: &[u8], offset: u64) -> Result<SafetensorsBlob> {
        let at = usize::try_from(offset)
            .ok()
            .filter(|&o| o < file.len())
            .ok_or_else(|| {
                Error::file(
                    path,
                    format!(
                        "a chunk is stored at byte {offset}, past the end of the file ({} bytes): truncated",
                        file.len()
                    ),
                )
            })?;
        let (list, extra) = crate::checkpoint::parse_safetensors(path, &file[at..]).map_err(|e| {
            let why = match e {
                Error::File { what, .. } => what,
                e => e.to_string(),
            };
            Error::file(
                path,
                format!("at byte {offset}: neither a torch.save archive nor DCP's safetensors serialization ({why})"),
            )
        })?;
        let saved_offsets = match extra.get(crate::checkpoint::DCP_SHARDING_INFO) {
            Some(info) => serde_json::from_str::<BTreeMap<String, crate::checkpoint::SavedOffsets>>(info)
                .map_err(|e| Error::file(path, format!("DCP_SHARDING_INFO is not valid: {e}")))?
                .into_iter()
                .map(|(k, v)| (k, v.saved_offsets))
                .collect(),
            None => {
                return Err(Error::file(
                    path,
                    "a safetensors blob without DCP_SHARDING_INFO in __metadata__",
                ))
            }
        };
        let entries = list
            .into_iter()
            .map(|(key, dtype, shape, range)| (key, (dtype, shape, at + range.start..at + range.end)))
            .collect();
        Ok(SafetensorsBlob { entries, saved_offsets })
    }

    /// The bytes of the chunk of `name` at `region`, checked against the
    /// metadata: element type, shape and offsets.
    fn chunk(&self, path: &Path, name: &str, dtype: DType, region: &Region) -> Result<Range<usize>> {
        let err = |what: String| Error::file(path, format!("`{name}` at {:?}: {what}", region.lo()));
        let (dt, shape, range) = self
            .entries
            .get(name)
            .ok_or_else(|| err("the file's safetensors blob has no entry of this name".into()))?;
        if *dt != dtype {
            return Err(err(format!("stored as {dt}, the metadata says {dtype}")));
        }
        if shape.as_slice() != region.shape().as_slice() {
            return Err(err(format!(
                "the stored chunk has shape {shape:?}, the metadata says {:?}",
                region.shape()
            )));
        }
        match self.saved_offsets.get(name) {
            Some(lo) if lo.as_slice() == region.lo().as_slice() => Ok(range.clone()),
            Some(lo) => Err(err(format!("the stored chunk is at offsets {lo:?}"))),
            None => Err(err("the chunk has no saved_offsets in DCP_SHARDING_INFO".into())),
        }
    }
}

/// Locate a chunk's elements inside its `torch.save` archive, checking the
/// archive's tensor against the metadata.
fn chunk_data(path: &Path, file: &[u8], s: &Stored, name: &str, dtype: DType, region: &Region) -> Result<Range<usize>> {
    let err = |what: String| Error::file(path, format!("`{name}` at {:?}: {what}", region.lo()));
    let end = s
        .offset
        .checked_add(s.length)
        .filter(|&e| e <= file.len() as u64)
        .ok_or_else(|| {
            err(format!(
                "bytes {}..{} lie past the end of the file ({} bytes): truncated",
                s.offset,
                s.offset.saturating_add(s.length),
                file.len()
            ))
        })?;
    let (lo, hi) = (s.offset as usize, end as usize);
    let slice = &file[lo..hi];
    let mut zip = zip::ZipArchive::new(Cursor::new(slice)).map_err(|e| {
        err(format!(
            "not a torch.save archive ({e}); only the default torch.save serialization is read"
        ))
    })?;
    let mut pkl_name = None;
    for i in 0..zip.len() {
        let f = zip
            .by_index_raw(i)
            .map_err(|e| err(format!("archive entry {i}: {e}")))?;
        let n = f.name().map_err(|e| err(format!("archive entry {i}: {e}")))?;
        if n.ends_with("/data.pkl") || n == "data.pkl" {
            pkl_name = Some(n.to_string());
        }
        if n.ends_with("/byteorder") {
            let at = f
                .data_start()
                .ok_or_else(|| err("byteorder entry without data".into()))? as usize;
            let b = slice.get(at..at + f.size() as usize).unwrap_or(b"");
            if b != b"little" {
                return Err(err(format!(
                    "byte order {:?} (only little-endian is read)",
                    String::from_utf8_lossy(b)
                )));
            }
        }
    }
    let pkl_name = pkl_name.ok_or_else(|| err("the archive has no data.pkl".into()))?;
    let root = pkl_name.strip_suffix("data.pkl").unwrap_or("").to_string();
    let pkl = {
        let i = zip
            .index_for_name(&pkl_name)
            .ok_or_else(|| err(format!("{pkl_name}: missing")))?;
        let f = zip.by_index_raw(i).map_err(|e| err(format!("{pkl_name}: {e}")))?;
        stored_range(&f, slice.len()).map_err(&err)?
    };
    let v = pickle::load(&slice[pkl.clone()]).map_err(|e| err(format!("{pkl_name}: {e}")))?;
    let rebuild = v
        .as_object()
        .filter(|o| o.class_name().is_some_and(|c| c.ends_with("_rebuild_tensor_v2")))
        .ok_or_else(|| err("data.pkl does not hold one tensor".into()))?;
    let a = &rebuild.args;
    let storage = match a.first() {
        Some(Value::Persistent(p)) => p.items(),
        _ => None,
    }
    .filter(|s| s.len() >= 5)
    .ok_or_else(|| err("data.pkl's tensor has no storage".into()))?;
    let class = storage[1].global().unwrap_or_default();
    if storage_dtype(&class) != Some(dtype) {
        return Err(err(format!("stored as {class}, the metadata says {dtype}")));
    }
    let key = storage[2]
        .as_str()
        .ok_or_else(|| err("storage key is not a string".into()))?;
    let numel = storage[4].as_int().and_then(|n| u64::try_from(n).ok());
    let (offset, shape, stride) = (
        a.get(1).and_then(|x| x.as_int()).and_then(|n| u64::try_from(n).ok()),
        a.get(2).and_then(ints),
        a.get(3).and_then(ints),
    );
    let (Some(numel), Some(offset), Some(shape), Some(stride)) = (numel, offset, shape, stride) else {
        return Err(err("data.pkl's tensor lacks its offset, size or stride".into()));
    };
    if shape != region.shape() {
        return Err(err(format!(
            "the archive's tensor has shape {shape:?}, the metadata says {:?}",
            region.shape()
        )));
    }
    let mut want = 1u64;
    for (d, (&n, &s)) in shape.iter().zip(&stride).enumerate().rev() {
        if n > 1 && s != want {
            return Err(err(format!(
                "dimension {d} has stride {s}, not row-major ({want}); only contiguous chunks are read"
            )));
        }
        want *= n;
    }
    let elem = dtype.size();
    let volume = region.volume();
    if offset + volume > numel {
        return Err(err(format!(
            "elements {offset}..{} lie past its storage of {numel}",
            offset + volume
        )));
    }
    let data_name = format!("{root}data/{key}");
    let i = zip
        .index_for_name(&data_name)
        .ok_or_else(|| err(format!("the archive has no {data_name}")))?;
    let f = zip.by_index_raw(i).map_err(|e| err(format!("{data_name}: {e}")))?;
    let data = stored_range(&f, slice.len()).map_err(&err)?;
    if (data.end - data.start) as u64 != numel * elem {
        return Err(err(format!(
            "{data_name} holds {} bytes, its storage needs {}",
            data.end - data.start,
            numel * elem
        )));
    }
    let start = lo + data.start + (offset * elem) as usize;
    Ok(start..start + (volume * elem) as usize)
}

/// The byte range of an uncompressed archive entry within the archive.
fn stored_range<R: std::io::Read>(
    f: &zip::read::ZipFile<'_, R>,
    len: usize,
) -> std::result::Result<Range<usize>, String> {
    if f.compression() != zip::CompressionMethod::Stored {
        return Err(format!("entry {:?} is compressed ({:?})", f.name(), f.compression()));
    }
    let at = f.data_start().ok_or("entry without data")? as usize;
    let end = at
        .checked_add(f.size() as usize)
        .filter(|&e| e <= len)
        .ok_or("entry runs past the archive: truncated")?;
    Ok(at..end)
}

/// Read every chunk of every tensor once (in parallel, by chunk), so that
/// an unreadable byte is found now; returns the bytes read.
pub fn read_all(d: &Dcp) -> u64 {
    use rayon::prelude::*;
    let chunks: Vec<&DcpChunk> = d.tensors.iter().flat_map(|t| &t.chunks).collect();
    chunks
        .par_iter()
        .map(|c| {
            let b = d.chunk_bytes(c);
            // Touch every page; the digest keeps the read from being elided.
            std::hint::black_box(xxhash_rust::xxh3::xxh3_64(b));
            b.len() as u64
        })
        .sum()
}

/// Where a stored box's bytes are: in a data file, or in a chunk converted
/// to the state's element type (tensor, chunk).
#[derive(Clone, Debug)]
enum Origin {
    File(usize),
    Converted(usize, usize),
}

/// `bytes` of `from` elements as `to` elements, when every value converts
/// exactly: bf16 and f16 widen to f32 always, f32 narrows to bf16 only when
/// its low 16 bits are zero.
fn convert(bytes: &[u8], from: DType, to: DType) -> Option<Vec<u8>> {
    let halves = || bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let words = || {
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    Some(match (from, to) {
        (DType::BF16, DType::F32) => halves().flat_map(|h| ((h as u32) << 16).to_le_bytes()).collect(),
        (DType::F16, DType::F32) => halves().flat_map(|h| f16_to_f32(h).to_le_bytes()).collect(),
        (DType::F32, DType::BF16) => {
            let mut out = Vec::with_capacity(bytes.len() / 2);
            for w in words() {
                if w & 0xffff != 0 {
                    return None;
                }
                out.extend(((w >> 16) as u16).to_le_bytes());
            }
            out
        }
        _ => return None,
    })
}

/// IEEE half to single precision, exactly.
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f32;
    match exp {
        0 => sign * frac * 2f32.powi(-24),
        0x1f if frac == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f32.powi(e - 15),
    }
}

/// A DCP checkpoint as it is ([`Dcp::state`]): every tensor under its own
/// name, model weights and optimizer state alike (a 0-d tensor, such as an
/// optimizer's `step`, as one element), each saved chunk a piece on the
/// rank that wrote it; and the entries that are not tensors, with their
/// bytes. Nothing of it depends on a model description.
#[derive(Debug)]
pub struct DcpState {
    dcp: Arc<Dcp>,
    layout: Layout,
    /// Each chunk's box in the layout's terms, per tensor, in chunk order.
    regions: Vec<Vec<Region>>,
    extras: DcpExtras,
}

impl DcpState {
    fn of(dcp: Arc<Dcp>) -> Result<DcpState> {
        let mut specs = Vec::with_capacity(dcp.tensors.len());
        let mut scalars = BTreeSet::new();
        let mut per_rank: BTreeMap<DeviceId, Vec<Buffer>> = BTreeMap::new();
        let mut regions = Vec::with_capacity(dcp.tensors.len());
        for (t, d) in dcp.tensors.iter().enumerate() {
            let scalar = d.shape.is_empty();
            if scalar {
                scalars.insert(d.name.clone());
            }
            let shape = if scalar { vec![1] } else { d.shape.clone() };
            let mut mine = Vec::with_capacity(d.chunks.len());
            for c in &d.chunks {
                let region = if scalar { Region::full(&[1]) } else { c.region.clone() };
                mine.push(region.clone());
                per_rank.entry(dcp.files[c.file].1).or_default().push(Buffer {
                    name: format!("{}@{:?}", d.name, region.lo()),
                    dtype: d.dtype,
                    len: region.volume(),
                    pieces: vec![Piece {
                        tensor: t as TensorId,
                        region,
                        offset: 0,
                    }],
                    partial: false,
                });
            }
            regions.push(mine);
            specs.push(TensorSpec::new(d.name.clone(), d.dtype, shape));
        }
        let mut others = BTreeMap::new();
        for name in &dcp.others {
            if !dcp.bytes_entries.contains_key(name) {
                return Err(bad(
                    &dcp.dir,
                    format!("`{name}` is a tensor of an element type tenplan does not carry; nothing of this checkpoint was written"),
                ));
            }
            let b = dcp.bytes_entry(name)?;
            others.insert(name.clone(), b);
        }
        let shards = per_rank
            .into_iter()
            .map(|(rank, buffers)| Shard {
                name: format!("rank{rank}"),
                devices: vec![rank],
                buffers,
            })
            .collect();
        let layout = Layout::new(specs.into(), shards).map_err(|e| Error::Coverage {
            tensor: "?".into(),
            what: format!("DCP checkpoint {} does not give a valid layout: {e}", dcp.dir.display()),
        })?;
        // A Megatron-Core checkpoint's own files go along as they are: the
        // output is a checkpoint of the same backend.
        let mut side_files = BTreeMap::new();
        if dcp.megatron.is_some() {
            for name in [METADATA_JSON, COMMON_FILE] {
                let path = dcp.dir.join(name);
                side_files.insert(
                    name.to_string(),
                    std::fs::read(&path).map_err(Error::io("read", &path))?,
                );
            }
        }
        let extras = DcpExtras {
            scalars,
            others,
            planner_data: dcp.planner_data.clone(),
            side_files,
            saved_as: BTreeMap::new(),
            mirrors: BTreeMap::new(),
            main_replica_only: dcp.megatron.is_some(),
            literals: BTreeMap::new(),
        };
        Ok(DcpState {
            dcp,
            layout,
            regions,
            extras,
        })
    }

    /// What the checkpoint holds besides its tensors' elements.
    pub fn extras(&self) -> &DcpExtras {
        &self.extras
    }

    /// The checkpoint.
    pub fn dcp(&self) -> &Dcp {
        &self.dcp
    }
}

impl Source for DcpState {
    fn location(&self) -> &Path {
        &self.dcp.dir
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>> {
        self.dcp
            .tensors
            .iter()
            .enumerate()
            .map(|(t, d)| {
                d.chunks
                    .iter()
                    .zip(&self.regions[t])
                    .map(|(c, region)| SourceBox {
                        tensor: t as TensorId,
                        region,
                        data: self.dcp.chunk_bytes(c),
                        file: Some((&self.dcp.handles[c.file], c.data.start as u64)),
                    })
                    .collect()
            })
            .collect()
    }

    fn prefetch(&self) {
        for t in &self.dcp.tensors {
            for c in &t.chunks {
                // A hint: failure only costs speed.
                let _ = self.dcp.files[c.file]
                    .2
                    .advise_range(memmap2::Advice::WillNeed, c.data.start, c.data.len());
            }
        }
    }

    fn digests(&self) -> Option<Vec<String>> {
        None
    }
}

/// A DCP checkpoint mapped onto a model: the plan's source.
#[derive(Debug)]
pub struct DcpSource {
    dcp: Arc<Dcp>,
    layout: Layout,
    stored: Vec<Vec<(Region, Origin, Range<usize>)>>,
    converted: Vec<Vec<Vec<u8>>>,
    unused: Vec<String>,
    reads: Vec<Vec<String>>,
}

impl DcpSource {
    /// The saved entries the model's tensor `t` is read from, by name.
    pub fn reads(&self, t: TensorId) -> &[String] {
        &self.reads[t as usize]
    }

    /// Saved entries no tensor of the model reads (optimizer state, other
    /// entries, a tied output layer), sorted.
    pub fn unused(&self) -> &[String] {
        &self.unused
    }
}

impl Source for DcpSource {
    fn location(&self) -> &Path {
        &self.dcp.dir
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>> {
        self.stored
            .iter()
            .enumerate()
            .map(|(t, boxes)| {
                boxes
                    .iter()
                    .map(|(region, origin, range)| match origin {
                        Origin::File(f) => SourceBox {
                            tensor: t as TensorId,
                            region,
                            data: &self.dcp.files[*f].2[range.clone()],
                            file: Some((&self.dcp.handles[*f], range.start as u64)),
                        },
                        Origin::Converted(i, c) => SourceBox {
                            tensor: t as TensorId,
                            region,
                            data: &self.converted[*i][*c][range.clone()],
                            file: None,
                        },
                    })
                    .collect()
            })
            .collect()
    }

    fn prefetch(&self) {
        // Only the chunks the model reads: optimizer state and other entries
        // stay on disk.
        for boxes in &self.stored {
            for (_, origin, range) in boxes {
                if let Origin::File(f) = origin {
                    // A hint: failure only costs speed.
                    let _ = self.dcp.files[*f]
                        .2
                        .advise_range(memmap2::Advice::WillNeed, range.start, range.len());
                }
            }
        }
    }

    fn digests(&self) -> Option<Vec<String>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_stacks_and_ranks() {
        assert_eq!(
            live_name("", "model.layers.3.mlp.experts.2.up_proj.weight", &[16, 32]),
            Some(("model.layers.3.mlp.experts.gate_up_proj".into(), Some(2), 16))
        );
        assert_eq!(
            live_name(
                "model.",
                "model.layers.0.block_sparse_moe.experts.1.w2.weight",
                &[32, 24]
            ),
            Some(("model.model.layers.0.mlp.experts.down_proj".into(), Some(1), 0))
        );
        assert_eq!(
            live_name("", "model.layers.0.block_sparse_moe.gate.weight", &[4, 32]),
            Some(("model.layers.0.mlp.gate.weight".into(), None, 0))
        );
        assert_eq!(live_name("", "model.layers.0.mlp.gate.weight", &[4, 32]), None);
        assert_eq!(rank_of("__12_0.distcp"), Some(12));
        let f32s: Vec<u8> = [1.5f32, -2.0, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let bf = convert(&f32s, DType::F32, DType::BF16).unwrap();
        assert_eq!(convert(&bf, DType::BF16, DType::F32).unwrap(), f32s);
        assert_eq!(convert(&0.1f32.to_le_bytes(), DType::F32, DType::BF16), None);
        for (h, want) in [
            (0x3c00u16, 1.0f32),
            (0xc000, -2.0),
            (0x0001, 2f32.powi(-24)),
            (0x7bff, 65504.0),
        ] {
            assert_eq!(f16_to_f32(h), want);
        }
        assert_eq!(rank_of("../x.distcp"), None);
    }
}
