//! A verified plan compiled into one program per device, for executors in
//! which every device is its own process and moves data by message passing
//! (the torch.distributed executor of the Python package: gloo on CPUs,
//! NCCL on GPUs).
//!
//! A program is a list of [`Step`]s in a global order shared by every
//! device: staging round first, then hop along the copies' routes. A copy
//! `src → via… → dst ⇒ fanout` travels one hop per step (the relays and
//! `dst` receive at one step and forward at the next; a relay that keeps
//! the data writes it at the step it arrives), so a device at step
//! `s` waits only for peers' operations of step `s`, which every peer
//! reaches after finishing its earlier steps: no device can wait on a peer
//! that waits on it. Within a step, the messages from one device to
//! another are packed into one transfer, in plan order, except large ones
//! that need no packing or unpacking when they travel alone
//! ([`ALONE_MIN_BYTES`]); sender and receiver list the transfers of a pair
//! in the same order, so the transport matches sends with receives in
//! order.
//!
//! A message is the copy's box in row-major order (its staging tensor):
//! the sender gathers it from the pieces of its source buffers
//! ([`Gather`]), every writer scatters it into its target piece
//! ([`Write`]), adding where the copy is a reduce-copy. Staging tensors are
//! released at the end of each round, so a plan staged to a memory budget
//! ([`BoxCopy::round`]) stays within it. Target buffers start zeroed, which is
//! what the plan's fills (padding) ask for.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;
use tenplan_ptc::{BoxCopy, DType, DeviceId, Layout, Region};

use crate::{Error, HostMemory, Result, Verified};

/// A box inside one piece of a device buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PieceBox {
    /// The buffer, as an index into the device's shard's buffers.
    pub buffer: u32,
    /// Element offset of the piece in the buffer.
    pub offset: u64,
    /// Shape of the piece (its elements are row-major from `offset`).
    pub shape: Vec<u64>,
    /// First element of the box on each dimension, relative to the piece.
    pub lo: Vec<u64>,
    /// One past the last, relative to the piece.
    pub hi: Vec<u64>,
}

/// Where a message's staging tensor comes from on its sender: each part is
/// a box of a source piece, landing at `at` (relative to the message's box).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gather {
    /// The message (the copy's index in the plan).
    pub message: u32,
    /// The parts, covering the message's box exactly once.
    pub parts: Vec<(PieceBox, Vec<u64>)>,
}

/// Where a message lands on a writer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Write {
    /// The message.
    pub message: u32,
    /// The box of the target piece it fills (the whole message).
    pub target: PieceBox,
    /// Add into the target instead of overwriting it.
    pub reduce: bool,
}

/// Messages sent to, or received from, one peer in one step, packed in
/// order; or one large message alone (see [`ALONE_MIN_BYTES`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// The peer device.
    pub peer: DeviceId,
    /// The messages, in the order they are packed.
    pub messages: Vec<u32>,
    /// Bytes in all.
    pub bytes: u64,
    /// A message that travels alone; no other joins this transfer.
    pub alone: bool,
}

/// A copy within one device: gathered from its source pieces and written
/// into its target pieces at once, so that it needs a staging tensor only
/// while it runs (local copies take no part in a plan's staging budget).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LocalCopy {
    /// Where the box comes from.
    pub gather: Gather,
    /// Where it lands.
    pub writes: Vec<Write>,
}

/// One step of a device's program: local copies one at a time; then
/// gather, send and receive (all at once), write; then release the staging
/// tensors named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Staging round.
    pub round: u32,
    /// Hop along the copies' routes.
    pub hop: u32,
    /// Copies from this device to itself.
    pub local: Vec<LocalCopy>,
    /// Staging tensors built from this device's source buffers.
    pub gathers: Vec<Gather>,
    /// What this device sends, by peer.
    pub sends: Vec<Transfer>,
    /// What it receives, by peer.
    pub recvs: Vec<Transfer>,
    /// Messages written into this device's target buffers.
    pub writes: Vec<Write>,
    /// Staging tensors no later step reads.
    pub release: Vec<u32>,
}

/// A message: one copy's box of one tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// Element type.
    pub dtype: DType,
    /// Shape of the box.
    pub shape: Vec<u64>,
}

/// The buffers of a device's shard in one layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BufferSpec {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Elements.
    pub len: u64,
    /// The shape of its one piece when it holds one piece filling it (a
    /// plain tensor shard), else none (a flat buffer).
    pub shape: Option<Vec<u64>>,
}

/// What one device does to perform a verified plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceProgram {
    /// The device.
    pub device: DeviceId,
    /// Its source buffers (empty when it holds no source state).
    pub source: Vec<BufferSpec>,
    /// Its target buffers (empty when it holds no target state).
    pub target: Vec<BufferSpec>,
    /// Every message it stages, by id.
    pub messages: BTreeMap<u32, Message>,
    /// The steps, in the global order.
    pub steps: Vec<Step>,
}

fn buffer_specs(layout: &Layout, device: DeviceId) -> Vec<BufferSpec> {
    let Some(shard) = layout.shard_of(device) else {
        return Vec::new();
    };
    shard
        .buffers
        .iter()
        .map(|b| BufferSpec {
            name: b.name.clone(),
            dtype: b.dtype,
            len: b.len,
            shape: match b.pieces.as_slice() {
                [p] if p.offset == 0 && p.region.volume() == b.len => Some(p.region.shape()),
                _ => None,
            },
        })
        .collect()
}

fn piece_box(buffer: usize, offset: u64, piece: &Region, inner: &Region) -> PieceBox {
    let plo = piece.lo();
    PieceBox {
        buffer: buffer as u32,
        offset,
        shape: piece.shape(),
        lo: inner.lo().iter().zip(&plo).map(|(a, b)| a - b).collect(),
        hi: (0..inner.ndim()).map(|d| inner.range(d).end - plo[d]).collect(),
    }
}

/// The parts of `c`'s box on its sender: the source pieces of the sender
/// that overlap it. Identical boxes in several buffers of a shard are one
/// replicated sub-tensor: the first is read.
fn gather(source: &Layout, c: &BoxCopy, message: u32) -> Result<Gather> {
    let mut parts = Vec::new();
    let mut seen: BTreeSet<&Region> = BTreeSet::new();
    let mut covered = 0;
    let lo = c.region.lo();
    for (bi, p) in source.pieces_of(c.src, c.tensor) {
        let Some(inner) = p.region.intersect(&c.region) else {
            continue;
        };
        if !seen.insert(&p.region) {
            continue;
        }
        covered += inner.volume();
        let at = inner.lo().iter().zip(&lo).map(|(a, b)| a - b).collect();
        parts.push((piece_box(bi, p.offset, &p.region, &inner), at));
    }
    if covered != c.region.volume() {
        return Err(Error::PlanMismatch {
            what: format!(
                "device {} does not hold box {} of tensor {} exactly once",
                c.src, c.region, c.tensor
            ),
        });
    }
    Ok(Gather { message, parts })
}

fn target_box(target: &Layout, c: &BoxCopy, dst: DeviceId, buffer: u32, offset: u64) -> Result<PieceBox> {
    let piece = target
        .piece_at(dst, buffer, offset, c.tensor)
        .ok_or_else(|| Error::PlanMismatch {
            what: format!("device {dst} has no target piece at buffer {buffer}, offset {offset}"),
        })?;
    Ok(piece_box(buffer as usize, offset, &piece.region, &c.region))
}

impl DeviceProgram {
    /// The program of every device the plan names, source or target. Each
    /// is what [`DeviceProgram::of`] gives for that device.
    pub fn all(verified: &Verified<'_>) -> Result<BTreeMap<DeviceId, DeviceProgram>> {
        Self::all_with(verified, ALONE_MIN_BYTES)
    }

    /// [`DeviceProgram::all`], with messages of at least `alone_min_bytes`
    /// sent alone where that saves a copy.
    pub fn all_with(verified: &Verified<'_>, alone_min_bytes: u64) -> Result<BTreeMap<DeviceId, DeviceProgram>> {
        let plan = verified.plan();
        let problem = &plan.problem;
        // Relays may hold no state of either layout.
        let devices: BTreeSet<DeviceId> = problem
            .source()
            .devices()
            .chain(problem.target().devices())
            .chain(plan.copies.iter().flat_map(|c| c.via.iter().copied()))
            .collect();
        devices
            .into_iter()
            .map(|d| Ok((d, Self::of_with(verified, d, alone_min_bytes)?)))
            .collect()
    }

    /// The program of `device` for a verified plan.
    pub fn of(verified: &Verified<'_>, device: DeviceId) -> Result<DeviceProgram> {
        Self::of_with(verified, device, ALONE_MIN_BYTES)
    }

    /// [`DeviceProgram::of`], with messages of at least `alone_min_bytes`
    /// sent alone where that saves a copy (every program of one plan must
    /// be made with the same value).
    pub fn of_with(verified: &Verified<'_>, device: DeviceId, alone_min_bytes: u64) -> Result<DeviceProgram> {
        let plan = verified.plan();
        let (source, target) = (plan.problem.source(), plan.problem.target());
        let tensors = plan.problem.tensors();
        // Steps by (round, hop), built as the copies are walked in plan order.
        let mut steps: BTreeMap<(u32, u32), Step> = BTreeMap::new();
        let mut messages = BTreeMap::new();
        let mut last_use: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
        let mut packed = PackedAt::new();
        for (i, c) in plan.copies.iter().enumerate() {
            let route = c.route();
            let involved = route.contains(&device) || c.fanout.iter().any(|f| f.dst == device);
            if !involved {
                continue;
            }
            let id = i as u32;
            let dtype = tensors[c.tensor as usize].dtype;
            let bytes = c.region.volume() * dtype.size();
            messages.insert(
                id,
                Message {
                    dtype,
                    shape: c.region.shape(),
                },
            );
            let r = c.round;
            let last = (route.len() - 1) as u32;
            let mut used = None;
            if device == c.src {
                step_at(&mut steps, &mut used, (r, 0))
                    .gathers
                    .push(gather(source, c, id)?);
            }
            // Hops along the route: route[h] sends to route[h + 1] at step h.
            for h in 0..last as usize {
                let (from, to) = (route[h], route[h + 1]);
                if device != from && device != to {
                    continue;
                }
                let alone = bytes >= alone_min_bytes
                    && ((h > 0 || sent_as_it_lies(source, c)?) || (to == c.dst && received_in_place(target, c)?));
                let k = (r, h as u32);
                if device == from {
                    let sends = &mut step_at(&mut steps, &mut used, k).sends;
                    push_transfer(sends, &mut packed, (k, true, to), id, bytes, alone);
                }
                if device == to {
                    let recvs = &mut step_at(&mut steps, &mut used, k).recvs;
                    push_transfer(recvs, &mut packed, (k, false, from), id, bytes, alone);
                }
            }
            // The destination writes where the data arrives (at hop
            // `last − 1`, or at hop 0 for a local copy), then forwards it
            // to the fanout at hop `last`.
            if device == c.dst {
                let target = target_box(target, c, c.dst, c.buffer, c.offset)?;
                step_at(&mut steps, &mut used, (r, last.saturating_sub(1)))
                    .writes
                    .push(Write {
                        message: id,
                        target,
                        reduce: c.reduce,
                    });
            }
            for f in &c.fanout {
                if f.in_passing {
                    // A relay that keeps the data writes it where it arrives.
                    if device == f.dst {
                        let hop = route.iter().position(|&d| d == f.dst).unwrap_or(0).saturating_sub(1);
                        let target = target_box(target, c, f.dst, f.buffer, f.offset)?;
                        step_at(&mut steps, &mut used, (r, hop as u32)).writes.push(Write {
                            message: id,
                            target,
                            reduce: c.reduce,
                        });
                    }
                    continue;
                }
                // A forward is sent from a staging tensor that is whole.
                let alone = bytes >= alone_min_bytes;
                if device == c.dst {
                    let sends = &mut step_at(&mut steps, &mut used, (r, last)).sends;
                    push_transfer(sends, &mut packed, ((r, last), true, f.dst), id, bytes, alone);
                }
                if device == f.dst {
                    let target = target_box(target, c, f.dst, f.buffer, f.offset)?;
                    let step = step_at(&mut steps, &mut used, (r, last));
                    push_transfer(
                        &mut step.recvs,
                        &mut packed,
                        ((r, last), false, c.dst),
                        id,
                        bytes,
                        alone,
                    );
                    step.writes.push(Write {
                        message: id,
                        target,
                        reduce: c.reduce,
                    });
                }
            }
            if let Some(k) = used {
                last_use.insert(id, k);
            }
        }
        for (id, k) in last_use {
            steps.get_mut(&k).expect("used").release.push(id);
        }
        for step in steps.values_mut() {
            separate_local(step);
        }
        Ok(DeviceProgram {
            device,
            source: buffer_specs(source, device),
            target: buffer_specs(target, device),
            messages,
            steps: steps.into_values().collect(),
        })
    }
}

/// The step `key` (made empty when new), noting it in `used` when it is the
/// latest step the message takes part in so far.
fn step_at<'s>(
    steps: &'s mut BTreeMap<(u32, u32), Step>,
    used: &mut Option<(u32, u32)>,
    key: (u32, u32),
) -> &'s mut Step {
    *used = (*used).max(Some(key));
    steps.entry(key).or_insert_with(|| Step {
        round: key.0,
        hop: key.1,
        ..Step::default()
    })
}

/// Move the copies a step gathers, writes and releases without sending
/// them anywhere into its local copies.
fn separate_local(step: &mut Step) {
    let sent: BTreeSet<u32> = step.sends.iter().flat_map(|t| t.messages.iter().copied()).collect();
    let released: BTreeSet<u32> = step.release.iter().copied().collect();
    let (local, shared): (Vec<Gather>, Vec<Gather>) = std::mem::take(&mut step.gathers)
        .into_iter()
        .partition(|g| !sent.contains(&g.message) && released.contains(&g.message));
    step.gathers = shared;
    if local.is_empty() {
        return;
    }
    // One pass over the step's writes, not one per local copy: a step of
    // thousands of tensors has thousands of each.
    let ids: BTreeSet<u32> = local.iter().map(|g| g.message).collect();
    let (mine, rest): (Vec<Write>, Vec<Write>) = std::mem::take(&mut step.writes)
        .into_iter()
        .partition(|w| ids.contains(&w.message));
    step.writes = rest;
    step.release.retain(|m| !ids.contains(m));
    let mut by_message: BTreeMap<u32, Vec<Write>> = BTreeMap::new();
    for w in mine {
        by_message.entry(w.message).or_default().push(w);
    }
    for gather in local {
        let writes = by_message.remove(&gather.message).unwrap_or_default();
        step.local.push(LocalCopy { gather, writes });
    }
}

/// Messages at least this large travel alone where that saves a copy: a
/// message sent alone needs no packing when it lies whole in one piece of
/// its sender, and none unpacking when it lands whole in one piece of its
/// receiver; below this size, the transport's cost per message is more
/// than the copy it saves.
pub const ALONE_MIN_BYTES: u64 = 256 << 10;

/// A box that is one contiguous range of its piece's row-major elements:
/// after its first dimension wider than one element, it spans its piece.
fn contiguous(b: &PieceBox) -> bool {
    let mut wide = false;
    for ((&lo, &hi), &n) in b.lo.iter().zip(&b.hi).zip(&b.shape) {
        if wide && (lo, hi) != (0, n) {
            return false;
        }
        wide |= hi - lo > 1;
    }
    true
}

/// Whether `c`'s sender can send its box without packing it: the box lies
/// whole and contiguous in one of its source pieces.
fn sent_as_it_lies(source: &Layout, c: &BoxCopy) -> Result<bool> {
    let g = gather(source, c, 0)?;
    Ok(matches!(g.parts.as_slice(), [(b, _)] if contiguous(b)))
}

/// Whether `c`'s destination can receive its box straight into its target
/// piece: the box is contiguous there and overwrites it.
fn received_in_place(target: &Layout, c: &BoxCopy) -> Result<bool> {
    Ok(!c.reduce && contiguous(&target_box(target, c, c.dst, c.buffer, c.offset)?))
}

/// Where the transfer that packs messages between this device and a peer
/// lies in its step's list: by (step, sends rather than receives, peer).
type PackedAt = BTreeMap<((u32, u32), bool, DeviceId), usize>;

/// Add a message to `list`, the transfers of one step to or from a peer
/// (`at`: the step, sends rather than receives, the peer): into the one
/// transfer that packs messages, or `alone` in a transfer of its own.
/// Sender and receiver walk the plan's copies in the same order, so their
/// transfers pair up in order.
fn push_transfer(
    list: &mut Vec<Transfer>,
    packed: &mut PackedAt,
    at: ((u32, u32), bool, DeviceId),
    message: u32,
    bytes: u64,
    alone: bool,
) {
    if !alone {
        if let Some(&i) = packed.get(&at) {
            list[i].messages.push(message);
            list[i].bytes += bytes;
            return;
        }
        packed.insert(at, list.len());
    }
    list.push(Transfer {
        peer: at.2,
        messages: vec![message],
        bytes,
        alone,
    });
}

/// Row-major element offsets of the box `b` inside its piece, in the box's
/// own row-major order.
fn offsets(b: &PieceBox) -> Vec<u64> {
    let region = Region::new(b.lo.iter().zip(&b.hi).map(|(&l, &h)| l..h)).expect("a box");
    let piece = Region::full(&b.shape);
    region.points().map(|p| b.offset + piece.offset_of(&p)).collect()
}

/// The staging bytes of a gathered message.
fn gather_bytes(p: &DeviceProgram, g: &Gather, source: &HostMemory) -> Result<Vec<u8>> {
    let m = &p.messages[&g.message];
    let size = m.dtype.size() as usize;
    let mut data = vec![0u8; m.shape.iter().product::<u64>() as usize * size];
    let whole = Region::full(&m.shape);
    for (part, lo) in &g.parts {
        let buf = source
            .buffer(p.device, part.buffer as usize)
            .ok_or(Error::MissingDevice { device: p.device })?;
        let inner = Region::new(
            part.lo
                .iter()
                .zip(&part.hi)
                .zip(lo)
                .map(|((&l, &h), &at)| at..at + h - l),
        )
        .expect("a box");
        for (from, point) in offsets(part).into_iter().zip(inner.points()) {
            let to = whole.offset_of(&point) as usize * size;
            data[to..to + size].copy_from_slice(&buf[from as usize * size..][..size]);
        }
    }
    Ok(data)
}

/// Write a message's staging bytes into a target piece.
fn write_bytes(p: &DeviceProgram, w: &Write, data: &[u8], target: &mut HostMemory) -> Result<()> {
    let dtype = p.messages[&w.message].dtype;
    let size = dtype.size() as usize;
    let buf = target
        .buffer_mut(p.device, w.target.buffer as usize)
        .ok_or(Error::MissingDevice { device: p.device })?;
    for (i, to) in offsets(&w.target).into_iter().enumerate() {
        let dst = &mut buf[to as usize * size..][..size];
        let src = &data[i * size..][..size];
        if w.reduce {
            dtype.add_assign(dst, src);
        } else {
            dst.copy_from_slice(src);
        }
    }
    Ok(())
}

/// Run every device's program by message passing in one process, one step
/// at a time in the global order, on host memory: the reference for
/// executors that run the programs in separate processes. Returns the
/// target state.
pub fn run_programs(verified: &Verified<'_>, source: &HostMemory) -> Result<HostMemory> {
    run_programs_with(verified, source, ALONE_MIN_BYTES)
}

/// [`run_programs`] on programs made with [`DeviceProgram::all_with`].
pub fn run_programs_with(verified: &Verified<'_>, source: &HostMemory, alone_min_bytes: u64) -> Result<HostMemory> {
    let programs = DeviceProgram::all_with(verified, alone_min_bytes)?;
    let plan = verified.plan();
    let mut target = HostMemory::zeroed(plan.problem.target());
    let mut staging: BTreeMap<(DeviceId, u32), Vec<u8>> = BTreeMap::new();
    let keys: BTreeSet<(u32, u32)> = programs
        .values()
        .flat_map(|p| p.steps.iter().map(|s| (s.round, s.hop)))
        .collect();
    for key in keys {
        // Transfers of one pair and step, in the order they are sent.
        let mut wires: BTreeMap<(DeviceId, DeviceId), VecDeque<Vec<u8>>> = BTreeMap::new();
        let at = |p: &DeviceProgram| p.steps.iter().find(|s| (s.round, s.hop) == key).cloned();
        for p in programs.values() {
            let Some(s) = at(p) else { continue };
            for l in &s.local {
                let data = gather_bytes(p, &l.gather, source)?;
                for w in &l.writes {
                    write_bytes(p, w, &data, &mut target)?;
                }
            }
            for g in &s.gathers {
                staging.insert((p.device, g.message), gather_bytes(p, g, source)?);
            }
            for t in &s.sends {
                let mut wire = Vec::new();
                for m in &t.messages {
                    wire.extend_from_slice(&staging[&(p.device, *m)]);
                }
                wires.entry((p.device, t.peer)).or_default().push_back(wire);
            }
        }
        for p in programs.values() {
            let Some(s) = at(p) else { continue };
            for t in &s.recvs {
                let wire = wires.get_mut(&(t.peer, p.device)).and_then(VecDeque::pop_front);
                let wire = wire.ok_or_else(|| Error::PlanMismatch {
                    what: format!(
                        "device {} expects a transfer from {} that is never sent",
                        p.device, t.peer
                    ),
                })?;
                if wire.len() as u64 != t.bytes {
                    return Err(Error::PlanMismatch {
                        what: format!(
                            "transfer {} -> {}: {} bytes, expected {}",
                            t.peer,
                            p.device,
                            wire.len(),
                            t.bytes
                        ),
                    });
                }
                let mut rest = &wire[..];
                for m in &t.messages {
                    let msg = &p.messages[m];
                    let n = msg.shape.iter().product::<u64>() as usize * msg.dtype.size() as usize;
                    staging.insert((p.device, *m), rest[..n].to_vec());
                    rest = &rest[n..];
                }
            }
            for w in &s.writes {
                let data = staging[&(p.device, w.message)].clone();
                write_bytes(p, w, &data, &mut target)?;
            }
            for m in &s.release {
                staging.remove(&(p.device, *m));
            }
        }
        if let Some(((a, b), _)) = wires.into_iter().find(|(_, w)| !w.is_empty()) {
            return Err(Error::PlanMismatch {
                what: format!("a transfer {a} -> {b} is sent but never received"),
            });
        }
    }
    Ok(target)
}
