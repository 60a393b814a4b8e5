//! Copies between strided views of host memory that another runtime owns:
//! the packs, gathers and writes of the torch.distributed executor on CPU
//! tensors (the Python package binds them once per prepared plan).
//!
//! Why not torch's own `copy_`: a box of a row-major piece is a strided
//! view whose rows are often short (a Shard(0) → Shard(1) pack of a
//! 1024-wide fp32 matrix on 4 ranks moves 1 KiB rows), and torch's
//! element-wise copy loop pays per row what a `memcpy` does not; measured
//! on a 2-core VM, torch copies such views at about half the rate of a
//! contiguous copy. Here every copy is compiled once into its longest
//! contiguous run and the outer dimensions it is repeated over, and each
//! call is a tight loop of `memcpy`s.
//!
//! Memory safety rests on the caller: the constructor checks that every
//! byte a copy reads or writes lies in one of the ranges it was given, and
//! [`StridedCopies::run`] is `unsafe` because only the caller can promise
//! that those ranges are live, writable memory nobody else touches while it
//! runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use crate::{Error, Result};

/// A range of host memory a copy may read or write: its first byte's
/// address and its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRange {
    /// Address of the first byte.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
}

/// A copy between two views of the same shape: addresses of their first
/// elements and their strides in bytes (torch's strides times the element
/// size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StridedCopy {
    /// Address of the destination's first element.
    pub dst: usize,
    /// Address of the source's first element.
    pub src: usize,
    /// Extent of every dimension.
    pub shape: Vec<usize>,
    /// Destination strides, in bytes.
    pub dst_strides: Vec<usize>,
    /// Source strides, in bytes.
    pub src_strides: Vec<usize>,
    /// Bytes per element.
    pub elem: usize,
}

/// A copy compiled into `memcpy`s: `run` contiguous bytes, repeated over
/// outer dimensions `(count, destination stride, source stride)`, for the
/// outer indices `from..to` (row-major over `outer`).
#[derive(Clone, Debug)]
struct Task {
    dst: usize,
    src: usize,
    run: usize,
    outer: Vec<(usize, usize, usize)>,
    from: usize,
    to: usize,
}

/// One `memcpy`: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Run {
    src: usize,
    dst: usize,
    len: usize,
}

/// Bytes a thread's share of the work has at least when several threads
/// share a set: about a mebibyte, so that its bookkeeping is negligible
/// beside its bytes and a large copy splits evenly.
const TASK_BYTES: usize = 1 << 20;

/// Sets that copy at least this many bytes write their listed runs with
/// streaming stores (when no run overlaps its source; by default, see
/// [`StridedCopies::streaming_from`]): their destinations
/// do not fit in a cache, and a pack of a reshard's payloads, which are
/// sent later, is about a quarter faster so (measured on the 2-core VM:
/// 4.4–5.1 GB/s with `memcpy`, 5.7–6.1 GB/s streaming).
pub const STREAMING_BYTES: usize = 16 << 20;

/// Runs at least this long are listed one by one and performed in the
/// order of their source bytes (the list costs 24 bytes a run, under a
/// tenth of what it copies); shorter ones are walked where they lie.
const LISTED_RUN: usize = 256;

/// Copies between strided views of host memory, compiled once, run many
/// times ([`StridedCopies::run`]). The copies of one set must not depend
/// on one another (none reads what another writes; no two write the same
/// byte): they may run in any order and, with several threads, at once.
///
/// The contiguous runs of all the copies are performed in the order of
/// their source bytes, whichever copy they belong to: the column blocks a
/// Shard(0) → Shard(1) reshard sends to each peer are, together, every
/// byte of the source rows, and one pass that reads the rows in order and
/// writes each block's part to its own payload runs at the rate of a
/// contiguous copy, where one strided pass per block reads a fraction of
/// every row each time and runs at about half of it.
#[derive(Debug)]
pub struct StridedCopies {
    /// The long runs of every copy, ordered by source address.
    runs: Vec<Run>,
    /// `runs` in consecutive shares, one per thread task (one share when
    /// the set runs on one thread).
    shares: Vec<std::ops::Range<usize>>,
    /// Copies of short runs, walked dimension by dimension.
    tasks: Vec<Task>,
    /// Whether no listed run overlaps its own source.
    apart: bool,
    /// Whether listed runs are written with streaming stores.
    streaming: bool,
    copies: usize,
    bytes: usize,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl StridedCopies {
    /// Compile `copies`, each of which must read and write only bytes
    /// inside `ranges`; with `threads` > 1 the copies run on that many
    /// threads when their destinations are disjoint.
    pub fn new(copies: &[StridedCopy], ranges: &[HostRange], threads: usize) -> Result<StridedCopies> {
        // The memory as disjoint spans sorted by start (overlapping ranges,
        // views of one storage, merged), so that each copy's check is a
        // binary search rather than a scan of every tensor.
        let mut spans: Vec<(usize, usize)> = ranges
            .iter()
            .map(|r| (r.start, r.start.saturating_add(r.len)))
            .collect();
        spans.sort_unstable();
        let mut memory: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
        for (start, end) in spans {
            match memory.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => memory.push((start, end)),
            }
        }
        let inside = |base: usize, end: usize| {
            let i = memory.partition_point(|&(start, _)| start <= base);
            i > 0 && end <= memory[i - 1].1
        };
        let mut tasks = Vec::with_capacity(copies.len());
        let mut runs = Vec::new();
        let mut bytes = 0usize;
        for (i, c) in copies.iter().enumerate() {
            let bad = |what: String| Error::StridedCopy { copy: i, what };
            if c.shape.len() != c.dst_strides.len() || c.shape.len() != c.src_strides.len() {
                return Err(bad(format!(
                    "{} dimensions with {} destination and {} source strides",
                    c.shape.len(),
                    c.dst_strides.len(),
                    c.src_strides.len()
                )));
            }
            if c.elem == 0 {
                return Err(bad("elements of 0 bytes".into()));
            }
            let Some(task) = compile(c) else { continue };
            for (side, base, stride_of) in [("destination", task.dst, 1usize), ("source", task.src, 2)] {
                let last = task
                    .outer
                    .iter()
                    .try_fold(base, |at, o| {
                        let stride = if stride_of == 1 { o.1 } else { o.2 };
                        (o.0 - 1).checked_mul(stride).and_then(|d| at.checked_add(d))
                    })
                    .and_then(|at| at.checked_add(task.run));
                if !last.is_some_and(|end| inside(base, end)) {
                    return Err(bad(format!("its {side} reaches outside the memory it was given")));
                }
            }
            bytes += (task.to - task.from) * task.run;
            if task.run >= LISTED_RUN {
                for_each_run(&task, |src, dst| {
                    runs.push(Run {
                        src,
                        dst,
                        len: task.run,
                    })
                });
            } else {
                tasks.push(task);
            }
        }
        runs.sort_unstable();
        let apart = runs.iter().all(|r| r.src + r.len <= r.dst || r.dst + r.len <= r.src);
        // Sets too small to share stay on the calling thread.
        let parallel = threads > 1 && bytes >= 2 * TASK_BYTES && disjoint_destinations(&runs, &tasks);
        let shares = if parallel {
            // Long runs cut to a share's size, then consecutive runs
            // grouped into shares of about that size.
            let mut cut = Vec::with_capacity(runs.len());
            for r in runs {
                let mut at = 0;
                while at < r.len {
                    let len = (r.len - at).min(TASK_BYTES);
                    cut.push(Run {
                        src: r.src + at,
                        dst: r.dst + at,
                        len,
                    });
                    at += len;
                }
            }
            runs = cut;
            let mut shares = Vec::new();
            let (mut start, mut size) = (0, 0);
            for (i, r) in runs.iter().enumerate() {
                size += r.len;
                if size >= TASK_BYTES {
                    shares.push(start..i + 1);
                    (start, size) = (i + 1, 0);
                }
            }
            if start < runs.len() {
                shares.push(start..runs.len());
            }
            let mut split = Vec::with_capacity(tasks.len());
            for t in tasks {
                let per = (TASK_BYTES / t.run).max(1);
                let mut from = t.from;
                while from < t.to {
                    let to = (from + per).min(t.to);
                    split.push(Task { from, to, ..t.clone() });
                    from = to;
                }
            }
            tasks = split;
            shares
        } else {
            std::iter::once(0..runs.len()).collect()
        };
        let pool = if parallel { shared_pool(threads) } else { None };
        Ok(StridedCopies {
            runs,
            shares,
            tasks,
            apart,
            streaming: apart && bytes >= STREAMING_BYTES,
            copies: copies.len(),
            bytes,
            pool,
        })
    }

    /// Write the listed runs with streaming stores when the set copies at
    /// least `min_bytes` ([`STREAMING_BYTES`] unless told): 0 for a set
    /// whose destination nobody reads soon (a target written at the end of
    /// a reshard), more for one whose bytes are sent at once and are read
    /// faster from the cache.
    pub fn streaming_from(mut self, min_bytes: usize) -> StridedCopies {
        self.streaming = self.apart && self.bytes >= min_bytes;
        self
    }

    /// How many copies were given.
    pub fn len(&self) -> usize {
        self.copies
    }

    /// Whether no copy was given.
    pub fn is_empty(&self) -> bool {
        self.copies == 0
    }

    /// Bytes one run copies.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Perform every copy.
    ///
    /// # Safety
    /// The ranges given to [`StridedCopies::new`] must be live memory,
    /// readable and (where copies write) writable, and no other thread may
    /// read what these copies write or write what they read while this runs.
    #[allow(unsafe_code)]
    pub unsafe fn run(&self) {
        // SAFETY (every call below): the caller's promise; with a pool,
        // destinations are disjoint (checked when the pool was made).
        let share = |s: &std::ops::Range<usize>| {
            let runs = &self.runs[s.clone()];
            if self.streaming {
                for r in runs {
                    unsafe { copy_streaming(r.src, r.dst, r.len) }
                }
                // Streaming stores are weakly ordered: fence them on the
                // thread that made them before anyone reads the bytes.
                fence_streaming();
            } else {
                for r in runs {
                    unsafe { copy(r.src, r.dst, r.len) }
                }
            }
        };
        let task = |t: &Task| for_each_run(t, |src, dst| unsafe { copy(src, dst, t.run) });
        match &self.pool {
            Some(pool) => pool.install(|| {
                self.shares.par_iter().for_each(share);
                self.tasks.par_iter().for_each(task);
            }),
            None => {
                self.shares.iter().for_each(share);
                self.tasks.iter().for_each(task);
            }
        }
    }
}

/// A copy as its longest contiguous run and the dimensions outside it
/// (dimensions of extent 1 dropped, neighbours that are one dimension in
/// memory on both sides merged); `None` for an empty copy.
fn compile(c: &StridedCopy) -> Option<Task> {
    if c.shape.contains(&0) {
        return None;
    }
    let mut dims: Vec<(usize, usize, usize)> = (0..c.shape.len())
        .filter(|&d| c.shape[d] > 1)
        .map(|d| (c.shape[d], c.dst_strides[d], c.src_strides[d]))
        .collect();
    // The contiguous run: inner dimensions whose stride on both sides is
    // the bytes of everything inside them.
    let mut run = c.elem;
    while let Some(&(n, ds, ss)) = dims.last() {
        if ds != run || ss != run {
            break;
        }
        run *= n;
        dims.pop();
    }
    // Outer neighbours that step through memory as one dimension.
    let mut outer: Vec<(usize, usize, usize)> = Vec::with_capacity(dims.len());
    for (n, ds, ss) in dims.into_iter().rev() {
        match outer.last_mut() {
            Some(inner) if ds == inner.1 * inner.0 && ss == inner.2 * inner.0 => inner.0 *= n,
            _ => outer.push((n, ds, ss)),
        }
    }
    outer.reverse();
    let to = outer.iter().map(|o| o.0).product();
    Some(Task {
        dst: c.dst,
        src: c.src,
        run,
        outer,
        from: 0,
        to,
    })
}

/// One pool of `threads` threads for the whole process: a prepared plan
/// holds a set per step and phase, hundreds in a long program, and a pool
/// each would start threads by the thousand. `None` if the threads cannot
/// be started (the set then runs on the calling thread).
fn shared_pool(threads: usize) -> Option<Arc<rayon::ThreadPool>> {
    static POOLS: OnceLock<Mutex<BTreeMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.get(&threads) {
        return Some(p.clone());
    }
    let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(threads).build().ok()?);
    pools.insert(threads, pool.clone());
    Some(pool)
}

/// Whether the byte spans that runs and tasks write are pairwise
/// disjoint, so that they may run at once (a task's whole span, not its
/// bytes: a conservative test).
fn disjoint_destinations(runs: &[Run], tasks: &[Task]) -> bool {
    let mut spans: Vec<(usize, usize)> = runs.iter().map(|r| (r.dst, r.dst + r.len)).collect();
    spans.extend(tasks.iter().map(|t| {
        let last: usize = t.outer.iter().map(|o| (o.0 - 1) * o.1).sum();
        (t.dst, t.dst + last + t.run)
    }));
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}

/// Call `f(source, destination)` with the start of each of a task's runs,
/// in order.
fn for_each_run(t: &Task, mut f: impl FnMut(usize, usize)) {
    let n = t.outer.len();
    // Where iteration `from` starts: its index on every outer dimension.
    let mut index = vec![0usize; n];
    let (mut dst, mut src) = (t.dst, t.src);
    let mut rest = t.from;
    for d in (0..n).rev() {
        let (count, ds, ss) = t.outer[d];
        index[d] = rest % count;
        rest /= count;
        dst += index[d] * ds;
        src += index[d] * ss;
    }
    for _ in t.from..t.to {
        f(src, dst);
        // The next outer index, innermost dimension fastest.
        for d in (0..n).rev() {
            let (count, ds, ss) = t.outer[d];
            index[d] += 1;
            dst += ds;
            src += ss;
            if index[d] < count {
                break;
            }
            index[d] = 0;
            dst -= count * ds;
            src -= count * ss;
        }
    }
}

/// `len` bytes from `src` to `dst` (which do not overlap) with streaming
/// stores that bypass the cache: a destination that will not be read
/// before it leaves the cache anyway is then written without first being
/// read into it. Call [`fence_streaming`] before the bytes are read.
///
/// # Safety
/// As [`copy`], and the two ranges do not overlap.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
unsafe fn copy_streaming(src: usize, dst: usize, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // Up to the destination's first 16-byte boundary, then 64 bytes at a
    // time (SSE2, which every x86-64 has), then the tail.
    let head = ((16 - dst % 16) % 16).min(len);
    let body = (len - head) / 64 * 64;
    unsafe {
        copy(src, dst, head);
        let (s, d) = (
            std::ptr::with_exposed_provenance::<u8>(src + head),
            std::ptr::with_exposed_provenance_mut::<u8>(dst + head),
        );
        let mut i = 0;
        while i < body {
            let (a, b, c, e) = (
                _mm_loadu_si128(s.add(i).cast::<__m128i>()),
                _mm_loadu_si128(s.add(i + 16).cast::<__m128i>()),
                _mm_loadu_si128(s.add(i + 32).cast::<__m128i>()),
                _mm_loadu_si128(s.add(i + 48).cast::<__m128i>()),
            );
            _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
            _mm_stream_si128(d.add(i + 16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(i + 32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(i + 48).cast::<__m128i>(), e);
            i += 64;
        }
        copy(src + head + body, dst + head + body, len - head - body);
    }
}

/// Elsewhere, a plain copy.
#[cfg(not(target_arch = "x86_64"))]
#[allow(unsafe_code)]
unsafe fn copy_streaming(src: usize, dst: usize, len: usize) {
    unsafe { copy(src, dst, len) }
}

/// Order this thread's streaming stores before its later stores.
fn fence_streaming() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64; a fence touches no memory.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

/// One `memcpy` (`memmove`: overlap allowed) between addresses.
///
/// # Safety
/// As [`StridedCopies::run`]; the bytes lie inside the ranges checked in
/// [`StridedCopies::new`].
#[allow(unsafe_code)]
unsafe fn copy(src: usize, dst: usize, len: usize) {
    unsafe {
        std::ptr::copy(
            std::ptr::with_exposed_provenance::<u8>(src),
            std::ptr::with_exposed_provenance_mut::<u8>(dst),
            len,
        )
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    fn range(v: &[u8]) -> HostRange {
        HostRange {
            start: v.as_ptr() as usize,
            len: v.len(),
        }
    }

    /// Element `(i, j)` of a row-major matrix of `cols` 4-byte elements:
    /// its bytes' addresses.
    fn matrix(rows: usize, cols: usize) -> Vec<u8> {
        (0..rows * cols * 4).map(|b| (b % 251) as u8).collect()
    }

    #[test]
    fn a_column_block_packs_row_by_row() {
        let (rows, cols) = (5, 8);
        let src = matrix(rows, cols);
        let mut dst = vec![0u8; rows * 3 * 4];
        // Columns 2..5 of every row.
        let copy = StridedCopy {
            dst: dst.as_mut_ptr() as usize,
            src: src.as_ptr() as usize + 2 * 4,
            shape: vec![rows, 3],
            dst_strides: vec![12, 4],
            src_strides: vec![cols * 4, 4],
            elem: 4,
        };
        let copies = StridedCopies::new(std::slice::from_ref(&copy), &[range(&src), range(&dst)], 1).unwrap();
        assert_eq!(copies.bytes(), rows * 12);
        unsafe { copies.run() };
        let want: Vec<u8> = (0..rows)
            .flat_map(|r| src[r * cols * 4 + 8..r * cols * 4 + 20].to_vec())
            .collect();
        assert_eq!(dst, want);
    }

    #[test]
    fn every_shape_copies_what_an_element_loop_copies() {
        // A 4-D box of a 4-D tensor into a contiguous buffer and back into
        // another box, on one thread and on several.
        let shape = [3usize, 4, 5, 6];
        let elem = 2;
        let strides = |s: &[usize]| {
            let mut st = vec![elem; s.len()];
            for d in (0..s.len() - 1).rev() {
                st[d] = st[d + 1] * s[d + 1];
            }
            st
        };
        let full: Vec<u8> = (0..shape.iter().product::<usize>() * elem)
            .map(|b| (b * 7 % 253) as u8)
            .collect();
        let (lo, ext) = ([1usize, 0, 2, 0], [2usize, 4, 3, 6]);
        let fs = strides(&shape);
        let base = full.as_ptr() as usize + lo.iter().zip(&fs).map(|(l, s)| l * s).sum::<usize>();
        for threads in [1, 3] {
            let mut packed = vec![0u8; ext.iter().product::<usize>() * elem];
            let copy = StridedCopy {
                dst: packed.as_mut_ptr() as usize,
                src: base,
                shape: ext.to_vec(),
                dst_strides: strides(&ext),
                src_strides: fs.clone(),
                elem,
            };
            let copies = StridedCopies::new(&[copy], &[range(&full), range(&packed)], threads).unwrap();
            unsafe { copies.run() };
            let mut want = Vec::new();
            for a in 0..ext[0] {
                for b in 0..ext[1] {
                    for c in 0..ext[2] {
                        for d in 0..ext[3] {
                            let at =
                                (lo[0] + a) * fs[0] + (lo[1] + b) * fs[1] + (lo[2] + c) * fs[2] + (lo[3] + d) * fs[3];
                            want.extend_from_slice(&full[at..at + elem]);
                        }
                    }
                }
            }
            assert_eq!(packed, want, "threads {threads}");
        }
    }

    #[test]
    fn large_copies_split_across_threads_land_whole() {
        let (rows, cols) = (4096, 1024);
        let src = matrix(rows, cols);
        let mut dst = vec![0u8; rows * 256 * 4];
        let copy = StridedCopy {
            dst: dst.as_mut_ptr() as usize,
            src: src.as_ptr() as usize + 512 * 4,
            shape: vec![rows, 256],
            dst_strides: vec![1024, 4],
            src_strides: vec![cols * 4, 4],
            elem: 4,
        };
        let copies = StridedCopies::new(&[copy], &[range(&src), range(&dst)], 2).unwrap();
        assert!(copies.shares.len() > 1);
        unsafe { copies.run() };
        for r in (0..rows).step_by(97) {
            assert_eq!(
                dst[r * 1024..(r + 1) * 1024],
                src[r * cols * 4 + 2048..r * cols * 4 + 3072]
            );
        }
    }

    #[test]
    fn a_copy_reaching_outside_its_memory_is_refused() {
        let src = vec![0u8; 64];
        let mut dst = vec![0u8; 64];
        let copy = StridedCopy {
            dst: dst.as_mut_ptr() as usize,
            src: src.as_ptr() as usize,
            shape: vec![2, 8],
            dst_strides: vec![32, 4],
            src_strides: vec![40, 4],
            elem: 4,
        };
        let e = StridedCopies::new(std::slice::from_ref(&copy), &[range(&src), range(&dst)], 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "copy 0 of a strided set: its source reaches outside the memory it was given"
        );
        let e = StridedCopies::new(
            &[StridedCopy { shape: vec![2], ..copy }],
            &[range(&src), range(&dst)],
            1,
        )
        .unwrap_err();
        assert!(e.to_string().contains("1 dimensions with 2 destination"), "{e}");
    }

    #[test]
    fn overlapping_destinations_run_on_one_thread() {
        let n = 2 * TASK_BYTES;
        let src = vec![1u8; n];
        let mut dst = vec![0u8; 2 * n];
        let at0 = dst.as_mut_ptr() as usize;
        let copy = |at: usize| StridedCopy {
            dst: at0 + at,
            src: src.as_ptr() as usize,
            shape: vec![n],
            dst_strides: vec![1],
            src_strides: vec![1],
            elem: 1,
        };
        let copies = StridedCopies::new(&[copy(0), copy(n / 2)], &[range(&src), range(&dst)], 4).unwrap();
        assert!(copies.pool.is_none());
        let copies = StridedCopies::new(&[copy(0), copy(n)], &[range(&src), range(&dst)], 4).unwrap();
        assert!(copies.pool.is_some());
        // Too small to share.
        let small = StridedCopy {
            shape: vec![4096],
            ..copy(0)
        };
        assert!(StridedCopies::new(&[small], &[range(&src), range(&dst)], 4)
            .unwrap()
            .pool
            .is_none());
    }

    #[test]
    fn the_blocks_of_every_row_are_copied_in_the_order_of_the_rows() {
        // Four column blocks of a matrix, each to its own payload (a
        // Shard(0) -> Shard(1) pack for four peers): one pass over the rows.
        let (rows, cols, block) = (1024, 1024, 256);
        let src = matrix(rows, cols);
        for threads in [1, 2] {
            let mut payloads = vec![vec![0u8; rows * block * 4]; 4];
            let copies: Vec<StridedCopy> = payloads
                .iter_mut()
                .enumerate()
                .map(|(k, p)| StridedCopy {
                    dst: p.as_mut_ptr() as usize,
                    src: src.as_ptr() as usize + k * block * 4,
                    shape: vec![rows, block],
                    dst_strides: vec![block * 4, 4],
                    src_strides: vec![cols * 4, 4],
                    elem: 4,
                })
                .collect();
            let mut ranges = vec![range(&src)];
            ranges.extend(payloads.iter().map(|p| range(p)));
            let set = StridedCopies::new(&copies, &ranges, threads).unwrap();
            assert!(
                set.runs.windows(2).all(|w| w[1].src == w[0].src + w[0].len),
                "one pass, in order"
            );
            unsafe { set.run() };
            for (k, p) in payloads.iter().enumerate() {
                for r in 0..rows {
                    let at = r * cols * 4 + k * block * 4;
                    assert_eq!(p[r * block * 4..(r + 1) * block * 4], src[at..at + block * 4]);
                }
            }
        }
    }

    #[test]
    fn a_long_contiguous_copy_is_shared_among_threads() {
        let src: Vec<u8> = (0..5 * TASK_BYTES + 17).map(|b| (b % 241) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let copy = StridedCopy {
            dst: dst.as_mut_ptr() as usize,
            src: src.as_ptr() as usize,
            shape: vec![src.len()],
            dst_strides: vec![1],
            src_strides: vec![1],
            elem: 1,
        };
        let set = StridedCopies::new(&[copy], &[range(&src), range(&dst)], 3).unwrap();
        assert_eq!(set.shares.len(), 6);
        unsafe { set.run() };
        assert_eq!(dst, src);
    }

    #[test]
    fn large_sets_stream_their_stores_at_any_alignment() {
        // Rows of 1,000 bytes (not a multiple of 16), destinations starting
        // 3 bytes past an alignment: heads, bodies and tails all copied.
        let (rows, row, stride) = (20_000usize, 1000usize, 1024usize);
        let src: Vec<u8> = (0..rows * stride).map(|b| (b * 13 % 251) as u8).collect();
        for threads in [1, 2] {
            let mut dst = vec![0u8; rows * row + 3];
            let copy = StridedCopy {
                dst: dst.as_mut_ptr() as usize + 3,
                src: src.as_ptr() as usize,
                shape: vec![rows, row],
                dst_strides: vec![row, 1],
                src_strides: vec![stride, 1],
                elem: 1,
            };
            let set = StridedCopies::new(&[copy], &[range(&src), range(&dst)], threads).unwrap();
            assert!(set.streaming && set.bytes() >= STREAMING_BYTES);
            unsafe { set.run() };
            assert_eq!(dst[..3], [0, 0, 0]);
            for r in 0..rows {
                assert_eq!(
                    dst[3 + r * row..3 + (r + 1) * row],
                    src[r * stride..r * stride + row],
                    "row {r}"
                );
            }
        }
    }
}
