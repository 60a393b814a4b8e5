//! Deterministic tensor contents for demos, tests and benchmarks.
//!
//! Element `i` (global row-major index) of tensor `name` is a function of
//! `(seed, name, i)` only, so every layout of the same state holds the same
//! global tensors: a checkpoint written at one layout and resharded to another
//! equals one written directly at the other, digest for digest.

use std::collections::BTreeMap;
use tenplan_ptc::rng::mix;

use tenplan_ptc::{DType, DeviceId, Layout, Region, TensorSpec};

use crate::HostMemory;

/// Host memory holding the generated contents of the given devices of a
/// layout (padding zero): the state a job would have in memory.
pub fn host_memory(layout: &Layout, seed: u64, present: impl Fn(DeviceId) -> bool) -> HostMemory {
    let tensors = layout.tensors();
    let keys: Vec<u64> = tensors.iter().map(|t| tensor_key(seed, t)).collect();
    let mut devices = BTreeMap::new();
    for shard in layout.shards() {
        for &d in shard.devices.iter().filter(|&&d| present(d)) {
            let bufs: Vec<Vec<u8>> = shard
                .buffers
                .iter()
                .map(|b| {
                    let elem = b.dtype.size() as usize;
                    let mut buf = vec![0u8; b.bytes() as usize];
                    for p in &b.pieces {
                        let at = p.offset as usize * elem;
                        let len = p.region.volume() as usize * elem;
                        let t = p.tensor as usize;
                        fill_region(keys[t], &tensors[t], &p.region, &mut buf[at..at + len]);
                    }
                    buf
                })
                .collect();
            devices.insert(d, bufs);
        }
    }
    HostMemory::from_buffers(layout, devices).expect("buffers follow the layout")
}

/// The per-tensor key: the seed mixed with a hash of the tensor's name.
pub fn tensor_key(seed: u64, spec: &TensorSpec) -> u64 {
    mix(seed ^ xxhash_rust::xxh3::xxh3_64(spec.name.as_bytes()))
}

/// Write the generated elements of `region` of a tensor into `out`
/// (row-major over the region; `out` holds exactly its bytes).
pub fn fill_region(key: u64, spec: &TensorSpec, region: &Region, out: &mut [u8]) {
    let n = region.ndim();
    let elem = spec.dtype.size() as usize;
    let shape = region.shape();
    let run = shape[n - 1] as usize;
    debug_assert_eq!(out.len(), region.volume() as usize * elem);
    // Global row-major strides.
    let mut strides = vec![1u64; n];
    for d in (0..n - 1).rev() {
        strides[d] = strides[d + 1] * spec.shape[d + 1];
    }
    let lo = region.lo();
    let mut idx = vec![0u64; n - 1];
    for row in out.chunks_exact_mut(run * elem) {
        let start: u64 = (0..n)
            .map(|d| (lo[d] + idx.get(d).copied().unwrap_or(0)) * strides[d])
            .sum();
        fill_run(key, spec.dtype, start, row);
        for d in (0..n - 1).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Elements `start..` of the global order, as many as `out` holds.
fn fill_run(key: u64, dtype: DType, start: u64, out: &mut [u8]) {
    let bits = |i: usize| mix(key.wrapping_add((start + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    // Small values around zero, like initialised weights.
    let float = |x: u64| ((x >> 40) as f32 * (1.0 / (1u32 << 24) as f32) - 0.5) * 0.04;
    match dtype {
        DType::F32 => {
            for (i, o) in out.chunks_exact_mut(4).enumerate() {
                o.copy_from_slice(&float(bits(i)).to_le_bytes());
            }
        }
        DType::BF16 => {
            for (i, o) in out.chunks_exact_mut(2).enumerate() {
                o.copy_from_slice(&((float(bits(i)).to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        DType::F16 => {
            for (i, o) in out.chunks_exact_mut(2).enumerate() {
                let x = bits(i);
                // Sign, exponent 2^-7..2^-4, random mantissa.
                let h = ((x >> 63) << 15) as u16 | ((8 + ((x >> 58) & 3)) << 10) as u16 | ((x >> 48) & 0x3ff) as u16;
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        DType::F64 => {
            for (i, o) in out.chunks_exact_mut(8).enumerate() {
                o.copy_from_slice(&f64::from(float(bits(i))).to_le_bytes());
            }
        }
        DType::I64 => {
            for (i, o) in out.chunks_exact_mut(8).enumerate() {
                o.copy_from_slice(&((bits(i) % 1000) as i64).to_le_bytes());
            }
        }
        DType::I32 => {
            for (i, o) in out.chunks_exact_mut(4).enumerate() {
                o.copy_from_slice(&((bits(i) % 1000) as i32).to_le_bytes());
            }
        }
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = bits(i) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_holds_the_same_elements_as_the_whole_tensor() {
        for dtype in DType::ALL {
            let spec = TensorSpec::new("w", dtype, [5, 7, 3]);
            let key = tensor_key(7, &spec);
            let e = dtype.size() as usize;
            let whole = Region::full(&spec.shape);
            let mut all = vec![0u8; whole.volume() as usize * e];
            fill_region(key, &spec, &whole, &mut all);
            let part = Region::new([1..4, 2..6, 1..3]).unwrap();
            let mut got = vec![0u8; part.volume() as usize * e];
            fill_region(key, &spec, &part, &mut got);
            for (k, p) in part.points().enumerate() {
                let g = whole.offset_of(&p) as usize;
                assert_eq!(got[k * e..(k + 1) * e], all[g * e..(g + 1) * e], "{dtype:?} at {p:?}");
            }
            assert_ne!(all, vec![0u8; all.len()]);
        }
    }
}
