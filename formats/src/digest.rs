//! Layout-independent digests of global tensors.
//!
//! The digest of a tensor is XXH3-128 of its elements in global row-major
//! order (little-endian bytes, padding excluded), so it is the same whatever
//! layout holds the tensor, and anyone can recompute it from an unsharded
//! copy (`xxhash.xxh3_128_hexdigest(array.tobytes())` in Python).

use tenplan_ptc::{Region, TensorSpec};
use xxhash_rust::xxh3::Xxh3;

use tenplan_ptc::box_io::read_into;
use tenplan_ptc::SourceBox;

/// Gather buffers stay in the second-level cache.
const SLAB_BYTES: u64 = 1 << 20;

/// The digest as written in manifests: `xxh3-128:` and 32 hex digits.
pub fn format_digest(d: u128) -> String {
    format!("xxh3-128:{d:032x}")
}

/// Digest of a tensor from boxes that tile it exactly once (the caller has
/// checked the tiling).
pub fn tensor_digest(spec: &TensorSpec, boxes: &[SourceBox<'_>]) -> u128 {
    let n = spec.shape.len();
    let elem = spec.dtype.size();
    let mut h = Xxh3::new();
    let full_rows = |r: &Region| (1..n).all(|d| r.range(d) == (0..spec.shape[d]));
    if boxes.iter().all(|b| full_rows(b.region)) {
        // Boxes of whole rows are contiguous stretches of the global order.
        let mut order: Vec<&SourceBox<'_>> = boxes.iter().collect();
        order.sort_by_key(|b| b.region.range(0).start);
        for b in order {
            h.update(b.data);
        }
        return h.digest128();
    }
    // Otherwise gather slabs of whole rows, then hash them in order.
    digest_from(spec, |slab, buf| {
        read_into(boxes, slab, buf, slab, elem as usize);
    })
}

/// Digest of a tensor whose slabs of whole rows `fill(slab, bytes)` writes
/// row-major (any source: a checkpoint, Hugging Face files).
pub fn digest_from(spec: &TensorSpec, fill: impl Fn(&Region, &mut [u8])) -> u128 {
    let elem = spec.dtype.size();
    let mut h = Xxh3::new();
    let row_bytes: u64 = spec.shape[1..].iter().product::<u64>() * elem;
    let rows_per_slab = (SLAB_BYTES / row_bytes.max(1)).max(1);
    let mut buf = Vec::new();
    let mut lo = 0;
    while lo < spec.shape[0] {
        let hi = (lo + rows_per_slab).min(spec.shape[0]);
        let slab = Region::full(&spec.shape).with_range(0, lo..hi);
        buf.clear();
        buf.resize(((hi - lo) * row_bytes) as usize, 0);
        fill(&slab, &mut buf);
        h.update(&buf);
        lo = hi;
    }
    h.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenplan_ptc::DType;

    #[test]
    fn digest_does_not_depend_on_the_tiling() {
        let spec = TensorSpec::new("w", DType::U8, [4, 6]);
        let global: Vec<u8> = (0..24).collect();
        let whole = Region::full(&spec.shape);
        let d0 = tensor_digest(
            &spec,
            &[SourceBox {
                tensor: 0,
                region: &whole,
                data: &global,
                file: None,
            }],
        );
        assert_eq!(d0, xxhash_rust::xxh3::xxh3_128(&global));
        // Column halves: rows interleave in the global order.
        let (l, r) = (Region::new([0..4, 0..3]).unwrap(), Region::new([0..4, 3..6]).unwrap());
        let half = |c0: u8| -> Vec<u8> { (0..4).flat_map(|i| (0..3).map(move |j| i * 6 + c0 + j)).collect() };
        let (ld, rd) = (half(0), half(3));
        let boxes = [
            SourceBox {
                tensor: 0,
                region: &r,
                data: &rd,
                file: None,
            },
            SourceBox {
                tensor: 0,
                region: &l,
                data: &ld,
                file: None,
            },
        ];
        assert_eq!(tensor_digest(&spec, &boxes), d0);
        // Row halves, given out of order.
        let (top, bottom) = (Region::new([0..2, 0..6]).unwrap(), Region::new([2..4, 0..6]).unwrap());
        let boxes = [
            SourceBox {
                tensor: 0,
                region: &bottom,
                data: &global[12..],
                file: None,
            },
            SourceBox {
                tensor: 0,
                region: &top,
                data: &global[..12],
                file: None,
            },
        ];
        assert_eq!(tensor_digest(&spec, &boxes), d0);
        assert!(format_digest(d0).starts_with("xxh3-128:"));
    }
}
