//! How a box's elements lie in row-major bytes: copies (and reduce-copies)
//! of a box between two pieces' buffers, and reads of a box from stored
//! boxes (memory maps of files, with positioned reads for long runs). Every
//! executor and every file format moves bytes with these.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{DType, Piece, Region, TensorId};

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
/// run of `region`.
fn runs(from: &Piece, to: &Piece, region: &Region, elem: usize, mut run_at: impl FnMut(usize, usize, usize)) {
    let g = BoxRuns::new(from, to, region);
    let run = g.run_elems() as usize * elem;
    g.for_each_start(g.k, |f, t| run_at(f as usize * elem, t as usize * elem, run));
}

/// Where a box lies in two row-major pieces: the inner dimensions `k..` the
/// box spans fully in both pieces merge into one contiguous run (starting
/// with the first dimension it does not span), and the dimensions above it
/// are walked. Offsets are in elements, pieces' offsets included.
pub struct BoxRuns {
    /// First dimension of the contiguous run.
    pub k: usize,
    /// The box's extent on every dimension.
    pub shape: Vec<u64>,
    /// Row-major strides of the source piece.
    pub from_strides: Vec<u64>,
    /// Row-major strides of the destination piece.
    pub to_strides: Vec<u64>,
    /// Offsets of the box's first element in source and destination.
    from_base: u64,
    to_base: u64,
}

impl BoxRuns {
    /// Where `region` lies in the pieces `from` and `to`.
    pub fn new(from: &Piece, to: &Piece, region: &Region) -> BoxRuns {
        let n = region.ndim();
        let (fs, ts, rs) = (from.region.shape(), to.region.shape(), region.shape());
        let mut k = n - 1;
        while k > 0 && rs[k] == fs[k] && rs[k] == ts[k] {
            k -= 1;
        }
        let strides = |shape: &[u64]| {
            let mut s = vec![1u64; n];
            for d in (0..n - 1).rev() {
                s[d] = s[d + 1] * shape[d + 1];
            }
            s
        };
        let (fst, tst) = (strides(&fs), strides(&ts));
        let rlo = region.lo();
        let base = |lo: &[u64], st: &[u64], off: u64| off + (0..n).map(|d| (rlo[d] - lo[d]) * st[d]).sum::<u64>();
        BoxRuns {
            k,
            from_base: base(&from.region.lo(), &fst, from.offset),
            to_base: base(&to.region.lo(), &tst, to.offset),
            shape: rs,
            from_strides: fst,
            to_strides: tst,
        }
    }

    /// Elements in one contiguous run.
    pub fn run_elems(&self) -> u64 {
        self.shape[self.k..].iter().product()
    }

    /// Call `at(source, destination)` with the starting offsets of every
    /// index of the dimensions `..dims`, in row-major order.
    pub fn for_each_start(&self, dims: usize, mut at: impl FnMut(u64, u64)) {
        let outer: u64 = self.shape[..dims].iter().product();
        let mut idx = vec![0u64; dims];
        for _ in 0..outer {
            let (mut f, mut t) = (self.from_base, self.to_base);
            for ((&i, &fs), &ts) in idx.iter().zip(&self.from_strides).zip(&self.to_strides) {
                f += i * fs;
                t += i * ts;
            }
            at(f, t);
            for d in (0..dims).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
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
    /// The open file `data` is mapped from and the byte where it starts
    /// there, when it is a file: runs of at least [`PREAD_RUN`] bytes are
    /// read from it with positioned reads, which cost no page faults on the
    /// map (a reshard's cost beside the copy itself, measured by
    /// `tenplan-bench executor`); shorter runs are copied from the map.
    pub file: Option<(&'a File, u64)>,
}

/// The shortest contiguous run read from a file by a positioned read rather
/// than copied from its memory map (one system call per run).
pub const PREAD_RUN: usize = 64 << 10;

/// Fill `region` (whose row-major bytes are `dst`) from the stored boxes of
/// one tensor; returns the bytes read.
pub fn read_box(sources: &[SourceBox<'_>], region: &Region, dst: &mut [u8], elem: usize) -> u64 {
    read_into(sources, region, dst, region, elem)
}

/// Fill `part` (inside the box `dst_region`, whose row-major bytes are `dst`)
/// from the stored boxes of one tensor. Returns the bytes read. Elements no
/// source covers are left as they were; callers know the sources tile the
/// tensor (a checked checkpoint, a verified plan).
pub fn read_into(sources: &[SourceBox<'_>], part: &Region, dst: &mut [u8], dst_region: &Region, elem: usize) -> u64 {
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
            match s.file {
                Some((file, at)) => runs(&from, &to, &common, elem, |f, t, n| {
                    let (dst, src) = (&mut dst[t..t + n], &s.data[f..f + n]);
                    // A failed read falls back to the map, which reports
                    // the same fault as it always did.
                    if n < PREAD_RUN || file.read_exact_at(dst, at + f as u64).is_err() {
                        dst.copy_from_slice(src);
                    }
                }),
                None => copy_box(s.data, &from, dst, &to, &common, elem),
            }
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

    #[test]
    fn positioned_reads_match_the_map() {
        // A 64 x 4096 byte tensor stored at byte 100 of a file: whole rows
        // merge into one run past PREAD_RUN (read with pread), a column
        // range leaves short runs (copied from the map).
        let shape = [64u64, 4096];
        let whole = Region::full(&shape);
        let data: Vec<u8> = (0..64 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let dir = std::env::temp_dir().join(format!("tenplan-fill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stored");
        let mut bytes = vec![0xeeu8; 100];
        bytes.extend_from_slice(&data);
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let mapped = [SourceBox {
            tensor: 0,
            region: &whole,
            data: &data,
            file: None,
        }];
        let read = [SourceBox {
            tensor: 0,
            region: &whole,
            data: &data,
            file: Some((&file, 100)),
        }];
        for part in [
            Region::new([3..60, 0..4096]).unwrap(),
            Region::new([3..60, 100..900]).unwrap(),
        ] {
            let n = part.volume() as usize;
            let (mut a, mut b) = (vec![0u8; n], vec![1u8; n]);
            assert_eq!(read_box(&mapped, &part, &mut a, 1), n as u64);
            assert_eq!(read_box(&read, &part, &mut b, 1), n as u64);
            assert_eq!(a, b);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
