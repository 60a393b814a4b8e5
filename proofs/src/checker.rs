//! The independent plan checker.
//!
//! It proves, from the two layouts and the cluster alone, that executing a
//! plan leaves every target device holding exactly what the target layout
//! says. It reasons on boxes, never on elements, so it scales to plans for
//! the largest models, and it shares no code with any planner.
//!
//! What it proves, for every live target device and every buffer of its shard:
//! - every copy reads from a live device whose source shard holds the whole
//!   box of that tensor, relays only through live devices, and writes into a
//!   target piece of the same tensor that contains the box (so every element
//!   lands at the position of the same logical element, never out of bounds);
//!   a multicast copy writes every device of its fanout the same way, and
//!   (unless the problem allows forwarding across the cluster) forwards
//!   only within the destination's node, from a source off it;
//! - the boxes written into each target piece are pairwise disjoint and their
//!   volumes add up to the piece's: every element is written exactly once;
//! - the fills cover exactly the buffer's padding: every padding element is
//!   zeroed once and no data element is.

use std::collections::BTreeMap;
use std::fmt;

use rustc_hash::FxHashMap;
use tenplan_ptc::{Buffer, DeviceId, Forwarding, Plan, Region, Shard};

/// Why a plan is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// A copy names a tensor that does not exist.
    #[error("copy #{copy}: tensor #{tensor} does not exist")]
    UnknownTensor {
        /// Index of the copy.
        copy: usize,
        /// The tensor index.
        tensor: u32,
    },
    /// A copy reads from a dead or missing device.
    #[error("copy #{copy} of `{tensor}` {region}: source device {device} is dead or does not exist")]
    DeadSource {
        /// Index of the copy.
        copy: usize,
        /// Tensor name.
        tensor: String,
        /// Box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
    },
    /// A copy reads a box its source does not hold.
    #[error("copy #{copy} of `{tensor}` {region}: device {device} holds only {held} of its {total} elements in the source layout")]
    SourceLacksData {
        /// Index of the copy.
        copy: usize,
        /// Tensor name.
        tensor: String,
        /// Box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
        /// Elements of the box the device holds.
        held: u64,
        /// Elements in the box.
        total: u64,
    },
    /// A copy relays through a dead or missing device.
    #[error("copy #{copy} of `{tensor}` {region}: relay device {device} is dead or does not exist")]
    DeadRelay {
        /// Index of the copy.
        copy: usize,
        /// Tensor name.
        tensor: String,
        /// Box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
    },
    /// A write to a device that holds no target shard.
    #[error("device {device} holds nothing in the target layout, but copy or fill #{index} writes to it")]
    NotATarget {
        /// Index of the copy or fill.
        index: usize,
        /// Device.
        device: DeviceId,
    },
    /// A write to a buffer or piece that does not exist.
    #[error("device {device}: buffer #{buffer} has no piece of `{tensor}` at offset {offset} (copy #{copy})")]
    NoSuchPiece {
        /// Index of the copy.
        copy: usize,
        /// Device.
        device: DeviceId,
        /// Buffer index.
        buffer: u32,
        /// Offset.
        offset: u64,
        /// Tensor name.
        tensor: String,
    },
    /// A copy's box does not fit in the target piece it writes.
    #[error("copy #{copy} of `{tensor}` {region} to device {device}: box lies outside the target piece {piece}")]
    OutOfPiece {
        /// Index of the copy.
        copy: usize,
        /// Tensor name.
        tensor: String,
        /// Box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
        /// The target piece's box.
        piece: Box<Region>,
    },
    /// Some elements are written twice.
    #[error("`{tensor}` {region} is written twice on device {device} (buffer `{buffer}`)")]
    DoubleWrite {
        /// Tensor name.
        tensor: String,
        /// The doubly written box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
    },
    /// Some elements of a target piece are never written.
    #[error(
        "`{tensor}` {region} on device {device} (buffer `{buffer}`): only {written} of {total} elements are written"
    )]
    NotWritten {
        /// Tensor name.
        tensor: String,
        /// The target piece's box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// Elements written.
        written: u64,
        /// Elements in the piece.
        total: u64,
    },
    /// A copy adds where it must overwrite, or overwrites where it must add:
    /// copies of partial tensors add (one addend each), all others overwrite.
    #[error("copy #{copy} of `{tensor}`: reduce is {reduce}, but the tensor is {}", if *reduce { "whole in the source" } else { "partial sums in the source" })]
    ReduceMismatch {
        /// Index of the copy.
        copy: usize,
        /// Tensor name.
        tensor: String,
        /// The copy's flag.
        reduce: bool,
    },
    /// A target piece of a partial tensor lacks (part of) one holder's addend.
    #[error(
        "`{tensor}` {region} on device {device} (buffer `{buffer}`): {written} of the {total} elements of device {holder}'s addend are added"
    )]
    AddendMissing {
        /// Tensor name.
        tensor: String,
        /// The target piece's box.
        region: Box<Region>,
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// The holder whose addend is missing.
        holder: DeviceId,
        /// Elements of its addend added.
        written: u64,
        /// Elements of its addend the piece needs.
        total: u64,
    },
    /// A multicast copy's fanout breaks the rules: each forwarded-to device
    /// is live and appears once, and unless the problem allows forwarding
    /// across the cluster they sit on the node of the copy's destination,
    /// the source on another node.
    #[error("copy #{copy} of `{tensor}` {region}: cannot forward to device {device}: {why}")]
    BadFanout {
        /// Index of the copy.
        copy: usize,
        /// Tensor name.
        tensor: String,
        /// Box.
        region: Box<Region>,
        /// The forwarded-to device.
        device: DeviceId,
        /// Which rule it breaks.
        why: String,
    },
    /// A fill that is empty, runs past its buffer, overlaps data or another fill.
    #[error("fill #{fill} of device {device} buffer `{buffer}` elements {start}..{end} is empty, out of bounds, or overwrites data or another fill")]
    BadFill {
        /// Index of the fill.
        fill: usize,
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// First element.
        start: u64,
        /// End.
        end: u64,
    },
    /// Padding that no fill zeroes.
    #[error("device {device} buffer `{buffer}`: {missing} padding elements are never zero-filled")]
    PaddingNotZeroed {
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// Elements left.
        missing: u64,
    },
}

/// What the checker proved about a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Certificate {
    /// Copies checked.
    pub copies: usize,
    /// Fills checked.
    pub fills: usize,
    /// Target pieces proven exactly covered.
    pub pieces: usize,
    /// Elements proven written exactly once (data and padding).
    pub elements: u64,
}

impl fmt::Display for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "verified: {} copies and {} fills write {} target pieces, {} elements, each exactly once",
            self.copies, self.fills, self.pieces, self.elements
        )
    }
}

/// Elements of `region` that `shard` holds: it may hold a tensor's box in
/// several pieces, and distinct boxes of a valid layout never overlap.
fn held(boxes: &[&Region], region: &Region) -> u64 {
    boxes
        .iter()
        .filter_map(|b| b.intersect(region))
        .map(|r| r.volume())
        .sum()
}

/// The distinct boxes a shard holds of each tensor (a box may sit in
/// several buffers), sorted: built once per source device, so checking a
/// copy costs its tensor's boxes, not the whole shard's pieces.
fn boxes_by_tensor(shard: &Shard) -> FxHashMap<u32, Vec<&Region>> {
    let mut by: FxHashMap<u32, Vec<&Region>> = FxHashMap::default();
    for p in shard.buffers.iter().flat_map(|b| &b.pieces) {
        by.entry(p.tensor).or_default().push(&p.region);
    }
    for boxes in by.values_mut() {
        boxes.sort();
        boxes.dedup();
    }
    by
}

/// A map from devices as a table indexed by device.
fn dense<T: Copy>(map: &BTreeMap<DeviceId, T>) -> Vec<Option<T>> {
    let len = map.keys().next_back().map_or(0, |&d| d as usize + 1);
    let mut table = vec![None; len];
    for (&d, &v) in map {
        table[d as usize] = Some(v);
    }
    table
}

/// A copy's write into a target piece: the piece's key, the copy, and the
/// elements it writes.
type Write<K> = (K, usize, u64);

/// The elements the copies of `sorted` (sorted by key, then copy) write
/// under one key (a piece of `device`), if no two of their boxes overlap.
fn written<K: Ord>(
    plan: &Plan,
    sorted: &[Write<K>],
    key: &K,
    (device, tensor, buffer): (DeviceId, &str, &str),
) -> Result<u64, Violation> {
    let start = sorted.partition_point(|(k, _, _)| k < key);
    let end = start + sorted[start..].partition_point(|(k, _, _)| k == key);
    match &sorted[start..end] {
        [] => Ok(0),
        [(_, _, elements)] => Ok(*elements),
        // Two writes (a piece fed by two sources, the commonest case of
        // several): compared directly, without gathering their boxes.
        [(_, i, a), (_, j, b)] => match plan.copies[*i].region.intersect(&plan.copies[*j].region) {
            Some(region) => Err(Violation::DoubleWrite {
                tensor: tensor.to_string(),
                region: Box::new(region),
                device,
                buffer: buffer.to_string(),
            }),
            None => Ok(a + b),
        },
        several => {
            let boxes = several.iter().map(|&(_, i, _)| &plan.copies[i].region).collect();
            disjoint_volume(boxes, tensor, device, buffer)
        }
    }
}

/// The elements the boxes written into one piece cover, if no two overlap.
fn disjoint_volume(mut boxes: Vec<&Region>, tensor: &str, device: DeviceId, buffer: &str) -> Result<u64, Violation> {
    if let Some(region) = first_overlap(&mut boxes) {
        return Err(Violation::DoubleWrite {
            tensor: tensor.to_string(),
            region: Box::new(region),
            device,
            buffer: buffer.to_string(),
        });
    }
    Ok(boxes.iter().map(|r| r.volume()).sum())
}

/// Find two overlapping boxes among `boxes`, if any.
fn first_overlap(boxes: &mut [&Region]) -> Option<Region> {
    boxes.sort_by_key(|r| r.range(0).start);
    for (i, a) in boxes.iter().enumerate() {
        for b in &boxes[i + 1..] {
            if b.range(0).start >= a.range(0).end {
                break;
            }
            if let Some(x) = a.intersect(b) {
                return Some(x);
            }
        }
    }
    None
}

/// A plan that the checker has accepted. Only [`verify`] makes one, so code
/// that takes a `Verified` (such as the executor) runs proven plans only.
#[derive(Clone, Debug)]
pub struct Verified<'a> {
    plan: &'a Plan,
    certificate: Certificate,
}

impl<'a> Verified<'a> {
    /// The plan.
    pub fn plan(&self) -> &'a Plan {
        self.plan
    }

    /// What was proven.
    pub fn certificate(&self) -> &Certificate {
        &self.certificate
    }
}

/// Check a plan and wrap it as proven.
pub fn verify(plan: &Plan) -> Result<Verified<'_>, Violation> {
    let certificate = check(plan)?;
    Ok(Verified { plan, certificate })
}

/// Check a plan against the problem it carries.
pub fn check(plan: &Plan) -> Result<Certificate, Violation> {
    let problem = &plan.problem;
    let (source, target, cluster) = (problem.source(), problem.target(), problem.cluster());
    let tensors = problem.tensors();
    let mut target_shards: BTreeMap<DeviceId, &Shard> = BTreeMap::new();
    for s in target.shards() {
        for &d in &s.devices {
            target_shards.insert(d, s);
        }
    }
    // Tables indexed by device, and what each source shard holds by tensor,
    // built once per shard (replicas share theirs): copies come in a
    // planner's issue order, where maps keyed by device and tensor missed
    // the cache on every copy. (The order of a HashMap reaches no output.)
    let target_of: Vec<Option<&Shard>> = dense(&target_shards);
    let source_of: Vec<Option<u32>> = {
        let mut by: BTreeMap<DeviceId, u32> = BTreeMap::new();
        for (i, s) in source.shards().iter().enumerate() {
            for &d in &s.devices {
                by.insert(d, u32::try_from(i).expect("fewer than 2^32 shards"));
            }
        }
        dense(&by)
    };
    // Looked up once per copy: FxHash, not SipHash.
    let mut source_boxes: Vec<Option<FxHashMap<u32, Vec<&Region>>>> = vec![None; source.shards().len()];
    // Writes as ((device, buffer, piece offset), copy, elements), and
    // addends of partial tensors as ((device, buffer, piece offset,
    // holder), copy, elements): sorted once below and read in ranges.
    // (Maps keyed per write cost a cache miss per insertion at millions of
    // copies in a planner's issue order: 8 s of 9 at 16,384 GPUs.) A piece
    // that one copy writes is summed without reading the copy again,
    // which in this order is a cache miss too (405B at 16,384 GPUs: 3.5 s
    // -> 2.0 s to check 7.3M copies).
    let mut writes: Vec<Write<(DeviceId, u32, u64)>> = Vec::new();
    let mut addends: Vec<Write<(DeviceId, u32, u64, DeviceId)>> = Vec::new();
    // A multicast's relays and written devices, sorted (chains and trees
    // name hundreds), in buffers reused from copy to copy.
    let (mut relays, mut named) = (Vec::new(), Vec::new());
    for (i, c) in plan.copies.iter().enumerate() {
        let spec = tensors.get(c.tensor as usize).ok_or(Violation::UnknownTensor {
            copy: i,
            tensor: c.tensor,
        })?;
        let name = || spec.name.clone();
        if !cluster.is_live(c.src) {
            return Err(Violation::DeadSource {
                copy: i,
                tensor: name(),
                region: Box::new(c.region.clone()),
                device: c.src,
            });
        }
        let total = c.region.volume();
        let have = match source_of.get(c.src as usize).copied().flatten() {
            Some(s) => {
                let boxes =
                    source_boxes[s as usize].get_or_insert_with(|| boxes_by_tensor(&source.shards()[s as usize]));
                boxes.get(&c.tensor).map_or(0, |b| held(b, &c.region))
            }
            None => 0,
        };
        if have != total || c.region.ndim() != spec.shape.len() || total == 0 {
            return Err(Violation::SourceLacksData {
                copy: i,
                tensor: name(),
                region: Box::new(c.region.clone()),
                device: c.src,
                held: have,
                total,
            });
        }
        for &v in &c.via {
            if !cluster.is_live(v) {
                return Err(Violation::DeadRelay {
                    copy: i,
                    tensor: name(),
                    region: Box::new(c.region.clone()),
                    device: v,
                });
            }
        }
        let dst_node = cluster.node_of(c.dst);
        let node_only = problem.forwarding() == Forwarding::Node;
        relays.clear();
        named.clear();
        if !c.fanout.is_empty() {
            named.extend(c.writes().map(|w| w.dst));
            named.sort_unstable();
            if c.fanout.iter().any(|f| f.in_passing) {
                relays.extend_from_slice(&c.via);
                relays.sort_unstable();
            }
        }
        let twice = named.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        for f in &c.fanout {
            let why = if !cluster.is_live(f.dst) {
                Some("it is dead or does not exist".to_string())
            } else if twice == Some(f.dst) {
                Some("it is named twice".to_string())
            } else if f.in_passing && relays.binary_search(&f.dst).is_err() {
                // A relay keeps what passes through it: no hop of its own.
                Some("it writes in passing but is not a relay of the copy".to_string())
            } else if node_only && cluster.node_of(f.dst) != dst_node {
                // A relay that keeps the box and passes it on to another
                // node forwards across nodes, as a fanout there would.
                Some(format!("it is not on node {dst_node} of destination {}", c.dst))
            } else if node_only && cluster.node_of(c.src) == dst_node {
                Some(format!("source {} is on the destination's node already", c.src))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Violation::BadFanout {
                    copy: i,
                    tensor: name(),
                    region: Box::new(c.region.clone()),
                    device: f.dst,
                    why,
                });
            }
        }
        let partial = source.is_partial(c.tensor);
        if c.reduce != partial {
            return Err(Violation::ReduceMismatch {
                copy: i,
                tensor: name(),
                reduce: c.reduce,
            });
        }
        for w in c.writes() {
            let dst_shard = target_of
                .get(w.dst as usize)
                .copied()
                .flatten()
                .ok_or(Violation::NotATarget {
                    index: i,
                    device: w.dst,
                })?;
            let piece = dst_shard
                .buffers
                .get(w.buffer as usize)
                .and_then(|b| b.pieces.iter().find(|p| p.offset == w.offset && p.tensor == c.tensor))
                .ok_or_else(|| Violation::NoSuchPiece {
                    copy: i,
                    device: w.dst,
                    buffer: w.buffer,
                    offset: w.offset,
                    tensor: name(),
                })?;
            if !piece.region.contains(&c.region) {
                return Err(Violation::OutOfPiece {
                    copy: i,
                    tensor: name(),
                    region: Box::new(c.region.clone()),
                    device: w.dst,
                    piece: Box::new(piece.region.clone()),
                });
            }
            if partial {
                addends.push(((w.dst, w.buffer, w.offset, c.src), i, total));
            } else {
                writes.push(((w.dst, w.buffer, w.offset), i, total));
            }
        }
    }
    let mut fills: BTreeMap<(DeviceId, u32), Vec<Span>> = BTreeMap::new();
    for (i, f) in plan.fills.iter().enumerate() {
        if !target_shards.contains_key(&f.device) {
            return Err(Violation::NotATarget {
                index: i,
                device: f.device,
            });
        }
        fills
            .entry((f.device, f.buffer))
            .or_default()
            .push((f.offset, f.offset.saturating_add(f.len), i));
    }
    writes.sort_unstable();
    addends.sort_unstable();
    let mut cert = Certificate {
        copies: plan.copies.len(),
        fills: plan.fills.len(),
        pieces: 0,
        elements: 0,
    };
    for (&device, shard) in &target_shards {
        for (bi, buf) in shard.buffers.iter().enumerate() {
            for p in &buf.pieces {
                if source.is_partial(p.tensor) {
                    // Every holder's addend, each element exactly once.
                    let mut need: BTreeMap<DeviceId, u64> = BTreeMap::new();
                    for s in source.sub_tensors(p.tensor) {
                        if let Some(common) = s.region.intersect(&p.region) {
                            for &h in &s.holders {
                                *need.entry(h).or_default() += common.volume();
                            }
                        }
                    }
                    for (holder, total) in need {
                        let key = (device, bi as u32, p.offset, holder);
                        let at = (device, tensors[p.tensor as usize].name.as_str(), buf.name.as_str());
                        let written = written(plan, &addends, &key, at)?;
                        if written != total {
                            return Err(Violation::AddendMissing {
                                tensor: tensors[p.tensor as usize].name.clone(),
                                region: Box::new(p.region.clone()),
                                device,
                                buffer: buf.name.clone(),
                                holder,
                                written,
                                total,
                            });
                        }
                        cert.elements += written;
                    }
                    cert.pieces += 1;
                    continue;
                }
                let key = (device, bi as u32, p.offset);
                let at = (device, tensors[p.tensor as usize].name.as_str(), buf.name.as_str());
                let written = written(plan, &writes, &key, at)?;
                if written != p.region.volume() {
                    return Err(Violation::NotWritten {
                        tensor: tensors[p.tensor as usize].name.clone(),
                        region: Box::new(p.region.clone()),
                        device,
                        buffer: buf.name.clone(),
                        written,
                        total: p.region.volume(),
                    });
                }
                cert.pieces += 1;
                cert.elements += written;
            }
            let zeroed = check_fills(device, buf, fills.remove(&(device, bi as u32)).unwrap_or_default())?;
            cert.elements += zeroed;
        }
    }
    if let Some(((device, buffer), f)) = fills.into_iter().next() {
        return Err(Violation::BadFill {
            fill: f[0].2,
            device,
            buffer: format!("#{buffer}"),
            start: f[0].0,
            end: f[0].1,
        });
    }
    Ok(cert)
}

/// A span of buffer elements `[start, end)` and the fill that writes it
/// (`usize::MAX` for a piece's data).
type Span = (u64, u64, usize);

/// Fills of one buffer must be non-empty, in bounds, disjoint from each other
/// and from every piece, and cover all the padding. Returns the padding size.
fn check_fills(device: DeviceId, buf: &Buffer, mut fills: Vec<Span>) -> Result<u64, Violation> {
    let bad = |f: Span| Violation::BadFill {
        fill: f.2,
        device,
        buffer: buf.name.clone(),
        start: f.0,
        end: f.1,
    };
    let data: u64 = buf.pieces.iter().map(|p| p.region.volume()).sum();
    if fills.is_empty() {
        // Nothing zeroed (most buffers: one piece fills them whole): the
        // pieces must cover the buffer, and a layout's pieces never overlap.
        return match buf.len - data {
            0 => Ok(0),
            missing => Err(Violation::PaddingNotZeroed {
                device,
                buffer: buf.name.clone(),
                missing,
            }),
        };
    }
    // Every span that gets written, data first: (start, end, fill index or MAX).
    let mut spans: Vec<Span> = buf
        .pieces
        .iter()
        .map(|p| (p.offset, p.offset + p.region.volume(), usize::MAX))
        .collect();
    for &f in &fills {
        if f.0 >= f.1 || f.1 > buf.len {
            return Err(bad(f));
        }
    }
    spans.append(&mut fills);
    spans.sort_unstable();
    let mut at = 0;
    let mut zeroed = 0;
    let mut prev = None;
    for s in spans {
        if s.0 < at {
            // Overlap: blame whichever of the two is a fill.
            let f = if s.2 != usize::MAX {
                s
            } else {
                prev.expect("overlap needs an earlier span")
            };
            return Err(bad(f));
        }
        if s.2 != usize::MAX {
            zeroed += s.1 - s.0;
        }
        at = s.1;
        prev = Some(s);
    }
    let padding = buf.len - data;
    if zeroed != padding {
        return Err(Violation::PaddingNotZeroed {
            device,
            buffer: buf.name.clone(),
            missing: padding - zeroed,
        });
    }
    Ok(zeroed)
}
