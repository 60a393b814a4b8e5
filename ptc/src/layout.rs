//! Layouts: where every sub-tensor of every tensor lives, and in which buffer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::{limits, DType, DeviceId, Error, Region, Result, TensorId, TensorSpec};

/// A box of a logical tensor placed at an element offset of a device buffer.
/// Its elements occupy `[offset, offset + region.volume())` of the buffer, in
/// the row-major order of the box.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Piece {
    /// The tensor, as an index into the tensor list.
    pub tensor: TensorId,
    /// The box of the tensor.
    #[serde(rename = "box")]
    pub region: Region,
    /// Element offset in the buffer.
    pub offset: u64,
}

/// A device-local buffer: a run of `len` elements of one dtype, holding
/// pieces. Elements no piece covers are padding and must be zero.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buffer {
    /// Name, unique within its shard (e.g. the parameter's name, or
    /// `optimizer.master.flat` for a ZeRO buffer).
    pub name: String,
    /// Element type of the buffer and of every tensor it holds.
    pub dtype: DType,
    /// Length in elements.
    pub len: u64,
    /// The pieces, in any order.
    pub pieces: Vec<Piece>,
    /// The buffer holds partial sums: every device holding it holds one
    /// addend of its pieces, and a tensor's value is the sum of the addends
    /// of all its holders (gradients before their data-parallel reduction).
    /// A tensor is partial in all of a layout's buffers or in none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl Buffer {
    /// A buffer that is one box of a tensor, whole, row-major, and nothing
    /// else (no padding, not partial).
    pub fn of_box(name: impl Into<String>, dtype: DType, tensor: TensorId, region: Region) -> Buffer {
        Buffer {
            name: name.into(),
            dtype,
            len: region.volume(),
            pieces: vec![Piece {
                tensor,
                region,
                offset: 0,
            }],
            partial: false,
        }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.len * self.dtype.size()
    }

    /// The padding: element ranges of the buffer that no piece covers, in order.
    pub fn padding(&self) -> Vec<std::ops::Range<u64>> {
        // Most buffers are one piece filling them whole: nothing to sort.
        if let [p] = &self.pieces[..] {
            if p.offset == 0 && p.region.volume() == self.len {
                return Vec::new();
            }
        }
        let mut spans: Vec<(u64, u64)> = self
            .pieces
            .iter()
            .map(|p| (p.offset, p.offset + p.region.volume()))
            .collect();
        spans.sort_unstable();
        let mut out = Vec::new();
        let mut at = 0;
        for (s, e) in spans {
            if s > at {
                out.push(at..s);
            }
            at = at.max(e);
        }
        if at < self.len {
            out.push(at..self.len);
        }
        out
    }
}

/// A sub-collection (φ): the buffers of one model-parallel rank, and the
/// devices (α) that each hold a replica of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// Name, such as `tp1.pp0` or `tp1.pp0.dp3`.
    pub name: String,
    /// Devices holding a replica, in data-parallel rank order.
    pub devices: Vec<DeviceId>,
    /// The buffers every replica holds.
    pub buffers: Vec<Buffer>,
}

/// A distinct sub-tensor (σ) of a tensor and every device that holds it, in
/// shard order then replica order. Each holder holds the whole box inside
/// one of its pieces (a piece may be larger where replicas are cut
/// differently).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubTensor {
    /// The box.
    pub region: Region,
    /// Holders, live or not.
    pub holders: Vec<DeviceId>,
}

/// A parallelizable tensor collection: tensors (T), their slicing into
/// sub-tensors (σ), the grouping of sub-tensors into shards (φ) and the
/// allocation of shards to devices (α).
///
/// Invariants, checked by [`Layout::new`] (a `Layout` that exists is valid):
/// - every piece names an existing tensor, lies inside it, is not empty, and
///   has its buffer's dtype; pieces of a buffer do not overlap and fit in it;
/// - every element of every tensor is held by at least one piece;
/// - one shard holds each element of a tensor at most once: its distinct
///   boxes of a tensor do not overlap (identical boxes in several buffers or
///   shards are one replicated sub-tensor);
///
/// Replicas in different shards may cut a tensor differently (Megatron's
/// tied embedding falls into differently sized ZeRO-1 buffers on the first
/// and the last pipeline stage). The sub-tensors are then the atoms of the
/// cuts: disjoint boxes tiling the tensor, each inside or outside every
/// piece, held by every device whose piece contains it. Where no boxes
/// overlap, the sub-tensors are the distinct boxes themselves.
/// - every shard has at least one device, and a device holds at most one shard.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    tensors: Arc<[TensorSpec]>,
    // Shared: a layout is immutable once built, and every problem and plan
    // holds one (millions of pieces at scale would be copied by each clone).
    shards: Arc<[Shard]>,
    sub_tensors: Arc<[Vec<SubTensor>]>,
    shard_of: Arc<BTreeMap<DeviceId, usize>>,
    partial: Arc<[bool]>,
    pieces_by_tensor: PiecesByTensor,
}

/// Each shard's pieces by tensor, made on the first lookup of that shard
/// ([`Layout::pieces_of`], [`Layout::piece_at`]): executors look up the
/// pieces of every copy they perform, and a scan of the shard per lookup
/// made a program of 16,000 tensors take 24 s. Planning never asks, so
/// its layouts never pay for it. Derived from the shards, so layouts
/// compare equal whatever has been made.
#[derive(Clone)]
struct PiecesByTensor(Arc<[OnceLock<Vec<TensorPiece>>]>);

/// A piece of a shard: its tensor, its buffer and its place in the buffer's list.
type TensorPiece = (TensorId, u32, u32);

impl PiecesByTensor {
    fn new(shards: usize) -> PiecesByTensor {
        PiecesByTensor((0..shards).map(|_| OnceLock::new()).collect())
    }

    /// The shard's (tensor, buffer, piece) triples, sorted: by tensor, then
    /// in the order the buffers and their pieces are listed.
    fn of<'a>(&'a self, shard: usize, s: &Shard) -> &'a [TensorPiece] {
        self.0[shard].get_or_init(|| {
            let mut all: Vec<TensorPiece> = s
                .buffers
                .iter()
                .enumerate()
                .flat_map(|(bi, b)| {
                    b.pieces
                        .iter()
                        .enumerate()
                        .map(move |(pi, p)| (p.tensor, bi as u32, pi as u32))
                })
                .collect();
            all.sort_unstable();
            all
        })
    }
}

impl PartialEq for PiecesByTensor {
    fn eq(&self, _: &PiecesByTensor) -> bool {
        true
    }
}

impl std::fmt::Debug for PiecesByTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PiecesByTensor")
    }
}

/// Check a tensor list: unique names, non-empty shapes.
pub fn validate_tensors(tensors: &[TensorSpec]) -> Result<()> {
    let mut names = BTreeSet::new();
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(Error::DuplicateTensor { name: t.name.clone() });
        }
        if t.shape.is_empty() || t.shape.contains(&0) || t.shape.len() > limits::MAX_DIMS {
            return Err(Error::BadShape {
                name: t.name.clone(),
                shape: t.shape.clone(),
            });
        }
        // Every later count (volumes, bytes) stays far from overflowing u64.
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX);
        limits::check("elements of a tensor", numel, limits::MAX_TENSOR_ELEMENTS)?;
    }
    Ok(())
}

impl Layout {
    /// Build and validate a layout.
    pub fn new(tensors: Arc<[TensorSpec]>, shards: Vec<Shard>) -> Result<Layout> {
        validate_tensors(&tensors)?;
        limits::check(
            "pieces held by the devices of a layout",
            pieces_held(&shards),
            limits::MAX_PIECES,
        )?;
        let mut shard_of = BTreeMap::new();
        // The distinct boxes of each tensor, with the shards that hold each
        // (sorted vectors rather than a map and a set per shard: a serving
        // layout of a 1T model holds 9M pieces, and the trees' lookups were
        // a sixth of its weight sync's command).
        let mut boxes: Vec<Vec<(&Region, u32)>> = vec![Vec::new(); tensors.len()];
        let mut partial: Vec<Option<bool>> = vec![None; tensors.len()];
        let mut held: Vec<(TensorId, &Region)> = Vec::new();
        for (si, shard) in shards.iter().enumerate() {
            if shard.devices.is_empty() {
                return Err(Error::UnallocatedShard {
                    shard: shard.name.clone(),
                });
            }
            for &d in &shard.devices {
                if shard_of.insert(d, si).is_some() {
                    return Err(Error::DeviceReused {
                        device: d,
                        shard: shard.name.clone(),
                    });
                }
            }
            let mut buffer_names = BTreeSet::new();
            held.clear();
            for buf in &shard.buffers {
                if !buffer_names.insert(buf.name.as_str()) {
                    return Err(Error::DuplicateBuffer {
                        shard: shard.name.clone(),
                        buffer: buf.name.clone(),
                    });
                }
                validate_buffer(&tensors, shard, buf)?;
                for p in &buf.pieces {
                    let seen = partial[p.tensor as usize].get_or_insert(buf.partial);
                    if *seen != buf.partial {
                        return Err(Error::MixedPartial {
                            tensor: tensors[p.tensor as usize].name.clone(),
                        });
                    }
                    held.push((p.tensor, &p.region));
                }
            }
            // Shards hold disjoint devices, so a box gains this shard's
            // devices once, however many of its buffers hold the box: a
            // membership test per device would be quadratic in the replicas.
            held.sort_unstable();
            held.dedup();
            // One shard holds each element of a tensor once: its distinct
            // boxes of a tensor are disjoint (other shards may cut it otherwise).
            for group in held.chunk_by(|a, b| a.0 == b.0) {
                let regions: Vec<&Region> = group.iter().map(|(_, r)| *r).collect();
                if let Some((a, b)) = first_overlap(&regions) {
                    return Err(Error::OverlappingBoxes {
                        shard: shard.name.clone(),
                        tensor: tensors[group[0].0 as usize].name.clone(),
                        a: Box::new(a),
                        b: Box::new(b),
                    });
                }
                let t = group[0].0 as usize;
                boxes[t].extend(regions.into_iter().map(|r| (r, si as u32)));
            }
        }
        // Holders of an atom are listed in shard order, then replica order.
        let rank = std::cell::OnceCell::new();
        let order = |d: DeviceId| -> (usize, usize) {
            let rank: &BTreeMap<DeviceId, (usize, usize)> = rank.get_or_init(|| {
                shards
                    .iter()
                    .enumerate()
                    .flat_map(|(si, s)| s.devices.iter().enumerate().map(move |(ri, &d)| (d, (si, ri))))
                    .collect()
            });
            rank[&d]
        };
        let mut sub_tensors = Vec::with_capacity(tensors.len());
        for (t, mut held) in boxes.into_iter().enumerate() {
            let spec = &tensors[t];
            // By box, then shard: a box's holders in shard order.
            held.sort_unstable();
            let map: Vec<(Region, Vec<DeviceId>)> = held
                .chunk_by(|a, b| a.0 == b.0)
                .map(|run| {
                    let holders = run
                        .iter()
                        .flat_map(|&(_, si)| shards[si as usize].devices.iter().copied())
                        .collect();
                    (run[0].0.clone(), holders)
                })
                .collect();
            let regions: Vec<&Region> = map.iter().map(|(r, _)| r).collect();
            let subs: Vec<SubTensor> = if first_overlap(&regions).is_none() {
                map.into_iter()
                    .map(|(region, holders)| SubTensor { region, holders })
                    .collect()
            } else {
                refine(map, &order)?
            };
            let covered: u64 = subs.iter().map(|s| s.region.volume()).sum();
            if covered != spec.numel() {
                return Err(Error::IncompleteCover {
                    tensor: spec.name.clone(),
                    covered,
                    total: spec.numel(),
                });
            }
            sub_tensors.push(subs);
        }
        Ok(Layout {
            tensors,
            pieces_by_tensor: PiecesByTensor::new(shards.len()),
            shards: shards.into(),
            sub_tensors: sub_tensors.into(),
            shard_of: Arc::new(shard_of),
            partial: partial.into_iter().map(|p| p.unwrap_or(false)).collect(),
        })
    }

    /// The tensors (T).
    pub fn tensors(&self) -> &Arc<[TensorSpec]> {
        &self.tensors
    }

    /// The shards, in rank order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The pieces the devices of this layout hold, each replica counted
    /// (what [`limits::MAX_PIECES`] bounds, and what planning memory grows with).
    pub fn pieces_held(&self) -> u64 {
        pieces_held(&self.shards)
    }

    /// The shard a device holds, if any.
    pub fn shard_of(&self, device: DeviceId) -> Option<&Shard> {
        self.shard_of.get(&device).map(|&i| &self.shards[i])
    }

    /// Every device holding a shard, in increasing order.
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + '_ {
        self.shard_of.keys().copied()
    }

    /// The distinct sub-tensors of a tensor, sorted by box.
    pub fn sub_tensors(&self, tensor: TensorId) -> &[SubTensor] {
        &self.sub_tensors[tensor as usize]
    }

    /// The piece of `tensor` that starts at element `offset` of buffer
    /// `buffer` of the shard `device` holds (how copies name their target).
    pub fn piece_at(&self, device: DeviceId, buffer: u32, offset: u64, tensor: TensorId) -> Option<&Piece> {
        self.pieces_in(device, tensor)
            .find(|&(b, p)| b == buffer as usize && p.offset == offset)
            .map(|(_, p)| p)
    }

    /// The distinct boxes of `tensor` that `device` holds, each with the
    /// index of the (first) buffer holding it: where to read a box from.
    pub fn pieces_of(&self, device: DeviceId, tensor: TensorId) -> Vec<(usize, &Piece)> {
        let mut found: Vec<(usize, &Piece)> = Vec::new();
        for (bi, p) in self.pieces_in(device, tensor) {
            if !found.iter().any(|(_, q)| q.region == p.region) {
                found.push((bi, p));
            }
        }
        found
    }

    /// Every piece of `tensor` on `device` with its buffer's index, buffers
    /// in order and each buffer's pieces in order.
    fn pieces_in(&self, device: DeviceId, tensor: TensorId) -> impl Iterator<Item = (usize, &Piece)> + '_ {
        let si = self.shard_of.get(&device).copied();
        let all = si.map_or(&[][..], |si| self.pieces_by_tensor.of(si, &self.shards[si]));
        let from = all.partition_point(|&(t, _, _)| t < tensor);
        all[from..]
            .iter()
            .take_while(move |&&(t, _, _)| t == tensor)
            .map(move |&(_, b, p)| {
                let shard = &self.shards[si.expect("indexed pieces lie in a shard")];
                (b as usize, &shard.buffers[b as usize].pieces[p as usize])
            })
    }

    /// Whether a tensor is held as partial sums (see [`Buffer::partial`]).
    pub fn is_partial(&self, tensor: TensorId) -> bool {
        self.partial[tensor as usize]
    }

    /// The same layout with the buffers of the tensors `partial` selects
    /// marked as partial sums. Fails if a buffer mixes selected and other
    /// tensors.
    pub fn with_partial(&self, partial: impl Fn(TensorId) -> bool) -> Result<Layout> {
        let mut shards = self.shards.to_vec();
        for s in &mut shards {
            for b in &mut s.buffers {
                let n = b.pieces.iter().filter(|p| partial(p.tensor)).count();
                if n > 0 && n < b.pieces.len() {
                    return Err(Error::MixedPartial {
                        tensor: self.tensors[b.pieces[0].tensor as usize].name.clone(),
                    });
                }
                b.partial = n > 0;
            }
        }
        Layout::new(self.tensors.clone(), shards)
    }

    /// Bytes held by one device.
    pub fn device_bytes(&self, device: DeviceId) -> u64 {
        self.shard_of(device)
            .map(|s| s.buffers.iter().map(Buffer::bytes).sum())
            .unwrap_or(0)
    }

    /// The same layout of the tensors `kept` alone (indices into
    /// [`Layout::tensors`], in increasing order), renumbered in that
    /// order: their pieces where they are, buffers and shards left with
    /// nothing dropped.
    pub fn restricted(&self, kept: &[TensorId]) -> Result<Layout> {
        let mut new_index = vec![None; self.tensors.len()];
        for (n, &t) in kept.iter().enumerate() {
            new_index[t as usize] = Some(n as TensorId);
        }
        let tensors: Arc<[TensorSpec]> = kept.iter().map(|&t| self.tensors[t as usize].clone()).collect();
        let shards = self
            .shards
            .iter()
            .map(|s| Shard {
                buffers: s
                    .buffers
                    .iter()
                    .filter_map(|b| {
                        let pieces: Vec<Piece> = b
                            .pieces
                            .iter()
                            .filter_map(|p| {
                                Some(Piece {
                                    tensor: new_index[p.tensor as usize]?,
                                    ..p.clone()
                                })
                            })
                            .collect();
                        (!pieces.is_empty()).then(|| Buffer { pieces, ..b.clone() })
                    })
                    .collect(),
                ..s.clone()
            })
            .filter(|s| !s.buffers.is_empty())
            .collect();
        Layout::new(tensors, shards)
    }

    /// The same layout with every device renamed by `map`. Fails if `map` is
    /// not injective on the devices used.
    pub fn relabel(&self, map: impl Fn(DeviceId) -> DeviceId) -> Result<Layout> {
        let shards = self
            .shards
            .iter()
            .map(|s| Shard {
                devices: s.devices.iter().map(|&d| map(d)).collect(),
                ..s.clone()
            })
            .collect();
        Layout::new(self.tensors.clone(), shards)
    }
}

fn validate_buffer(tensors: &[TensorSpec], shard: &Shard, buf: &Buffer) -> Result<()> {
    let bytes = buf.len.saturating_mul(buf.dtype.size());
    limits::check("bytes of a buffer", bytes, limits::MAX_BUFFER_BYTES)?;
    let mut spans = Vec::with_capacity(buf.pieces.len());
    for p in &buf.pieces {
        let spec = tensors.get(p.tensor as usize).ok_or_else(|| Error::UnknownTensor {
            shard: shard.name.clone(),
            buffer: buf.name.clone(),
            tensor: p.tensor,
            count: tensors.len(),
        })?;
        if p.region.is_empty() || !p.region.fits(&spec.shape) {
            return Err(Error::BoxOutOfBounds {
                tensor: spec.name.clone(),
                region: Box::new(p.region.clone()),
                shape: spec.shape.clone(),
                shard: shard.name.clone(),
            });
        }
        if spec.dtype != buf.dtype {
            return Err(Error::DTypeMismatch {
                shard: shard.name.clone(),
                buffer: buf.name.clone(),
                buffer_dtype: buf.dtype,
                tensor: spec.name.clone(),
                tensor_dtype: spec.dtype,
            });
        }
        let end = p.offset.checked_add(p.region.volume());
        spans.push((p.offset, end.unwrap_or(u64::MAX)));
    }
    spans.sort_unstable();
    let mut at = 0;
    for (s, e) in spans {
        if s < at || e > buf.len {
            return Err(Error::BufferOverlap {
                shard: shard.name.clone(),
                buffer: buf.name.clone(),
                len: buf.len,
                offset: s,
            });
        }
        at = e;
    }
    Ok(())
}

/// Pieces as the devices hold them: a shard on many devices holds each of
/// its pieces once per device, and so costs what they cost (saturating).
fn pieces_held(shards: &[Shard]) -> u64 {
    shards
        .iter()
        .map(|s| {
            let held: u64 = s.buffers.iter().map(|b| b.pieces.len() as u64).sum();
            held.saturating_mul(s.devices.len() as u64)
        })
        .fold(0, u64::saturating_add)
}

/// Two overlapping boxes among `regions`, if any: a sweep on the first
/// dimension.
fn first_overlap(regions: &[&Region]) -> Option<(Region, Region)> {
    let mut by_start: Vec<&Region> = regions.to_vec();
    by_start.sort_by_key(|r| r.range(0).start);
    for (i, a) in by_start.iter().enumerate() {
        for b in &by_start[i + 1..] {
            if b.range(0).start >= a.range(0).end {
                break;
            }
            if a.overlaps(b) {
                return Some(((*a).clone(), (*b).clone()));
            }
        }
    }
    None
}

/// Most box intersections spent refining one tensor's overlapping replicas.
const MAX_REFINE_WORK: u64 = 1 << 28;

/// The sub-tensors of a tensor whose distinct boxes overlap (replicas cut
/// differently): disjoint boxes ("atoms") that each lie inside
/// or outside every box, each held by the devices of every box containing
/// it. Boxes whose first-dimension ranges do not chain never meet, so each
/// chain is refined on its own.
fn refine(boxes: Vec<(Region, Vec<DeviceId>)>, order: &dyn Fn(DeviceId) -> (usize, usize)) -> Result<Vec<SubTensor>> {
    let mut sorted = boxes;
    sorted.sort_by_key(|(r, _)| r.range(0).start);
    let mut out: Vec<(Region, Vec<DeviceId>)> = Vec::new();
    let mut work = 0u64;
    let mut i = 0;
    while i < sorted.len() {
        let mut end = sorted[i].0.range(0).end;
        let mut j = i + 1;
        while j < sorted.len() && sorted[j].0.range(0).start < end {
            end = end.max(sorted[j].0.range(0).end);
            j += 1;
        }
        let mut atoms: Vec<(Region, Vec<DeviceId>)> = Vec::new();
        for (b, holders) in &sorted[i..j] {
            let mut rest = vec![b.clone()];
            let mut next = Vec::with_capacity(atoms.len() + 1);
            for (a, h) in atoms.drain(..) {
                let Some(common) = a.intersect(b) else {
                    next.push((a, h));
                    continue;
                };
                next.extend(a.minus(&common).into_iter().map(|part| (part, h.clone())));
                work += rest.len() as u64;
                rest = rest.iter().flat_map(|r| r.minus(&common)).collect();
                // A device holding both boxes would hold an element twice in
                // one shard, which `Layout::new` refuses: the lists are disjoint.
                let mut both = h;
                both.extend_from_slice(holders);
                both.sort_by_key(|&d| order(d));
                next.push((common, both));
            }
            next.extend(rest.into_iter().map(|r| (r, holders.clone())));
            atoms = next;
            work += atoms.len() as u64;
            limits::check(
                "box intersections to refine overlapping replicas",
                work,
                MAX_REFINE_WORK,
            )?;
        }
        out.extend(atoms);
        i = j;
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out
        .into_iter()
        .map(|(region, holders)| SubTensor { region, holders })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> Arc<[TensorSpec]> {
        vec![TensorSpec::new("w", DType::F32, [4, 6])].into()
    }

    fn piece(rows: std::ops::Range<u64>, offset: u64) -> Piece {
        Piece {
            tensor: 0,
            region: Region::new([rows, 0..6]).unwrap(),
            offset,
        }
    }

    fn shard(name: &str, devices: Vec<u32>, pieces: Vec<Piece>, len: u64) -> Shard {
        Shard {
            name: name.into(),
            devices,
            buffers: vec![Buffer {
                name: "w".into(),
                dtype: DType::F32,
                len,
                pieces,
                partial: false,
            }],
        }
    }

    #[test]
    fn accepts_a_tiling_with_replicas_and_padding() {
        let l = Layout::new(
            tensors(),
            vec![
                shard("a", vec![0, 2], vec![piece(0..2, 0)], 18),
                shard("b", vec![1], vec![piece(2..4, 0)], 12),
            ],
        )
        .unwrap();
        assert_eq!(l.sub_tensors(0).len(), 2);
        assert_eq!(l.sub_tensors(0)[0].holders, vec![0, 2]);
        assert_eq!(l.shard_of(1).unwrap().name, "b");
        assert_eq!(l.shards()[0].buffers[0].padding(), vec![12..18]);
    }

    #[test]
    fn rejects_gaps_overlaps_and_reuse() {
        let gap = Layout::new(tensors(), vec![shard("a", vec![0], vec![piece(0..3, 0)], 18)]);
        assert!(matches!(
            gap,
            Err(Error::IncompleteCover {
                covered: 18,
                total: 24,
                ..
            })
        ));
        // One shard holding an element twice, in two buffers.
        let mut twice = shard("a", vec![0], vec![piece(0..3, 0)], 18);
        twice.buffers.push(Buffer {
            name: "v".into(),
            pieces: vec![piece(2..4, 0)],
            len: 12,
            ..twice.buffers[0].clone()
        });
        assert!(matches!(
            Layout::new(tensors(), vec![twice]),
            Err(Error::OverlappingBoxes { .. })
        ));
        let reuse = Layout::new(
            tensors(),
            vec![
                shard("a", vec![0], vec![piece(0..2, 0)], 12),
                shard("b", vec![0], vec![piece(2..4, 0)], 12),
            ],
        );
        assert!(matches!(reuse, Err(Error::DeviceReused { device: 0, .. })));
        let spill = Layout::new(tensors(), vec![shard("a", vec![0], vec![piece(0..4, 1)], 24)]);
        assert!(matches!(spill, Err(Error::BufferOverlap { .. })));
    }

    #[test]
    fn replicas_cut_differently_become_atoms() {
        // Shard a holds rows 0..3, shard b rows 2..4 (and 0..2 on device 2):
        // the atoms are rows 0..2, 2..3 and 3..4, each with every device
        // whose piece contains it.
        let l = Layout::new(
            tensors(),
            vec![
                shard("a", vec![0], vec![piece(0..3, 0)], 18),
                shard("b", vec![1], vec![piece(2..4, 0)], 12),
                shard("c", vec![2], vec![piece(0..2, 0)], 12),
            ],
        )
        .unwrap();
        let subs: Vec<(Region, Vec<u32>)> = l
            .sub_tensors(0)
            .iter()
            .map(|s| (s.region.clone(), s.holders.clone()))
            .collect();
        let rows = |r: std::ops::Range<u64>| Region::new([r, 0..6]).unwrap();
        assert_eq!(
            subs,
            vec![
                (rows(0..2), vec![0, 2]),
                (rows(2..3), vec![0, 1]),
                (rows(3..4), vec![1])
            ]
        );
        // A partial row: 1.5 rows in one piece, 2.5 in the other.
        let half = |lo: [u64; 2], hi: [u64; 2]| Region::new([lo[0]..lo[1], hi[0]..hi[1]]).unwrap();
        let p = |r: Region, offset: u64| Piece {
            tensor: 0,
            region: r,
            offset,
        };
        let l = Layout::new(
            tensors(),
            vec![
                Shard {
                    name: "x".into(),
                    devices: vec![0],
                    buffers: vec![Buffer {
                        name: "flat".into(),
                        dtype: DType::F32,
                        len: 24,
                        pieces: vec![
                            p(half([0, 1], [0, 6]), 0),
                            p(half([1, 2], [0, 3]), 6),
                            p(half([1, 2], [3, 6]), 9),
                            p(half([2, 4], [0, 6]), 12),
                        ],
                        partial: false,
                    }],
                },
                shard("y", vec![1], vec![piece(0..4, 0)], 24),
            ],
        )
        .unwrap();
        assert_eq!(l.sub_tensors(0).len(), 4);
        assert!(l.sub_tensors(0).iter().all(|s| s.holders == vec![0, 1]));
        // Overlapping replicas that leave an element unheld.
        let gap = Layout::new(
            tensors(),
            vec![
                shard("a", vec![0], vec![piece(0..2, 0)], 12),
                shard("b", vec![1], vec![piece(1..3, 0)], 12),
            ],
        );
        assert!(matches!(gap, Err(Error::IncompleteCover { covered: 18, .. })));
    }

    #[test]
    fn counts_a_replicated_shard_once_per_device() {
        // One box on 2¹⁶ devices (cheap, not quadratic), and the same box
        // held twice by one shard lists each holder once.
        let many: Vec<u32> = (0..1 << 16).collect();
        let mut s = shard("a", many.clone(), vec![piece(0..4, 0)], 24);
        s.buffers.push(Buffer {
            name: "copy".into(),
            ..s.buffers[0].clone()
        });
        let l = Layout::new(tensors(), vec![s]).unwrap();
        assert_eq!(l.sub_tensors(0)[0].holders, many);
        // Pieces count once per device holding them.
        let pieces: Vec<Piece> = (0..4).map(|r| piece(r..r + 1, 6 * r)).collect();
        let huge = shard("a", (0..1 << 25).collect(), pieces, 24);
        assert!(matches!(
            Layout::new(tensors(), vec![huge]),
            Err(Error::Limit { value, .. }) if value == 1 << 27
        ));
    }

    #[test]
    fn piece_lookups_agree_with_a_scan_of_the_shard() {
        // Three tensors over flat buffers, pieces listed out of order, one
        // box held in two buffers (tied weights): the lookups by index
        // give what a scan of every buffer and piece gives, in its order.
        let specs: Arc<[TensorSpec]> = (0..3)
            .map(|t| TensorSpec::new(format!("t{t}"), DType::F32, [4, 6]))
            .collect();
        let p = |tensor: TensorId, rows: std::ops::Range<u64>, offset: u64| Piece {
            tensor,
            region: Region::new([rows, 0..6]).unwrap(),
            offset,
        };
        let buffer = |name: &str, pieces: Vec<Piece>| Buffer {
            name: name.into(),
            dtype: DType::F32,
            len: 72,
            pieces,
            partial: false,
        };
        let shards = vec![
            Shard {
                name: "a".into(),
                devices: vec![0, 3],
                buffers: vec![
                    buffer("x", vec![p(2, 2..4, 48), p(0, 2..4, 12), p(1, 0..2, 0), p(0, 0..2, 36)]),
                    buffer("y", vec![p(1, 2..4, 24), p(0, 2..4, 0), p(2, 0..2, 60)]),
                ],
            },
            Shard {
                name: "b".into(),
                devices: vec![1],
                buffers: vec![buffer("z", vec![p(1, 0..4, 0), p(0, 0..4, 24)])],
            },
        ];
        let l = Layout::new(specs, shards).unwrap();
        for device in [0, 1, 2, 3] {
            let shard = l.shard_of(device);
            for tensor in 0..3 {
                let mut want: Vec<(usize, &Piece)> = Vec::new();
                for (bi, b) in shard.iter().flat_map(|s| s.buffers.iter().enumerate()) {
                    for q in b.pieces.iter().filter(|q| q.tensor == tensor) {
                        if !want.iter().any(|(_, w)| w.region == q.region) {
                            want.push((bi, q));
                        }
                    }
                }
                assert_eq!(l.pieces_of(device, tensor), want, "device {device}, tensor {tensor}");
                for buffer in 0..3u32 {
                    for offset in (0..72).step_by(12) {
                        let scan = shard
                            .and_then(|s| s.buffers.get(buffer as usize))
                            .and_then(|b| b.pieces.iter().find(|q| q.offset == offset && q.tensor == tensor));
                        assert_eq!(l.piece_at(device, buffer, offset, tensor), scan);
                    }
                }
            }
        }
        assert_eq!(l.pieces_of(0, 0).len(), 2, "the box held twice is given once");
    }
}
