//! Clusters as operations need them: the default one, and a summary.

use std::fmt::Write as _;

use tenplan_ptc::Cluster;

use crate::units::bytes;
use crate::Result;

/// The cluster a layout runs on when none is named: enough DGX-H100 nodes
/// (8 GPUs each, NVLink within a node, one 400 Gb/s NIC per GPU) for
/// `devices` devices. The one default of every operation (init, import,
/// reshard, sync, the Python package).
pub fn default_cluster(devices: u32) -> Result<Cluster> {
    Ok(Cluster::parse(&format!("dgx-h100:{}", devices.max(1).div_ceil(8)))?)
}

/// A cluster's shape and fabric in a few lines: per tier of switches, how
/// many, their uplinks, and their oversubscription (the capacity of the
/// links below a switch over its uplink).
pub fn fabric_summary(cluster: &Cluster) -> String {
    let d = cluster.data();
    let b = &d.bandwidth;
    let mut out = format!(
        "cluster {}: {} nodes x {} devices ({} devices), {} NICs per node at {}/s, NVLink {}/s per device\n",
        d.name,
        d.nodes,
        d.gpus_per_node,
        d.nodes * d.gpus_per_node,
        d.nics_per_node,
        bytes(b.nic as u64),
        bytes(b.intra_node as u64),
    );
    let Some(f) = &d.fabric else {
        out.push_str("network: non-blocking (no fabric: inter-node traffic loads only the NICs)\n");
        return out;
    };
    let n = f.switches.len();
    let mut below = vec![0.0f64; n];
    for &s in &f.nics {
        below[s as usize] += b.nic;
    }
    let depth = |mut s: usize| {
        let mut k = 0;
        while let Some(p) = f.switches[s].parent {
            s = p as usize;
            k += 1;
        }
        k
    };
    let depths: Vec<usize> = (0..n).map(depth).collect();
    // Deepest first, so that every child adds to its parent before the
    // parent is read.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(depths[s]));
    for &s in &order {
        if let Some(p) = f.switches[s].parent {
            below[p as usize] += f.switches[s].down;
        }
    }
    let _ = writeln!(
        out,
        "fabric: {n} switches in {} levels",
        depths.iter().max().unwrap_or(&0) + 1
    );
    // One line per tier and distinct (uplink, ratio).
    let mut tiers: std::collections::BTreeMap<(usize, u64, u64), usize> = std::collections::BTreeMap::new();
    for s in (0..n).filter(|&s| f.switches[s].parent.is_some()) {
        let ratio = below[s] / f.switches[s].up;
        *tiers
            .entry((depths[s], f.switches[s].up as u64, (ratio * 100.0).round() as u64))
            .or_default() += 1;
    }
    for ((tier, up, ratio), count) in tiers.iter().rev() {
        let _ = writeln!(
            out,
            "  tier {tier}: {count} switches, uplink {}/s, {:.2}:1 oversubscribed",
            bytes(*up),
            *ratio as f64 / 100.0
        );
    }
    out
}
