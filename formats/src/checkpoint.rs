//! Sharded safetensors checkpoints: one file per rank and a manifest.
//!
//! A checkpoint is a directory:
//!
//! - `rank-NNNNN.safetensors`, one per device of the layout. Each entry is one
//!   box of one logical tensor, keyed by the tensor's name; when a rank stores
//!   several boxes of one tensor (ZeRO ranges, SwiGLU halves), the second and
//!   later go to `rank-NNNNN.part1.safetensors`, `.part2`, ... in box order,
//!   because DCP keys chunks by entry name (checkpoints of earlier versions
//!   keyed them `name#1`, `name#2` in the rank's file, which still reads). The file's
//!   `__metadata__` carries `DCP_SHARDING_INFO` (`{key: {"saved_offsets":
//!   [...]}}`), `DCP_VERSION` and `format: pt`, so PyTorch DCP's Hugging Face
//!   storage reader can load the checkpoint and reshard it itself. Padding is
//!   not stored. State held by several ranks (replicas) is stored once, by the
//!   least-loaded holder, as DCP's deduplication does.
//! - `tenplan.json`, the manifest: model, layout (tensors and shards),
//!   cluster, dataset and RNG state when present, each file's size, and the
//!   digest of every global tensor ([`crate::tensor_digest`]). It is written
//!   last: a directory without a manifest is incomplete.
//!
//! Writes are atomic: each file is written under a temporary name, synced and
//! renamed; a failed write removes the directory it created. Reads go through
//! memory maps and touch only the bytes asked for.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tenplan_ptc::{Cluster, DType, DeviceId, JobState, Layout, Region, Shard, TensorId, TensorSpec};

use tenplan_models::{
    find, hf_family, hf_layout, transformers_version, ModelSpec, ModelState, ParallelConfig, StateKind,
};

use crate::stream::{write_files, OutFile};
use tenplan_ptc::SourceBox;

use crate::{format_digest, tensor_digest, Error, Result};

/// The manifest's file name.
pub const MANIFEST_FILE: &str = "tenplan.json";
/// The `format` tag of a manifest.
pub const CHECKPOINT_FORMAT: &str = "tenplan-checkpoint";
/// The manifest version this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 1;
/// Separates a tensor's name from the part number in entry keys of
/// checkpoints written before part files (still read).
pub const PART_SEPARATOR: char = '#';
/// The metadata key PyTorch DCP reads box offsets from.
pub const DCP_SHARDING_INFO: &str = "DCP_SHARDING_INFO";

/// Work items are at most this big, so rayon can balance them.
const SLAB_BYTES: u64 = 8 << 20;
/// Manifests larger than this are rejected before parsing.
const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// What a checkpoint says about itself, besides its layout.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointInfo {
    /// The model, if known: a catalog preset or one from a `config.json`.
    pub model: Option<ModelSpec>,
    /// Parallel configuration (`tp=2,dp=2`), if any.
    pub config: Option<String>,
    /// State kind (`weights:bf16`, `training`), if any.
    pub state: Option<String>,
    /// The cluster the layout's devices belong to.
    pub cluster: Cluster,
    /// Dataset and RNG state.
    pub job: JobState,
    /// The Hugging Face `config.json` the model came from, kept for export.
    pub hf_config: Option<serde_json::Value>,
    /// Tensors saved with no dimension, held as one element.
    pub scalars: Vec<String>,
}

/// The state label of a checkpoint whose tensors keep the names of the
/// Hugging Face files they came from, laid out by their family's plan
/// (`hf_config` says the family): models tenplan's catalog does not
/// describe.
pub const NAMED_STATE: &str = "hf";

/// The manifest, `tenplan.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`CHECKPOINT_FORMAT`].
    pub format: String,
    /// Always [`CHECKPOINT_VERSION`].
    pub version: u32,
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model's hyper-parameters, for a model that is not a catalog
    /// preset (one from a Hugging Face `config.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_spec: Option<ModelSpec>,
    /// Parallel configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// State kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The cluster.
    pub cluster: Cluster,
    /// Every logical tensor with its digest, in layout order.
    pub tensors: Vec<TensorRecord>,
    /// The layout's shards.
    pub shards: Vec<Shard>,
    /// One file per device.
    pub files: Vec<FileRecord>,
    /// Dataset and RNG state.
    #[serde(default, skip_serializing_if = "is_empty_job")]
    pub job: JobState,
    /// The Hugging Face `config.json` of an imported model, written back
    /// by `tenplan export` (its fields beyond the tensors' shapes: rope,
    /// norms, token ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_config: Option<serde_json::Value>,
    /// Tensors saved with no dimension (a 0-d tensor), held as one element
    /// and written back with no dimension.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scalars: Vec<String>,
}

fn is_empty_job(j: &JobState) -> bool {
    *j == JobState::default()
}

/// A logical tensor and the digest of its contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRecord {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Global shape.
    pub shape: Vec<u64>,
    /// [`crate::format_digest`] of [`crate::tensor_digest`].
    pub digest: String,
}

/// One rank's file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    /// The device (rank).
    pub device: DeviceId,
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Number of entries.
    pub entries: u64,
}

/// A box that one rank's file stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBox {
    /// The device whose file stores it.
    pub device: DeviceId,
    /// The tensor.
    pub tensor: TensorId,
    /// The box (keyed in its file by the tensor's name).
    pub region: Region,
}

/// The file name of a device's file.
pub fn file_name(device: DeviceId) -> String {
    format!("rank-{device:05}.safetensors")
}

/// Which device's file stores each distinct box of a layout: replicated boxes
/// go to the holder with the fewest bytes so far, largest boxes first (as
/// DCP's deduplication balances them). Every device of the layout gets a
/// (possibly empty) list, in (tensor, box) order.
pub fn storage_assignment(layout: &Layout) -> BTreeMap<DeviceId, Vec<StoredBox>> {
    assign_storage(layout, false)
}

/// Which device's file stores each distinct box of a layout when only the
/// main replica saves: the lowest-numbered holder of each box (as
/// Megatron-Core's ranks of replica id 0, the first data-parallel rank of
/// each model-parallel group, save a `torch_dist` checkpoint, so that its
/// files tell the tensor and pipeline split). Every device of the layout
/// gets a (possibly empty) list, in (tensor, box) order.
pub fn main_replica_assignment(layout: &Layout) -> BTreeMap<DeviceId, Vec<StoredBox>> {
    assign_storage(layout, true)
}

fn assign_storage(layout: &Layout, lowest: bool) -> BTreeMap<DeviceId, Vec<StoredBox>> {
    let tensors = layout.tensors();
    let mut load: BTreeMap<DeviceId, u64> = layout.devices().map(|d| (d, 0)).collect();
    let mut boxes: Vec<(u64, TensorId, &Region, &[DeviceId])> = Vec::new();
    for t in 0..tensors.len() as TensorId {
        for s in layout.sub_tensors(t) {
            let bytes = s.region.volume() * tensors[t as usize].dtype.size();
            boxes.push((bytes, t, &s.region, &s.holders));
        }
    }
    boxes.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let mut chosen: BTreeMap<DeviceId, Vec<(TensorId, Region)>> = load.keys().map(|&d| (d, Vec::new())).collect();
    for (bytes, t, region, holders) in boxes {
        let d = *holders
            .iter()
            .min_by_key(|&&d| (if lowest { 0 } else { load[&d] }, d))
            .expect("sub-tensors have holders");
        *load.get_mut(&d).expect("holders are layout devices") += bytes;
        chosen
            .get_mut(&d)
            .expect("holders are layout devices")
            .push((t, region.clone()));
    }
    chosen
        .into_iter()
        .map(|(d, mut list)| {
            list.sort();
            let stored = list
                .into_iter()
                .map(|(tensor, region)| StoredBox {
                    device: d,
                    tensor,
                    region,
                })
                .collect();
            (d, stored)
        })
        .collect()
}

/// A device's boxes split into files: PyTorch DCP's Hugging Face reader
/// keys chunks by entry name, so a file holds at most one box of a tensor.
/// The first box of each tensor goes to [`file_name`], the `k`-th to
/// [`part_file_name`]`(device, k)`.
fn file_parts(boxes: Vec<StoredBox>) -> Vec<Vec<StoredBox>> {
    let mut parts: Vec<Vec<StoredBox>> = vec![Vec::new()];
    let mut seen: BTreeMap<TensorId, usize> = BTreeMap::new();
    for b in boxes {
        let k = seen.entry(b.tensor).or_default();
        if parts.len() <= *k {
            parts.push(Vec::new());
        }
        parts[*k].push(b);
        *k += 1;
    }
    parts
}

/// The file of a device's `k`-th boxes of tensors it stores several boxes
/// of (`k` ≥ 1).
pub fn part_file_name(device: DeviceId, k: usize) -> String {
    format!("rank-{device:05}.part{k}.safetensors")
}

fn dtype_tag(d: DType) -> &'static str {
    match d {
        DType::F64 => "F64",
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        _ => "U8",
    }
}

/// Our element type of a safetensors one, if we have it.
pub(crate) fn dtype_of(d: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype as S;
    Some(match d {
        S::F64 => DType::F64,
        S::F32 => DType::F32,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::I64 => DType::I64,
        S::I32 => DType::I32,
        S::U8 => DType::U8,
        _ => return None,
    })
}

/// Where one file's header and entries go.
struct FilePlan {
    device: DeviceId,
    name: String,
    header: Vec<u8>,
    /// Entries with their absolute byte ranges in the file.
    entries: Vec<(StoredBox, Range<usize>)>,
    bytes: u64,
}

fn file_plan(tensors: &[TensorSpec], device: DeviceId, name: String, boxes: Vec<StoredBox>) -> FilePlan {
    let entries: Vec<HeaderEntry<'_>> = boxes
        .iter()
        .map(|b| {
            let spec = &tensors[b.tensor as usize];
            (
                spec.name.as_str(),
                spec.dtype,
                b.region.shape(),
                b.region.volume() * spec.dtype.size(),
            )
        })
        .collect();
    let sharding: serde_json::Map<String, serde_json::Value> = boxes
        .iter()
        .map(|b| {
            let name = tensors[b.tensor as usize].name.clone();
            (name, serde_json::json!({ "saved_offsets": b.region.lo() }))
        })
        .collect();
    let (head, ranges) = safetensors_header(
        &entries,
        serde_json::json!({
            DCP_SHARDING_INFO: serde_json::Value::Object(sharding).to_string(),
            "DCP_VERSION": "1.0",
            "format": "pt",
        }),
    );
    let bytes = ranges.last().map_or(head.len(), |r| r.end) as u64;
    FilePlan {
        device,
        name,
        header: head,
        entries: boxes.into_iter().zip(ranges).collect(),
        bytes,
    }
}

/// One entry of a safetensors header: key, element type, shape, bytes.
pub(crate) type HeaderEntry<'a> = (&'a str, DType, Vec<u64>, u64);

/// A safetensors header (length prefix, JSON, padding to 8 bytes as
/// safetensors writers do) for entries stored in order, with `metadata` as
/// its `__metadata__`; and each entry's absolute byte range in the file.
pub(crate) fn safetensors_header(
    entries: &[HeaderEntry<'_>],
    metadata: serde_json::Value,
) -> (Vec<u8>, Vec<Range<usize>>) {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    let mut ranges = Vec::with_capacity(entries.len());
    for (key, dtype, shape, bytes) in entries {
        header.insert(
            key.to_string(),
            serde_json::json!({
                "dtype": dtype_tag(*dtype),
                "shape": shape,
                "data_offsets": [offset, offset + bytes],
            }),
        );
        ranges.push(offset..offset + bytes);
        offset += bytes;
    }
    header.insert("__metadata__".into(), metadata);
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let start = 8 + json.len();
    let mut head = (json.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&json);
    let ranges = ranges
        .into_iter()
        .map(|r| start + r.start as usize..start + r.end as usize)
        .collect();
    (head, ranges)
}

/// Write `bytes` to `dir/name` atomically: temporary name, fsync, rename.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    let mut f = File::create(&tmp).map_err(Error::io("create", &tmp))?;
    f.write_all(bytes).map_err(Error::io("write", &tmp))?;
    f.sync_all().map_err(Error::io("sync", &tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(Error::io("rename", &tmp))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(Error::io("sync", dir))
}

/// The marker a write puts in its directory first and removes once the
/// manifest is written: a directory that has it was interrupted.
pub const INCOMPLETE_MARKER: &str = ".tenplan-incomplete";

/// Create a new directory holding only the incomplete-write marker; an
/// existing path is an error, never overwritten (see [`Destination`]).
pub(crate) fn create_new_dir(out: &Path) -> Result<()> {
    if out.exists() {
        return Err(Error::DestinationExists { path: out.into() });
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
    }
    fs::create_dir(out).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            Error::DestinationExists { path: out.into() }
        } else {
            Error::Io {
                op: "create",
                path: out.into(),
                source,
            }
        }
    })?;
    write_atomic(
        out,
        INCOMPLETE_MARKER,
        b"tenplan is writing a checkpoint here; if this file is still here, the write was interrupted\n",
    )?;
    sync_dir(out)
}

/// What a path given as the destination of a write holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DestinationState {
    /// Nothing: the write creates it.
    Absent,
    /// An empty directory.
    Empty,
    /// A complete tenplan checkpoint (it has a manifest).
    Checkpoint,
    /// What an interrupted tenplan write left: no manifest, and the
    /// incomplete-write marker, or only files a tenplan write makes.
    Incomplete {
        /// Files in it.
        files: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// Anything else: a file, or a directory of someone else's.
    Foreign,
}

/// True for the names a checkpoint write creates: rank files, the manifest,
/// their temporary names and the marker.
fn is_checkpoint_name(name: &str) -> bool {
    let plain = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".tmp"))
        .unwrap_or(name);
    name == INCOMPLETE_MARKER
        || plain == MANIFEST_FILE
        || (plain.starts_with("rank-") && plain.ends_with(".safetensors"))
}

/// Look at a destination without changing it.
pub fn inspect_destination(out: &Path) -> Result<DestinationState> {
    let meta = match fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DestinationState::Absent),
        Err(e) => return Err(Error::io("read", out)(e)),
    };
    if !meta.is_dir() {
        return Ok(DestinationState::Foreign);
    }
    let (mut files, mut bytes, mut ours, mut marker, mut manifest) = (0u64, 0u64, true, false, false);
    for entry in fs::read_dir(out).map_err(Error::io("read", out))? {
        let entry = entry.map_err(Error::io("read", out))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let meta = entry.metadata().map_err(Error::io("read", &entry.path()))?;
        files += 1;
        bytes += meta.len();
        marker |= name == INCOMPLETE_MARKER;
        manifest |= name == MANIFEST_FILE;
        ours &= meta.is_file() && is_checkpoint_name(&name);
    }
    Ok(match (files, manifest, marker || ours) {
        (0, _, _) => DestinationState::Empty,
        (_, true, _) => DestinationState::Checkpoint,
        (_, false, true) => DestinationState::Incomplete { files, bytes },
        _ => DestinationState::Foreign,
    })
}

/// Where a checkpoint write goes, decided before anything is written.
///
/// Without `overwrite`, only an absent path is accepted; an interrupted
/// write is named as such. With `overwrite`, an interrupted write or an empty
/// directory is removed first, and a complete checkpoint is replaced safely:
/// the new one is written beside it (`.NAME.tenplan-new`) and swapped in by
/// [`Destination::commit`] only once it is complete, so a crash leaves the
/// old one in place. A path that holds anything else is never removed.
#[derive(Debug)]
pub struct Destination {
    out: PathBuf,
    staging: Option<PathBuf>,
}

impl Destination {
    /// Decide where a write into `out` goes.
    pub fn new(out: &Path, overwrite: bool) -> Result<Destination> {
        let plain = Destination {
            out: out.into(),
            staging: None,
        };
        match inspect_destination(out)? {
            DestinationState::Absent => Ok(plain),
            DestinationState::Foreign => Err(Error::DestinationForeign { path: out.into() }),
            DestinationState::Incomplete { files, bytes } if !overwrite => Err(Error::DestinationIncomplete {
                path: out.into(),
                files,
                bytes,
            }),
            DestinationState::Empty | DestinationState::Checkpoint if !overwrite => {
                Err(Error::DestinationExists { path: out.into() })
            }
            DestinationState::Empty | DestinationState::Incomplete { .. } => {
                fs::remove_dir_all(out).map_err(Error::io("remove", out))?;
                Ok(plain)
            }
            DestinationState::Checkpoint => {
                let name = out
                    .file_name()
                    .ok_or_else(|| Error::file(out, "not a directory name"))?
                    .to_string_lossy();
                let staging = out.with_file_name(format!(".{name}.tenplan-new"));
                // A staging directory left by an interrupted replacement is ours.
                match inspect_destination(&staging)? {
                    DestinationState::Absent => {}
                    DestinationState::Foreign => return Err(Error::DestinationForeign { path: staging }),
                    _ => fs::remove_dir_all(&staging).map_err(Error::io("remove", &staging))?,
                }
                Ok(Destination {
                    out: out.into(),
                    staging: Some(staging),
                })
            }
        }
    }

    /// The directory to write into.
    pub fn path(&self) -> &Path {
        self.staging.as_deref().unwrap_or(&self.out)
    }

    /// After a complete write: swap a replacement in and remove the old
    /// checkpoint.
    pub fn commit(self) -> Result<()> {
        let Some(staging) = self.staging else {
            return Ok(());
        };
        let old = staging.with_extension("old");
        fs::rename(&self.out, &old).map_err(Error::io("rename", &self.out))?;
        fs::rename(&staging, &self.out).map_err(Error::io("rename", &staging))?;
        if let Some(parent) = self.out.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = sync_dir(parent);
        }
        fs::remove_dir_all(&old).map_err(Error::io("remove", &old))
    }
}

/// The callback that fills a slab of a stored box.
type FillFn<'a> = dyn Fn(&StoredBox, &Region, &mut [u8]) -> Result<()> + Sync + 'a;

/// What a write did.
#[derive(Clone, Debug, PartialEq)]
pub struct Written {
    /// The manifest written last.
    pub manifest: Manifest,
    /// Bytes of tensor data written (headers excluded).
    pub data_bytes: u64,
    /// Bytes of all files written (headers included, manifest excluded).
    pub file_bytes: u64,
}

/// Write a checkpoint of `layout` into the new directory `out`.
///
/// `fill(stored, slab, bytes)` writes the elements of `slab` (a range of the
/// stored box's first dimension, or the whole box) row-major into `bytes`; it
/// is called in parallel on disjoint slabs. `progress` gets the byte count of
/// every filled slab. After the files are synced, every tensor's digest is
/// computed from the files as written and, when `expected` is given (in
/// layout tensor order), compared with it; only then is the manifest written.
/// On any error the directory is removed.
pub fn write<F>(
    out: &Path,
    layout: &Layout,
    info: &CheckpointInfo,
    expected: Option<&[String]>,
    fill: F,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Written>
where
    F: Fn(&StoredBox, &Region, &mut [u8]) -> Result<()> + Sync,
{
    if let Some(t) = (0..layout.tensors().len() as TensorId).find(|&t| layout.is_partial(t)) {
        return Err(Error::Partial {
            tensor: layout.tensors()[t as usize].name.clone(),
            what: "reduce it before checkpointing",
        });
    }
    create_new_dir(out)?;
    let result = write_into(out, layout, info, expected, &fill, progress);
    if result.is_err() {
        // We created the directory, so it holds nothing of anybody else's.
        let _ = fs::remove_dir_all(out);
    }
    result
}

fn write_into(
    out: &Path,
    layout: &Layout,
    info: &CheckpointInfo,
    expected: Option<&[String]>,
    fill: &FillFn<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Written> {
    let tensors = layout.tensors();
    let plans: Vec<FilePlan> = storage_assignment(layout)
        .into_iter()
        .flat_map(|(d, boxes)| {
            file_parts(boxes).into_iter().enumerate().map(move |(k, part)| {
                let name = if k == 0 { file_name(d) } else { part_file_name(d, k) };
                file_plan(tensors, d, name, part)
            })
        })
        .collect();
    // Files stream out batch by batch: memory stays at two batches however
    // large a rank's file is.
    let files: Vec<OutFile<(&StoredBox, Region)>> = plans
        .iter()
        .map(|p| OutFile {
            name: p.name.clone(),
            header: p.header.clone(),
            items: p
                .entries
                .iter()
                .flat_map(|(b, _)| {
                    let elem = tensors[b.tensor as usize].dtype.size();
                    slabs(&b.region, elem).into_iter().map(move |slab| {
                        let len = (slab.volume() * elem) as usize;
                        ((b, slab), len)
                    })
                })
                .collect(),
        })
        .collect();
    write_files(out, &files, &|(b, slab), bytes| fill(b, slab, bytes), progress)?;
    sync_dir(out)?;
    // Digests from the files as written: what a reader will see.
    let files: Vec<(PathBuf, Mmap)> = plans
        .iter()
        .map(|p| {
            let path = out.join(&p.name);
            let f = File::open(&path).map_err(Error::io("open", &path))?;
            Ok((path.clone(), map(&f).map_err(Error::io("map", &path))?))
        })
        .collect::<Result<_>>()?;
    let mut boxes: Vec<Vec<SourceBox<'_>>> = vec![Vec::new(); tensors.len()];
    for (p, (_, m)) in plans.iter().zip(&files) {
        for (b, r) in &p.entries {
            boxes[b.tensor as usize].push(SourceBox {
                tensor: b.tensor,
                region: &b.region,
                data: &m[r.clone()],
                file: None,
            });
        }
    }
    let digests: Vec<String> = (0..tensors.len())
        .into_par_iter()
        .map(|t| format_digest(tensor_digest(&tensors[t], &boxes[t])))
        .collect();
    if let Some(expected) = expected {
        for ((spec, want), got) in tensors.iter().zip(expected).zip(&digests) {
            if want != got {
                return Err(Error::DigestMismatch {
                    tensor: spec.name.clone(),
                    expected: want.clone(),
                    got: got.clone(),
                });
            }
        }
    }
    let manifest = Manifest {
        format: CHECKPOINT_FORMAT.into(),
        version: CHECKPOINT_VERSION,
        model: info.model.as_ref().map(|m| m.name.to_string()),
        model_spec: info.model.as_ref().filter(|m| find(&m.name).ok() != Some(*m)).cloned(),
        config: info.config.clone(),
        state: info.state.clone(),
        cluster: info.cluster.clone(),
        tensors: tensors
            .iter()
            .zip(digests)
            .map(|(t, digest)| TensorRecord {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                digest,
            })
            .collect(),
        shards: layout.shards().to_vec(),
        files: plans
            .iter()
            .map(|p| FileRecord {
                device: p.device,
                file: p.name.clone(),
                bytes: p.bytes,
                entries: p.entries.len() as u64,
            })
            .collect(),
        job: info.job,
        hf_config: info.hf_config.clone(),
        scalars: info.scalars.clone(),
    };
    let text = serde_json::to_string(&manifest).expect("manifests always serialise");
    write_atomic(out, MANIFEST_FILE, text.as_bytes())?;
    // The manifest is in place: the checkpoint is complete.
    fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(Error::io("remove", &out.join(INCOMPLETE_MARKER)))?;
    sync_dir(out)?;
    let file_bytes = plans.iter().map(|p| p.bytes).sum();
    let data_bytes = plans.iter().map(|p| p.bytes - p.header.len() as u64).sum();
    Ok(Written {
        manifest,
        data_bytes,
        file_bytes,
    })
}

/// A box cut along its first dimension into pieces of about [`SLAB_BYTES`].
pub(crate) fn slabs(region: &Region, elem: u64) -> Vec<Region> {
    let rows = region.range(0);
    let row_bytes = region.volume() / (rows.end - rows.start) * elem;
    let per = (SLAB_BYTES / row_bytes.max(1)).max(1);
    (rows.start..rows.end)
        .step_by(per as usize)
        .map(|lo| region.with_range(0, lo..(lo + per).min(rows.end)))
        .collect()
}

#[allow(unsafe_code)]
pub(crate) fn map(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and tenplan never writes a file it reads
    // (checkpoints are immutable once their manifest exists). Another program
    // truncating the file while it is mapped could fault; changing its bytes
    // is caught by the digests.
    unsafe { Mmap::map(file) }
}

/// One entry of an open checkpoint.
#[derive(Clone, Debug)]
struct Stored {
    region: Region,
    file: usize,
    range: Range<usize>,
}

/// An open, structurally checked checkpoint: the manifest parsed, the layout
/// rebuilt, every file mapped, every header parsed and every box of the layout
/// found stored exactly once. Contents are checked by [`Checkpoint::verify`].
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    manifest: Manifest,
    layout: Layout,
    files: Vec<(PathBuf, Mmap)>,
    /// The files themselves, beside their maps: long runs are read from
    /// them with positioned reads (see [`SourceBox::file`]).
    handles: Vec<File>,
    entries: Vec<Vec<Stored>>,
}

/// Parse a safetensors header: the entries `(key, dtype, shape, absolute byte
/// range)` and the `__metadata__` map, checking the offsets against the file.
pub(crate) type Entries = Vec<(String, DType, Vec<u64>, Range<usize>)>;

pub(crate) fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<(Entries, BTreeMap<String, String>)> {
    let (n, meta) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::file(path, format!("not a valid safetensors file: {e}")))?;
    let start = 8 + n;
    let mut entries: Entries = Vec::new();
    let mut infos: Vec<(String, &safetensors::tensor::TensorInfo)> = meta.tensors().into_iter().collect();
    infos.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, info) in infos {
        let dtype = dtype_of(info.dtype)
            .ok_or_else(|| Error::file(path, format!("entry `{key}` has element type {:?}", info.dtype)))?;
        let (lo, hi) = info.data_offsets;
        entries.push((
            key,
            dtype,
            info.shape.iter().map(|&s| s as u64).collect(),
            start + lo..start + hi,
        ));
    }
    let extra = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect::<BTreeMap<_, _>>();
    Ok((entries, extra))
}

impl Manifest {
    /// The model the manifest names: its recorded hyper-parameters, or the
    /// catalog preset of its name; `None` when it names none.
    pub fn model(&self) -> std::result::Result<Option<ModelSpec>, String> {
        match (&self.model, &self.model_spec) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err("model_spec is given without a model name".into()),
            (Some(name), None) => find(name).map(|m| Some(m.clone())).map_err(|e| format!("model: {e}")),
            (Some(name), Some(spec)) => {
                if spec.name != *name {
                    return Err(format!("model `{name}` has a model_spec named `{}`", spec.name));
                }
                spec.check().map_err(|e| format!("model_spec: {e}"))?;
                Ok(Some(spec.clone()))
            }
        }
    }
}

/// Check what a manifest says about its layout against the layout itself:
/// the cluster holds every device; the state kind parses; a catalog model's
/// tensors are the layout's; a configuration builds exactly the layout's
/// shards (devices, buffers, lengths, pieces). A manifest that claims
/// anything its shards do not have is refused before any file is read.
fn check_claims(m: &Manifest, layout: &Layout) -> std::result::Result<(), String> {
    let c = &m.cluster;
    // Compute devices, and the checkpoint store's device when it has one.
    let devices = c.compute_nodes() as u64 * c.gpus_per_node() as u64;
    let exists = |d: DeviceId| u64::from(d) < devices || Some(d) == c.storage_device();
    if let Some(d) = layout.devices().find(|&d| !exists(d)) {
        return Err(format!(
            "cluster `{}` has {devices} devices ({} nodes of {}), but the layout uses device {d}",
            c.name(),
            c.compute_nodes(),
            c.gpus_per_node()
        ));
    }
    for name in &m.scalars {
        match layout.tensors().iter().find(|t| t.name == *name) {
            Some(t) if t.shape == [1] => {}
            Some(t) => return Err(format!("scalar `{name}` has shape {:?}, not one element", t.shape)),
            None => return Err(format!("scalar `{name}` is no tensor of the layout")),
        }
    }
    let config = m
        .config
        .as_deref()
        .map(|s| s.parse::<ParallelConfig>().map_err(|e| format!("config: {e}")))
        .transpose()?;
    if m.state.as_deref() == Some(NAMED_STATE) {
        return check_named_claims(m, layout, config.as_ref());
    }
    let kind = m
        .state
        .as_deref()
        .map(str::parse::<StateKind>)
        .transpose()
        .map_err(|e| format!("state: {e}"))?;
    if let Some(cfg) = &config {
        let used = layout.devices().count() as u64;
        if cfg.world() != used {
            return Err(format!(
                "config `{cfg}` has {} ranks, the layout's shards are on {used} devices",
                cfg.world()
            ));
        }
    }
    let Some(spec) = m.model()? else {
        return Ok(());
    };
    let name = &spec.name;
    let Some(kind) = kind else {
        return Err(format!("model `{name}` is named without a state"));
    };
    let state = ModelState::new(&spec, kind);
    if state.tensors()[..] != layout.tensors()[..] {
        let mine = state.tensors();
        let theirs = layout.tensors();
        let what = match mine.iter().zip(theirs.iter()).find(|(a, b)| a != b) {
            Some((a, b)) => format!(
                "tensor `{}` {} {:?} where {name} ({kind}) has `{}` {} {:?}",
                b.name, b.dtype, b.shape, a.name, a.dtype, a.shape
            ),
            None => format!("{} tensors where {name} ({kind}) has {}", theirs.len(), mine.len()),
        };
        return Err(format!("the tensors are not those of the model it names: {what}"));
    }
    let Some(cfg) = config else {
        return Ok(());
    };
    let want = state.layout(&cfg).map_err(|e| format!("config `{cfg}`: {e}"))?;
    // A placing planner may put the config's ranks on other devices of the
    // same set: the shards must match the config's in everything else.
    let what = if want.shards().len() != layout.shards().len() {
        Some(format!(
            "{} shards where the config has {}",
            layout.shards().len(),
            want.shards().len()
        ))
    } else if want.devices().collect::<BTreeSet<_>>() != layout.devices().collect::<BTreeSet<_>>() {
        Some("its shards are on other devices than the config's".to_string())
    } else {
        want.shards().iter().zip(layout.shards()).find_map(|(a, b)| {
            if a.name != b.name || a.devices.len() != b.devices.len() {
                return Some(format!(
                    "shard `{}` on {} devices where the config has `{}` on {}",
                    b.name,
                    b.devices.len(),
                    a.name,
                    a.devices.len()
                ));
            }
            if a.buffers == b.buffers {
                return None;
            }
            Some(match a.buffers.iter().zip(&b.buffers).find(|(x, y)| x != y) {
                Some((x, y)) if x.len != y.len => format!(
                    "buffer `{}` of shard `{}` has {} elements where the config has {}",
                    y.name, b.name, y.len, x.len
                ),
                Some((_, y)) => format!("buffer `{}` of shard `{}` differs from the config's", y.name, b.name),
                None => format!("shard `{}` has other buffers than the config's", b.name),
            })
        })
    };
    match what {
        Some(what) => Err(format!(
            "config `{cfg}` of {name} does not build the manifest's shards: {what}"
        )),
        None => Ok(()),
    }
}

/// [`check_claims`] of a state under its Hugging Face names: the config
/// names a transformers family, no catalog model is named, and the
/// configuration lays the tensors out as the family's plan does.
fn check_named_claims(
    m: &Manifest,
    layout: &Layout,
    config: Option<&ParallelConfig>,
) -> std::result::Result<(), String> {
    if m.model.is_some() || m.model_spec.is_some() {
        return Err(format!(
            "state `{NAMED_STATE}` keeps the files' names, but a catalog model is named"
        ));
    }
    let hf = m
        .hf_config
        .as_ref()
        .ok_or_else(|| format!("state `{NAMED_STATE}` without the hf_config that names its family"))?;
    let model_type = hf.get("model_type").and_then(|t| t.as_str()).unwrap_or("");
    let family = hf_family(model_type).ok_or_else(|| {
        format!(
            "hf_config: `{model_type}` is no causal-LM family of transformers {}",
            transformers_version()
        )
    })?;
    let Some(cfg) = config else {
        return Ok(());
    };
    let want = hf_layout(family, hf, layout.tensors().clone(), cfg).map_err(|e| format!("config `{cfg}`: {e}"))?;
    let same_devices = want.devices().collect::<BTreeSet<_>>() == layout.devices().collect::<BTreeSet<_>>();
    let same_shards = want.shards().len() == layout.shards().len()
        && want
            .shards()
            .iter()
            .zip(layout.shards())
            .all(|(a, b)| a.name == b.name && a.devices.len() == b.devices.len() && a.buffers == b.buffers);
    if !same_devices || !same_shards {
        return Err(format!(
            "config `{cfg}` does not lay out the tensors as the manifest's shards do ({model_type}'s plan)"
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
pub(crate) struct SavedOffsets {
    pub(crate) saved_offsets: Vec<u64>,
}

impl Checkpoint {
    /// Open a checkpoint directory and check its structure.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let mpath = dir.join(MANIFEST_FILE);
        if !dir.is_dir() {
            return Err(Error::file(dir, "not a directory"));
        }
        let bad = |what: String| Error::Manifest {
            path: mpath.clone(),
            what,
        };
        let len = fs::metadata(&mpath)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound && dir.join(INCOMPLETE_MARKER).exists() {
                    bad("missing: the directory is an incomplete write left by an interrupted tenplan run".into())
                } else if e.kind() == std::io::ErrorKind::NotFound {
                    bad("missing: the checkpoint is incomplete or not a tenplan checkpoint".into())
                } else {
                    Error::Io {
                        op: "read",
                        path: mpath.clone(),
                        source: e,
                    }
                }
            })?
            .len();
        if len > MAX_MANIFEST_BYTES {
            return Err(bad(format!("{len} bytes is too large")));
        }
        let text = fs::read_to_string(&mpath).map_err(Error::io("read", &mpath))?;
        let header: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let format = header.get("format").and_then(|v| v.as_str()).unwrap_or("");
        if format != CHECKPOINT_FORMAT {
            return Err(bad(format!("format is `{format}`, expected `{CHECKPOINT_FORMAT}`")));
        }
        let version = header.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version != u64::from(CHECKPOINT_VERSION) {
            return Err(bad(format!(
                "version {version} is not supported (this build reads version {CHECKPOINT_VERSION})"
            )));
        }
        let manifest: Manifest = serde_json::from_value(header).map_err(|e| bad(e.to_string()))?;
        let tensors: Arc<[TensorSpec]> = manifest
            .tensors
            .iter()
            .map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone()))
            .collect::<Vec<_>>()
            .into();
        let layout = Layout::new(tensors.clone(), manifest.shards.clone()).map_err(|e| bad(format!("layout: {e}")))?;
        check_claims(&manifest, &layout).map_err(bad)?;
        let devices: BTreeSet<DeviceId> = layout.devices().collect();
        let listed: BTreeSet<DeviceId> = manifest.files.iter().map(|f| f.device).collect();
        if listed != devices {
            return Err(bad(format!(
                "files are listed for devices {listed:?}, the layout has devices {devices:?}"
            )));
        }
        // A device may have part files besides its rank file; no file twice.
        let names: BTreeSet<&str> = manifest.files.iter().map(|f| f.file.as_str()).collect();
        if names.len() != manifest.files.len() {
            return Err(bad("a file is listed twice".into()));
        }
        let by_name: BTreeMap<&str, TensorId> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i as TensorId))
            .collect();
        let mut files = Vec::with_capacity(manifest.files.len());
        let mut handles = Vec::with_capacity(manifest.files.len());
        let mut entries: Vec<Vec<Stored>> = vec![Vec::new(); tensors.len()];
        for (fi, rec) in manifest.files.iter().enumerate() {
            if rec.file.contains(['/', '\\']) || rec.file.starts_with('.') {
                return Err(bad(format!("file name `{}` is not a plain name", rec.file)));
            }
            // A rank's files are named after it: a manifest that lists a
            // file under another rank would read its boxes as that rank's.
            let own = file_name(rec.device);
            let part = part_file_name(rec.device, 0);
            let part_prefix = part.strip_suffix("0.safetensors").unwrap_or(&part);
            let is_part = rec
                .file
                .strip_prefix(part_prefix)
                .and_then(|k| k.strip_suffix(".safetensors"))
                .is_some_and(|k| k.parse::<usize>().is_ok_and(|k| k > 0));
            if rec.file != own && !is_part {
                return Err(bad(format!(
                    "file `{}` is listed for rank {}, whose files are {own} and its part files",
                    rec.file, rec.device
                )));
            }
            let path = dir.join(&rec.file);
            let f = File::open(&path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Error::file(&path, format!("missing: the file of rank {} is not there", rec.device))
                } else {
                    Error::Io {
                        op: "open",
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
            let size = f.metadata().map_err(Error::io("read", &path))?.len();
            if size != rec.bytes {
                return Err(Error::file(
                    &path,
                    format!("{size} bytes, the manifest says {} (truncated or replaced?)", rec.bytes),
                ));
            }
            let m = map(&f).map_err(Error::io("map", &path))?;
            let (list, extra) = parse_safetensors(&path, &m)?;
            if list.len() as u64 != rec.entries {
                return Err(Error::file(
                    &path,
                    format!("{} entries, the manifest says {}", list.len(), rec.entries),
                ));
            }
            let info: BTreeMap<String, SavedOffsets> = match extra.get(DCP_SHARDING_INFO) {
                Some(s) => serde_json::from_str(s)
                    .map_err(|e| Error::file(&path, format!("{DCP_SHARDING_INFO} is not valid: {e}")))?,
                None if list.is_empty() => BTreeMap::new(),
                None => return Err(Error::file(&path, format!("no {DCP_SHARDING_INFO} in __metadata__"))),
            };
            for (key, dtype, shape, range) in list {
                let name = match by_name.get(key.as_str()) {
                    Some(_) => key.as_str(),
                    None => key.rsplit_once(PART_SEPARATOR).map_or(key.as_str(), |(n, _)| n),
                };
                let &t = by_name
                    .get(name)
                    .ok_or_else(|| Error::file(&path, format!("entry `{key}` is not a tensor of the manifest")))?;
                let spec = &tensors[t as usize];
                if dtype != spec.dtype {
                    return Err(Error::file(
                        &path,
                        format!("entry `{key}` is {dtype}, the manifest says {}", spec.dtype),
                    ));
                }
                let lo = &info
                    .get(&key)
                    .ok_or_else(|| Error::file(&path, format!("entry `{key}` has no saved_offsets")))?
                    .saved_offsets;
                let region = (lo.len() == shape.len() && lo.len() == spec.shape.len())
                    .then(|| Region::new(lo.iter().zip(&shape).map(|(&l, &s)| l..l.saturating_add(s))).ok())
                    .flatten()
                    .filter(|r| r.fits(&spec.shape) && !r.is_empty())
                    .ok_or_else(|| {
                        Error::file(
                            &path,
                            format!(
                                "entry `{key}` at offsets {lo:?} with shape {shape:?} does not fit tensor shape {:?}",
                                spec.shape
                            ),
                        )
                    })?;
                // The box must be one the listed rank holds.
                let held = layout
                    .sub_tensors(t)
                    .binary_search_by(|st| st.region.cmp(&region))
                    .ok()
                    .is_some_and(|i| layout.sub_tensors(t)[i].holders.contains(&rec.device));
                if !held {
                    return Err(Error::file(
                        &path,
                        format!(
                            "entry `{key}` is box {region:?}, which rank {} does not hold in the manifest's layout",
                            rec.device
                        ),
                    ));
                }
                entries[t as usize].push(Stored {
                    region,
                    file: fi,
                    range,
                });
            }
            files.push((path, m));
            handles.push(f);
        }
        for (t, list) in entries.iter_mut().enumerate() {
            list.sort_by(|a, b| a.region.cmp(&b.region));
            let want: Vec<&Region> = layout.sub_tensors(t as TensorId).iter().map(|s| &s.region).collect();
            let got: Vec<&Region> = list.iter().map(|s| &s.region).collect();
            if want != got {
                let name = tensors[t].name.clone();
                let what = if let Some(w) = got.windows(2).find(|w| w[0] == w[1]) {
                    format!("box {:?} is stored twice", w[0])
                } else if let Some(m) = want.iter().find(|r| !got.contains(r)) {
                    format!("box {m:?} is in no file (missing rank or entry)")
                } else {
                    let extra = got.iter().find(|r| !want.contains(r)).expect("lists differ");
                    format!("a file stores box {extra:?}, which the layout does not have")
                };
                return Err(Error::Coverage { tensor: name, what });
            }
        }
        Ok(Checkpoint {
            dir: dir.into(),
            manifest,
            layout,
            files,
            handles,
            entries,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The layout the checkpoint was written at.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The paths of the rank files.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// Ask the kernel to start reading every file now (asynchronous
    /// readahead), so that a cold read overlaps the disk with the copies.
    /// Every stored byte is needed by any reshard (each box is stored once),
    /// so this reads nothing superfluous.
    pub fn prefetch(&self) {
        for (_, m) in &self.files {
            // A hint: failure only costs speed.
            let _ = m.advise(memmap2::Advice::WillNeed);
        }
    }

    /// The stored boxes of one tensor, reading nothing yet (memory maps).
    pub fn boxes(&self, tensor: TensorId) -> Vec<SourceBox<'_>> {
        self.entries[tensor as usize]
            .iter()
            .map(|s| SourceBox {
                tensor,
                region: &s.region,
                data: &self.files[s.file].1[s.range.clone()],
                file: Some((&self.handles[s.file], s.range.start as u64)),
            })
            .collect()
    }

    /// The stored boxes of every tensor, in tensor order.
    pub fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>> {
        (0..self.entries.len() as TensorId).map(|t| self.boxes(t)).collect()
    }

    /// The manifest's digests, in tensor order.
    pub fn digests(&self) -> Vec<String> {
        self.manifest.tensors.iter().map(|t| t.digest.clone()).collect()
    }

    /// Read every tensor and compare its digest with the manifest's.
    /// Returns the bytes read.
    pub fn verify(&self) -> Result<u64> {
        let tensors = self.layout.tensors();
        let boxes = self.all_boxes();
        let bad = (0..tensors.len()).into_par_iter().find_map_first(|t| {
            let got = format_digest(tensor_digest(&tensors[t], &boxes[t]));
            (got != self.manifest.tensors[t].digest).then(|| Error::DigestMismatch {
                tensor: tensors[t].name.clone(),
                expected: self.manifest.tensors[t].digest.clone(),
                got,
            })
        });
        match bad {
            Some(e) => Err(e),
            None => Ok(tensors.iter().map(TensorSpec::bytes).sum()),
        }
    }
}
