//! Cut every target piece by the source sub-tensors that overlap it.
//!
//! For each tensor, the boundaries of the source sub-tensors on every
//! dimension ("cut points") form a grid whose cells each lie inside exactly
//! one sub-tensor. A target piece looks up only the cells it spans, so the
//! cost follows the number of overlaps, not the number of pairs of boxes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use smallvec::SmallVec;

use tenplan_ptc::{BoxCopy, Cluster, DeviceId, Fill, Layout, Problem, Region, Shard, TensorId};

use crate::error::{Infeasible, Missing};
use crate::{Error, Result};

/// A part of a target piece that lies inside one source sub-tensor: the unit
/// that planners assign to a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// Destination device.
    pub dst: DeviceId,
    /// Destination buffer (index into the destination shard's buffers).
    pub buffer: u32,
    /// Offset of the destination piece in that buffer.
    pub offset: u64,
    /// The tensor.
    pub tensor: TensorId,
    /// The box: target piece ∩ source sub-tensor.
    pub region: Region,
    /// Size in bytes.
    pub bytes: u64,
    /// Live devices holding the source sub-tensor, in holder order (shard
    /// order, then data-parallel rank). For a partial tensor, the one device
    /// whose addend this fragment carries. Shared: the fragments of one
    /// replicated shard (millions at 16k GPUs) hold one list.
    pub holders: Arc<[DeviceId]>,
    /// The fragment is one addend of a partial tensor: its copy adds.
    pub reduce: bool,
}

impl Fragment {
    /// A copy of `region` (a box within this fragment) from `src`, through
    /// the relays `via`, into this fragment's target piece.
    pub fn copy(&self, src: DeviceId, via: Vec<DeviceId>, region: Region) -> BoxCopy {
        BoxCopy {
            src,
            dst: self.dst,
            via,
            tensor: self.tensor,
            region,
            buffer: self.buffer,
            offset: self.offset,
            reduce: self.reduce,
            round: 0,
            fanout: Vec::new(),
        }
    }
}

/// The nodes of each holder list, sorted, computed once per shared list:
/// at 16k GPUs millions of fragments share a few thousand lists of hundreds
/// of holders, and asking "is a holder on node n" of each would cost
/// billions of lookups.
pub(crate) struct HolderNodes<'a> {
    cluster: &'a Cluster,
    nodes: HashMap<*const DeviceId, Vec<u32>>,
}

impl<'a> HolderNodes<'a> {
    pub(crate) fn new(cluster: &'a Cluster) -> HolderNodes<'a> {
        HolderNodes {
            cluster,
            nodes: HashMap::new(),
        }
    }

    /// The distinct nodes of `holders`, ascending.
    pub(crate) fn of(&mut self, holders: &Arc<[DeviceId]>) -> &[u32] {
        let cluster = self.cluster;
        // Keyed by address: the list lives as long as the fragments that
        // share it, which outlive this cache.
        self.nodes.entry(holders.as_ptr()).or_insert_with(|| {
            let mut n: Vec<u32> = holders.iter().map(|&h| cluster.node_of(h)).collect();
            n.sort_unstable();
            n.dedup();
            n
        })
    }
}

/// The cut-point grid of one tensor's source sub-tensors.
struct Grid {
    cuts: Vec<Vec<u64>>,
    owner: Vec<u32>,
    /// The holder lists of each sub-tensor's fragments: its live holders
    /// (one list), or for a partial tensor one list per addend's holder.
    holders: Vec<Vec<Arc<[DeviceId]>>>,
}

impl Grid {
    fn new(layout: &Layout, tensor: TensorId) -> Grid {
        let subs = layout.sub_tensors(tensor);
        let ndim = layout.tensors()[tensor as usize].shape.len();
        let mut cuts: Vec<Vec<u64>> = vec![Vec::new(); ndim];
        for s in subs {
            for (d, c) in cuts.iter_mut().enumerate() {
                let r = s.region.range(d);
                c.push(r.start);
                c.push(r.end);
            }
        }
        for c in &mut cuts {
            c.sort_unstable();
            c.dedup();
        }
        let cells: usize = cuts.iter().map(|c| c.len() - 1).product();
        let mut owner = vec![u32::MAX; cells];
        let mut g = Grid {
            cuts,
            owner: Vec::new(),
            holders: Vec::new(),
        };
        for (i, s) in subs.iter().enumerate() {
            g.for_cells(&s.region, |cell| owner[cell] = i as u32);
        }
        g.owner = owner;
        g
    }

    /// Call `f` with every cell that overlaps `region`.
    fn for_cells(&self, region: &Region, mut f: impl FnMut(usize)) {
        let spans: SmallVec<[(usize, usize); 4]> = self
            .cuts
            .iter()
            .enumerate()
            .map(|(d, c)| {
                let r = region.range(d);
                let a = c.partition_point(|&x| x <= r.start) - 1;
                let b = c.partition_point(|&x| x < r.end) - 1;
                (a, b + 1)
            })
            .collect();
        let mut idx: SmallVec<[usize; 4]> = spans.iter().map(|s| s.0).collect();
        loop {
            let mut cell = 0;
            for (d, &i) in idx.iter().enumerate() {
                cell = cell * (self.cuts[d].len() - 1) + i;
            }
            f(cell);
            let mut d = idx.len();
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < spans[d].1 {
                    break;
                }
                idx[d] = spans[d].0;
            }
        }
    }
}

/// Every fragment of the problem, in a fixed order: target shards in order,
/// their devices in order, buffers, pieces, then source sub-tensors by box.
/// Fails with every (tensor, box) that has no live holder.
///
/// Three steps: the grid of every wanted tensor and the live holders of its
/// sub-tensors (interned, so equal lists share one allocation); the target
/// shards cut in parallel, read-only on those; the cuts laid out once, each
/// shard's repeated for its data-parallel devices (a 1T weight sync has 9M
/// fragments: grown by doubling, they were copied and faulted in twice).
pub fn fragments(problem: &Problem) -> Result<Vec<Fragment>> {
    use rayon::prelude::*;

    let (source, target, cluster) = (problem.source(), problem.target(), problem.cluster());
    let tensors = problem.tensors();
    let mut wanted = vec![false; tensors.len()];
    for shard in target.shards() {
        for buf in &shard.buffers {
            for piece in &buf.pieces {
                wanted[piece.tensor as usize] = true;
            }
        }
    }
    let parallel = source.pieces_held().saturating_add(target.pieces_held()) >= crate::par::SMALL as u64;
    let grid = |t: usize| wanted[t].then(|| Grid::new(source, t as TensorId));
    let mut grids: Vec<Option<Grid>> = if parallel {
        (0..tensors.len()).into_par_iter().map(grid).collect()
    } else {
        (0..tensors.len()).map(grid).collect()
    };
    let mut interned: BTreeMap<Vec<DeviceId>, Arc<[DeviceId]>> = BTreeMap::new();
    let mut intern = |list: Vec<DeviceId>| {
        interned
            .entry(list)
            .or_insert_with_key(|k| Arc::from(k.as_slice()))
            .clone()
    };
    for (t, grid) in grids.iter_mut().enumerate() {
        let Some(grid) = grid else {
            continue;
        };
        let subs = source.sub_tensors(t as TensorId);
        grid.holders = if source.is_partial(t as TensorId) {
            // Every holder owns an addend: one single-device list each.
            subs.iter()
                .map(|s| s.holders.iter().map(|&h| intern(vec![h])).collect())
                .collect()
        } else {
            subs.iter()
                .map(|s| {
                    vec![intern(
                        s.holders.iter().copied().filter(|&d| cluster.is_live(d)).collect(),
                    )]
                })
                .collect()
        };
    }
    let cut = |shard| cut_shard(problem, &grids, shard);
    let cuts: Vec<(Vec<Fragment>, Vec<MissingBox>)> = if parallel {
        target.shards().par_iter().map(cut).collect()
    } else {
        target.shards().iter().map(cut).collect()
    };
    let mut missing: BTreeMap<(TensorId, Region), Vec<DeviceId>> = BTreeMap::new();
    let mut out = Vec::with_capacity(
        cuts.iter()
            .zip(target.shards())
            .map(|((cut, _), shard)| cut.len() * shard.devices.len())
            .sum(),
    );
    for ((cut, lost), shard) in cuts.into_iter().zip(target.shards()) {
        missing.extend(lost);
        // A shard's devices (its data-parallel replicas) want the same
        // fragments: the others get a copy of the first one's.
        let (start, len) = (out.len(), cut.len());
        out.extend(cut);
        for &dst in shard.devices.iter().skip(1) {
            for i in start..start + len {
                let f = Fragment { dst, ..out[i].clone() };
                out.push(f);
            }
        }
    }
    if !missing.is_empty() {
        return Err(Error::Infeasible(Infeasible {
            missing: missing
                .into_iter()
                .map(|((t, region), dead_holders)| Missing {
                    tensor: tensors[t as usize].name.clone(),
                    region,
                    dead_holders,
                })
                .collect(),
        }));
    }
    Ok(out)
}

/// A box no live device holds, with the holders it had.
type MissingBox = ((TensorId, Region), Vec<DeviceId>);

/// The fragments of one target shard, for its first device, and the boxes
/// it wants that no live device holds.
fn cut_shard(problem: &Problem, grids: &[Option<Grid>], shard: &Shard) -> (Vec<Fragment>, Vec<MissingBox>) {
    let (source, cluster, tensors) = (problem.source(), problem.cluster(), problem.tensors());
    let mut cut: Vec<Fragment> = Vec::new();
    let mut missing = Vec::new();
    let Some(&first) = shard.devices.first() else {
        return (cut, missing);
    };
    let mut owners: Vec<u32> = Vec::new();
    for (bi, buf) in shard.buffers.iter().enumerate() {
        for piece in &buf.pieces {
            let grid = grids[piece.tensor as usize]
                .as_ref()
                .expect("a wanted tensor has a grid");
            owners.clear();
            grid.for_cells(&piece.region, |cell| owners.push(grid.owner[cell]));
            owners.sort_unstable();
            owners.dedup();
            let subs = source.sub_tensors(piece.tensor);
            let partial = source.is_partial(piece.tensor);
            let bytes_per = tensors[piece.tensor as usize].dtype.size();
            for &o in &owners {
                let sub = &subs[o as usize];
                let region = sub
                    .region
                    .intersect(&piece.region)
                    .expect("a cell's owner overlaps the piece");
                let lists = &grid.holders[o as usize];
                if partial {
                    // Every holder owns an addend: each must arrive, and a
                    // dead holder's addend is lost.
                    let dead: Vec<DeviceId> = sub.holders.iter().copied().filter(|&d| !cluster.is_live(d)).collect();
                    if !dead.is_empty() {
                        missing.push(((piece.tensor, region), dead));
                        continue;
                    }
                } else if lists[0].is_empty() {
                    missing.push(((piece.tensor, region), sub.holders.clone()));
                    continue;
                }
                let bytes = region.volume() * bytes_per;
                for holders in lists {
                    cut.push(Fragment {
                        dst: first,
                        buffer: bi as u32,
                        offset: piece.offset,
                        tensor: piece.tensor,
                        region: region.clone(),
                        bytes,
                        holders: holders.clone(),
                        reduce: partial,
                    });
                }
            }
        }
    }
    (cut, missing)
}

/// The zero-fills of every target buffer's padding.
pub fn padding_fills(problem: &Problem) -> Vec<Fill> {
    let mut out = Vec::new();
    for shard in problem.target().shards() {
        // Found once per shard: its replicas pad alike.
        let padding: Vec<(u32, std::ops::Range<u64>)> = shard
            .buffers
            .iter()
            .enumerate()
            .flat_map(|(bi, buf)| buf.padding().into_iter().map(move |r| (bi as u32, r)))
            .collect();
        for &device in &shard.devices {
            out.extend(padding.iter().map(|(buffer, r)| Fill {
                device,
                buffer: *buffer,
                offset: r.start,
                len: r.end - r.start,
            }));
        }
    }
    out
}
