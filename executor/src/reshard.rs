//! Verified plans performed on states stored in files: reshard into a new
//! tenplan checkpoint, or load the target state into memory.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use tenplan_ptc::{BoxCopy, DeviceId, Layout, Region, TensorId};

use tenplan_formats::checkpoint::{self, CheckpointInfo, StoredBox, Written};
use tenplan_formats::dcp::{DcpExtras, DcpWritten};
use tenplan_formats::Source;
use tenplan_ptc::box_io::read_into;
use tenplan_ptc::SourceBox;

use crate::host::piece_tasks;
use crate::{Error, HostMemory, Result, Verified};

/// What a reshard did.
#[derive(Clone, Debug, PartialEq)]
pub struct Resharded {
    /// The new checkpoint.
    pub written: Written,
    /// Bytes read from the source files (tensor data; headers excluded).
    pub bytes_read: u64,
}

fn check_source(verified: &Verified<'_>, source: &dyn Source) -> Result<()> {
    if verified.plan().problem.source() != source.layout() {
        return Err(Error::PlanMismatch {
            what: format!(
                "the plan's source layout is not the layout of {}",
                source.location().display()
            ),
        });
    }
    Ok(())
}

/// The copies into each target piece, keyed by (device, tensor, piece box).
fn copies_by_piece<'p>(
    copies: &'p [BoxCopy],
    target: &'p Layout,
) -> HashMap<(DeviceId, TensorId, &'p Region), Vec<&'p BoxCopy>> {
    let mut by: HashMap<(DeviceId, TensorId, &Region), Vec<&BoxCopy>> = HashMap::new();
    for c in copies {
        for w in c.writes() {
            let piece = target
                .piece_at(w.dst, w.buffer, w.offset, c.tensor)
                .expect("verified: the target piece exists");
            by.entry((w.dst, c.tensor, &piece.region)).or_default().push(c);
        }
    }
    by
}

/// A verified plan reading its source from files: it fills any box of the
/// target state (a box one target device stores, or a slab of it) from the
/// plan's copies into that device, each reading its box from the source
/// files through memory maps. What a checkpoint writer of any format calls
/// for every box it stores.
pub struct PlanReader<'a> {
    target: &'a Layout,
    by_piece: HashMap<(DeviceId, TensorId, &'a Region), Vec<&'a BoxCopy>>,
    boxes: Vec<Vec<SourceBox<'a>>>,
    read: AtomicU64,
}

impl<'a> PlanReader<'a> {
    /// The reader of `verified`'s plan over `source` (whose layout must be
    /// the plan's source layout).
    pub fn new(verified: &'a Verified<'a>, source: &'a dyn Source) -> Result<PlanReader<'a>> {
        check_source(verified, source)?;
        let plan = verified.plan();
        let target = plan.problem.target();
        source.prefetch();
        Ok(PlanReader {
            target,
            by_piece: copies_by_piece(&plan.copies, target),
            boxes: source.all_boxes(),
            read: AtomicU64::new(0),
        })
    }

    /// Fill `slab` (inside the box `stored` of the target state, on its
    /// device) row-major into `bytes`.
    pub fn fill(&self, stored: &StoredBox, slab: &Region, bytes: &mut [u8]) -> tenplan_formats::Result<()> {
        let target = self.target;
        let elem = target.tensors()[stored.tensor as usize].dtype.size() as usize;
        // A stored box is a sub-tensor: the piece holding it on its device is
        // the same box, or larger where replicas are cut differently.
        let copies = self
            .by_piece
            .get(&(stored.device, stored.tensor, &stored.region))
            .or_else(|| {
                let (_, piece) = target
                    .pieces_of(stored.device, stored.tensor)
                    .into_iter()
                    .find(|(_, p)| p.region.contains(&stored.region))?;
                self.by_piece.get(&(stored.device, stored.tensor, &piece.region))
            })
            .ok_or_else(|| {
                tenplan_formats::Error::Fill(
                    Error::PlanMismatch {
                        what: format!("no copy writes box {:?} of tensor {}", stored.region, stored.tensor),
                    }
                    .to_string(),
                )
            })?;
        let mut n = 0;
        for c in copies {
            if let Some(part) = c.region.intersect(slab) {
                n += read_into(&self.boxes[stored.tensor as usize], &part, bytes, slab, elem);
            }
        }
        self.read.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Bytes read from the source files so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
}

/// Perform a verified plan whose source is stored in files, writing the
/// target state as a new tenplan checkpoint in `out`. Each target box is
/// stored once (by the holder [`checkpoint::storage_assignment`] picks) and
/// filled by the plan's copies into that holder ([`PlanReader`]): every byte
/// of the new checkpoint is read once, and no other byte is read. The
/// digests of the new files must equal the source's where it records them.
pub fn reshard(
    verified: &Verified<'_>,
    source: &dyn Source,
    out: &Path,
    info: &CheckpointInfo,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Resharded> {
    let target = verified.plan().problem.target();
    let reader = PlanReader::new(verified, source)?;
    let digests = source.digests();
    let written = checkpoint::write(
        out,
        target,
        info,
        digests.as_deref(),
        |b, slab, bytes| reader.fill(b, slab, bytes),
        progress,
    )?;
    Ok(Resharded {
        written,
        bytes_read: reader.bytes_read(),
    })
}

/// Perform a verified plan whose source is stored in files, writing the
/// target state as a new PyTorch DCP checkpoint in `out` (the tensors keep
/// their names; `extras` carries what is not a tensor): what `dcp.load`
/// reads back into a job on the target's mesh. Returns what was written and
/// the bytes read.
pub fn reshard_to_dcp(
    verified: &Verified<'_>,
    source: &dyn Source,
    out: &Path,
    extras: &DcpExtras,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(DcpWritten, u64)> {
    let target = verified.plan().problem.target();
    let reader = PlanReader::new(verified, source)?;
    let written = tenplan_formats::dcp::write(
        out,
        target,
        extras,
        |b, slab, bytes| reader.fill(b, slab, bytes),
        progress,
    )?;
    Ok((written, reader.bytes_read()))
}

/// Perform a verified plan whose source is a checkpoint, loading the target
/// state into host memory (what a training job restarting at the new layout
/// needs): every target device's buffers, padding zeroed. Reads only the
/// boxes the plan copies, through memory maps.
pub fn load(verified: &Verified<'_>, source: &dyn Source) -> Result<(HostMemory, u64)> {
    check_source(verified, source)?;
    let plan = verified.plan();
    let target = plan.problem.target();
    let tensors = target.tensors();
    source.prefetch();
    let boxes: Vec<Vec<SourceBox<'_>>> = source.all_boxes();
    let mut memory = HostMemory::zeroed(target);
    let read = AtomicU64::new(0);
    let tasks = piece_tasks(&mut memory, plan);
    tasks.into_par_iter().for_each(|(bytes, piece, copies)| {
        let (region, t) = (&piece.region, piece.tensor as usize);
        let elem = tensors[t].dtype.size() as usize;
        let mut n = 0;
        for c in copies {
            n += read_into(&boxes[t], &c.region, bytes, region, elem);
        }
        read.fetch_add(n, Ordering::Relaxed);
    });
    Ok((memory, read.into_inner()))
}
