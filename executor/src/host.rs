//! Devices as byte buffers in one process.

use std::collections::BTreeMap;

use rayon::prelude::*;
use tenplan_ptc::{Copy, DeviceId, Layout, Region};

use crate::{copy_box, Error, HostBuffer, Result, Verified};

/// The buffers of the devices of a layout, as bytes in host memory.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HostMemory {
    devices: BTreeMap<DeviceId, Vec<HostBuffer>>,
}

impl HostMemory {
    /// Zeroed buffers for every device of a layout.
    pub fn zeroed(layout: &Layout) -> HostMemory {
        let mut devices = BTreeMap::new();
        for shard in layout.shards() {
            for &d in &shard.devices {
                let bufs = shard
                    .buffers
                    .iter()
                    .map(|b| HostBuffer::zeroed(b.bytes() as usize))
                    .collect();
                devices.insert(d, bufs);
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
                .map(|(d, bufs)| (d, bufs.into_iter().map(HostBuffer::from_vec).collect()))
                .collect(),
        })
    }

    /// The devices held.
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + '_ {
        self.devices.keys().copied()
    }

    /// One buffer of one device.
    pub fn buffer(&self, device: DeviceId, buffer: usize) -> Option<&[u8]> {
        self.devices.get(&device).and_then(|b| b.get(buffer)).map(|b| &**b)
    }

    /// Every buffer, by device.
    pub fn into_buffers(self) -> BTreeMap<DeviceId, Vec<Vec<u8>>> {
        self.devices
            .into_iter()
            .map(|(d, bufs)| (d, bufs.into_iter().map(HostBuffer::into_vec).collect()))
            .collect()
    }

    /// Every buffer, by device, for writing in place.
    pub(crate) fn buffers_mut(&mut self) -> &mut BTreeMap<DeviceId, Vec<HostBuffer>> {
        &mut self.devices
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
