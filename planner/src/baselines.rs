//! Baseline planners: faithful re-implementations of published source-selection
//! policies, kept as the yardstick for the optimal planner. All keep the
//! target layout's placement (target rank r on the r-th device of its set).

use tenplan_ptc::{DeviceId, Plan, Problem};

use crate::intersect::{fragments, padding_fills, Fragment};
use crate::{Planner, Result};

/// Turn fragments into a plan, with a source (and relay) chosen per fragment.
fn assemble(
    problem: &Problem,
    name: &str,
    frags: &[Fragment],
    mut choose: impl FnMut(usize, &Fragment) -> (DeviceId, Vec<DeviceId>),
) -> Plan {
    let copies = frags
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (src, via) = choose(i, f);
            f.copy(src, via, f.region.clone())
        })
        .collect();
    Plan {
        planner: name.to_string(),
        problem: problem.clone(),
        copies,
        fills: padding_fills(problem),
        paces: Vec::new(),
    }
}

/// Tenplex (SOSP'24): every target device pulls each overlap from the
/// data-parallel rank 0 replica of the source sub-tensor, or the next live
/// replica in ring order when that one is dead.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tenplex;

impl Planner for Tenplex {
    fn name(&self) -> &'static str {
        "tenplex"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let frags = fragments(problem)?;
        // Holders come in shard order then replica order, dead ones removed:
        // the first is replica 0, or the next live one in ring order.
        Ok(assemble(problem, self.name(), &frags, |_, f| {
            (f.holders[0], Vec::new())
        }))
    }
}

/// A static point-to-point schedule, as RL frameworks sync weights from
/// trainers to inference engines (in the manner Perplexity describes for
/// Kimi-K2): every piece an inference rank needs is sent straight to it by
/// a trainer rank that owns it, the owners of each piece taking turns
/// (round-robin over each replica group, in fragment order), with no
/// relays and no multicast.
#[derive(Clone, Copy, Debug, Default)]
pub struct StaticP2p;

impl Planner for StaticP2p {
    fn name(&self) -> &'static str {
        "static-p2p"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let frags = fragments(problem)?;
        // Turns per holder list (fragments of one replica group share it).
        let mut turn: std::collections::HashMap<*const DeviceId, usize> = std::collections::HashMap::new();
        Ok(assemble(problem, self.name(), &frags, |_, f| {
            let t = turn.entry(f.holders.as_ptr()).or_insert(0);
            let src = f.holders[*t % f.holders.len()];
            *t += 1;
            (src, Vec::new())
        }))
    }
}

/// Centralised: all state flows through one node (the lowest-numbered node
/// with a live device), as when a coordinator gathers a checkpoint and
/// scatters it again. Sources on that node are preferred; other copies are
/// relayed through one of its devices unless they start or end there.
#[derive(Clone, Copy, Debug, Default)]
pub struct Central;

impl Planner for Central {
    fn name(&self) -> &'static str {
        "central"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let frags = fragments(problem)?;
        let cluster = problem.cluster();
        let live: Vec<DeviceId> = (0..cluster.num_devices()).filter(|&d| cluster.is_live(d)).collect();
        let hub = cluster.node_of(live[0]);
        let hub_devices: Vec<DeviceId> = live.into_iter().filter(|&d| cluster.node_of(d) == hub).collect();
        Ok(assemble(problem, self.name(), &frags, |_, f| {
            let src = f
                .holders
                .iter()
                .copied()
                .find(|&h| cluster.node_of(h) == hub)
                .unwrap_or(f.holders[0]);
            let via = if cluster.node_of(src) != hub && cluster.node_of(f.dst) != hub {
                let local = (f.dst % cluster.gpus_per_node()) as usize;
                vec![hub_devices[local % hub_devices.len()]]
            } else {
                Vec::new()
            };
            (src, via)
        }))
    }
}

/// Least-loaded greedy, the deduplication policy of PyTorch DCP, Megatron
/// dist-checkpointing and ByteCheckpoint: fragments with the fewest holders
/// first, largest first, each to the holder that has sent the fewest bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl Planner for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let frags = fragments(problem)?;
        let mut order: Vec<usize> = (0..frags.len()).collect();
        order.sort_by_key(|&i| (frags[i].holders.len(), std::cmp::Reverse(frags[i].bytes), i));
        // Dense per device: each fragment scans all its holders.
        let mut load = vec![0u64; problem.cluster().num_devices() as usize];
        let mut src = vec![0; frags.len()];
        for i in order {
            let f = &frags[i];
            let best = *f
                .holders
                .iter()
                .min_by_key(|&&h| load[h as usize])
                .expect("fragments have live holders");
            load[best as usize] += f.bytes;
            src[i] = best;
        }
        Ok(assemble(problem, self.name(), &frags, |i, _| (src[i], Vec::new())))
    }
}

/// HotSPa's switch planner (SOSP'24): the destination itself if it holds the
/// data, else an owner on the destination's node, else any owner; among
/// candidates the one that has sent the least volume so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct HotSpa;

impl Planner for HotSpa {
    fn name(&self) -> &'static str {
        "hotspa"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let frags = fragments(problem)?;
        let cluster = problem.cluster();
        let mut sent = vec![0u64; cluster.num_devices() as usize];
        Ok(assemble(problem, self.name(), &frags, |_, f| {
            if f.holders.contains(&f.dst) {
                return (f.dst, Vec::new());
            }
            let node = cluster.node_of(f.dst);
            // Least sent among the owners on the destination's node, else among all.
            let least = |pool: &mut dyn Iterator<Item = DeviceId>| pool.min_by_key(|&h| sent[h as usize]);
            let best = least(&mut f.holders.iter().copied().filter(|&h| cluster.node_of(h) == node))
                .or_else(|| least(&mut f.holders.iter().copied()))
                .expect("fragments have live holders");
            sent[best as usize] += f.bytes;
            (best, Vec::new())
        }))
    }
}
