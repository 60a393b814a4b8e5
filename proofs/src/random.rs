//! Random problems for property tests: random tensors, random tilings
//! (guillotine cuts and flat ZeRO-style ranges), replicas across and within
//! shards, replicas cut differently, multi-piece buffers with padding, random clusters with dead
//! devices and rail-optimized fabrics. Everything follows from one seed.

use std::collections::BTreeMap;
use std::sync::Arc;

use tenplan_ptc::{
    Buffer, Cluster, ClusterData, DType, DeviceId, Layout, Piece, Problem, Region, Shard, TensorId, TensorSpec,
};

use crate::splitmix::SplitMix64;

/// A random problem; the same seed gives the same problem.
pub fn random_problem(seed: u64) -> Problem {
    let mut rng = SplitMix64::new(seed);
    let tensors = random_tensors(&mut rng);
    let nodes = rng.range(1, 3) as u32;
    let gpus = rng.range(1, 4) as u32;
    let n = nodes * gpus;
    let mut dead: Vec<DeviceId> = (0..n).filter(|_| rng.chance(0.2)).collect();
    if dead.len() == n as usize {
        dead.pop();
    }
    let mut data = Cluster::parse(&format!("{nodes}x{gpus}"))
        .expect("valid size")
        .data()
        .clone();
    // Sometimes one NIC per device and no message latency, as on DGX nodes
    // moving large tensors: the case where relays through peers pay off.
    if rng.chance(0.5) {
        data.nics_per_node = gpus;
        data.latency_s = 0.0;
    }
    // Sometimes a rail-optimized fabric above the NICs, its spine at 1:1
    // to 3:1, in units of one or two nodes (drawn from a stream of its own,
    // so that the rest of every problem stays what it was).
    let mut fabric_rng = SplitMix64::new(seed ^ 0x6a09_e667_f3bc_c908);
    if nodes > 1 && fabric_rng.chance(0.4) {
        let unit = fabric_rng.range(1, 2) as u32;
        let ratio = fabric_rng.range(1, 3) as f64;
        data.fabric = Some(tenplan_ptc::rail_optimized(
            nodes,
            data.nics_per_node,
            data.bandwidth.nic,
            unit,
            ratio,
        ));
    }
    let cluster = Cluster::new(data)
        .expect("valid cluster")
        .with_dead(dead)
        .expect("dead devices exist");
    let all: Vec<DeviceId> = (0..n).collect();
    let live: Vec<DeviceId> = all.iter().copied().filter(|&d| cluster.is_live(d)).collect();
    let mut source = random_layout(&mut rng, &tensors, &all);
    let target = random_layout(&mut rng, &tensors, &live);
    // Sometimes a tensor holds partial sums in the source (gradients before
    // their reduction): its copies become reduce-copies.
    if rng.chance(0.4) {
        let t = rng.range(0, tensors.len() as u64 - 1) as TensorId;
        if let Ok(partial) = source.with_partial(|x| x == t) {
            source = partial;
        }
    }
    let problem = Problem::new(source, target, cluster).expect("random problems are valid");
    // Sometimes the last checkpoint is on storage, a source of its own.
    if rng.chance(0.25) {
        problem.with_storage().expect("a store keeps problems valid")
    } else {
        problem
    }
}

/// The same problem with the devices renamed by a random permutation (the
/// cluster's node structure stays; ranks follow their devices).
pub fn relabel(problem: &Problem, seed: u64) -> Problem {
    let mut rng = SplitMix64::new(seed);
    // Compute devices only: the checkpoint store keeps its place.
    let compute = problem.cluster().compute_nodes() * problem.cluster().gpus_per_node();
    let mut perm: Vec<DeviceId> = (0..compute).collect();
    rng.shuffle(&mut perm);
    perm.extend(compute..problem.cluster().num_devices());
    let map = |d: DeviceId| perm[d as usize];
    let mut data: ClusterData = problem.cluster().data().clone();
    data.dead = data.dead.iter().map(|&d| map(d)).collect();
    let cluster = Cluster::new(data).expect("a permutation keeps devices valid");
    Problem::new(
        problem.source().relabel(map).expect("permutations are injective"),
        problem.target().relabel(map).expect("permutations are injective"),
        cluster,
    )
    .expect("relabelled problems are valid")
}

fn random_tensors(rng: &mut SplitMix64) -> Arc<[TensorSpec]> {
    let dtypes = [DType::F32, DType::BF16, DType::U8, DType::I64];
    (0..rng.range(1, 4))
        .map(|i| {
            let ndim = rng.range(1, 3);
            let shape: Vec<u64> = (0..ndim).map(|_| rng.range(1, 7)).collect();
            TensorSpec::new(format!("t{i}"), dtypes[rng.range(0, 3) as usize], shape)
        })
        .collect::<Vec<_>>()
        .into()
}

fn random_tiling(rng: &mut SplitMix64, shape: &[u64]) -> Vec<Region> {
    let full = Region::full(shape);
    if rng.chance(0.35) {
        // Flat ranges of the row-major tensor, as a ZeRO buffer cuts it.
        let numel = full.volume();
        let mut cuts: Vec<u64> = (0..rng.range(0, 3)).map(|_| rng.range(1, numel.max(2) - 1)).collect();
        cuts.push(0);
        cuts.push(numel);
        cuts.sort_unstable();
        cuts.dedup();
        return cuts.windows(2).flat_map(|w| full.flat_range(w[0], w[1])).collect();
    }
    let mut boxes = vec![full];
    for _ in 0..rng.range(0, 5) {
        let i = rng.range(0, boxes.len() as u64 - 1) as usize;
        let b = boxes[i].clone();
        let dims: Vec<usize> = (0..b.ndim())
            .filter(|&d| b.range(d).end - b.range(d).start >= 2)
            .collect();
        if dims.is_empty() {
            continue;
        }
        let d = dims[rng.range(0, dims.len() as u64 - 1) as usize];
        let r = b.range(d);
        let (x, y) = b.split(d, rng.range(r.start + 1, r.end - 1));
        boxes[i] = x;
        boxes.push(y);
    }
    boxes
}

/// A random valid layout of `tensors` on some of `devices`.
pub fn random_layout(rng: &mut SplitMix64, tensors: &Arc<[TensorSpec]>, devices: &[DeviceId]) -> Layout {
    let mut devs = devices.to_vec();
    rng.shuffle(&mut devs);
    let shards_n = rng.range(1, devs.len().min(5) as u64) as usize;
    let mut contents: Vec<Vec<(u32, Region)>> = vec![Vec::new(); shards_n];
    for (t, spec) in tensors.iter().enumerate() {
        let mut holding = vec![false; shards_n];
        for region in random_tiling(rng, &spec.shape) {
            let s = rng.range(0, shards_n as u64 - 1) as usize;
            contents[s].push((t as u32, region.clone()));
            holding[s] = true;
            if shards_n > 1 && rng.chance(0.3) {
                let o = (s + 1 + rng.range(0, shards_n as u64 - 2) as usize) % shards_n;
                contents[o].push((t as u32, region));
                holding[o] = true;
            }
        }
        // Sometimes a shard that holds none of it holds part of another
        // tiling of the same tensor: replicas cut differently, as the tied
        // embedding in ZeRO-1 buffers of different sizes.
        let free: Vec<usize> = (0..shards_n).filter(|&s| !holding[s]).collect();
        if !free.is_empty() && rng.chance(0.3) {
            let o = free[rng.range(0, free.len() as u64 - 1) as usize];
            for region in random_tiling(rng, &spec.shape) {
                if rng.chance(0.7) {
                    contents[o].push((t as u32, region));
                }
            }
        }
    }
    let mut next = 0;
    let mut shards = Vec::new();
    for (i, pieces) in contents.into_iter().enumerate() {
        // Every shard gets one device; later ones may get replicas too.
        let left_after = shards_n - i - 1;
        let mut take = 1;
        while next + take < devs.len() - left_after && rng.chance(0.4) {
            take += 1;
        }
        let shard_devices = devs[next..next + take].to_vec();
        next += take;
        shards.push(Shard {
            name: format!("s{i}"),
            devices: shard_devices,
            buffers: random_buffers(rng, tensors, pieces),
        });
    }
    Layout::new(tensors.clone(), shards).expect("random layouts are valid")
}

fn random_buffers(rng: &mut SplitMix64, tensors: &[TensorSpec], pieces: Vec<(u32, Region)>) -> Vec<Buffer> {
    let mut by_dtype: BTreeMap<DType, Vec<(u32, Region)>> = BTreeMap::new();
    for p in pieces {
        by_dtype.entry(tensors[p.0 as usize].dtype).or_default().push(p);
    }
    let mut out = Vec::new();
    for (dtype, mut group) in by_dtype {
        rng.shuffle(&mut group);
        let split = rng.range(0, group.len() as u64) as usize;
        let (a, b) = group.split_at(split);
        for part in [a, b] {
            if part.is_empty() {
                continue;
            }
            let mut at = 0;
            let mut ps = Vec::new();
            for (t, region) in part {
                at += rng.range(0, 2) * u64::from(rng.chance(0.3));
                ps.push(Piece {
                    tensor: *t,
                    region: region.clone(),
                    offset: at,
                });
                at += region.volume();
            }
            out.push(Buffer {
                name: format!("b{}", out.len()),
                dtype,
                len: at + rng.range(0, 2) * u64::from(rng.chance(0.3)),
                pieces: ps,
                partial: false,
            });
        }
    }
    out
}

/// Proptest strategies over random problems.
#[cfg(feature = "proptest")]
pub mod strategies {
    use proptest::prelude::*;

    use super::*;

    /// Random problems (see the module docs); shrinking works on the seed.
    pub fn problems() -> impl Strategy<Value = Problem> {
        any::<u64>().prop_map(random_problem)
    }

    /// Random problems whose cluster has no dead device.
    pub fn healthy_problems() -> impl Strategy<Value = Problem> {
        problems().prop_map(|p| {
            let mut data = p.cluster().data().clone();
            data.dead.clear();
            p.with_cluster(Cluster::new(data).expect("valid")).expect("valid")
        })
    }
}
