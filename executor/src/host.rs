//! Devices as byte buffers in one process.

use std::collections::{BTreeMap, HashMap};

use rayon::prelude::*;
use tenplan_ptc::{BoxCopy, DeviceId, Layout, Piece, TensorId};

use tenplan_ptc::{add_box, copy_box};

use crate::{Error, HostBuffer, Result, Verified};

/// The buffers of the devices of a layout, as bytes in host memory.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HostMemory {
    devices: BTreeMap<DeviceId, DeviceBuffers>,
}

/// One device's buffers, laid end to end in one allocation: a layout has a
/// buffer per tensor (hundreds per device, many under a huge page), and one
/// large allocation takes huge pages where hundreds of small ones would
/// fault in 4 KiB at a time (a load's page faults cost more than its
/// copies otherwise: see `tenplan-bench executor`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct DeviceBuffers {
    bytes: HostBuffer,
    /// Each buffer's bytes in `bytes`, in order, starting on [`ALIGN`].
    ranges: Vec<std::ops::Range<usize>>,
}

/// Where each buffer starts in a device's allocation: a cache line, which
/// also aligns every element type.
const ALIGN: usize = 64;

impl DeviceBuffers {
    /// Zeroed buffers of the given sizes.
    fn zeroed(sizes: impl IntoIterator<Item = usize>) -> DeviceBuffers {
        let mut ranges = Vec::new();
        let mut end = 0usize;
        for len in sizes {
            let start = end.next_multiple_of(ALIGN);
            ranges.push(start..start + len);
            end = start + len;
        }
        DeviceBuffers {
            bytes: HostBuffer::zeroed(end),
            ranges,
        }
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        self.ranges.get(i).map(|r| &self.bytes[r.clone()])
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        self.ranges.get(i).map(|r| &mut self.bytes[r.clone()])
    }

    /// Every buffer, to write, at once.
    fn split_mut(&mut self) -> Vec<&mut [u8]> {
        let mut rest: &mut [u8] = &mut self.bytes;
        let mut at = 0;
        let mut out = Vec::with_capacity(self.ranges.len());
        for r in &self.ranges {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - at);
            let (here, after) = tail.split_at_mut(r.len());
            out.push(here);
            rest = after;
            at = r.end;
        }
        out
    }
}

impl std::ops::Index<usize> for DeviceBuffers {
    type Output = [u8];
    fn index(&self, i: usize) -> &[u8] {
        &self.bytes[self.ranges[i].clone()]
    }
}

impl HostMemory {
    /// Zeroed buffers for every device of a layout.
    pub fn zeroed(layout: &Layout) -> HostMemory {
        let mut devices = BTreeMap::new();
        for shard in layout.shards() {
            for &d in &shard.devices {
                devices.insert(
                    d,
                    DeviceBuffers::zeroed(shard.buffers.iter().map(|b| b.bytes() as usize)),
                );
            }
        }
        HostMemory { devices }
    }

    /// Wrap existing buffers, checking them against the layout: every device
    /// given must hold its shard's buffers at their exact sizes.
    pub fn from_buffers(layout: &Layout, devices: BTreeMap<DeviceId, Vec<Vec<u8>>>) -> Result<HostMemory> {
        for (&d, bufs) in &devices {
            let shard = layout.shard_of(d).ok_or(Error::MissingDevice { device: d })?;
            for (i, b) in shard.buffers.iter().enumerate() {
                let got = bufs.get(i).map_or(0, |v| v.len() as u64);
                if got != b.bytes() || bufs.len() != shard.buffers.len() {
                    return Err(Error::BufferSize {
                        device: d,
                        buffer: b.name.clone(),
                        expected: b.bytes(),
                        got,
                    });
                }
            }
        }
        Ok(HostMemory {
            devices: devices
                .into_iter()
                .map(|(d, bufs)| {
                    let mut mine = DeviceBuffers::zeroed(bufs.iter().map(Vec::len));
                    for (to, from) in mine.split_mut().into_iter().zip(&bufs) {
                        to.copy_from_slice(from);
                    }
                    (d, mine)
                })
                .collect(),
        })
    }

    /// These buffers, laid out as `from`, with every element converted to
    /// the element type of the matching buffer of `to`: a layout that
    /// differs from `from` in element types alone (the trainer's fp32
    /// weights as the bf16 a weight sync sends; see
    /// `tenplan_application::SyncRequest::trainer_dtype`). Floating-point
    /// types only, rounded to nearest even ([`tenplan_ptc::DType::convert`]).
    pub fn converted(&self, from: &Layout, to: &Layout) -> Result<HostMemory> {
        let mut devices = BTreeMap::new();
        for (&d, bufs) in &self.devices {
            let (a, b) = (from.shard_of(d), to.shard_of(d));
            let (Some(a), Some(b)) = (a, b) else {
                return Err(Error::MissingDevice { device: d });
            };
            if a.buffers.len() != b.buffers.len() || a.buffers.len() != bufs.ranges.len() {
                return Err(Error::Conversion {
                    device: d,
                    buffer: a.name.clone(),
                    what: format!("{} buffers to {}", a.buffers.len(), b.buffers.len()),
                });
            }
            let mut out = DeviceBuffers::zeroed(b.buffers.iter().map(|x| x.bytes() as usize));
            for (i, dst) in out.split_mut().into_iter().enumerate() {
                let (x, y) = (&a.buffers[i], &b.buffers[i]);
                let bad = |what: String| Error::Conversion {
                    device: d,
                    buffer: x.name.clone(),
                    what,
                };
                if x.len != y.len || x.pieces != y.pieces {
                    return Err(bad(format!("to buffer `{}`, whose pieces differ", y.name)));
                }
                if !x.dtype.convert(y.dtype, &bufs[i], dst) {
                    return Err(bad(format!("{} to {} (floating-point types only)", x.dtype, y.dtype)));
                }
            }
            devices.insert(d, out);
        }
        Ok(HostMemory { devices })
    }

    /// The devices held.
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + '_ {
        self.devices.keys().copied()
    }

    /// One buffer of one device.
    pub fn buffer(&self, device: DeviceId, buffer: usize) -> Option<&[u8]> {
        self.devices.get(&device).and_then(|b| b.get(buffer))
    }

    /// One buffer of one device, to write.
    pub fn buffer_mut(&mut self, device: DeviceId, buffer: usize) -> Option<&mut [u8]> {
        self.devices.get_mut(&device).and_then(|b| b.get_mut(buffer))
    }

    /// Every buffer, by device.
    pub fn into_buffers(self) -> BTreeMap<DeviceId, Vec<Vec<u8>>> {
        self.devices
            .into_iter()
            .map(|(d, bufs)| (d, (0..bufs.ranges.len()).map(|i| bufs[i].to_vec()).collect()))
            .collect()
    }
}

/// One work item per target piece: its bytes (disjoint from every other
/// item's), the piece, and the plan's copies into it.
pub(crate) type PieceTask<'m, 'p> = (&'m mut [u8], &'p Piece, Vec<&'p BoxCopy>);

/// Split the target buffers of `memory` (laid out as the plan's target) into
/// one task per piece.
pub(crate) fn piece_tasks<'m, 'p>(memory: &'m mut HostMemory, plan: &'p tenplan_ptc::Plan) -> Vec<PieceTask<'m, 'p>> {
    let target = plan.problem.target();
    let mut by_piece: HashMap<(DeviceId, u32, u64), Vec<&BoxCopy>> = HashMap::new();
    for c in &plan.copies {
        // A multicast lands in every piece it names, from the same source.
        for w in c.writes() {
            by_piece.entry((w.dst, w.buffer, w.offset)).or_default().push(c);
        }
    }
    let mut tasks = Vec::new();
    for (d, bufs) in memory.devices.iter_mut() {
        let shard = target.shard_of(*d).expect("zeroed() follows the layout");
        for ((bi, buf), spec) in bufs.split_mut().into_iter().enumerate().zip(&shard.buffers) {
            let elem = spec.dtype.size() as usize;
            let mut pieces: Vec<&Piece> = spec.pieces.iter().collect();
            pieces.sort_by_key(|p| p.offset);
            let mut rest: &mut [u8] = &mut buf[..];
            let mut at = 0usize;
            for p in pieces {
                let (_, tail) = rest.split_at_mut(p.offset as usize * elem - at);
                let (here, after) = tail.split_at_mut(p.region.volume() as usize * elem);
                at = (p.offset + p.region.volume()) as usize * elem;
                rest = after;
                let copies = by_piece.remove(&(*d, bi as u32, p.offset)).unwrap_or_default();
                tasks.push((here, p, copies));
            }
        }
    }
    tasks
}

/// Execute a verified plan on host memory: returns the target state.
///
/// Work is split per target piece (disjoint byte ranges of the target
/// buffers), so rayon balances it whatever the number of devices.
pub fn execute(verified: &Verified<'_>, source: &HostMemory) -> Result<HostMemory> {
    let plan = verified.plan();
    let problem = &plan.problem;
    let (src_layout, dst_layout) = (problem.source(), problem.target());
    let tensors = problem.tensors();
    for c in &plan.copies {
        if !source.devices.contains_key(&c.src) {
            return Err(Error::MissingDevice { device: c.src });
        }
    }
    // Source pieces by (device, tensor): (buffer, piece), each box once.
    let mut src_pieces: HashMap<(DeviceId, TensorId), Vec<(usize, &Piece)>> = HashMap::new();
    for c in &plan.copies {
        src_pieces
            .entry((c.src, c.tensor))
            .or_insert_with(|| src_layout.pieces_of(c.src, c.tensor));
    }
    let mut target = HostMemory::zeroed(dst_layout);
    let tasks = piece_tasks(&mut target, plan);
    tasks.into_par_iter().for_each(|(bytes, p, copies)| {
        // The task's slice starts at the piece.
        let to = Piece {
            tensor: p.tensor,
            region: p.region.clone(),
            offset: 0,
        };
        for c in copies {
            let elem = tensors[c.tensor as usize].dtype.size() as usize;
            let src_bufs = &source.devices[&c.src];
            // The box may span several source pieces; copy each overlap.
            for &(bi, from) in &src_pieces[&(c.src, c.tensor)] {
                if let Some(part) = from.region.intersect(&c.region) {
                    if c.reduce {
                        add_box(&src_bufs[bi], from, bytes, &to, &part, tensors[c.tensor as usize].dtype);
                    } else {
                        copy_box(&src_bufs[bi], from, bytes, &to, &part, elem);
                    }
                }
            }
        }
    });
    // Fills: zeroed() already zeroes every buffer, and fills cover exactly the
    // padding (checker), so there is nothing left to write.
    Ok(target)
}
