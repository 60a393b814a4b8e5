//! Box copies between row-major buffers, and reads of boxes from stored pieces.

use tenplan_ptc::{DType, Piece, Region, TensorId};

/// Copy the elements of `region` from a buffer holding piece `from` to a
/// buffer holding piece `to`, one memcpy per contiguous run.
pub fn copy_box(src: &[u8], from: &Piece, dst: &mut [u8], to: &Piece, region: &Region, elem: usize) {
    runs(from, to, region, elem, |f, t, n| {
        dst[t..t + n].copy_from_slice(&src[f..f + n])
    });
}

/// Add the elements of `region` from a buffer holding piece `from` into a
/// buffer holding piece `to` (a reduce-copy), one contiguous run at a time.
pub fn add_box(src: &[u8], from: &Piece, dst: &mut [u8], to: &Piece, region: &Region, dtype: DType) {
    let elem = dtype.size() as usize;
    runs(from, to, region, elem, |f, t, n| {
        dtype.add_assign(&mut dst[t..t + n], &src[f..f + n])
    });
}

/// Call `run(source byte, destination byte, length)` for every contiguous
/// run of `region`: the inner dimensions the region spans fully in both
/// pieces merge with the first one it does not.
fn runs(from: &Piece, to: &Piece, region: &Region, elem: usize, mut run_at: impl FnMut(usize, usize, usize)) {
    let n = region.ndim();
    let (fs, ts, rs) = (from.region.shape(), to.region.shape(), region.shape());
    // Longest run: the inner dimensions the region spans fully in both
    // pieces merge with the first one it does not.
    let mut k = n - 1;
    while k > 0 && rs[k] == fs[k] && rs[k] == ts[k] {
        k -= 1;
    }
    let run = rs[k..].iter().product::<u64>() as usize * elem;
    let (flo, tlo, rlo) = (from.region.lo(), to.region.lo(), region.lo());
    // Row-major strides (in elements) of both pieces.
    let strides = |shape: &[u64]| {
        let mut s = vec![1u64; n];
        for d in (0..n - 1).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let (fst, tst) = (strides(&fs), strides(&ts));
    let base = |lo: &[u64], st: &[u64], off: u64| off + (0..n).map(|d| (rlo[d] - lo[d]) * st[d]).sum::<u64>();
    let (fb, tb) = (base(&flo, &fst, from.offset), base(&tlo, &tst, to.offset));
    let outer: u64 = rs[..k].iter().product();
    let mut idx = vec![0u64; k];
    for _ in 0..outer {
        let (mut f, mut t) = (fb, tb);
        for d in 0..k {
            f += idx[d] * fst[d];
            t += idx[d] * tst[d];
        }
        let (f, t) = (f as usize * elem, t as usize * elem);
        run_at(f, t, run);
        for d in (0..k).rev() {
            idx[d] += 1;
            if idx[d] < rs[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// A stored box of a tensor: its region and its bytes, row-major over the region.
///
/// Checkpoint entries, imported Hugging Face tensors (or row ranges of them)
/// and generated data are all sources of this shape.
#[derive(Clone, Copy, Debug)]
pub struct SourceBox<'a> {
    /// The tensor.
    pub tensor: TensorId,
    /// Its box.
    pub region: &'a Region,
    /// The box's elements, row-major.
    pub data: &'a [u8],
}

/// Fill `region` (whose row-major bytes are `dst`) from the stored boxes of
/// one tensor; returns the bytes read.
pub fn read_box(sources: &[SourceBox<'_>], region: &Region, dst: &mut [u8], elem: usize) -> u64 {
    read_into(sources, region, dst, region, elem)
}

/// Fill `part` (inside the box `dst_region`, whose row-major bytes are `dst`)
/// from the stored boxes of one tensor. Returns the bytes read. Elements no
/// source covers are left as they were; callers know the sources tile the
/// tensor (a checked checkpoint, a verified plan).
pub(crate) fn read_into(
    sources: &[SourceBox<'_>],
    part: &Region,
    dst: &mut [u8],
    dst_region: &Region,
    elem: usize,
) -> u64 {
    let to = Piece {
        tensor: 0,
        region: dst_region.clone(),
        offset: 0,
    };
    let mut read = 0;
    for s in sources {
        if let Some(common) = s.region.intersect(part) {
            let from = Piece {
                tensor: 0,
                region: s.region.clone(),
                offset: 0,
            };
            copy_box(s.data, &from, dst, &to, &common, elem);
            read += common.volume() * elem as u64;
        }
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_strided_boxes_between_pieces() {
        // Source piece: rows 0..4, cols 0..6 of a 4x6 tensor; destination piece
        // rows 1..3, cols 2..6 at offset 5 of a buffer; copy rows 1..3, cols 3..5.
        let from = Piece {
            tensor: 0,
            region: Region::new([0..4, 0..6]).unwrap(),
            offset: 0,
        };
        let to = Piece {
            tensor: 0,
            region: Region::new([1..3, 2..6]).unwrap(),
            offset: 5,
        };
        let src: Vec<u8> = (0..24).collect();
        let mut dst = vec![0xffu8; 13];
        copy_box(&src, &from, &mut dst, &to, &Region::new([1..3, 3..5]).unwrap(), 1);
        assert_eq!(dst, vec![255, 255, 255, 255, 255, 255, 9, 10, 255, 255, 15, 16, 255]);
    }
}
