//! CUDA devices. With the `cuda` feature, plans run on GPUs through cudarc
//! (the driver library is loaded at run time, so neither build needs a CUDA
//! toolkit); without it, the same API returns [`Error::NotCompiledWithCuda`].
//!
//! Logical device `d` of a plan runs on GPU `d % count`. A box copy is cut
//! into 2-D slabs (rows of the longest contiguous run, pitched by both
//! pieces' strides). Slabs whose both ends are on one GPU are cut into
//! items of at most 256 KiB (a wide row into several) and performed by one
//! launch per GPU of the `box_copy` kernel (kernels/box_copy.cu, embedded
//! as PTX that the driver compiles for the GPU at hand): thousands of small
//! copies cost one launch, not one driver call each, and a large one is
//! spread over every SM. Slabs between GPUs (and every slab, should the
//! driver refuse the PTX) are one `cuMemcpy2DAsync` each, peer to peer under
//! unified addressing.

use std::time::Duration;

use crate::{HostMemory, Result, Verified};

/// What a CUDA run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaRun {
    /// The target state, copied back to host memory.
    pub target: HostMemory,
    /// Time of the copies on the GPUs, from the first launch or driver copy
    /// to the last GPU's completion (uploads, downloads and the host's
    /// preparation excluded).
    pub copy_time: Duration,
    /// Host time spent turning the plan into kernel items and driver copies
    /// (done before the timed copies; a caller repeating one plan pays it
    /// once per run here).
    pub prepare_time: Duration,
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

    /// Whether box copies within a GPU run as launches of the box-copy
    /// kernel (else as one driver copy per slab).
    pub fn uses_kernel(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            self.inner.uses_kernel()
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// The same GPUs with every box copy performed by the driver, one
    /// `cuMemcpy2DAsync` per slab (no box-copy kernel): the path a driver
    /// that refuses the PTX takes, kept callable to test and measure it.
    pub fn with_driver_copies(self) -> CudaExecutor {
        #[cfg(feature = "cuda")]
        {
            CudaExecutor {
                inner: self.inner.with_driver_copies(),
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            self
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

/// One 2-D slab of a box copy: `height` rows of `width` bytes, pitched by
/// both sides, at device addresses (or, in tests, offsets).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Copy2d {
    src: u64,
    dst: u64,
    width: u64,
    height: u64,
    src_pitch: u64,
    dst_pitch: u64,
}

/// Largest item of a kernel launch: big enough to amortise a block's start,
/// small enough to spread a large copy over every SM.
const ITEM_BYTES: u64 = 256 << 10;
/// Words per item: source, destination, width, rows, source pitch,
/// destination pitch (the kernel's `Item`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const ITEM_WORDS: usize = 6;

/// The kernel's items for one slab, each at most [`ITEM_BYTES`]: runs of
/// whole rows where rows are narrow, a wide row cut into pieces (at
/// multiples of 16 bytes, so the pieces keep the row's alignment).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn push_items(items: &mut Vec<u64>, s: &Copy2d) {
    if s.width > ITEM_BYTES {
        for r in 0..s.height {
            let (src, dst) = (s.src + r * s.src_pitch, s.dst + r * s.dst_pitch);
            let mut at = 0;
            while at < s.width {
                let n = ITEM_BYTES.min(s.width - at);
                items.extend([src + at, dst + at, n, 1, n, n]);
                at += n;
            }
        }
        return;
    }
    let per = (ITEM_BYTES / s.width.max(1)).max(1);
    let mut r = 0;
    while r < s.height {
        let n = per.min(s.height - r);
        items.extend([
            s.src + r * s.src_pitch,
            s.dst + r * s.dst_pitch,
            s.width,
            n,
            s.src_pitch,
            s.dst_pitch,
        ]);
        r += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kernel does with an item list, on host bytes.
    fn emulate(items: &[u64], src: &[u8], dst: &mut [u8]) {
        for it in items.chunks(ITEM_WORDS) {
            let [s, d, w, rows, sp, dp] = [it[0], it[1], it[2], it[3], it[4], it[5]].map(|x| x as usize);
            for r in 0..rows {
                dst[d + r * dp..d + r * dp + w].copy_from_slice(&src[s + r * sp..s + r * sp + w]);
            }
        }
    }

    #[test]
    fn items_cover_each_slab_exactly_and_stay_small() {
        let k = ITEM_BYTES;
        for (width, height, sp, dp) in [
            (4, 1000, 8, 12),
            (k, 3, k + 16, k),
            (k + 16, 2, k + 32, 2 * k),
            (3 * k + 48, 3, 4 * k, 3 * k + 64),
            (5 * k, 1, 5 * k, 5 * k),
            (1000, 700, 1024, 1000),
        ] {
            let slab = Copy2d {
                src: 16,
                dst: 32,
                width,
                height,
                src_pitch: sp,
                dst_pitch: dp,
            };
            let src: Vec<u8> = (0..(16 + sp * height) as usize).map(|i| (i * 7 % 251) as u8).collect();
            let mut want = vec![0u8; (32 + dp * height) as usize];
            for r in 0..height as usize {
                let (s, d, w) = (16 + r * sp as usize, 32 + r * dp as usize, width as usize);
                want[d..d + w].copy_from_slice(&src[s..s + w]);
            }
            let mut items = Vec::new();
            push_items(&mut items, &slab);
            let mut got = vec![0u8; want.len()];
            emulate(&items, &src, &mut got);
            assert_eq!(got, want, "{width} x {height}");
            for it in items.chunks(ITEM_WORDS) {
                assert!(it[2] * it[3] <= k.max(width.min(k)), "item of {} x {}", it[2], it[3]);
                assert_eq!(it[0] % 16, 0, "aligned pieces keep their alignment");
            }
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
    use cudarc::driver::{
        CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig,
        PushKernelArg,
    };
    use tenplan_ptc::{DeviceId, Piece, Region};

    use super::{push_items, Copy2d, CudaRun, ITEM_WORDS};
    use crate::{Error, HostMemory, Result, Verified};
    use tenplan_ptc::box_io::BoxRuns;

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

    /// The box-copy kernel, as PTX for compute capability 7.5 and later.
    const BOX_COPY_PTX: &str = include_str!("../kernels/box_copy.ptx");

    #[derive(Debug)]
    pub(super) struct Inner {
        pub(super) ctxs: Vec<Arc<CudaContext>>,
        /// Each GPU's box-copy kernel, when its driver loaded the PTX.
        kernels: Vec<Option<CudaFunction>>,
    }

    impl Inner {
        pub(super) fn new() -> Result<Inner> {
            let n = device_count();
            if n == 0 {
                return Err(Error::Cuda {
                    what: "no CUDA driver or no GPU on this machine".into(),
                });
            }
            let ctxs: Vec<Arc<CudaContext>> = (0..n)
                .map(|i| CudaContext::new(i).map_err(cuda))
                .collect::<Result<_>>()?;
            // A driver too old for the PTX leaves the 2-D copies.
            let kernels = ctxs
                .iter()
                .map(|c| {
                    c.load_module(cudarc::nvrtc::Ptx::from_src(BOX_COPY_PTX))
                        .and_then(|m| m.load_function("box_copy"))
                        .ok()
                })
                .collect();
            Ok(Inner { ctxs, kernels })
        }

        pub(super) fn with_driver_copies(self) -> Inner {
            let kernels = vec![None; self.ctxs.len()];
            Inner { kernels, ..self }
        }

        /// Whether box copies within a GPU run as kernel launches.
        pub(super) fn uses_kernel(&self) -> bool {
            self.kernels.iter().all(Option::is_some)
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
            // Base addresses (the buffers outlive every copy: they are
            // dropped after the final synchronisation).
            let src_ptrs: BTreeMap<DeviceId, Vec<u64>> = src
                .iter()
                .map(|(&d, bufs)| (d, bufs.iter().map(|b| b.device_ptr(&self.stream(d)).0).collect()))
                .collect();
            let dst_ptrs: BTreeMap<DeviceId, Vec<u64>> = dst
                .iter_mut()
                .map(|(&d, bufs)| {
                    let s = self.stream(d);
                    (d, bufs.iter_mut().map(|b| b.device_ptr_mut(&s).0).collect())
                })
                .collect();
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            // Host work first: every slab becomes a kernel item or a driver
            // copy, and the item lists go to their GPUs before the clock starts.
            let t_prepare = Instant::now();
            let gpus = self.ctxs.len();
            let mut items: Vec<Vec<u64>> = vec![Vec::new(); gpus];
            let mut driver: Vec<(DeviceId, Copy2d)> = Vec::new();
            let mut bytes = 0u64;
            // A multicast lands on every device it names; under UVA each
            // destination copies from the source directly.
            for (c, w) in plan.copies.iter().flat_map(|c| c.writes().map(move |w| (c, w))) {
                let elem = tensors[c.tensor as usize].dtype.size() as usize;
                let to = dst_layout
                    .piece_at(w.dst, w.buffer, w.offset, c.tensor)
                    .expect("verified: the target piece exists");
                let (from_gpu, to_gpu) = (c.src as usize % gpus, w.dst as usize % gpus);
                for (bi, from) in src_layout.pieces_of(c.src, c.tensor) {
                    let Some(part) = from.region.intersect(&c.region) else {
                        continue;
                    };
                    let sp = src_ptrs[&c.src][bi];
                    let dp = dst_ptrs[&w.dst][w.buffer as usize];
                    let slabs = Slabs::new(from, to, &part, elem);
                    if from_gpu == to_gpu && self.kernels[to_gpu].is_some() {
                        slabs.for_each(sp, dp, |slab| push_items(&mut items[to_gpu], &slab));
                    } else {
                        slabs.for_each(sp, dp, |slab| driver.push((w.dst, slab)));
                    }
                    bytes += part.volume() * elem as u64;
                }
            }
            let mut launched = Vec::new();
            for (g, list) in items.iter().enumerate() {
                if self.kernels[g].is_some() && !list.is_empty() {
                    let s = self.ctxs[g].default_stream();
                    launched.push((g, s.clone_htod(list).map_err(cuda)?));
                }
            }
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            let prepare_time = t_prepare.elapsed();
            let t0 = Instant::now();
            for (d, copy) in &driver {
                copy.issue(&self.stream(*d))?;
            }
            for (g, on_gpu) in &launched {
                let f = self.kernels[*g].as_ref().expect("items only for GPUs with the kernel");
                let s = self.ctxs[*g].default_stream();
                let n = items[*g].len() / ITEM_WORDS;
                let mut first = 0;
                while first < n {
                    let count = (n - first).min(MAX_BLOCKS);
                    let (base, _sync) = on_gpu.device_ptr(&s);
                    let ptr: u64 = base + (first * ITEM_WORDS * 8) as u64;
                    let mut b = s.launch_builder(f);
                    b.arg(&ptr);
                    let cfg = LaunchConfig {
                        grid_dim: (count as u32, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: every item lies inside buffers whose sizes the
                    // checker proved (as for the 2-D copies), and the item
                    // list stays alive until the stream is synchronised.
                    unsafe { b.launch(cfg) }.map_err(cuda)?;
                    first += count;
                }
            }
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            let copy_time = t0.elapsed();
            drop(launched);
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
                prepare_time,
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

    /// Most blocks of one launch (the grid's x limit is 2^31 - 1).
    const MAX_BLOCKS: usize = 1 << 30;

    /// One box copy as 2-D slabs: rows of the longest contiguous run, pitched
    /// by the two pieces' strides, byte offsets within the two buffers.
    struct Slabs {
        runs: BoxRuns,
        k: usize,
        elem: u64,
        width: u64,
        height: u64,
        from_pitch: u64,
        to_pitch: u64,
    }

    impl Slabs {
        fn new(from: &Piece, to: &Piece, region: &Region, elem: usize) -> Slabs {
            let runs = BoxRuns::new(from, to, region);
            let (k, elem) = (runs.k, elem as u64);
            let width = runs.run_elems() * elem;
            // Dimension k-1 (if any) becomes the slab's rows; the ones above
            // it are walked.
            let (height, from_pitch, to_pitch) = if k > 0 {
                (
                    runs.shape[k - 1],
                    runs.from_strides[k - 1] * elem,
                    runs.to_strides[k - 1] * elem,
                )
            } else {
                (1, width, width)
            };
            Slabs {
                runs,
                k,
                elem,
                width,
                height,
                from_pitch,
                to_pitch,
            }
        }

        /// Each slab, at the given base addresses of the source and the
        /// destination buffer.
        fn for_each(&self, src: u64, dst: u64, mut at: impl FnMut(Copy2d)) {
            self.runs.for_each_start(self.k.saturating_sub(1), |f, t| {
                at(Copy2d {
                    src: src + f * self.elem,
                    dst: dst + t * self.elem,
                    width: self.width,
                    height: self.height,
                    src_pitch: self.from_pitch,
                    dst_pitch: self.to_pitch,
                })
            });
        }
    }

    impl Copy2d {
        /// Queue the slab as one `cuMemcpy2DAsync` (peer to peer under unified
        /// addressing when the two ends are on different GPUs).
        fn issue(&self, s: &Arc<CudaStream>) -> Result<()> {
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: self.src,
                srcArray: std::ptr::null_mut(),
                srcPitch: self.src_pitch as usize,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: self.dst,
                dstArray: std::ptr::null_mut(),
                dstPitch: self.dst_pitch as usize,
                WidthInBytes: self.width as usize,
                Height: self.height as usize,
            };
            // SAFETY: the checker proved both boxes lie inside their pieces,
            // and the pieces inside buffers of exactly these sizes; the
            // pointers stay alive until the stream is synchronised.
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, s.cu_stream()) }
                .result()
                .map_err(cuda)
        }
    }
}
