//! `tenplan._tenplan.HostCopies`: the torch.distributed executor's copies
//! between CPU tensors, compiled once into `memcpy`s
//! ([`tenplan_executor::StridedCopies`]) and run with the GIL released.

use pyo3::prelude::*;
use tenplan_executor::{HostRange, StridedCopies, StridedCopy, STREAMING_BYTES};

use crate::error::layout_error;

/// Copies between strided views of CPU tensors that do not depend on one
/// another, compiled once and run at each call of a prepared plan.
///
/// `memory` lists the tensors the copies may touch as `(tensor, address,
/// bytes)`; this object keeps them alive, and every copy must lie inside
/// them (checked here). `copies` gives each copy as `(destination address,
/// source address, shape, destination strides, source strides, element
/// bytes)`, strides in bytes. A set of at least `streaming_min_bytes`
/// (16 MiB unless told) writes with streaming stores, which bypass the
/// cache. The tensors must keep their storage while
/// this object lives (not resized, not given new storage).
#[pyclass(module = "tenplan._tenplan", name = "HostCopies", frozen)]
pub struct PyHostCopies {
    copies: StridedCopies,
    /// The tensors whose memory the copies touch, kept alive.
    _memory: Vec<Py<PyAny>>,
}

/// One copy as Python gives it.
type CopyArgs = (usize, usize, Vec<usize>, Vec<usize>, Vec<usize>, usize);

#[pymethods]
impl PyHostCopies {
    #[new]
    #[pyo3(signature = (memory, copies, threads = 1, streaming_min_bytes = None))]
    fn new(
        py: Python<'_>,
        memory: Vec<(Py<PyAny>, usize, usize)>,
        copies: Vec<CopyArgs>,
        threads: usize,
        streaming_min_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let ranges: Vec<HostRange> = memory.iter().map(|&(_, start, len)| HostRange { start, len }).collect();
        let copies: Vec<StridedCopy> = copies
            .into_iter()
            .map(|(dst, src, shape, dst_strides, src_strides, elem)| StridedCopy {
                dst,
                src,
                shape,
                dst_strides,
                src_strides,
                elem,
            })
            .collect();
        let compiled = StridedCopies::new(&copies, &ranges, threads)
            .map_err(|e| layout_error(py, e))?
            .streaming_from(streaming_min_bytes.unwrap_or(STREAMING_BYTES));
        Ok(PyHostCopies {
            copies: compiled,
            _memory: memory.into_iter().map(|(t, _, _)| t).collect(),
        })
    }

    /// Perform every copy (the GIL released meanwhile).
    #[allow(unsafe_code)]
    fn run(&self, py: Python<'_>) {
        // SAFETY: every copy lies inside the memory of tensors this object
        // keeps alive (checked in `new`); the executor runs a set only
        // while no other work of its own touches those bytes, and the
        // tensors keep their storage, as the class says.
        py.detach(|| unsafe { self.copies.run() })
    }

    /// Bytes one run copies.
    #[getter]
    fn bytes(&self) -> usize {
        self.copies.bytes()
    }

    fn __len__(&self) -> usize {
        self.copies.len()
    }
}
