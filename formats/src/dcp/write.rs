//! Writing a state as a PyTorch DCP checkpoint, in the format DCP's
//! default `FileSystemWriter` writes and its default `FileSystemReader`
//! loads (`dcp.load(state_dict, checkpoint_id=DIR)`): one
//! `__<rank>_0.distcp` file per device of the layout, each stored box of
//! each tensor a `torch.save` archive in it (a box several devices hold is
//! stored once, as DCP's deduplication does), the entries that are not
//! tensors as their pickled bytes, and `.metadata` last: every tensor's
//! element type, size and chunks, where each chunk is stored, and the
//! state dict's nesting. Files are written atomically and streamed (memory
//! stays at two batches whatever their size); the directory holds the
//! incomplete-write marker until `.metadata` is in place.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use tenplan_ptc::{DType, DeviceId, Layout, Region, TensorId, TensorSpec};

use super::torch_save::{storage_class, TensorArchive};
use super::METADATA_FILE;
use crate::checkpoint::{
    create_new_dir, main_replica_assignment, slabs, storage_assignment, sync_dir, write_atomic, StoredBox,
    INCOMPLETE_MARKER,
};
use crate::pickle_writer::PickleWriter;
use crate::stream::{write_files, OutFile};
use crate::{Error, Result};

/// One step of a path into a nested state dict: a key, or a list index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathPart {
    /// A dict key.
    Key(String),
    /// A list index (an optimizer's `param_groups`).
    Index(i64),
}

/// What a DCP checkpoint holds besides its tensors' elements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DcpExtras {
    /// Tensors saved with no dimension (an optimizer's `step`), which the
    /// layout holds as one element each.
    pub scalars: BTreeSet<String>,
    /// The entries that are not tensors (learning rates, `param_groups`,
    /// `_extra_state` objects), by name: their pickled bytes, carried as
    /// they are.
    pub others: BTreeMap<String, Vec<u8>>,
    /// Each key's path in the nested state dict it was flattened from (what
    /// DCP's planner records); a key missing here is its own one-step path.
    pub planner_data: BTreeMap<String, Vec<PathPart>>,
    /// Files written beside the DCP files, byte for byte, before the
    /// metadata (a Megatron-Core checkpoint's `metadata.json` and
    /// `common.pt`), by name.
    pub side_files: BTreeMap<String, Vec<u8>>,
    /// Tensors saved as a slice of a larger one, by the layout's name:
    /// Megatron-Core stacks a block's layers (see [`SavedAs`]).
    pub saved_as: BTreeMap<String, SavedAs>,
    /// Saved tensors the metadata names a second time, by their saved
    /// name: the second name's chunks are the same bytes of the same files
    /// (an fp32 Megatron model's weights are its distributed optimizer's
    /// main parameters, `optimizer.state.param.<name>`).
    pub mirrors: BTreeMap<String, String>,
    /// Each box a replicated tensor has is stored by its lowest-numbered
    /// holder, as Megatron-Core's main replica saves (its files then tell
    /// the parallel configuration), rather than spread over the holders
    /// as DCP's deduplication spreads them.
    pub main_replica_only: bool,
    /// Tensors written whole with the given elements, not from the
    /// layout's state (a PyTorch optimizer's per-parameter `step`, made
    /// from a checkpoint that keeps one step for all), by name.
    pub literals: BTreeMap<String, Literal>,
}

/// A tensor written with given elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Literal {
    /// Its element type.
    pub dtype: DType,
    /// Its shape (`[]` for a 0-d tensor).
    pub shape: Vec<u64>,
    /// Its elements, row-major, little-endian.
    pub data: Vec<u8>,
}

/// Where a tensor of the layout is saved: at fixed indices of the leading
/// axes of a larger saved tensor (Megatron-Core's
/// `decoder.layers.self_attention.linear_qkv.weight` of shape `[L, ...]`
/// holds layer 3's tensor at index 3), from a row of the saved tensor's
/// next axis on (a transformers 5 MoE layer's `experts.gate_up_proj` of
/// shape `[E, 2F, H]` holds expert 3's `up_proj` at index 3 from row F).
/// Each of its chunks is saved with those leading axes, of size one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedAs {
    /// The saved tensor's name.
    pub name: String,
    /// The indices on its leading axes.
    pub lead: Vec<u64>,
    /// The saved tensor's row (on the axis after `lead`) where the
    /// tensor's first row lies.
    pub row0: u64,
    /// Its global shape: the leading axes, then the shape of the rest,
    /// which holds the tensor from `row0` on.
    pub shape: Vec<u64>,
}

/// What a DCP write did.
#[derive(Clone, Debug, PartialEq)]
pub struct DcpWritten {
    /// The data files, in order.
    pub files: Vec<String>,
    /// Tensors written.
    pub tensors: usize,
    /// Chunks written (stored boxes).
    pub chunks: usize,
    /// Entries that are not tensors, written.
    pub others: usize,
    /// Bytes of tensor data written.
    pub data_bytes: u64,
    /// Bytes of the data files (archives and other entries included).
    pub file_bytes: u64,
}

/// A data file's name.
fn file_name(device: DeviceId) -> String {
    format!("__{device}_0.distcp")
}

/// One item of a data file: literal bytes, or a slab of a stored box.
enum Item {
    Literal(Vec<u8>),
    Slab { stored: usize, slab: Region, index: usize },
}

/// Where a stored box's archive is: its file, its byte range, the slabs
/// its data is filled in, and the two offsets of its CRC.
struct Placed {
    file: usize,
    start: u64,
    len: u64,
    slabs: std::ops::Range<usize>,
    crc_at: [u64; 2],
}

/// Write `layout`'s state into the new directory `out` as a DCP
/// checkpoint. `fill(stored, slab, bytes)` writes the elements of `slab`
/// row-major into `bytes`, in parallel on disjoint slabs (as for
/// [`crate::checkpoint::write`]); `progress` gets the byte count of every
/// filled slab. The tensors keep the layout's names; `extras` gives the
/// 0-d tensors, the other entries and the nesting. On any error the
/// directory is removed.
pub fn write<F>(
    out: &Path,
    layout: &Layout,
    extras: &DcpExtras,
    fill: F,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<DcpWritten>
where
    F: Fn(&StoredBox, &Region, &mut [u8]) -> Result<()> + Sync,
{
    let tensors = layout.tensors();
    if let Some(t) = (0..tensors.len() as TensorId).find(|&t| layout.is_partial(t)) {
        return Err(Error::Partial {
            tensor: tensors[t as usize].name.clone(),
            what: "reduce it before checkpointing",
        });
    }
    if let Some(t) = tensors.iter().find(|t| storage_class(t.dtype).is_none()) {
        return Err(Error::File {
            path: out.into(),
            what: format!(
                "tensor `{}` is {}, which DCP's torch.save format cannot hold here",
                t.name, t.dtype
            ),
        });
    }
    if let Some(t) = tensors
        .iter()
        .find(|t| extras.scalars.contains(&t.name) && t.shape != [1])
    {
        return Err(Error::File {
            path: out.into(),
            what: format!("tensor `{}` of shape {:?} is marked 0-d", t.name, t.shape),
        });
    }
    if let Some((name, _)) = extras.literals.iter().find(|(name, l)| {
        TensorArchive::whole(l.dtype, &l.shape, &l.data).is_none() || tensors.iter().any(|t| &t.name == *name)
    }) {
        return Err(Error::File {
            path: out.into(),
            what: format!("tensor `{name}` given by value is of another size than its shape, or of the state too"),
        });
    }
    create_new_dir(out)?;
    let result = write_into(out, layout, extras, &fill, progress);
    if result.is_err() {
        // We created the directory, so it holds nothing of anybody else's.
        let _ = fs::remove_dir_all(out);
    }
    result
}

/// Fills a stored box's region of a tensor into a buffer.
type FillBox<'a> = dyn Fn(&StoredBox, &Region, &mut [u8]) -> Result<()> + Sync + 'a;

fn write_into(
    out: &Path,
    layout: &Layout,
    extras: &DcpExtras,
    fill: &FillBox<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<DcpWritten> {
    let tensors = layout.tensors();
    let assignment = match extras.main_replica_only {
        true => main_replica_assignment(layout),
        false => storage_assignment(layout),
    };
    let mut files: Vec<OutFile<Item>> = Vec::new();
    let mut stored: Vec<StoredBox> = Vec::new();
    let mut placed: Vec<Placed> = Vec::new();
    let mut slab_count = 0;
    // Entries that are not tensors, and tensors given by value, go to the
    // first file, before its tensors.
    let mut other_at: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    let mut literal_at: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for (fi, (device, boxes)) in assignment.into_iter().enumerate() {
        let mut items = Vec::new();
        let mut at = 0u64;
        if fi == 0 {
            for (name, bytes) in &extras.others {
                other_at.insert(name, (fi, at, bytes.len() as u64));
                at += bytes.len() as u64;
                items.push((Item::Literal(bytes.clone()), bytes.len()));
            }
            for (name, l) in &extras.literals {
                let bytes = TensorArchive::whole(l.dtype, &l.shape, &l.data).expect("checked before");
                literal_at.insert(name, (fi, at, bytes.len() as u64));
                at += bytes.len() as u64;
                let n = bytes.len();
                items.push((Item::Literal(bytes), n));
            }
        }
        for b in boxes {
            let spec = &tensors[b.tensor as usize];
            let shape = saved_box(extras, spec, &b.region).1;
            let archive = TensorArchive::new(spec.dtype, &shape).expect("element types checked before");
            let start = at;
            let first_slab = slab_count;
            items.push((Item::Literal(archive.prefix.clone()), archive.prefix.len()));
            let elem = spec.dtype.size();
            let stored_index = stored.len();
            for slab in slabs(&b.region, elem) {
                let n = (slab.volume() * elem) as usize;
                items.push((
                    Item::Slab {
                        stored: stored_index,
                        slab,
                        index: slab_count,
                    },
                    n,
                ));
                slab_count += 1;
            }
            items.push((Item::Literal(archive.suffix.clone()), archive.suffix.len()));
            at += archive.len();
            placed.push(Placed {
                file: fi,
                start,
                len: archive.len(),
                slabs: first_slab..slab_count,
                crc_at: archive.crc_at.map(|c| start + c),
            });
            stored.push(b);
        }
        files.push(OutFile {
            name: file_name(device),
            header: Vec::new(),
            items,
        });
    }
    // Each slab's CRC-32, combined per archive once the data is written.
    let crcs: Vec<Mutex<Option<crc32fast::Hasher>>> = (0..slab_count).map(|_| Mutex::new(None)).collect();
    let data_bytes: u64 = stored
        .iter()
        .map(|b| b.region.volume() * tensors[b.tensor as usize].dtype.size())
        .sum();
    write_files(
        out,
        &files,
        &|item, bytes| match item {
            Item::Literal(b) => {
                bytes.copy_from_slice(b);
                Ok(())
            }
            Item::Slab { stored: s, slab, index } => {
                fill(&stored[*s], slab, bytes)?;
                let mut h = crc32fast::Hasher::new();
                h.update(bytes);
                *crcs[*index].lock().expect("no poisoning") = Some(h);
                Ok(())
            }
        },
        &|n| progress(n),
    )?;
    // The data's CRCs into each archive's two CRC fields.
    let mut handles = Vec::with_capacity(files.len());
    for f in &files {
        let path = out.join(&f.name);
        handles.push(
            OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(Error::io("open", &path))?,
        );
    }
    let mut crcs: Vec<Option<crc32fast::Hasher>> = crcs
        .into_iter()
        .map(|m| m.into_inner().expect("no poisoning"))
        .collect();
    for p in &placed {
        let mut whole = crc32fast::Hasher::new();
        for s in p.slabs.clone() {
            whole.combine(&crcs[s].take().expect("every slab was filled"));
        }
        let crc = whole.finalize().to_le_bytes();
        let path = out.join(&files[p.file].name);
        for at in p.crc_at {
            handles[p.file]
                .write_all_at(&crc, at)
                .map_err(Error::io("write", &path))?;
        }
    }
    for (h, f) in handles.iter().zip(&files) {
        h.sync_all().map_err(Error::io("sync", out.join(&f.name)))?;
    }
    for (name, bytes) in &extras.side_files {
        write_atomic(out, name, bytes)?;
    }
    // The metadata, last.
    let mut chunks: BTreeMap<TensorId, Vec<(usize, &StoredBox)>> = BTreeMap::new();
    for (i, b) in stored.iter().enumerate() {
        chunks.entry(b.tensor).or_default().push((i, b));
    }
    let meta = metadata(layout, extras, &chunks, &placed, &files, &other_at, &literal_at);
    write_atomic(out, METADATA_FILE, &meta)?;
    fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(Error::io("remove", out.join(INCOMPLETE_MARKER)))?;
    sync_dir(out)?;
    Ok(DcpWritten {
        files: files.iter().map(|f| f.name.clone()).collect(),
        tensors: tensors.len() + literal_at.len(),
        chunks: stored.len() + literal_at.len(),
        others: extras.others.len(),
        data_bytes,
        file_bytes: files.iter().map(|f| f.bytes()).sum(),
    })
}

/// The offsets and sizes a stored box of `spec` is saved with: a 0-d
/// tensor's none, a stacked tensor's leading indices (sizes one) first.
fn saved_box(extras: &DcpExtras, spec: &TensorSpec, region: &Region) -> (Vec<u64>, Vec<u64>) {
    match extras.saved_as.get(&spec.name) {
        Some(s) => {
            let mut lo = region.lo();
            if let Some(first) = lo.first_mut() {
                *first += s.row0;
            }
            (
                s.lead.iter().copied().chain(lo).collect(),
                s.lead.iter().map(|_| 1).chain(region.shape()).collect(),
            )
        }
        None if extras.scalars.contains(&spec.name) => (Vec::new(), Vec::new()),
        None => (region.lo(), region.shape()),
    }
}

/// `torch.Size(dims)`.
fn torch_size(w: &mut PickleWriter, dims: &[u64]) {
    w.global("torch", "Size").mark().int_tuple(dims).tuple().reduce();
}

/// The name of an element type's `torch` dtype.
fn torch_dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::I64 => "int64",
        DType::I32 => "int32",
        _ => "uint8",
    }
}

const META: &str = "torch.distributed.checkpoint.metadata";

/// `.metadata`: DCP's `Metadata`, pickled as Python pickles its dataclasses.
fn metadata(
    layout: &Layout,
    extras: &DcpExtras,
    chunks: &BTreeMap<TensorId, Vec<(usize, &StoredBox)>>,
    placed: &[Placed],
    files: &[OutFile<Item>],
    other_at: &BTreeMap<&str, (usize, u64, u64)>,
    literal_at: &BTreeMap<&str, (usize, u64, u64)>,
) -> Vec<u8> {
    let tensors = layout.tensors();
    // The saved tensors, in the order their first chunk's tensor comes:
    // name, element type, global size, and each chunk (where it is
    // stored: file, start, length; offsets and sizes).
    type Chunk = ((usize, u64, u64), Vec<u64>, Vec<u64>);
    let mut entries: Vec<(String, DType, Vec<u64>, Vec<Chunk>)> = Vec::new();
    let mut entry_of: BTreeMap<String, usize> = BTreeMap::new();
    for (t, list) in chunks {
        let spec = &tensors[*t as usize];
        let (name, size) = match extras.saved_as.get(&spec.name) {
            Some(s) => (s.name.clone(), s.shape.clone()),
            None if extras.scalars.contains(&spec.name) => (spec.name.clone(), Vec::new()),
            None => (spec.name.clone(), spec.shape.clone()),
        };
        let e = *entry_of.entry(name.clone()).or_insert_with(|| {
            entries.push((name, spec.dtype, size, Vec::new()));
            entries.len() - 1
        });
        for (i, b) in list {
            let (lo, shape) = saved_box(extras, spec, &b.region);
            let p = &placed[*i];
            entries[e].3.push(((p.file, p.start, p.len), lo, shape));
        }
    }
    for (name, &at) in literal_at {
        let l = &extras.literals[*name];
        let lo = vec![0; l.shape.len()];
        entries.push((
            name.to_string(),
            l.dtype,
            l.shape.clone(),
            vec![(at, lo, l.shape.clone())],
        ));
    }
    let mirrored: Vec<_> = entries
        .iter()
        .filter_map(|(name, dtype, size, list)| {
            Some((extras.mirrors.get(name)?.clone(), *dtype, size.clone(), list.clone()))
        })
        .collect();
    entries.extend(mirrored);
    let mut w = PickleWriter::new(3);
    w.instance(
        META,
        "Metadata",
        &[
            "state_dict_metadata",
            "planner_data",
            "storage_data",
            "storage_meta",
            "version",
        ],
        |w, field| match field {
            "state_dict_metadata" => {
                w.empty_dict().mark();
                for name in extras.others.keys() {
                    w.str(name);
                    w.global(META, "BytesStorageMetadata").mark().tuple().newobj();
                }
                for (name, dtype, size, list) in &entries {
                    w.str(name);
                    w.instance(
                        META,
                        "TensorStorageMetadata",
                        &["properties", "size", "chunks"],
                        |w, f| match f {
                            "properties" => {
                                // TensorProperties pickles its state as a tuple:
                                // dtype, layout, requires_grad, memory format, pin_memory.
                                w.global(META, "TensorProperties").mark().tuple().newobj();
                                w.mark();
                                w.global("torch", torch_dtype_name(*dtype));
                                w.global("torch.serialization", "_get_layout")
                                    .mark()
                                    .str("torch.strided")
                                    .tuple()
                                    .reduce();
                                w.bool(false);
                                w.global(META, "_MEM_FORMAT_ENCODING").mark().int(0).tuple().reduce();
                                w.bool(false);
                                w.tuple().build();
                            }
                            "size" => torch_size(w, size),
                            _ => {
                                w.empty_list().mark();
                                for (_, lo, shape) in list {
                                    w.instance(META, "ChunkStorageMetadata", &["offsets", "sizes"], |w, f| {
                                        torch_size(w, if f == "offsets" { lo } else { shape });
                                    });
                                }
                                w.appends();
                            }
                        },
                    );
                }
                w.set_items();
            }
            "planner_data" => {
                w.empty_dict().mark();
                let names = extras.others.keys().cloned().chain(entries.iter().map(|e| e.0.clone()));
                for name in names {
                    w.str(&name).mark();
                    match extras.planner_data.get(&name) {
                        Some(path) => {
                            for p in path {
                                match p {
                                    PathPart::Key(k) => w.str(k),
                                    PathPart::Index(i) => w.int(*i),
                                };
                            }
                        }
                        None => {
                            w.str(&name);
                        }
                    }
                    w.tuple();
                }
                w.set_items();
            }
            "storage_data" => {
                w.empty_dict().mark();
                let info = |w: &mut PickleWriter, file: usize, offset: u64, length: u64| {
                    w.instance(
                        "torch.distributed.checkpoint.filesystem",
                        "_StorageInfo",
                        &["relative_path", "offset", "length"],
                        |w, f| match f {
                            "relative_path" => {
                                w.str(&files[file].name);
                            }
                            "offset" => {
                                w.int(offset as i64);
                            }
                            _ => {
                                w.int(length as i64);
                            }
                        },
                    );
                };
                for (name, &(file, offset, length)) in other_at {
                    w.instance(META, "MetadataIndex", &["fqn", "offset", "index"], |w, f| match f {
                        "fqn" => {
                            w.str(name);
                        }
                        _ => {
                            w.none();
                        }
                    });
                    info(&mut *w, file, offset, length);
                }
                for (name, _, _, list) in &entries {
                    for (k, ((file, start, len), lo, _)) in list.iter().enumerate() {
                        w.instance(META, "MetadataIndex", &["fqn", "offset", "index"], |w, f| match f {
                            "fqn" => {
                                w.str(name);
                            }
                            "offset" => torch_size(w, lo),
                            _ => {
                                w.int(k as i64);
                            }
                        });
                        info(&mut *w, *file, *start, *len);
                    }
                }
                w.set_items();
            }
            "storage_meta" => {
                w.none();
            }
            _ => {
                w.str("1.0.0");
            }
        },
    );
    w.finish()
}
