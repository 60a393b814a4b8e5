//! CUDA devices. With the `cuda` feature, plans run on GPUs through cudarc
//! (the driver library is loaded at run time, so neither build needs a CUDA
//! toolkit); without it, the same API returns [`Error::NotCompiledWithCuda`].
//!
//! Logical device `d` of a plan runs on GPU `d % count`. Each box copy is one
//! `cuMemcpy2DAsync` per contiguous 2-D slab (rows of the longest contiguous
//! run, pitched by both pieces' strides), so a tensor-parallel column slice
//! moves in one call; copies between GPUs go peer to peer under unified
//! addressing.

use std::time::Duration;

use crate::{HostMemory, Result, Verified};

/// What a CUDA run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaRun {
    /// The target state, copied back to host memory.
    pub target: HostMemory,
    /// Time of the copies on the GPUs (uploads and downloads excluded).
    pub copy_time: Duration,
    /// Bytes the copies moved.
    pub bytes: u64,
}

/// Runs verified plans on CUDA devices.
#[derive(Debug)]
pub struct CudaExecutor {
    #[cfg(feature = "cuda")]
    inner: imp::Inner,
}

/// Number of CUDA devices usable by this build: 0 without the `cuda` feature,
/// without a driver, or without a GPU.
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        imp::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

impl CudaExecutor {
    /// Open every visible GPU.
    pub fn new() -> Result<CudaExecutor> {
        #[cfg(feature = "cuda")]
        {
            Ok(CudaExecutor {
                inner: imp::Inner::new()?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(crate::Error::NotCompiledWithCuda)
        }
    }

    /// Number of GPUs in use.
    pub fn gpus(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.inner.ctxs.len()
        }
        #[cfg(not(feature = "cuda"))]
        {
            0
        }
    }

    /// Upload the source state, perform the plan's copies on the GPUs, and
    /// download the target state.
    pub fn execute(&self, verified: &Verified<'_>, source: &HostMemory) -> Result<CudaRun> {
        #[cfg(feature = "cuda")]
        {
            self.inner.execute(verified, source)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (verified, source);
            Err(crate::Error::NotCompiledWithCuda)
        }
    }

    /// Device-to-device copy bandwidth of one GPU (bytes per second) for one
    /// contiguous copy of `bytes`, best of `reps`: the peer for box copies.
    pub fn dtod_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
        #[cfg(feature = "cuda")]
        {
            self.inner.dtod_bandwidth(bytes, reps)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (bytes, reps);
            Err(crate::Error::NotCompiledWithCuda)
        }
    }
}

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod imp {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Instant;

    use cudarc::driver::sys;
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError};
    use tenplan_ptc::{DeviceId, Piece, Region};

    use super::CudaRun;
    use crate::fill::BoxRuns;
    use crate::{Error, HostMemory, Result, Verified};

    fn cuda(e: DriverError) -> Error {
        Error::Cuda { what: e.to_string() }
    }

    pub(super) fn device_count() -> usize {
        // SAFETY: only asks the loader whether libcuda can be opened.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
    }

    #[derive(Debug)]
    pub(super) struct Inner {
        pub(super) ctxs: Vec<Arc<CudaContext>>,
    }

    impl Inner {
        pub(super) fn new() -> Result<Inner> {
            let n = device_count();
            if n == 0 {
                return Err(Error::Cuda {
                    what: "no CUDA driver or no GPU on this machine".into(),
                });
            }
            let ctxs = (0..n)
                .map(|i| CudaContext::new(i).map_err(cuda))
                .collect::<Result<_>>()?;
            Ok(Inner { ctxs })
        }

        fn stream(&self, d: DeviceId) -> Arc<CudaStream> {
            self.ctxs[d as usize % self.ctxs.len()].default_stream()
        }

        pub(super) fn execute(&self, verified: &Verified<'_>, source: &HostMemory) -> Result<CudaRun> {
            let plan = verified.plan();
            let (src_layout, dst_layout) = (plan.problem.source(), plan.problem.target());
            let tensors = plan.problem.tensors();
            if let Some(c) = plan.copies.iter().find(|c| c.reduce) {
                return Err(Error::Partial {
                    tensor: tensors[c.tensor as usize].name.clone(),
                    what: "reduce-copies need an addition kernel, which the CUDA back end does not have yet",
                });
            }
            let mut src: BTreeMap<DeviceId, Vec<CudaSlice<u8>>> = BTreeMap::new();
            for c in &plan.copies {
                if let std::collections::btree_map::Entry::Vacant(slot) = src.entry(c.src) {
                    let s = self.stream(c.src);
                    let bufs = (0..src_layout.shard_of(c.src).map_or(0, |sh| sh.buffers.len()))
                        .map(|b| {
                            let host = source.buffer(c.src, b).ok_or(Error::MissingDevice { device: c.src })?;
                            s.clone_htod(host).map_err(cuda)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    slot.insert(bufs);
                }
            }
            let mut dst: BTreeMap<DeviceId, Vec<CudaSlice<u8>>> = BTreeMap::new();
            for shard in dst_layout.shards() {
                for &d in &shard.devices {
                    let s = self.stream(d);
                    let bufs = shard
                        .buffers
                        .iter()
                        .map(|b| s.alloc_zeros::<u8>(b.bytes() as usize).map_err(cuda))
                        .collect::<Result<Vec<_>>>()?;
                    dst.insert(d, bufs);
                }
            }
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            let t0 = Instant::now();
            let mut bytes = 0u64;
            // A multicast lands on every device it names; under UVA each
            // destination copies from the source directly.
            for (c, w) in plan.copies.iter().flat_map(|c| c.writes().map(move |w| (c, w))) {
                let elem = tensors[c.tensor as usize].dtype.size() as usize;
                let to = dst_layout
                    .piece_at(w.dst, w.buffer, w.offset, c.tensor)
                    .expect("verified: the target piece exists");
                let s = self.stream(w.dst);
                for (bi, from) in src_layout.pieces_of(c.src, c.tensor) {
                    let Some(part) = from.region.intersect(&c.region) else {
                        continue;
                    };
                    let src_buf = &src[&c.src][bi];
                    let dst_buf = &mut dst.get_mut(&w.dst).expect("allocated")[w.buffer as usize];
                    copy_box(&s, src_buf, from, dst_buf, to, &part, elem)?;
                    bytes += part.volume() * elem as u64;
                }
            }
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            let copy_time = t0.elapsed();
            let mut out = BTreeMap::new();
            for (d, bufs) in &dst {
                let s = self.stream(*d);
                let host = bufs
                    .iter()
                    .map(|b| s.clone_dtoh(b).map_err(cuda))
                    .collect::<Result<Vec<_>>>()?;
                out.insert(*d, host);
            }
            Ok(CudaRun {
                target: HostMemory::from_buffers(dst_layout, out)?,
                copy_time,
                bytes,
            })
        }

        pub(super) fn dtod_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
            let s = self.ctxs[0].default_stream();
            let a = s.alloc_zeros::<u8>(bytes).map_err(cuda)?;
            let mut b = s.alloc_zeros::<u8>(bytes).map_err(cuda)?;
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) {
                s.synchronize().map_err(cuda)?;
                let t = Instant::now();
                s.memcpy_dtod(&a, &mut b).map_err(cuda)?;
                s.synchronize().map_err(cuda)?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            Ok(bytes as f64 / best)
        }
    }

    /// One box copy as 2-D copies: rows of the longest contiguous run,
    /// pitched by the two pieces' strides.
    fn copy_box(
        s: &Arc<CudaStream>,
        src: &CudaSlice<u8>,
        from: &Piece,
        dst: &mut CudaSlice<u8>,
        to: &Piece,
        region: &Region,
        elem: usize,
    ) -> Result<()> {
        let g = BoxRuns::new(from, to, region);
        let (k, run) = (g.k, g.run_elems() as usize * elem);
        // Dimension k-1 (if any) becomes the 2-D copy's rows; the ones above
        // it are walked.
        let (height, fpitch, tpitch) = if k > 0 {
            (
                g.shape[k - 1] as usize,
                g.from_strides[k - 1] as usize * elem,
                g.to_strides[k - 1] as usize * elem,
            )
        } else {
            (1, run, run)
        };
        let (sp, _sync_src) = src.device_ptr(s);
        let (dp, _sync_dst) = dst.device_ptr_mut(s);
        let mut failed = None;
        g.for_each_start(k.saturating_sub(1), |f, t| {
            if failed.is_some() {
                return;
            }
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: sp + f * elem as u64,
                srcArray: std::ptr::null_mut(),
                srcPitch: fpitch,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: dp + t * elem as u64,
                dstArray: std::ptr::null_mut(),
                dstPitch: tpitch,
                WidthInBytes: run,
                Height: height,
            };
            // SAFETY: the checker proved both boxes lie inside their pieces,
            // and the pieces inside buffers of exactly these sizes; the
            // pointers stay alive until the stream is synchronised.
            if let Err(e) = unsafe { sys::cuMemcpy2DAsync_v2(&copy, s.cu_stream()) }.result() {
                failed = Some(cuda(e));
            }
        });
        failed.map_or(Ok(()), Err)
    }
}
