//! `tenplan.Layout`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::{Deserialize, Serialize};
use tenplan_ptc::{DType, DeviceId, HeldBox, Layout, RankHolding, Region, Shard, TensorSpec};

use crate::conversion::{dtype, to_py};
use crate::error::layout_error;

#[derive(Serialize)]
struct LayoutRef<'a> {
    tensors: &'a [TensorSpec],
    shards: &'a [Shard],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutDoc {
    tensors: Vec<TensorSpec>,
    shards: Vec<Shard>,
}

/// Where every sub-tensor of every tensor lives: tensors, and shards (each
/// on one or more devices) of buffers holding pieces. A `Layout` that
/// exists is valid (its pieces tile every tensor exactly).
#[pyclass(module = "tenplan._tenplan", name = "Layout", frozen)]
pub struct PyLayout {
    pub(crate) inner: Arc<Layout>,
}

#[pymethods]
impl PyLayout {
    /// A layout from JSON: `{"tensors": [{"name", "dtype", "shape"}...],
    /// "shards": [{"name", "devices", "buffers": [{"name", "dtype", "len",
    /// "pieces": [{"tensor", "box": [[lo, hi]...], "offset"}]}]}]}`.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        let doc: LayoutDoc = serde_json::from_str(text).map_err(|e| layout_error(py, format!("not a layout: {e}")))?;
        let layout = Layout::new(doc.tensors.into(), doc.shards).map_err(|e| layout_error(py, e))?;
        Ok(PyLayout {
            inner: Arc::new(layout),
        })
    }

    /// The layout of a group whose rank `r` holds `descriptions[r]`, on
    /// device `devices[r]` (default `r`): dicts `{"name", "dtype",
    /// "shape", "box"}` and optionally `"buffer"` and `"partial"` (the
    /// rank holds an addend of the box), one per box a rank holds. The tensors are numbered in `order` when given, else as they
    /// first appear.
    #[staticmethod]
    #[pyo3(signature = (descriptions, devices = None, order = None))]
    fn from_descriptions(
        py: Python<'_>,
        descriptions: Vec<Vec<Bound<'_, PyAny>>>,
        devices: Option<Vec<DeviceId>>,
        order: Option<Vec<String>>,
    ) -> PyResult<Self> {
        group_layout(py, descriptions.len(), devices, order, |rank| {
            descriptions[rank]
                .iter()
                .map(|d| held_box(py, d).map_err(|e| layout_error(py, format!("rank {rank}'s description: {e}"))))
                .collect()
        })
    }

    /// The layout of a group from its descriptions as
    /// `tenplan.torch` gathers them, compactly: `headers` are the distinct
    /// lists of `(name, dtype, shape, buffer or None, partial)` that ranks hold,
    /// and `ranks[r] = (header, bounds)` names rank `r`'s header and gives
    /// its boxes as native-endian u64 `lo, hi` pairs, dimension by
    /// dimension, entry by entry. What `from_descriptions` builds from the
    /// same boxes, without a Python object per box.
    #[staticmethod]
    #[pyo3(signature = (headers, ranks, devices = None, order = None))]
    fn from_gathered(
        py: Python<'_>,
        headers: Vec<Vec<HeaderEntry>>,
        ranks: Vec<(usize, Bound<'_, PyBytes>)>,
        devices: Option<Vec<DeviceId>>,
        order: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let headers = headers
            .into_iter()
            .map(|h| {
                h.into_iter()
                    .map(|(name, d, shape, buffer, partial)| Ok((name, dtype(py, &d)?, shape, buffer, partial)))
                    .collect::<PyResult<Vec<_>>>()
            })
            .collect::<PyResult<Vec<_>>>()?;
        group_layout(py, ranks.len(), devices, order, |rank| {
            let (h, bounds) = &ranks[rank];
            let header = headers
                .get(*h)
                .ok_or_else(|| layout_error(py, format!("rank {rank} names header {h} of {}", headers.len())))?;
            gathered_boxes(py, rank, header, bounds.as_bytes())
        })
    }

    /// The layout as JSON (what `from_json` reads).
    fn to_json(&self) -> String {
        serde_json::to_string(&LayoutRef {
            tensors: self.inner.tensors(),
            shards: self.inner.shards(),
        })
        .expect("layouts serialise")
    }

    /// The devices holding state, in order.
    fn devices(&self) -> Vec<DeviceId> {
        self.inner.devices().collect()
    }

    /// The tensors: dicts of name, dtype and shape.
    fn tensors(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &**self.inner.tensors())
    }

    /// The shard a device holds (name, devices, buffers with their
    /// pieces), or None.
    fn shard(&self, py: Python<'_>, device: DeviceId) -> PyResult<Py<PyAny>> {
        match self.inner.shard_of(device) {
            Some(s) => to_py(py, s),
            None => Ok(py.None()),
        }
    }

    /// Bytes a device holds.
    fn device_bytes(&self, device: DeviceId) -> u64 {
        self.inner.device_bytes(device)
    }

    fn __eq__(&self, other: &PyLayout) -> bool {
        self.inner == other.inner
    }

    fn __repr__(&self) -> String {
        format!(
            "Layout({} tensors, {} shards, {} devices)",
            self.inner.tensors().len(),
            self.inner.shards().len(),
            self.inner.devices().count()
        )
    }
}

/// A header's entry as Python gives it: name, element type, shape, buffer,
/// whether the rank holds an addend.
type HeaderEntry = (String, String, Vec<u64>, Option<String>, bool);

/// One entry of a rank's description (`tenplan.torch.describe`'s dicts).
fn held_box(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<HeldBox> {
    let name: String = d.get_item("name")?.extract()?;
    let named = |e: PyErr| layout_error(py, format!("tensor `{name}`: {e}"));
    let dtype = dtype(py, &d.get_item("dtype")?.extract::<String>()?)?;
    let shape: Vec<u64> = d.get_item("shape")?.extract().map_err(named)?;
    let bounds: Vec<[u64; 2]> = d.get_item("box")?.extract().map_err(named)?;
    let region = Region::try_from(bounds).map_err(|e| named(layout_error(py, e)))?;
    let buffer = match d.get_item("buffer") {
        Ok(b) if !b.is_none() => Some(b.extract()?),
        _ => None,
    };
    let partial = match d.get_item("partial") {
        Ok(p) => p.extract().map_err(named)?,
        Err(_) => false,
    };
    Ok(HeldBox {
        name,
        dtype,
        shape,
        region,
        buffer,
        partial,
    })
}

/// A header's entry with its element type parsed.
type ParsedEntry = (String, DType, Vec<u64>, Option<String>, bool);

/// Rank `rank`'s boxes from its header and its bounds (native-endian u64
/// `lo, hi` pairs, dimension by dimension, entry by entry).
fn gathered_boxes(py: Python<'_>, rank: usize, header: &[ParsedEntry], bytes: &[u8]) -> PyResult<Vec<HeldBox>> {
    let words = header.iter().map(|(_, _, shape, _, _)| 2 * shape.len()).sum::<usize>();
    if bytes.len() != 8 * words {
        return Err(layout_error(
            py,
            format!(
                "rank {rank}'s boxes: {} bytes, its {} tensors need {}",
                bytes.len(),
                header.len(),
                8 * words
            ),
        ));
    }
    let mut at = bytes
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")));
    let mut next = || at.next().expect("the length was checked");
    header
        .iter()
        .map(|(name, dtype, shape, buffer, partial)| {
            let bounds: Vec<[u64; 2]> = shape.iter().map(|_| [next(), next()]).collect();
            let region = Region::try_from(bounds)
                .map_err(|e| layout_error(py, format!("rank {rank}'s description: tensor `{name}`: {e}")))?;
            Ok(HeldBox {
                name: name.clone(),
                dtype: *dtype,
                shape: shape.clone(),
                region,
                buffer: buffer.clone(),
                partial: *partial,
            })
        })
        .collect()
}

/// The layout of a group of `ranks` ranks, rank `r` holding `boxes_of(r)`
/// on device `devices[r]` (default `r`), built with the GIL released.
fn group_layout(
    py: Python<'_>,
    ranks: usize,
    devices: Option<Vec<DeviceId>>,
    order: Option<Vec<String>>,
    mut boxes_of: impl FnMut(usize) -> PyResult<Vec<HeldBox>>,
) -> PyResult<PyLayout> {
    if let Some(d) = devices.as_ref().filter(|d| d.len() != ranks) {
        return Err(layout_error(
            py,
            format!("{} devices given for {ranks} ranks' descriptions", d.len()),
        ));
    }
    let holdings = (0..ranks)
        .map(|rank| {
            let device = devices.as_ref().map_or(rank as DeviceId, |d| d[rank]);
            Ok(RankHolding {
                device,
                boxes: boxes_of(rank)?,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let layout = py
        .detach(|| Layout::from_rank_holdings(&holdings, order.as_deref()))
        .map_err(|e| layout_error(py, e))?;
    Ok(PyLayout {
        inner: Arc::new(layout),
    })
}
