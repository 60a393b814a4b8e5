//! Performs verified plans. Today: devices as byte buffers in one process.
//!
//! The executor is thin on purpose: it takes a [`Verified`] plan (only the
//! independent checker makes one), reads every source box where the source
//! layout puts it, and writes it where the target layout wants it. A box copy
//! runs as a sequence of `memcpy`s of the longest contiguous stretch that the
//! source and destination pieces share; destination devices run in parallel
//! (rayon), which is safe because the checker proved that no two copies write
//! the same element.
//!
//! ```
//! use tenplan_executor::HostMemory;
//! use tenplan_models::{find, ModelState, StateKind};
//! use tenplan_planner::planner;
//! use tenplan_ptc::{Cluster, Problem};
//!
//! let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
//! let from = state.layout(&"tp=2,dp=2".parse().unwrap()).unwrap();
//! let to = state.layout(&"tp=4".parse().unwrap()).unwrap();
//! let problem = Problem::new(from, to, Cluster::parse("1x4").unwrap()).unwrap();
//! let plan = planner("hotspa").unwrap().plan(&problem).unwrap();
//! let verified = tenplan_proofs::verify(&plan).unwrap();
//! let source = HostMemory::zeroed(problem.source());
//! let target = tenplan_executor::execute(&verified, &source).unwrap();
//! assert_eq!(target.devices().count(), 4);
//! ```
#![deny(missing_docs)]

use std::collections::BTreeMap;

use rayon::prelude::*;
pub use tenplan_proofs::Verified;
use tenplan_ptc::{Copy, DeviceId, Layout, Piece, Region};

/// Why a plan could not be executed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The source state lacks a device the plan reads from.
    #[error("no source buffers for device {device}")]
    MissingDevice {
        /// Device.
        device: DeviceId,
    },
    /// A buffer of the wrong size.
    #[error("device {device} buffer `{buffer}` has {got} bytes, the layout says {expected}")]
    BufferSize {
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// Bytes the layout needs.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The buffers of the devices of a layout, as bytes in host memory.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HostMemory {
    devices: BTreeMap<DeviceId, Vec<Vec<u8>>>,
}

impl HostMemory {
    /// Zeroed buffers for every device of a layout.
    pub fn zeroed(layout: &Layout) -> HostMemory {
        let mut devices = BTreeMap::new();
        for shard in layout.shards() {
            let bufs: Vec<Vec<u8>> = shard.buffers.iter().map(|b| vec![0u8; b.bytes() as usize]).collect();
            for &d in &shard.devices {
                devices.insert(d, bufs.clone());
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
        Ok(HostMemory { devices })
    }

    /// The devices held.
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + '_ {
        self.devices.keys().copied()
    }

    /// One buffer of one device.
    pub fn buffer(&self, device: DeviceId, buffer: usize) -> Option<&[u8]> {
        self.devices.get(&device).and_then(|b| b.get(buffer)).map(Vec::as_slice)
    }

    /// Every buffer, by device.
    pub fn into_buffers(self) -> BTreeMap<DeviceId, Vec<Vec<u8>>> {
        self.devices
    }
}

/// Copy the elements of `region` from a buffer holding piece `from` to a
/// buffer holding piece `to`, one memcpy per contiguous run.
pub fn copy_box(src: &[u8], from: &Piece, dst: &mut [u8], to: &Piece, region: &Region, elem: usize) {
    let n = region.ndim();
    let (fs, ts, rs) = (from.region.shape(), to.region.shape(), region.shape());
    // Longest run: the inner dimensions the region spans fully in both
    // pieces merge with the first one it does not.
    let mut k = n - 1;
    while k > 0 && rs[k] == fs[k] && rs[k] == ts[k] {
        k -= 1;
    }
    let run = rs[k..].iter().product::<u64>() as usize * elem;
    let (flo, tlo, rlo) = (from.region.lo(), to.region.lo(), region.lo());
    // Row-major strides (in elements) of both pieces.
    let strides = |shape: &[u64]| {
        let mut s = vec![1u64; n];
        for d in (0..n - 1).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let (fst, tst) = (strides(&fs), strides(&ts));
    let base = |lo: &[u64], st: &[u64], off: u64| off + (0..n).map(|d| (rlo[d] - lo[d]) * st[d]).sum::<u64>();
    let (fb, tb) = (base(&flo, &fst, from.offset), base(&tlo, &tst, to.offset));
    let outer: u64 = rs[..k].iter().product();
    let mut idx = vec![0u64; k];
    for _ in 0..outer {
        let (mut f, mut t) = (fb, tb);
        for d in 0..k {
            f += idx[d] * fst[d];
            t += idx[d] * tst[d];
        }
        let (f, t) = (f as usize * elem, t as usize * elem);
        dst[t..t + run].copy_from_slice(&src[f..f + run]);
        for d in (0..k).rev() {
            idx[d] += 1;
            if idx[d] < rs[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Execute a verified plan on host memory: returns the target state.
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
    let mut by_dst: BTreeMap<DeviceId, Vec<&Copy>> = BTreeMap::new();
    for c in &plan.copies {
        by_dst.entry(c.dst).or_default().push(c);
    }
    let mut target = HostMemory::zeroed(dst_layout);
    target.devices.par_iter_mut().for_each(|(&d, bufs)| {
        let shard = dst_layout.shard_of(d).expect("target devices hold a shard");
        for c in by_dst.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
            let elem = tensors[c.tensor as usize].dtype.size() as usize;
            let to = shard.buffers[c.buffer as usize]
                .pieces
                .iter()
                .find(|p| p.offset == c.offset && p.tensor == c.tensor)
                .expect("verified: the target piece exists");
            let src_shard = src_layout.shard_of(c.src).expect("verified: the source holds the box");
            let src_bufs = &source.devices[&c.src];
            // The box may span several source pieces; copy each overlap.
            let mut done: Vec<&Region> = Vec::new();
            for (bi, b) in src_shard.buffers.iter().enumerate() {
                for from in b.pieces.iter().filter(|p| p.tensor == c.tensor) {
                    if done.contains(&&from.region) {
                        continue;
                    }
                    if let Some(part) = from.region.intersect(&c.region) {
                        copy_box(&src_bufs[bi], from, &mut bufs[c.buffer as usize], to, &part, elem);
                        done.push(&from.region);
                    }
                }
            }
        }
    });
    // Fills: zeroed() already zeroes every buffer, and fills cover exactly the
    // padding (checker), so there is nothing left to write.
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenplan_ptc::Region;

    #[test]
    fn copies_strided_boxes_between_pieces() {
        // Source piece: rows 0..4, cols 0..6 of a 4x6 tensor; destination piece
        // rows 1..3, cols 2..6 at offset 5 of a buffer; copy rows 1..3, cols 3..5.
        let from = Piece {
            tensor: 0,
            region: Region::new([0..4, 0..6]).unwrap(),
            offset: 0,
        };
        let to = Piece {
            tensor: 0,
            region: Region::new([1..3, 2..6]).unwrap(),
            offset: 5,
        };
        let src: Vec<u8> = (0..24).collect();
        let mut dst = vec![0xffu8; 13];
        copy_box(&src, &from, &mut dst, &to, &Region::new([1..3, 3..5]).unwrap(), 1);
        assert_eq!(dst, vec![255, 255, 255, 255, 255, 255, 9, 10, 255, 255, 15, 16, 255]);
    }
}
