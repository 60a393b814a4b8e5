//! Comparing two states tensor by tensor, whatever their layouts and
//! formats: each side's global tensors are digested in global row-major
//! order ([`crate::tensor_digest`]), so a tenplan checkpoint at one layout
//! and a Hugging Face directory, or two checkpoints at different layouts,
//! compare equal exactly when they hold the same elements under the same
//! (tenplan) names.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;
use tenplan_models::{ModelSpec, ModelState, StateKind};
use tenplan_ptc::{DType, Region, TensorId, TensorSpec};

use crate::checkpoint::slabs;
use crate::hf::HfModel;
use crate::{digest_from, format_digest, tensor_digest, Checkpoint, Result, Source};

/// One global tensor and the digest of its elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorDigest {
    /// Name (tenplan's, Megatron-core's).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Global shape.
    pub shape: Vec<u64>,
    /// [`crate::format_digest`] of its row-major elements.
    pub digest: String,
}

/// The digests of a checkpoint's tensors, read from its files and checked
/// against its manifest (a damaged checkpoint is an error, not a
/// difference).
pub fn checkpoint_digests(c: &Checkpoint) -> Result<Vec<TensorDigest>> {
    c.verify()?;
    Ok(c.manifest()
        .tensors
        .iter()
        .map(|t| TensorDigest {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            digest: t.digest.clone(),
        })
        .collect())
}

/// The digests of a stored state's tensors, read from its boxes (a DCP
/// checkpoint mapped onto a model, say: a state that records no digests).
/// Its layout was built, so the boxes tile every tensor exactly once.
pub fn source_digests(source: &dyn Source) -> Vec<TensorDigest> {
    source_digests_where(source, |_| true)
}

/// [`source_digests`] of the tensors whose names `keep` says, the others
/// not read.
pub fn source_digests_where(source: &dyn Source, keep: impl Fn(&str) -> bool + Sync) -> Vec<TensorDigest> {
    let tensors = source.layout().tensors();
    let boxes = source.all_boxes();
    (0..tensors.len())
        .into_par_iter()
        .filter(|&t| keep(&tensors[t].name))
        .map(|t| {
            let spec = &tensors[t];
            let d = tensor_digest(spec, &boxes[t]);
            TensorDigest {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                digest: format_digest(d),
            }
        })
        .collect()
}

/// The digests of a Hugging Face model's weights under tenplan's names
/// (fused tensors assembled as an import would), in the files' element
/// type.
pub fn hf_digests(hf: &HfModel, model: &ModelSpec, dtype: DType) -> Result<Vec<TensorDigest>> {
    let state = ModelState::new(model, StateKind::Weights(dtype));
    let tensors: &[TensorSpec] = state.tensors();
    let sources = hf.sources(model, tensors)?;
    Ok((0..tensors.len())
        .into_par_iter()
        .map(|t| {
            let spec = &tensors[t];
            let d = digest_from(spec, |slab, buf| sources.fill(t as TensorId, spec, slab, buf));
            TensorDigest {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
                digest: format_digest(d),
            }
        })
        .collect())
}

/// Where a tensor first differs between two sides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FirstDifference {
    /// Tensor name.
    pub tensor: String,
    /// Index of the first differing element, row-major order.
    pub index: Vec<u64>,
    /// Its bytes on the first side, hexadecimal (little-endian).
    pub a: String,
    /// Its bytes on the second side.
    pub b: String,
}

/// The first element (row-major) where two fillers of one tensor differ,
/// compared slab by slab; `None` when they agree everywhere.
pub fn first_difference(
    spec: &TensorSpec,
    a: impl Fn(&Region, &mut [u8]),
    b: impl Fn(&Region, &mut [u8]),
) -> Option<FirstDifference> {
    let elem = spec.dtype.size() as usize;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    // Elements before each slab, in row-major order.
    let mut before = 0u64;
    for slab in slabs(&Region::full(&spec.shape), elem as u64) {
        let n = (slab.volume() as usize) * elem;
        x.clear();
        x.resize(n, 0);
        y.clear();
        y.resize(n, 0);
        a(&slab, &mut x);
        b(&slab, &mut y);
        if let Some(at) = x.chunks_exact(elem).zip(y.chunks_exact(elem)).position(|(p, q)| p != q) {
            let mut flat = before + at as u64;
            let mut index = vec![0; spec.shape.len()];
            for d in (0..spec.shape.len()).rev() {
                index[d] = flat % spec.shape[d];
                flat /= spec.shape[d];
            }
            let hex = |v: &[u8]| v.iter().map(|b| format!("{b:02x}")).collect::<String>();
            return Some(FirstDifference {
                tensor: spec.name.clone(),
                index,
                a: hex(&x[at * elem..(at + 1) * elem]),
                b: hex(&y[at * elem..(at + 1) * elem]),
            });
        }
        before += slab.volume();
    }
    None
}

/// A tensor both sides have but that differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// Tensor name.
    pub name: String,
    /// What differs: element type, shape, or contents.
    pub what: String,
}

/// The comparison of two states.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Diff {
    /// Tensors equal on both sides.
    pub same: usize,
    /// Tensors on both sides that differ.
    pub different: Vec<Difference>,
    /// Tensors only the first side has.
    pub only_a: Vec<String>,
    /// Tensors only the second side has.
    pub only_b: Vec<String>,
}

impl Diff {
    /// True when both sides hold the same tensors with the same elements.
    pub fn identical(&self) -> bool {
        self.different.is_empty() && self.only_a.is_empty() && self.only_b.is_empty()
    }
}

/// Compare two lists of digests by name.
pub fn compare(a: &[TensorDigest], b: &[TensorDigest]) -> Diff {
    let by_name: BTreeMap<&str, &TensorDigest> = b.iter().map(|t| (t.name.as_str(), t)).collect();
    let in_a: BTreeMap<&str, &TensorDigest> = a.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut diff = Diff::default();
    for x in a {
        let Some(y) = by_name.get(x.name.as_str()) else {
            diff.only_a.push(x.name.clone());
            continue;
        };
        let what = if x.dtype != y.dtype {
            Some(format!("element type {} vs {}", x.dtype, y.dtype))
        } else if x.shape != y.shape {
            Some(format!("shape {:?} vs {:?}", x.shape, y.shape))
        } else if x.digest != y.digest {
            Some(format!("contents differ ({} vs {})", x.digest, y.digest))
        } else {
            None
        };
        match what {
            Some(what) => diff.different.push(Difference {
                name: x.name.clone(),
                what,
            }),
            None => diff.same += 1,
        }
    }
    diff.only_b = b
        .iter()
        .filter(|t| !in_a.contains_key(t.name.as_str()))
        .map(|t| t.name.clone())
        .collect();
    diff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(name: &str, dtype: DType, shape: &[u64], digest: &str) -> TensorDigest {
        TensorDigest {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            digest: digest.into(),
        }
    }

    #[test]
    fn differences_are_named_by_kind() {
        let a = [
            d("w", DType::BF16, &[2, 2], "x"),
            d("t", DType::BF16, &[2], "y"),
            d("s", DType::BF16, &[2], "z"),
            d("c", DType::BF16, &[2], "1"),
            d("only-a", DType::F32, &[1], "q"),
        ];
        let b = [
            d("c", DType::BF16, &[2], "2"),
            d("s", DType::BF16, &[3], "z"),
            d("t", DType::F32, &[2], "y"),
            d("w", DType::BF16, &[2, 2], "x"),
            d("only-b", DType::F32, &[1], "q"),
        ];
        let diff = compare(&a, &b);
        assert_eq!(diff.same, 1);
        assert!(!diff.identical());
        let what: Vec<&str> = diff.different.iter().map(|x| x.what.as_str()).collect();
        assert_eq!(
            what,
            [
                "element type bf16 vs f32",
                "shape [2] vs [3]",
                "contents differ (1 vs 2)"
            ]
        );
        assert_eq!(
            (diff.only_a, diff.only_b),
            (vec!["only-a".into()], vec!["only-b".into()])
        );
        assert!(compare(&a, &a).identical());
    }

    #[test]
    fn finds_the_first_differing_element() {
        let spec = TensorSpec::new("w", DType::F32, [3, 4]);
        let base = |r: &Region, out: &mut [u8]| {
            for (i, p) in r.points().enumerate() {
                out[i * 4..i * 4 + 4].copy_from_slice(&((p[0] * 4 + p[1]) as f32).to_le_bytes());
            }
        };
        assert_eq!(first_difference(&spec, base, base), None);
        let changed = |r: &Region, out: &mut [u8]| {
            base(r, out);
            for (i, p) in r.points().enumerate() {
                if p == [2, 1] || p == [2, 3] {
                    out[i * 4] ^= 1;
                }
            }
        };
        let d = first_difference(&spec, base, changed).unwrap();
        assert_eq!(d.index, [2, 1]);
        assert_eq!(d.a, "00001041");
        assert_eq!(d.b, "01001041");
    }
}
