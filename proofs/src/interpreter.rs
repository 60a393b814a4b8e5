//! The reference interpreter: runs a plan element by element on concrete
//! bytes. Slow and obviously correct; meant for small problems.

use std::collections::BTreeMap;

use tenplan_ptc::{bf16_from_f32, f16_from_f32, DType, DeviceId, Layout, Plan, Region, TensorSpec};

use crate::splitmix::SplitMix64;

/// The bytes of every buffer of every device of a layout.
pub type State = BTreeMap<DeviceId, Vec<Vec<u8>>>;

/// Why a plan could not run, or ran to the wrong result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    /// A copy read from a device with no source state (dead, or not in the layout).
    #[error("copy #{copy} reads from device {device}, which has no state")]
    NoSourceState {
        /// Index of the copy.
        copy: usize,
        /// Device.
        device: DeviceId,
    },
    /// A copy read an element its source does not hold.
    #[error("copy #{copy}: device {device} holds no element {point:?} of `{tensor}`")]
    NotHeld {
        /// Index of the copy.
        copy: usize,
        /// Device.
        device: DeviceId,
        /// Tensor.
        tensor: String,
        /// The element.
        point: Vec<u64>,
    },
    /// A write outside the target state.
    #[error("copy or fill #{index} writes outside device {device}'s target buffers")]
    BadWrite {
        /// Index of the copy or fill.
        index: usize,
        /// Device.
        device: DeviceId,
    },
    /// A target buffer ended with the wrong bytes.
    #[error("device {device} buffer `{buffer}`: byte {byte} differs from the expected state")]
    Differs {
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// First differing byte.
        byte: usize,
    },
}

/// Random contents for every tensor, from a seed.
pub fn random_tensors(tensors: &[TensorSpec], seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SplitMix64::new(seed);
    tensors
        .iter()
        .map(|t| (0..t.bytes()).map(|_| rng.next() as u8).collect())
        .collect()
}

/// The state of every device of `layout` for which `present` holds, built
/// directly from the global tensors: each piece copied from its tensor,
/// padding zero.
pub fn materialize(layout: &Layout, globals: &[Vec<u8>], present: impl Fn(DeviceId) -> bool) -> State {
    let tensors = layout.tensors();
    let mut state = State::new();
    for shard in layout.shards() {
        let bufs: Vec<Vec<u8>> = shard
            .buffers
            .iter()
            .map(|b| {
                let es = b.dtype.size() as usize;
                let mut bytes = vec![0u8; b.len as usize * es];
                for p in &b.pieces {
                    let full = tenplan_ptc::Region::full(&tensors[p.tensor as usize].shape);
                    for (i, point) in p.region.points().enumerate() {
                        let g = full.offset_of(&point) as usize * es;
                        let l = (p.offset as usize + i) * es;
                        bytes[l..l + es].copy_from_slice(&globals[p.tensor as usize][g..g + es]);
                    }
                }
                bytes
            })
            .collect();
        for &d in &shard.devices {
            if present(d) {
                state.insert(d, bufs.clone());
            }
        }
    }
    state
}

/// A small integer in `dtype`'s encoding: sums of a few of them are exact in
/// every type, so the interpreter can compare reduced values bit for bit.
fn small(dtype: DType, v: i64) -> Vec<u8> {
    match dtype {
        DType::F64 => (v as f64).to_le_bytes().to_vec(),
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::BF16 => bf16_from_f32(v as f32).to_le_bytes().to_vec(),
        DType::F16 => f16_from_f32(v as f32).to_le_bytes().to_vec(),
        DType::I64 => v.to_le_bytes().to_vec(),
        DType::I32 => (v as i32).to_le_bytes().to_vec(),
        _ => vec![v as u8],
    }
}

/// Give every holder of a partial tensor of `layout` its own addend (small
/// integers from `seed`; written into `state` for the devices it has) and
/// replace that tensor's global value by the sum of all holders' addends.
pub fn addends(layout: &Layout, globals: &mut [Vec<u8>], state: &mut State, seed: u64) {
    let tensors = layout.tensors();
    for t in 0..tensors.len() {
        if !layout.is_partial(t as u32) {
            continue;
        }
        let spec = &tensors[t];
        let es = spec.dtype.size() as usize;
        let full = Region::full(&spec.shape);
        let mut sums = vec![0i64; spec.numel() as usize];
        for shard in layout.shards() {
            for &d in &shard.devices {
                for (bi, b) in shard.buffers.iter().enumerate() {
                    for p in b.pieces.iter().filter(|p| p.tensor as usize == t) {
                        for (i, point) in p.region.points().enumerate() {
                            let g = full.offset_of(&point) as usize;
                            let h = SplitMix64::new(seed ^ (u64::from(d) << 40) ^ ((t as u64) << 20) ^ g as u64).next();
                            let v = if spec.dtype == DType::U8 {
                                (h % 9) as i64
                            } else {
                                (h % 9) as i64 - 4
                            };
                            sums[g] += v;
                            if let Some(bufs) = state.get_mut(&d) {
                                let at = (p.offset as usize + i) * es;
                                bufs[bi][at..at + es].copy_from_slice(&small(spec.dtype, v));
                            }
                        }
                    }
                }
            }
        }
        globals[t] = sums.iter().flat_map(|&v| small(spec.dtype, v)).collect();
    }
}

/// Run `plan` on `source` (the state of the plan's source layout) and return
/// the target state. Target buffers start filled with random garbage, so an
/// element no copy writes shows up as a difference.
pub fn execute(plan: &Plan, source: &State, seed: u64) -> Result<State, Mismatch> {
    let problem = &plan.problem;
    let (src_layout, dst_layout) = (problem.source(), problem.target());
    let tensors = problem.tensors();
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut out = State::new();
    for shard in dst_layout.shards() {
        for &d in &shard.devices {
            let bufs = shard
                .buffers
                .iter()
                .map(|b| (0..b.bytes()).map(|_| rng.next() as u8 | 1).collect())
                .collect();
            out.insert(d, bufs);
        }
    }
    // Reduce-copies add into their pieces, which start at zero.
    for shard in dst_layout.shards() {
        for &d in &shard.devices {
            for (bi, b) in shard.buffers.iter().enumerate() {
                let es = b.dtype.size() as usize;
                for p in b.pieces.iter().filter(|p| src_layout.is_partial(p.tensor)) {
                    let at = p.offset as usize * es;
                    out.get_mut(&d).expect("just inserted")[bi][at..at + p.region.volume() as usize * es].fill(0);
                }
            }
        }
    }
    // A multicast copy writes each of its destinations the same way.
    for (i, c) in plan
        .copies
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.unicast().map(move |u| (i, u)))
    {
        let src_state = source
            .get(&c.src)
            .ok_or(Mismatch::NoSourceState { copy: i, device: c.src })?;
        let src_shard = src_layout
            .shard_of(c.src)
            .ok_or(Mismatch::NoSourceState { copy: i, device: c.src })?;
        let dst_shard = dst_layout.shard_of(c.dst).ok_or(Mismatch::BadWrite {
            index: i,
            device: c.dst,
        })?;
        let dst_buf = dst_shard.buffers.get(c.buffer as usize).ok_or(Mismatch::BadWrite {
            index: i,
            device: c.dst,
        })?;
        let dst_piece = dst_buf
            .pieces
            .iter()
            .find(|p| p.offset == c.offset && p.tensor == c.tensor)
            .ok_or(Mismatch::BadWrite {
                index: i,
                device: c.dst,
            })?;
        let es = tensors[c.tensor as usize].dtype.size() as usize;
        for point in c.region.points() {
            let mut found = None;
            'search: for (bi, b) in src_shard.buffers.iter().enumerate() {
                for p in &b.pieces {
                    if p.tensor == c.tensor && contains_point(&p.region, &point) {
                        found = Some((bi, (p.offset + p.region.offset_of(&point)) as usize * es));
                        break 'search;
                    }
                }
            }
            let (bi, at) = found.ok_or_else(|| Mismatch::NotHeld {
                copy: i,
                device: c.src,
                tensor: tensors[c.tensor as usize].name.clone(),
                point: point.clone(),
            })?;
            if !contains_point(&dst_piece.region, &point) {
                return Err(Mismatch::BadWrite {
                    index: i,
                    device: c.dst,
                });
            }
            let to = (dst_piece.offset + dst_piece.region.offset_of(&point)) as usize * es;
            let value = src_state[bi][at..at + es].to_vec();
            let slot = &mut out.get_mut(&c.dst).expect("target device present")[c.buffer as usize][to..to + es];
            if c.reduce {
                tensors[c.tensor as usize].dtype.add_assign(slot, &value);
            } else {
                slot.copy_from_slice(&value);
            }
        }
    }
    for (i, f) in plan.fills.iter().enumerate() {
        let bad = Mismatch::BadWrite {
            index: i,
            device: f.device,
        };
        let bufs = out.get_mut(&f.device).ok_or(bad.clone())?;
        let shard = dst_layout.shard_of(f.device).ok_or(bad.clone())?;
        let b = shard.buffers.get(f.buffer as usize).ok_or(bad.clone())?;
        let es = b.dtype.size() as usize;
        let (s, e) = (f.offset as usize * es, (f.offset + f.len) as usize * es);
        if e > bufs[f.buffer as usize].len() {
            return Err(bad);
        }
        bufs[f.buffer as usize][s..e].fill(0);
    }
    Ok(out)
}

fn contains_point(r: &tenplan_ptc::Region, p: &[u64]) -> bool {
    p.iter().enumerate().all(|(d, &x)| r.range(d).contains(&x))
}

/// Compare two states of `layout`, naming the first differing byte.
pub fn compare(layout: &Layout, got: &State, want: &State) -> Result<(), Mismatch> {
    for (&d, want_bufs) in want {
        let shard = layout.shard_of(d).expect("state of a layout device");
        let got_bufs = got.get(&d);
        for (bi, w) in want_bufs.iter().enumerate() {
            let g = got_bufs.and_then(|b| b.get(bi)).map(Vec::as_slice).unwrap_or(&[]);
            if g != w.as_slice() {
                let byte = g
                    .iter()
                    .zip(w)
                    .position(|(a, b)| a != b)
                    .unwrap_or(g.len().min(w.len()));
                return Err(Mismatch::Differs {
                    device: d,
                    buffer: shard.buffers[bi].name.clone(),
                    byte,
                });
            }
        }
    }
    Ok(())
}

/// Run a plan on random data and compare every target buffer with one built
/// directly from the global tensors.
pub fn run_and_compare(plan: &Plan, seed: u64) -> Result<(), Mismatch> {
    let problem = &plan.problem;
    let mut globals = random_tensors(problem.tensors(), seed);
    let cluster = problem.cluster();
    let mut source = materialize(problem.source(), &globals, |d| cluster.is_live(d));
    addends(problem.source(), &mut globals, &mut source, seed);
    let got = execute(plan, &source, seed)?;
    let want = materialize(problem.target(), &globals, |_| true);
    compare(problem.target(), &got, &want)
}
