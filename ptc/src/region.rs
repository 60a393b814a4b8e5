//! Boxes: half-open ranges on every dimension of a tensor.

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::Error;

/// A box of a tensor: a half-open range `[lo, hi)` on every dimension.
///
/// Invariant: `lo <= hi` on every dimension (checked by [`Region::new`] and on
/// deserialisation). A region may be empty (volume 0) only as the result of
/// arithmetic; layouts and plans reject empty boxes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "Vec<[u64; 2]>", into = "Vec<[u64; 2]>")]
pub struct Region {
    dims: Dims,
}

/// The ranges of a box, inline up to four dimensions: a plan at thousands
/// of GPUs holds millions of boxes, and one heap block each cost a cache
/// miss on every pass over them and a `free` each at the end (Llama 3.1
/// 405B on 16,384 GPUs: a quarter of the command's samples in
/// `Region::volume`). Compared and hashed as the slice of ranges, as a
/// `Vec` was.
type Dims = SmallVec<[[u64; 2]; 4]>;

impl Region {
    /// A region from one range per dimension.
    pub fn new(ranges: impl IntoIterator<Item = Range<u64>>) -> Result<Region, Error> {
        let dims: Dims = ranges.into_iter().map(|r| [r.start, r.end]).collect();
        Region::checked(dims)
    }

    /// A region from its ranges, each checked to have `lo <= hi`.
    fn checked(dims: Dims) -> Result<Region, Error> {
        if let Some(d) = dims.iter().position(|r| r[0] > r[1]) {
            return Err(Error::InvalidRange {
                dim: d,
                lo: dims[d][0],
                hi: dims[d][1],
            });
        }
        Ok(Region { dims })
    }

    /// The whole of a tensor of this shape.
    pub fn full(shape: &[u64]) -> Region {
        Region {
            dims: shape.iter().map(|&n| [0, n]).collect(),
        }
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.dims.len()
    }

    /// The range on dimension `d`.
    pub fn range(&self, d: usize) -> Range<u64> {
        self.dims[d][0]..self.dims[d][1]
    }

    /// Lower corner.
    pub fn lo(&self) -> Vec<u64> {
        self.dims.iter().map(|r| r[0]).collect()
    }

    /// Extent on every dimension.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().map(|r| r[1] - r[0]).collect()
    }

    /// Number of elements (saturating at `u64::MAX`: a box of a valid
    /// tensor never comes near it, and a box from a tampered file must not
    /// overflow before it is found not to fit).
    pub fn volume(&self) -> u64 {
        self.dims.iter().fold(1u64, |v, r| v.saturating_mul(r[1] - r[0]))
    }

    /// True when some dimension has no extent.
    pub fn is_empty(&self) -> bool {
        self.dims.iter().any(|r| r[0] >= r[1])
    }

    /// The common part of two boxes, or `None` when they do not overlap (or
    /// have different numbers of dimensions).
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        if self.ndim() != other.ndim() {
            return None;
        }
        let mut dims = Dims::with_capacity(self.ndim());
        for (a, b) in self.dims.iter().zip(&other.dims) {
            let lo = a[0].max(b[0]);
            let hi = a[1].min(b[1]);
            if lo >= hi {
                return None;
            }
            dims.push([lo, hi]);
        }
        Some(Region { dims })
    }

    /// True when the two boxes share at least one element.
    pub fn overlaps(&self, other: &Region) -> bool {
        self.ndim() == other.ndim()
            && self
                .dims
                .iter()
                .zip(&other.dims)
                .all(|(a, b)| a[0].max(b[0]) < a[1].min(b[1]))
    }

    /// True when `other` lies inside `self`.
    pub fn contains(&self, other: &Region) -> bool {
        self.ndim() == other.ndim()
            && self
                .dims
                .iter()
                .zip(&other.dims)
                .all(|(a, b)| a[0] <= b[0] && b[1] <= a[1])
    }

    /// The elements of this box outside `other`, as at most `2·ndim`
    /// disjoint boxes (a slab below and above `other` in each dimension, the
    /// earlier dimensions narrowed to `other`'s range); the box itself when
    /// they do not overlap.
    pub fn minus(&self, other: &Region) -> Vec<Region> {
        let Some(common) = self.intersect(other) else {
            return vec![self.clone()];
        };
        let mut out = Vec::new();
        let mut rest = self.clone();
        for d in 0..self.ndim() {
            let (lo, hi) = (common.dims[d][0], common.dims[d][1]);
            if rest.dims[d][0] < lo {
                out.push(rest.with_range(d, rest.dims[d][0]..lo));
            }
            if hi < rest.dims[d][1] {
                out.push(rest.with_range(d, hi..rest.dims[d][1]));
            }
            rest.dims[d] = [lo, hi];
        }
        out
    }

    /// True when the box lies inside a tensor of this shape.
    pub fn fits(&self, shape: &[u64]) -> bool {
        self.ndim() == shape.len() && self.dims.iter().zip(shape).all(|(r, &n)| r[1] <= n)
    }

    /// Cut the box at coordinate `at` of dimension `dim`. Either half may be
    /// empty when `at` lies on or outside a face.
    pub fn split(&self, dim: usize, at: u64) -> (Region, Region) {
        let mut left = self.clone();
        let mut right = self.clone();
        let at = at.clamp(self.dims[dim][0], self.dims[dim][1]);
        left.dims[dim][1] = at;
        right.dims[dim][0] = at;
        (left, right)
    }

    /// The same box with one dimension's range replaced.
    pub fn with_range(&self, dim: usize, range: Range<u64>) -> Region {
        let mut r = self.clone();
        r.dims[dim] = [range.start, range.end];
        r
    }

    /// The boxes that make up elements `[start, end)` of this box's row-major
    /// order, in that order: at most `2·ndim − 1` boxes, in the coordinates of
    /// the tensor (not of the box). This is how a flat range of a ZeRO buffer
    /// becomes sub-tensors.
    pub fn flat_range(&self, start: u64, end: u64) -> Vec<Region> {
        let end = end.min(self.volume());
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let shape = self.shape();
        let mut prefix = Dims::with_capacity(self.ndim());
        flat_boxes(&shape, &mut prefix, start, end, &mut out);
        for b in &mut out {
            for (r, lo) in b.dims.iter_mut().zip(&self.dims) {
                r[0] += lo[0];
                r[1] += lo[0];
            }
        }
        out
    }

    /// Row-major position of `point` inside this box.
    pub fn offset_of(&self, point: &[u64]) -> u64 {
        let mut off = 0;
        for (r, &p) in self.dims.iter().zip(point) {
            off = off * (r[1] - r[0]) + (p - r[0]);
        }
        off
    }

    /// Every point of the box in row-major order. Meant for small boxes
    /// (reference interpreters, tests).
    pub fn points(&self) -> impl Iterator<Item = Vec<u64>> + '_ {
        let n = self.volume();
        let shape = self.shape();
        (0..n).map(move |mut i| {
            let mut p = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                p[d] = self.dims[d][0] + i % shape[d];
                i /= shape[d];
            }
            p
        })
    }
}

/// Decompose `[start, end)` of a row-major box of `shape` (origin 0), with the
/// outer coordinates fixed by `prefix`.
fn flat_boxes(shape: &[u64], prefix: &mut Dims, start: u64, end: u64, out: &mut Vec<Region>) {
    let rest = &shape[prefix.len()..];
    if rest.len() == 1 {
        let mut dims = prefix.clone();
        dims.push([start, end]);
        out.push(Region { dims });
        return;
    }
    let inner: u64 = rest[1..].iter().product();
    let (mut r0, r1) = (start / inner, end / inner);
    let (s, e) = (start % inner, end % inner);
    if r0 == r1 {
        prefix.push([r0, r0 + 1]);
        flat_boxes(shape, prefix, s, e, out);
        prefix.pop();
        return;
    }
    if s != 0 {
        prefix.push([r0, r0 + 1]);
        flat_boxes(shape, prefix, s, inner, out);
        prefix.pop();
        r0 += 1;
    }
    if r0 < r1 {
        let mut dims = prefix.clone();
        dims.push([r0, r1]);
        dims.extend(rest[1..].iter().map(|&n| [0, n]));
        out.push(Region { dims });
    }
    if e != 0 {
        prefix.push([r1, r1 + 1]);
        flat_boxes(shape, prefix, 0, e, out);
        prefix.pop();
    }
}

impl TryFrom<Vec<[u64; 2]>> for Region {
    type Error = Error;
    fn try_from(dims: Vec<[u64; 2]>) -> Result<Region, Error> {
        Region::checked(dims.into_iter().collect())
    }
}

impl From<Region> for Vec<[u64; 2]> {
    fn from(r: Region) -> Self {
        r.dims.into_vec()
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, r) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}:{}", r[0], r[1])?;
        }
        f.write_str("]")
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ranges: &[Range<u64>]) -> Region {
        Region::new(ranges.iter().cloned()).unwrap()
    }

    #[test]
    fn intersect_and_contain() {
        let a = r(&[0..4, 0..6]);
        let b = r(&[2..8, 3..4]);
        assert_eq!(a.intersect(&b), Some(r(&[2..4, 3..4])));
        assert!(a.contains(&r(&[1..2, 0..6])));
        assert!(!a.contains(&b));
        // What lies outside a box: disjoint slabs adding up to the rest.
        let whole = r(&[0..4, 0..6]);
        let hole = r(&[1..3, 2..4]);
        let parts = whole.minus(&hole);
        assert_eq!(parts.len(), 4);
        assert_eq!(parts.iter().map(Region::volume).sum::<u64>(), 24 - 4);
        assert!(parts.iter().all(|p| !p.overlaps(&hole) && whole.contains(p)));
        assert!(parts
            .iter()
            .enumerate()
            .all(|(i, p)| parts[i + 1..].iter().all(|q| !p.overlaps(q))));
        assert_eq!(whole.minus(&r(&[4..5, 0..6])), vec![whole.clone()]);
        assert!(hole.minus(&whole).is_empty());
        assert_eq!(a.intersect(&r(&[4..5, 0..6])), None);
        assert!(!a.overlaps(&r(&[4..5, 0..6])));
        assert_eq!(a.volume(), 24);
    }

    #[test]
    fn rejects_inverted_ranges() {
        assert!(Region::try_from(vec![[3u64, 1]]).is_err());
    }

    #[test]
    fn split_halves() {
        let (a, b) = r(&[0..10, 0..2]).split(0, 3);
        assert_eq!((a, b), (r(&[0..3, 0..2]), r(&[3..10, 0..2])));
    }

    #[test]
    fn flat_range_covers_exactly_and_in_order() {
        let shape = [3u64, 4, 5];
        let full = Region::full(&shape);
        for start in 0..60 {
            for end in start..=60 {
                let boxes = full.flat_range(start, end);
                assert!(boxes.len() < 2 * shape.len());
                let flat: Vec<u64> = boxes
                    .iter()
                    .flat_map(|b| b.points().map(|p| full.offset_of(&p)).collect::<Vec<_>>())
                    .collect();
                assert_eq!(flat, (start..end).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn flat_range_of_an_inner_box_uses_tensor_coordinates() {
        let b = r(&[2..4, 10..13]);
        assert_eq!(b.flat_range(2, 4), vec![r(&[2..3, 12..13]), r(&[3..4, 10..11])]);
    }
}
