//! Verified plans performed on checkpoints: reshard into a new checkpoint, or
//! load the target state into memory.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use tenplan_ptc::{Copy, DeviceId, Layout, Region, TensorId};

use crate::checkpoint::{self, Checkpoint, CheckpointInfo, Written};
use crate::fill::read_into;
use crate::host::piece_tasks;
use crate::{Error, HostMemory, Result, SourceBox, Verified};

/// What a reshard did.
#[derive(Clone, Debug, PartialEq)]
pub struct Resharded {
    /// The new checkpoint.
    pub written: Written,
    /// Bytes read from the source files (tensor data; headers excluded).
    pub bytes_read: u64,
}

/// A state stored in files that a verified plan reads from: a tenplan
/// [`Checkpoint`], or a PyTorch DCP checkpoint mapped onto a model
/// ([`crate::dcp::DcpSource`]).
pub trait Source: Sync {
    /// Where it is stored (for messages).
    fn location(&self) -> &Path;
    /// Its layout: the source layout of the plans that read it.
    fn layout(&self) -> &Layout;
    /// The stored boxes of every tensor, in tensor order (memory maps;
    /// nothing is read yet).
    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>>;
    /// Ask the kernel to start reading what every reshard reads.
    fn prefetch(&self);
    /// The digests the state records, in tensor order, when it records
    /// them: what a reshard's output must match.
    fn digests(&self) -> Option<Vec<String>>;
}

impl Source for Checkpoint {
    fn location(&self) -> &Path {
        self.dir()
    }

    fn layout(&self) -> &Layout {
        Checkpoint::layout(self)
    }

    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>> {
        Checkpoint::all_boxes(self)
    }

    fn prefetch(&self) {
        Checkpoint::prefetch(self)
    }

    fn digests(&self) -> Option<Vec<String>> {
        Some(Checkpoint::digests(self))
    }
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
    copies: &'p [Copy],
    target: &'p Layout,
) -> HashMap<(DeviceId, TensorId, &'p Region), Vec<&'p Copy>> {
    let mut by: HashMap<(DeviceId, TensorId, &Region), Vec<&Copy>> = HashMap::new();
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

/// Perform a verified plan whose source is stored in files, writing the
/// target state as a new checkpoint in `out`. Each target box is stored once (by
/// the holder [`checkpoint::storage_assignment`] picks) and filled by the
/// plan's copies into that holder, each reading its box from the source files
/// through memory maps: every byte of the new checkpoint is read once, and no
/// other byte is read. The digests of the new files must equal the source's
/// where it records them.
pub fn reshard(
    verified: &Verified<'_>,
    source: &dyn Source,
    out: &Path,
    info: &CheckpointInfo,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Resharded> {
    check_source(verified, source)?;
    let plan = verified.plan();
    let target = plan.problem.target();
    let tensors = target.tensors();
    let by_piece = copies_by_piece(&plan.copies, target);
    source.prefetch();
    let boxes = source.all_boxes();
    let read = AtomicU64::new(0);
    let fill = |b: &checkpoint::StoredBox, slab: &Region, bytes: &mut [u8]| -> Result<()> {
        let elem = tensors[b.tensor as usize].dtype.size() as usize;
        // A stored box is a sub-tensor: the piece holding it on its device is
        // the same box, or larger where replicas are cut differently.
        let copies = by_piece
            .get(&(b.device, b.tensor, &b.region))
            .or_else(|| {
                let (_, piece) = target
                    .pieces_of(b.device, b.tensor)
                    .into_iter()
                    .find(|(_, p)| p.region.contains(&b.region))?;
                by_piece.get(&(b.device, b.tensor, &piece.region))
            })
            .ok_or_else(|| Error::PlanMismatch {
                what: format!("no copy writes box {:?} of tensor {}", b.region, b.tensor),
            })?;
        let mut n = 0;
        for c in copies {
            if let Some(part) = c.region.intersect(slab) {
                n += read_into(&boxes[b.tensor as usize], &part, bytes, slab, elem);
            }
        }
        read.fetch_add(n, Ordering::Relaxed);
        Ok(())
    };
    let digests = source.digests();
    let written = checkpoint::write(out, target, info, digests.as_deref(), fill, progress)?;
    Ok(Resharded {
        written,
        bytes_read: read.into_inner(),
    })
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
