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
//!
//! Reduce-copies (addends of a partial tensor) are items of the
//! `box_reduce` kernel, which adds as the host executor does
//! ([`tenplan_ptc::DType::add_assign`]). Two addends of one element never
//! share a launch: the k-th reduce-copy into a target piece runs in launch
//! wave k, and a GPU's launches run in order on its stream. An addend from
//! another GPU is first copied by the driver into a staging buffer on the
//! destination's GPU, then added from there. Without the kernels (a driver
//! that refuses the PTX) reduce-copies are refused.
//!
//! [`Error::NotCompiledWithCuda`]: crate::Error::NotCompiledWithCuda

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tenplan_ptc::box_io::BoxRuns;
use tenplan_ptc::{DType, DeviceId, Piece, Plan, Region};

use crate::{Error, HostMemory, Result, Verified};

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
    /// kernel, and reduce-copies can run (else copies are one driver copy
    /// per slab, and plans with reduce-copies are refused).
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
    /// `cuMemcpy2DAsync` per slab (no box kernels, so no reduce-copies):
    /// the path a driver that refuses the PTX takes, kept callable to test
    /// and measure it.
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

/// One box copy as 2-D slabs: rows of the longest contiguous run, pitched
/// by the two pieces' strides, byte offsets within the two buffers.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
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

/// What a kernel launch runs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    /// `box_copy`: destination = source.
    Copy,
    /// `box_reduce`: destination += source, elements of this type.
    Reduce(DType),
}

/// One launch: items `first..first + count` of its GPU's item list.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Launch {
    kernel: Kernel,
    first: usize,
    count: usize,
}

/// The `box_reduce` kernel's number for an element type
/// (kernels/box_copy.cu); `None` for a type it cannot add.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn kernel_dtype(dtype: DType) -> Option<u32> {
    Some(match dtype {
        DType::F64 => 0,
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::I64 => 4,
        DType::I32 => 5,
        DType::U8 => 6,
        _ => return None,
    })
}

/// Refuses a plan whose reduce-copies cannot run: without the box kernels
/// (`kernels` false), or of a type the kernel cannot add.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn check_reductions(plan: &Plan, kernels: bool) -> Result<()> {
    let tensors = plan.problem.tensors();
    for c in plan.copies.iter().filter(|c| c.reduce) {
        let t = &tensors[c.tensor as usize];
        let what = if !kernels {
            "reduce-copies need the box_reduce kernel, whose PTX this GPU's driver refused"
        } else if kernel_dtype(t.dtype).is_none() {
            "the box_reduce kernel cannot add this element type"
        } else {
            continue;
        };
        return Err(Error::Partial {
            tensor: t.name.clone(),
            what,
        });
    }
    Ok(())
}

/// Device addresses of the buffers a plan touches: source and target
/// buffers by logical device, and each GPU's staging buffer (reduce-copies
/// between GPUs land there before they are added).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Addresses<'a> {
    src: &'a BTreeMap<DeviceId, Vec<u64>>,
    dst: &'a BTreeMap<DeviceId, Vec<u64>>,
    staging: &'a [u64],
}

/// A plan's copies as work for the GPUs: driver copies, then each GPU's
/// launches in order on its stream.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Default)]
struct GpuWork {
    /// Slabs the driver copies (one `cuMemcpy2DAsync` each), issued on the
    /// stream of the GPU given before any launch.
    driver: Vec<(usize, Copy2d)>,
    /// Each GPU's kernel items, in launch order.
    items: Vec<Vec<u64>>,
    /// Each GPU's launches.
    launches: Vec<Vec<Launch>>,
    /// Bytes the plan moves.
    bytes: u64,
}

/// One slab of a plan's writes, found by [`for_each_slab`].
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct SlabOf {
    slab: Copy2d,
    from_gpu: usize,
    to_gpu: usize,
    /// The element type when the copy is a reduce-copy.
    reduce: Option<DType>,
    /// Launch wave of a reduce-copy: how many reduce-copies into the same
    /// target piece come before it in the plan.
    wave: u32,
}

/// Staging bytes a slab takes (16-byte aligned, as the kernel's widest loads).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn staged_bytes(s: &Copy2d) -> u64 {
    (s.width * s.height).div_ceil(16) * 16
}

/// Every slab of every write of the plan, at the given buffer addresses.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn for_each_slab(
    plan: &Plan,
    src: &BTreeMap<DeviceId, Vec<u64>>,
    dst: &BTreeMap<DeviceId, Vec<u64>>,
    gpus: usize,
    mut at: impl FnMut(SlabOf),
) {
    let (src_layout, dst_layout) = (plan.problem.source(), plan.problem.target());
    let tensors = plan.problem.tensors();
    let mut waves: HashMap<(DeviceId, u32, u64), u32> = HashMap::new();
    // A multicast lands on every device it names; under UVA each
    // destination copies from the source directly.
    for (c, w) in plan.copies.iter().flat_map(|c| c.writes().map(move |w| (c, w))) {
        let dtype = tensors[c.tensor as usize].dtype;
        let to = dst_layout
            .piece_at(w.dst, w.buffer, w.offset, c.tensor)
            .expect("verified: the target piece exists");
        let wave = if c.reduce {
            let n = waves.entry((w.dst, w.buffer, w.offset)).or_insert(0);
            *n += 1;
            *n - 1
        } else {
            0
        };
        let (from_gpu, to_gpu) = (c.src as usize % gpus, w.dst as usize % gpus);
        for (bi, from) in src_layout.pieces_of(c.src, c.tensor) {
            let Some(part) = from.region.intersect(&c.region) else {
                continue;
            };
            let (sp, dp) = (src[&c.src][bi], dst[&w.dst][w.buffer as usize]);
            Slabs::new(from, to, &part, dtype.size() as usize).for_each(sp, dp, |slab| {
                at(SlabOf {
                    slab,
                    from_gpu,
                    to_gpu,
                    reduce: c.reduce.then_some(dtype),
                    wave,
                })
            });
        }
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl GpuWork {
    /// Staging bytes each GPU needs: one slab's worth for every reduce-copy
    /// slab that comes from another GPU.
    fn staging_bytes(
        plan: &Plan,
        src: &BTreeMap<DeviceId, Vec<u64>>,
        dst: &BTreeMap<DeviceId, Vec<u64>>,
        gpus: usize,
    ) -> Vec<u64> {
        let mut need = vec![0; gpus];
        if !plan.copies.iter().any(|c| c.reduce) {
            return need;
        }
        for_each_slab(plan, src, dst, gpus, |s| {
            if s.reduce.is_some() && s.from_gpu != s.to_gpu {
                need[s.to_gpu] += staged_bytes(&s.slab);
            }
        });
        need
    }

    /// The plan's work on `gpus` GPUs, with the box kernels (`kernels`) or
    /// with driver copies only. Reduce-copies need the kernels.
    fn new(plan: &Plan, at: &Addresses<'_>, gpus: usize, kernels: bool) -> Result<GpuWork> {
        check_reductions(plan, kernels)?;
        let mut copies: Vec<Vec<u64>> = vec![Vec::new(); gpus];
        // Reduce items by GPU, then (wave, type): one launch each.
        let mut reduces: Vec<BTreeMap<(u32, DType), Vec<u64>>> = vec![BTreeMap::new(); gpus];
        let mut staged = at.staging.to_vec();
        let mut work = GpuWork::default();
        for_each_slab(plan, at.src, at.dst, gpus, |s| {
            work.bytes += s.slab.width * s.slab.height;
            match s.reduce {
                None if s.from_gpu == s.to_gpu && kernels => push_items(&mut copies[s.to_gpu], &s.slab),
                None => work.driver.push((s.to_gpu, s.slab)),
                Some(dtype) => {
                    let list = reduces[s.to_gpu].entry((s.wave, dtype)).or_default();
                    if s.from_gpu == s.to_gpu {
                        push_items(list, &s.slab);
                    } else {
                        // The addend crosses GPUs by the driver into staging,
                        // then the kernel adds it from there.
                        let stage = staged[s.to_gpu];
                        staged[s.to_gpu] += staged_bytes(&s.slab);
                        work.driver.push((
                            s.to_gpu,
                            Copy2d {
                                dst: stage,
                                dst_pitch: s.slab.width,
                                ..s.slab
                            },
                        ));
                        push_items(
                            list,
                            &Copy2d {
                                src: stage,
                                src_pitch: s.slab.width,
                                ..s.slab
                            },
                        );
                    }
                }
            }
        });
        for (copy_items, reduce_groups) in copies.into_iter().zip(reduces) {
            let mut items = copy_items;
            let mut launches = Vec::new();
            if !items.is_empty() {
                launches.push(Launch {
                    kernel: Kernel::Copy,
                    first: 0,
                    count: items.len() / ITEM_WORDS,
                });
            }
            for ((_, dtype), list) in reduce_groups {
                launches.push(Launch {
                    kernel: Kernel::Reduce(dtype),
                    first: items.len() / ITEM_WORDS,
                    count: list.len() / ITEM_WORDS,
                });
                items.extend(list);
            }
            work.items.push(items);
            work.launches.push(launches);
        }
        Ok(work)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tenplan_models::{find, ModelState, StateKind};
    use tenplan_planner::{planner, PLANNERS, SYNC_PLANNERS};
    use tenplan_proofs::strategies::healthy_problems;
    use tenplan_proofs::{addends, materialize, random_tensors, verify, State};
    use tenplan_ptc::{Cluster, Problem};

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

    /// Perform `work` on one host arena of "device memory" as the GPUs
    /// would: the driver copies, then each GPU's launches in order, reduce
    /// items adding with the host's own addition.
    fn run_on_host(work: &GpuWork, arena: &mut [u8]) {
        let rows = |s: Copy2d| (0..s.height).map(move |r| (s.src + r * s.src_pitch, s.dst + r * s.dst_pitch, s.width));
        for (_, slab) in &work.driver {
            for (f, t, w) in rows(*slab) {
                arena.copy_within(f as usize..(f + w) as usize, t as usize);
            }
        }
        for (items, launches) in work.items.iter().zip(&work.launches) {
            for l in launches {
                let mine = &items[l.first * ITEM_WORDS..(l.first + l.count) * ITEM_WORDS];
                // Two items of one reduce launch never write the same byte.
                if let Kernel::Reduce(_) = l.kernel {
                    let mut spans: Vec<(u64, u64)> = mine
                        .chunks(ITEM_WORDS)
                        .flat_map(|it| (0..it[3]).map(move |r| (it[1] + r * it[5], it[1] + r * it[5] + it[2])))
                        .collect();
                    spans.sort_unstable();
                    assert!(
                        spans.windows(2).all(|w| w[0].1 <= w[1].0),
                        "a reduce launch adds twice into one byte"
                    );
                }
                for it in mine.chunks(ITEM_WORDS) {
                    let slab = Copy2d {
                        src: it[0],
                        dst: it[1],
                        width: it[2],
                        height: it[3],
                        src_pitch: it[4],
                        dst_pitch: it[5],
                    };
                    for (f, t, w) in rows(slab) {
                        let (f, t, w) = (f as usize, t as usize, w as usize);
                        match l.kernel {
                            Kernel::Copy => arena.copy_within(f..f + w, t),
                            Kernel::Reduce(dtype) => {
                                let addend = arena[f..f + w].to_vec();
                                dtype.add_assign(&mut arena[t..t + w], &addend);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Append `bytes` to the arena at a 256-byte boundary (as the driver
    /// aligns allocations); returns its "device address".
    fn place(arena: &mut Vec<u8>, bytes: &[u8]) -> u64 {
        let at = arena.len().next_multiple_of(256);
        arena.resize(at, 0);
        arena.extend_from_slice(bytes);
        at as u64
    }

    /// What `work` counted: (reduce launches, staged slabs) over all GPUs.
    fn shape(work: &GpuWork) -> (usize, usize) {
        let reduces = work
            .launches
            .iter()
            .flatten()
            .filter(|l| l.kernel != Kernel::Copy)
            .count();
        (reduces, work.driver.len())
    }

    /// The plan's GPU work on `gpus` GPUs, performed on host memory, against
    /// the interpreter's target bytes; returns the work's shape.
    fn gpu_work_on_host(plan: &Plan, seed: u64, gpus: usize, kernels: bool) -> Option<(usize, usize)> {
        let problem = &plan.problem;
        let mut globals = random_tensors(problem.tensors(), seed);
        let mut source = materialize(problem.source(), &globals, |_| true);
        addends(problem.source(), &mut globals, &mut source, seed);
        let mut arena = Vec::new();
        let src: BTreeMap<DeviceId, Vec<u64>> = source
            .iter()
            .map(|(&d, bufs)| (d, bufs.iter().map(|b| place(&mut arena, b)).collect()))
            .collect();
        let mut dst: BTreeMap<DeviceId, Vec<u64>> = BTreeMap::new();
        let mut sizes: BTreeMap<DeviceId, Vec<usize>> = BTreeMap::new();
        for shard in problem.target().shards() {
            for &d in &shard.devices {
                let bytes: Vec<usize> = shard.buffers.iter().map(|b| b.bytes() as usize).collect();
                dst.insert(d, bytes.iter().map(|&n| place(&mut arena, &vec![0; n])).collect());
                sizes.insert(d, bytes);
            }
        }
        let need = GpuWork::staging_bytes(plan, &src, &dst, gpus);
        let staging: Vec<u64> = need.iter().map(|&n| place(&mut arena, &vec![0; n as usize])).collect();
        let at = Addresses {
            src: &src,
            dst: &dst,
            staging: &staging,
        };
        let work = match GpuWork::new(plan, &at, gpus, kernels) {
            Ok(w) => w,
            Err(e) => {
                assert!(!kernels && plan.copies.iter().any(|c| c.reduce), "{e}");
                assert!(e.to_string().contains("box_reduce"), "{e}");
                return None;
            }
        };
        run_on_host(&work, &mut arena);
        let got: State = dst
            .iter()
            .map(|(&d, at)| {
                let bufs = at
                    .iter()
                    .zip(&sizes[&d])
                    .map(|(&p, &n)| arena[p as usize..p as usize + n].to_vec());
                (d, bufs.collect())
            })
            .collect();
        assert_eq!(
            got,
            materialize(problem.target(), &globals, |_| true),
            "{gpus} GPUs, kernels {kernels}"
        );
        Some(shape(&work))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the number of GPUs, the work the CUDA back end derives
        /// from a plan (items, launch waves, staging, driver copies) writes
        /// the interpreter's bytes, partial sums included.
        #[test]
        fn gpu_work_writes_the_interpreters_bytes(problem in healthy_problems(), seed in any::<u64>(), gpus in 1usize..4) {
            for name in PLANNERS.iter().chain(SYNC_PLANNERS) {
                let Ok(plan) = planner(name).unwrap().plan(&problem) else { continue };
                verify(&plan).unwrap();
                gpu_work_on_host(&plan, seed, gpus, true);
                gpu_work_on_host(&plan, seed, gpus, false);
            }
        }
    }

    /// Gradients of a model reduced from 8 data-parallel addends: several
    /// reduce waves, addends staged across GPUs, the sums right.
    #[test]
    fn partial_gradients_reduce_in_waves_across_gpus() {
        let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::WeightsAndGrads);
        let grads = |t: u32| state.tensors()[t as usize].name.starts_with("grad.");
        let source = state
            .layout(&"tp=2,dp=4".parse().unwrap())
            .unwrap()
            .with_partial(grads)
            .unwrap();
        let target = state.layout(&"tp=4,dp=2".parse().unwrap()).unwrap();
        let problem = Problem::new(source, target, Cluster::parse("2x4").unwrap()).unwrap();
        for name in PLANNERS {
            let plan = planner(name).unwrap().plan(&problem).unwrap();
            verify(&plan).unwrap();
            let (one_gpu_waves, one_gpu_staged) = gpu_work_on_host(&plan, 3, 1, true).unwrap();
            assert!(one_gpu_waves > 1, "{name}: {one_gpu_waves} reduce launches");
            assert_eq!(one_gpu_staged, 0, "{name}: one GPU stages nothing");
            for gpus in [2, 3, 8] {
                let (waves, staged) = gpu_work_on_host(&plan, 3, gpus, true).unwrap();
                assert!(
                    waves > 1 && staged > 0,
                    "{name} on {gpus} GPUs: {waves} reduce launches, {staged} staged"
                );
            }
            assert!(gpu_work_on_host(&plan, 3, 2, false).is_none());
        }
    }

    /// The embedded PTX holds both kernels the back end loads, for a PTX ISA
    /// CUDA 12.0 drivers read, and was made from the kernels' current
    /// source (`make cuda-ptx` records the source's FNV-1a hash).
    #[test]
    fn the_ptx_is_built_from_the_current_kernel_source() {
        let ptx = include_str!("../kernels/box_copy.ptx");
        let source = include_bytes!("../kernels/box_copy.cu");
        for entry in [".entry box_copy(", ".entry box_reduce(", "\n.version 8.0\n"] {
            assert!(ptx.contains(entry), "the PTX lacks `{}`", entry.trim());
        }
        let hash = source.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        assert!(
            ptx.contains(&format!("// source: box_copy.cu fnv1a64 {hash:016x}")),
            "executor/kernels/box_copy.ptx is older than box_copy.cu: run `make cuda-ptx`"
        );
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
    use tenplan_ptc::DeviceId;

    use super::{check_reductions, kernel_dtype, Addresses, Copy2d, CudaRun, GpuWork, Kernel, ITEM_WORDS};
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

    /// The box kernels, as PTX for compute capability 7.5 and later.
    const BOX_PTX: &str = include_str!("../kernels/box_copy.ptx");

    /// One GPU's box kernels.
    #[derive(Clone, Debug)]
    struct Kernels {
        copy: CudaFunction,
        reduce: CudaFunction,
    }

    #[derive(Debug)]
    pub(super) struct Inner {
        pub(super) ctxs: Vec<Arc<CudaContext>>,
        /// Each GPU's box kernels, when its driver loaded the PTX.
        kernels: Vec<Option<Kernels>>,
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
                    let m = c.load_module(cudarc::nvrtc::Ptx::from_src(BOX_PTX)).ok()?;
                    Some(Kernels {
                        copy: m.load_function("box_copy").ok()?,
                        reduce: m.load_function("box_reduce").ok()?,
                    })
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
            let gpus = self.ctxs.len();
            // Refuse before uploading anything (GpuWork::new checks again,
            // for its own callers).
            check_reductions(plan, self.uses_kernel())?;
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
            // Host work first: every slab becomes a kernel item or a driver
            // copy, and the item lists go to their GPUs before the clock starts.
            let t_prepare = Instant::now();
            let need = GpuWork::staging_bytes(plan, &src_ptrs, &dst_ptrs, gpus);
            let mut staging = Vec::with_capacity(gpus);
            for (g, &bytes) in need.iter().enumerate() {
                let s = self.ctxs[g].default_stream();
                staging.push(
                    (bytes > 0)
                        .then(|| s.alloc_zeros::<u8>(bytes as usize))
                        .transpose()
                        .map_err(cuda)?,
                );
            }
            // A GPU that stages nothing gets no buffer (and no address).
            let staging_ptrs: Vec<u64> = staging
                .iter_mut()
                .enumerate()
                .map(|(g, b)| {
                    b.as_mut()
                        .map_or(0, |b| b.device_ptr_mut(&self.ctxs[g].default_stream()).0)
                })
                .collect();
            let at = Addresses {
                src: &src_ptrs,
                dst: &dst_ptrs,
                staging: &staging_ptrs,
            };
            let work = GpuWork::new(plan, &at, gpus, self.uses_kernel())?;
            let mut on_gpu = Vec::with_capacity(gpus);
            for (g, list) in work.items.iter().enumerate() {
                let s = self.ctxs[g].default_stream();
                on_gpu.push(if list.is_empty() {
                    None
                } else {
                    Some(s.clone_htod(list).map_err(cuda)?)
                });
            }
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            let prepare_time = t_prepare.elapsed();
            let t0 = Instant::now();
            // Driver copies first: a staged addend is in place before the
            // launch that adds it (one stream per GPU keeps the order).
            for (g, copy) in &work.driver {
                copy.issue(&self.ctxs[*g].default_stream())?;
            }
            for (g, launches) in work.launches.iter().enumerate() {
                let (Some(kernels), Some(list)) = (&self.kernels[g], &on_gpu[g]) else {
                    continue;
                };
                let s = self.ctxs[g].default_stream();
                for launch in launches {
                    let mut first = launch.first;
                    let end = launch.first + launch.count;
                    while first < end {
                        let count = (end - first).min(MAX_BLOCKS);
                        let (base, _sync) = list.device_ptr(&s);
                        let ptr: u64 = base + (first * ITEM_WORDS * 8) as u64;
                        let (f, dtype) = match launch.kernel {
                            Kernel::Copy => (&kernels.copy, None),
                            Kernel::Reduce(d) => (&kernels.reduce, kernel_dtype(d)),
                        };
                        let mut b = s.launch_builder(f);
                        b.arg(&ptr);
                        if let Some(code) = &dtype {
                            b.arg(code);
                        }
                        let cfg = LaunchConfig {
                            grid_dim: (count as u32, 1, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        // SAFETY: every item lies inside buffers whose sizes
                        // the checker proved (as for the 2-D copies) or
                        // inside the staging buffer sized for it, and the
                        // item list stays alive until the stream is
                        // synchronised.
                        unsafe { b.launch(cfg) }.map_err(cuda)?;
                        first += count;
                    }
                }
            }
            for ctx in &self.ctxs {
                ctx.synchronize().map_err(cuda)?;
            }
            let copy_time = t0.elapsed();
            drop(on_gpu);
            drop(staging);
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
                bytes: work.bytes,
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
