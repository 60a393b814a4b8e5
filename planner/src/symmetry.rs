//! Symmetry reduction: tensors a problem cannot tell apart are planned as
//! one.
//!
//! A model's state repeats itself: every layer of a pipeline stage holds
//! the same tensors, cut the same way, on the same devices (GPT-3 6.7B's
//! training state: 1,553 tensors, 19 to 33 distinct placements across a
//! reshard). Two tensors whose pieces lie in the same shards with the same
//! boxes and element type, in the source and in the target, put the same
//! bytes on every resource whatever a plan does with them. The reduced
//! problem stacks each such class of `k` tensors into one tensor of shape
//! `[k, ...]` whose pieces are the members' pieces stacked: the same bytes
//! from the same holders to the same destinations, in a fraction of the
//! fragments.
//!
//! What it preserves, and why a bound on it is a bound on the original:
//! any plan of the original problem is a plan of the reduced one (member
//! `j`'s copies become copies of slice `j` of the stack), with the same
//! bytes on every resource and the same copies, so no reduced plan is
//! worse than the best original plan, and every lower bound on the
//! reduced problem's makespan (the cuts, the message bound, the LP's
//! certificate) holds for the original. A reduced plan expands
//! ([`Reduced::expand`]) into a plan of the original problem with the same
//! bytes on every resource and the same streams, its copies split by
//! member (issued and paced again, as the planner finishes its plans): the
//! expanded plan is what the independent checker proves and the simulator
//! times.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use tenplan_ptc::{BoxCopy, Buffer, DType, Forward, Layout, Piece, Plan, Problem, Region, Shard, TensorId, TensorSpec};

use crate::spec::Planner;
use crate::{padding_fills, LowerBound, Result};

/// A tensor's pieces in a layout: (shard index, box), sorted.
type Pieces = Vec<(u32, Region)>;

/// What a reduced target shard's buffers hold, per shard: (reduced
/// tensor, the members' box) per buffer.
type StackedBuffers = Vec<Vec<(TensorId, Region)>>;

/// What two tensors of one class share: element type, partial flag,
/// pieces.
type ClassKey<'a> = (DType, bool, &'a [(u32, Region)]);

/// A piece of one (shard, tensor) run: (buffer, offset, box).
type Located<'a> = Option<(u32, u64, &'a Region)>;

/// The classes of a layout's tensors: two tensors share a class when they
/// have the same element type, the same partial flag, and pieces with the
/// same boxes in the same shards. Computed once per layout (a scheduler
/// keeps them beside the layout it reuses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutClasses {
    /// The class of every tensor; classes are numbered in the order of
    /// their first tensor.
    class: Arc<[u32]>,
    /// Every class's pieces: (shard index, box), sorted.
    pieces: Arc<[Pieces]>,
}

impl LayoutClasses {
    /// The classes of `layout`'s tensors.
    pub fn of(layout: &Layout) -> LayoutClasses {
        let n = layout.tensors().len();
        let mut pieces: Vec<Pieces> = vec![Vec::new(); n];
        for (s, shard) in layout.shards().iter().enumerate() {
            for buffer in &shard.buffers {
                for p in &buffer.pieces {
                    pieces[p.tensor as usize].push((s as u32, p.region.clone()));
                }
            }
        }
        for p in &mut pieces {
            p.sort_unstable();
        }
        let mut ids: HashMap<ClassKey<'_>, u32> = HashMap::default();
        let mut class = Vec::with_capacity(n);
        let mut first = Vec::new();
        for (t, p) in pieces.iter().enumerate() {
            let key = (
                layout.tensors()[t].dtype,
                layout.is_partial(t as TensorId),
                p.as_slice(),
            );
            let next = ids.len() as u32;
            let id = *ids.entry(key).or_insert_with(|| {
                first.push(t);
                next
            });
            class.push(id);
        }
        let class_pieces: Vec<Pieces> = first.into_iter().map(|t| std::mem::take(&mut pieces[t])).collect();
        LayoutClasses {
            class: class.into(),
            pieces: class_pieces.into(),
        }
    }

    /// The class of tensor `t`.
    pub fn class(&self, t: TensorId) -> u32 {
        self.class[t as usize]
    }
}

/// A problem with its interchangeable tensors stacked (see the module
/// docs), and how to expand the reduced problem's plans into plans of the
/// original.
#[derive(Clone, Debug)]
pub struct Reduced {
    original: Problem,
    reduced: Problem,
    /// The original tensors stacked in each reduced tensor, in stack order
    /// (increasing tensor index).
    members: Vec<Vec<TensorId>>,
    /// For every target shard, for every buffer of the reduced target
    /// shard: the reduced tensor it holds and the member pieces' box.
    target_buffers: StackedBuffers,
}

impl Reduced {
    /// The reduction of `problem`, or `None` where no two tensors are
    /// interchangeable (nothing to gain).
    pub fn new(problem: &Problem) -> Result<Option<Reduced>> {
        let source = LayoutClasses::of(problem.source());
        let target = LayoutClasses::of(problem.target());
        Reduced::with_classes(problem, &source, &target)
    }

    /// [`Reduced::new`] with the classes of the problem's source and
    /// target layouts computed before (they must be those layouts'
    /// classes: [`LayoutClasses::of`]).
    pub fn with_classes(problem: &Problem, source: &LayoutClasses, target: &LayoutClasses) -> Result<Option<Reduced>> {
        let n = problem.tensors().len();
        debug_assert_eq!(source.class.len(), n);
        debug_assert_eq!(target.class.len(), n);
        let mut ids: HashMap<(u32, u32), u32> = HashMap::default();
        let mut members: Vec<Vec<TensorId>> = Vec::new();
        for t in 0..n as TensorId {
            let key = (source.class(t), target.class(t));
            let next = members.len() as u32;
            let id = *ids.entry(key).or_insert_with(|| {
                members.push(Vec::new());
                next
            });
            members[id as usize].push(t);
        }
        if members.len() == n {
            return Ok(None);
        }
        let specs = problem.tensors();
        let tensors: Arc<[TensorSpec]> = members
            .iter()
            .map(|m| {
                let spec = &specs[m[0] as usize];
                let mut shape = Vec::with_capacity(spec.shape.len() + 1);
                shape.push(m.len() as u64);
                shape.extend_from_slice(&spec.shape);
                TensorSpec::new(spec.name.clone(), spec.dtype, shape)
            })
            .collect();
        let (src, _) = stacked(problem.source(), source, &members, &tensors)?;
        let (tgt, target_buffers) = stacked(problem.target(), target, &members, &tensors)?;
        let reduced = Problem::new(src, tgt, problem.cluster().clone())?
            .with_job(*problem.job())
            .with_forwarding(problem.forwarding());
        Ok(Some(Reduced {
            original: problem.clone(),
            reduced,
            members,
            target_buffers,
        }))
    }

    /// The reduced problem.
    pub fn problem(&self) -> &Problem {
        &self.reduced
    }

    /// The problem it reduces.
    pub fn original(&self) -> &Problem {
        &self.original
    }

    /// The original tensors stacked in reduced tensor `t`, in stack order.
    pub fn members(&self, t: TensorId) -> &[TensorId] {
        &self.members[t as usize]
    }

    /// The whole problem's trivial bound (cuts and messages), from the
    /// reduced problem's fragments: the cuts are the same bytes, and each
    /// reduced piece counts as the pieces of its members
    /// ([`crate::trivial_lower_bound_weighted`]).
    pub fn trivial_lower_bound(&self, fragments: &[crate::Fragment]) -> LowerBound {
        crate::trivial_lower_bound_weighted(&self.reduced, fragments, &|t| self.members[t as usize].len() as u64)
    }

    /// A plan of the reduced problem as a plan of the original: every copy
    /// split by the members it carries, into their pieces, in order; the
    /// same streams and rounds; the original target's padding zero-filled.
    /// A paced plan (an optimal planner's) is issued and paced again for
    /// its expanded copies, as the planner finishes its own plans.
    pub fn expand(&self, plan: &Plan) -> Result<Plan> {
        let target = self.original.target();
        let mut shard_of = vec![u32::MAX; self.original.cluster().num_devices() as usize];
        for (s, shard) in target.shards().iter().enumerate() {
            for &d in &shard.devices {
                shard_of[d as usize] = s as u32;
            }
        }
        let index = PieceIndex::of(target, self.original.tensors().len());
        // Where member `m`'s piece of box `region` lies in the original
        // target shard of device `dst`: (buffer, offset).
        let locate = |dst: u32, buffer: u32, member: usize| -> Result<(TensorId, u32, u64)> {
            let s = shard_of.get(dst as usize).copied().unwrap_or(u32::MAX);
            let (stack, region) = self
                .target_buffers
                .get(s as usize)
                .and_then(|b| b.get(buffer as usize))
                .ok_or_else(|| not_reduced(dst, buffer))?;
            let t = *self.members[*stack as usize]
                .get(member)
                .ok_or_else(|| not_reduced(dst, buffer))?;
            let (b, offset) = index.find(s, t, region).ok_or_else(|| not_reduced(dst, buffer))?;
            Ok((t, b, offset))
        };
        let mut copies = Vec::with_capacity(plan.copies.len());
        for c in &plan.copies {
            let stack = c.region.range(0);
            let inner = Region::new((1..c.region.ndim()).map(|d| c.region.range(d)))?;
            for j in stack {
                let (tensor, buffer, offset) = locate(c.dst, c.buffer, j as usize)?;
                let fanout = c
                    .fanout
                    .iter()
                    .map(|f| {
                        let (_, buffer, offset) = locate(f.dst, f.buffer, j as usize)?;
                        Ok(Forward {
                            buffer,
                            offset,
                            ..f.clone()
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                copies.push(BoxCopy {
                    src: c.src,
                    dst: c.dst,
                    via: c.via.clone(),
                    tensor,
                    region: inner.clone(),
                    buffer,
                    offset,
                    reduce: c.reduce,
                    round: c.round,
                    fanout,
                });
            }
        }
        // A paced plan is an optimal planner's: its issue order and paces
        // depend on each device's messages, which the members multiply, so
        // they are made again for the expanded copies.
        if !plan.paces.is_empty() {
            return Ok(crate::issue::finish(&plan.planner, &self.original, copies));
        }
        Ok(Plan {
            planner: plan.planner.clone(),
            problem: self.original.clone(),
            copies,
            fills: padding_fills(&self.original),
            paces: Vec::new(),
        })
    }
}

/// A copy into a reduced buffer the reduction never made: a bug.
fn not_reduced(dst: u32, buffer: u32) -> crate::Error {
    crate::Error::Ptc(tenplan_ptc::Error::Format {
        what: format!("a reduced plan writes buffer {buffer} of device {dst}, which the reduced target does not have"),
    })
}

/// A layout with its tensors replaced by the stacks of their classes: in
/// every shard, one buffer per piece of each stack (the members' box with
/// the stack's whole first dimension), in stack order. Returns the layout
/// and, per shard, what each of its buffers holds.
fn stacked(
    layout: &Layout,
    classes: &LayoutClasses,
    members: &[Vec<TensorId>],
    tensors: &Arc<[TensorSpec]>,
) -> Result<(Layout, StackedBuffers)> {
    let mut buffers: Vec<Vec<Buffer>> = vec![Vec::new(); layout.shards().len()];
    let mut held: StackedBuffers = vec![Vec::new(); layout.shards().len()];
    for (r, m) in members.iter().enumerate() {
        let k = m.len() as u64;
        let first = m[0];
        let partial = layout.is_partial(first);
        for (s, region) in &classes.pieces[classes.class(first) as usize] {
            let stack = Region::new(std::iter::once(0..k).chain((0..region.ndim()).map(|d| region.range(d))))?;
            let shard = &mut buffers[*s as usize];
            shard.push(Buffer {
                name: format!("s{r}.{}", shard.len()),
                dtype: tensors[r].dtype,
                len: stack.volume(),
                pieces: vec![Piece {
                    tensor: r as TensorId,
                    region: stack,
                    offset: 0,
                }],
                partial,
            });
            held[*s as usize].push((r as TensorId, region.clone()));
        }
    }
    let shards = layout
        .shards()
        .iter()
        .zip(buffers)
        .map(|(s, buffers)| Shard {
            name: s.name.clone(),
            devices: s.devices.clone(),
            buffers,
        })
        .collect();
    Ok((Layout::new(tensors.clone(), shards)?, held))
}

/// The pieces of every shard of a layout by tensor, to find a member's
/// piece of a box without a hash per piece: (buffer, offset, box) runs,
/// one per (shard, tensor).
struct PieceIndex<'a> {
    /// Per shard: where each tensor's run starts in `entries` (one more
    /// than the tensors).
    starts: Vec<Vec<u32>>,
    entries: Vec<Vec<Located<'a>>>,
}

impl<'a> PieceIndex<'a> {
    fn of(layout: &'a Layout, tensors: usize) -> PieceIndex<'a> {
        let mut starts = Vec::with_capacity(layout.shards().len());
        let mut entries = Vec::with_capacity(layout.shards().len());
        for shard in layout.shards() {
            let mut count = vec![0u32; tensors + 1];
            for b in &shard.buffers {
                for p in &b.pieces {
                    count[p.tensor as usize + 1] += 1;
                }
            }
            for t in 0..tensors {
                count[t + 1] += count[t];
            }
            let mut at = count.clone();
            let total = count[tensors] as usize;
            let mut run: Vec<Located<'_>> = vec![None; total];
            for (bi, b) in shard.buffers.iter().enumerate() {
                for p in &b.pieces {
                    let slot = &mut at[p.tensor as usize];
                    run[*slot as usize] = Some((bi as u32, p.offset, &p.region));
                    *slot += 1;
                }
            }
            starts.push(count);
            entries.push(run);
        }
        PieceIndex { starts, entries }
    }

    fn find(&self, shard: u32, tensor: TensorId, region: &Region) -> Option<(u32, u64)> {
        let starts = self.starts.get(shard as usize)?;
        let (lo, hi) = (starts[tensor as usize] as usize, starts[tensor as usize + 1] as usize);
        self.entries[shard as usize][lo..hi]
            .iter()
            .flatten()
            .find(|(_, _, r)| *r == region)
            .map(|&(b, o, _)| (b, o))
    }
}

/// A planner that plans the [`Reduced`] problem and expands its plan: the
/// same plan bytes on every resource as planning the original, in the time
/// the reduced problem takes. Where nothing reduces, or the reduced
/// problem has no plan (the original's error names the original's
/// tensors), the original is planned.
pub struct Symmetric<P> {
    inner: P,
}

impl<P: Planner> Symmetric<P> {
    /// `inner`, on reduced problems.
    pub fn new(inner: P) -> Symmetric<P> {
        Symmetric { inner }
    }
}

/// Plan `reduced`'s problem with `planner` and expand the plan; the bound
/// is the planner's on the reduced problem (a bound on the original: see
/// the module docs). Where the reduced problem has no plan, the original
/// is planned, so that its error names the original's tensors.
pub fn plan_reduced(planner: &dyn Planner, reduced: &Reduced) -> Result<(Plan, Option<LowerBound>)> {
    match planner.plan_with_bound(reduced.problem()) {
        Ok((plan, bound)) => Ok((reduced.expand(&plan)?, bound)),
        Err(_) => planner.plan_with_bound(reduced.original()),
    }
}

impl<P: Planner> Planner for Symmetric<P> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        Ok(self.plan_with_bound(problem)?.0)
    }

    fn plan_with_bound(&self, problem: &Problem) -> Result<(Plan, Option<LowerBound>)> {
        match Reduced::new(problem)? {
            Some(r) => plan_reduced(&self.inner, &r),
            None => self.inner.plan_with_bound(problem),
        }
    }
}
