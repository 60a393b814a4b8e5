//! Max-min fair rates kept as bottleneck levels while streams come and go.
//!
//! In the max-min fair allocation every group has a bottleneck: a saturated
//! resource on which no group gets more. Each active group is *held* by one
//! such resource, and every group a resource holds gets the same rate, the
//! resource's *level*: what the groups held elsewhere leave of its capacity,
//! shared by the streams it holds. So the state is a level per resource,
//! not a rate per group, and an allocation is the max-min fair one when:
//! - no resource is overloaded (a resource that holds no group carries less
//!   than its capacity);
//! - no group held elsewhere outpaces a resource's level (a group through a
//!   holder that gets more than the holder's own groups should be held
//!   there: it is the one that gets too much).
//!
//! A change (a stream starts or ends) moves the level of its holder, which
//! moves the load of the resources its held groups cross, and so on; each
//! step costs the resource's neighbours, not its groups, and stops where a
//! level barely moves. A resource's groups advance on one virtual clock at
//! its level (the bytes each of its streams has been served), so a level
//! change costs one entry of the heap of next ends, whatever the number of
//! groups it holds. Where a condition breaks, the groups concerned move to
//! the resource that should hold them. Where settling takes unreasonably
//! many steps (rounding can make two levels chase each other), every rate
//! is refilled from scratch by progressive filling instead.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::ends::Ends;
use super::filling::Filler;
use crate::OrdF64;

/// The key of a (holder, crossed resource) pair.
fn pair_key(a: usize, q: usize) -> u64 {
    ((a as u64) << 32) | q as u64
}

/// The holder of an inactive group.
pub(super) const NONE: usize = usize::MAX;

/// Relative tolerance of the fair-share conditions and of stream ends.
pub(super) const TOLERANCE: f64 = 1e-9;

/// A level change smaller than this (relative) is not passed on: below
/// rounding of the sums it would move.
const QUIET: f64 = 1e-13;

/// A resource's summed load from groups held elsewhere is refreshed after
/// this many edits, and at least as many as its holders, so that rounding
/// cannot drift.
const RESUM: u32 = 64;

/// The resources a group crosses, sorted (inline: most routes cross two
/// to four).
pub(super) type Route = SmallVec<[u32; 4]>;

/// Streams with the same route: they always get the same rate. A paced
/// stream is a group of its own, its pace a resource only it crosses.
pub(super) struct Group {
    /// The resources it crosses, sorted.
    pub(super) route: Route,
    /// Active streams: (group-virtual bytes at which they finish, stream).
    active: BinaryHeap<Reverse<(OrdF64, usize)>>,
    /// The resource that holds it (`NONE` while it has no active stream).
    holder: usize,
    /// Where it sits in its holder's list.
    slot: usize,
    /// Its virtual bytes are its holder's clock minus this.
    offset: f64,
    /// Bumped at every attach and detach: older heap entries are stale.
    stamp: u32,
}

impl Group {
    pub(super) fn new(route: Route) -> Group {
        Group {
            route,
            active: BinaryHeap::new(),
            holder: NONE,
            slot: 0,
            offset: 0.0,
            stamp: 0,
        }
    }

    fn streams(&self) -> f64 {
        self.active.len() as f64
    }

    /// How many times its route crosses `r` (a multicast's forwarding
    /// device sends once per forward).
    fn uses(&self, r: usize) -> f64 {
        let r = r as u32;
        let from = self.route.partition_point(|&q| q < r);
        let to = self.route.partition_point(|&q| q <= r);
        (to - from) as f64
    }

    fn first(&self) -> Option<f64> {
        self.active.peek().map(|&Reverse((OrdF64(f), _))| f)
    }
}

/// A resource's state, in one cache line: settling reads and writes these
/// fields of every neighbour of a resource whose level moves.
#[derive(Clone, Copy, Default)]
#[repr(align(64))]
struct Res {
    cap: f64,
    /// Rate per stream of the groups it holds (0 if none).
    level: f64,
    /// Streams it holds, each as often as its route crosses it.
    streams: f64,
    /// Load of the groups held elsewhere that cross it, and the edits
    /// since it was last summed afresh.
    foreign: f64,
    edits: u32,
    /// Holders whose groups cross it (the length of its `inn`): its load
    /// is summed afresh after at least as many edits.
    crossing: u32,
    /// Bytes served per held stream up to `at` (a virtual clock).
    clock: f64,
    at: f64,
    /// Whether it waits to be settled; whether it became a holder since it
    /// was last settled (groups through it held elsewhere may outpace it);
    /// whether its next end must be recomputed.
    queued: bool,
    fresh: bool,
    touched: bool,
    /// Whether the top of its `finishes` is known live (no group came or
    /// went since it was checked).
    top_live: bool,
}

/// Where a (holder, crossed resource) pair sits in `Levels::out` and
/// `Levels::inn`, and the groups it counts (most often one).
struct Pair {
    out_at: u32,
    inn_at: u32,
    groups: SmallVec<[u32; 2]>,
}

/// The levels, what they rest on, and the next end of each holder.
pub(super) struct Levels {
    res: Vec<Res>,
    /// The groups each resource holds.
    held: Vec<Vec<usize>>,
    /// Each holder's groups by first finish on its clock, lazily:
    /// (clock at which the group's first stream ends, group, stamp).
    finishes: Vec<BinaryHeap<Reverse<(OrdF64, usize, u32)>>>,
    /// Streams held by `a` that cross `q`: in `out[a]` as (q, count), in
    /// `inn[q]` as (a, count); `pairs` says where each pair sits in both,
    /// and which groups they are.
    out: Vec<Vec<(u32, u32)>>,
    inn: Vec<Vec<(u32, u32)>>,
    pairs: FxHashMap<u64, Pair>,
    /// Resources to settle, lowest level first.
    queue: BinaryHeap<Reverse<(OrdF64, usize)>>,
    /// Groups just attached, whose route must be checked for a lower
    /// holder; a scratch list of resources.
    placed: Vec<usize>,
    scratch: Vec<usize>,
    /// Holders whose next end must be recomputed.
    touched: Vec<usize>,
    /// The next end of each holder.
    pub(super) ends: Ends,
    /// Active groups.
    pub(super) active: usize,
    /// Settling steps after which everything is refilled instead.
    step_limit: u64,
}

impl Levels {
    pub(super) fn new(caps: Vec<f64>) -> Levels {
        let n = caps.len();
        Levels {
            res: caps.into_iter().map(|cap| Res { cap, ..Res::default() }).collect(),
            held: vec![Vec::new(); n],
            finishes: vec![BinaryHeap::new(); n],
            out: vec![Vec::new(); n],
            inn: vec![Vec::new(); n],
            pairs: FxHashMap::default(),
            queue: BinaryHeap::new(),
            placed: Vec::new(),
            scratch: Vec::new(),
            touched: Vec::new(),
            ends: Ends::new(n),
            active: 0,
            step_limit: 16 * n as u64 + 100_000,
        }
    }

    /// Refill everything after this many settling steps in one settle
    /// (tests force the fallback with a small limit).
    #[cfg(test)]
    pub(super) fn with_step_limit(mut self, limit: u64) -> Levels {
        self.step_limit = limit;
        self
    }

    fn is_holder(&self, r: usize) -> bool {
        self.res[r].streams > 0.0
    }

    fn advance(&mut self, r: usize, now: f64) {
        self.res[r].clock += self.res[r].level * (now - self.res[r].at);
        self.res[r].at = now;
    }

    fn enqueue(&mut self, r: usize) {
        if !self.res[r].queued {
            self.res[r].queued = true;
            // Lowest levels first, as progressive filling saturates them.
            let key = if self.is_holder(r) {
                self.res[r].level
            } else {
                f64::NEG_INFINITY
            };
            self.queue.push(Reverse((OrdF64(key), r)));
        }
    }

    fn touch(&mut self, r: usize) {
        if !self.res[r].touched {
            self.res[r].touched = true;
            self.touched.push(r);
        }
    }

    /// Group `g`, `n` streams held by `a`, crosses `q`: count it.
    fn link(&mut self, a: usize, q: usize, g: usize, n: u32) {
        let (out_at, inn_at) = (self.out[a].len() as u32, self.inn[q].len() as u32);
        let pair = self.pairs.entry(pair_key(a, q)).or_insert_with(|| Pair {
            out_at,
            inn_at,
            groups: SmallVec::new(),
        });
        pair.groups.push(g as u32);
        if pair.groups.len() == 1 {
            self.out[a].push((q as u32, n));
            self.inn[q].push((a as u32, n));
            self.res[q].crossing += 1;
        } else {
            self.out[a][pair.out_at as usize].1 += n;
            self.inn[q][pair.inn_at as usize].1 += n;
        }
    }

    /// Group `g`, `n` streams, is no longer held by `a`: uncount it on `q`.
    fn unlink(&mut self, a: usize, q: usize, g: usize, n: u32) {
        let key = pair_key(a, q);
        let pair = self.pairs.get_mut(&key).expect("a held group's pairs are listed");
        let k = pair.groups.iter().position(|&h| h == g as u32).expect("listed");
        pair.groups.swap_remove(k);
        let (i, j) = (pair.out_at as usize, pair.inn_at as usize);
        if !pair.groups.is_empty() {
            self.out[a][i].1 -= n;
            self.inn[q][j].1 -= n;
            return;
        }
        self.pairs.remove(&key);
        self.out[a].swap_remove(i);
        if let Some(&(moved, _)) = self.out[a].get(i) {
            self.pairs.get_mut(&pair_key(a, moved as usize)).expect("listed").out_at = i as u32;
        }
        self.inn[q].swap_remove(j);
        self.res[q].crossing -= 1;
        if let Some(&(moved, _)) = self.inn[q].get(j) {
            self.pairs.get_mut(&pair_key(moved as usize, q)).expect("listed").inn_at = j as u32;
        }
    }

    /// Count (`held`) or uncount group `g`'s `n` streams, held by `b` at
    /// `level`, on every other resource of its route: a resource it crosses
    /// m times (the route is sorted) once, m-fold.
    fn count_route(&mut self, route: &[u32], g: usize, b: usize, n: f64, held: bool, level: f64) {
        let mut k = 0;
        while k < route.len() {
            let q = route[k];
            let m = route[k..].iter().take_while(|&&r| r == q).count();
            k += m;
            let q = q as usize;
            if q != b {
                let (c, load) = ((n as usize * m) as u32, n * level * m as f64);
                if held {
                    self.link(b, q, g, c);
                    self.add_foreign(q, load);
                } else {
                    self.unlink(b, q, g, c);
                    self.add_foreign(q, -load);
                }
            }
        }
    }

    /// Change the load that groups held elsewhere put on `q`.
    fn add_foreign(&mut self, q: usize, d: f64) {
        self.res[q].edits += 1;
        if self.res[q].edits >= RESUM.max(self.res[q].crossing) {
            self.res[q].edits = 0;
            self.res[q].foreign = self.inn[q]
                .iter()
                .map(|&(a, c)| f64::from(c) * self.res[a as usize].level)
                .sum();
        } else {
            self.res[q].foreign += d;
        }
        // A holder's level moves; a resource that holds nothing matters
        // only once it is overloaded.
        if self.is_holder(q) || self.res[q].foreign > self.res[q].cap * (1.0 + TOLERANCE) {
            self.enqueue(q);
        }
    }

    /// Hold a group at `b`, its streams having been served `vb` bytes.
    fn attach(&mut self, groups: &mut [Group], g: usize, b: usize, vb: f64, now: f64) {
        self.advance(b, now);
        let n = groups[g].streams();
        // Streams weighted by how often each crosses `b`.
        let held = n * groups[g].uses(b);
        if !self.is_holder(b) {
            // A new holder: its level is what the others leave it.
            self.res[b].level = (self.res[b].cap - self.res[b].foreign) / held;
            self.res[b].fresh = true;
        }
        self.res[b].streams += held;
        let group = &mut groups[g];
        group.holder = b;
        group.slot = self.held[b].len();
        group.offset = self.res[b].clock - vb;
        group.stamp = group.stamp.wrapping_add(1);
        self.held[b].push(g);
        self.res[b].top_live = false;
        if let Some(f) = group.first() {
            self.finishes[b].push(Reverse((OrdF64(f + group.offset), g, group.stamp)));
        }
        let level = self.res[b].level;
        self.count_route(&groups[g].route, g, b, n, true, level);
        self.placed.push(g);
        self.enqueue(b);
        self.touch(b);
    }

    /// Take a group off its holder; returns the bytes its streams have
    /// been served.
    fn detach(&mut self, groups: &mut [Group], g: usize, now: f64) -> f64 {
        let b = groups[g].holder;
        self.advance(b, now);
        let n = groups[g].streams();
        let vb = self.res[b].clock - groups[g].offset;
        let slot = groups[g].slot;
        self.held[b].swap_remove(slot);
        if let Some(&moved) = self.held[b].get(slot) {
            groups[moved].slot = slot;
        }
        groups[g].holder = NONE;
        groups[g].stamp = groups[g].stamp.wrapping_add(1);
        self.res[b].top_live = false;
        self.res[b].streams -= n * groups[g].uses(b);
        let level = self.res[b].level;
        self.count_route(&groups[g].route, g, b, n, false, level);
        if !self.is_holder(b) {
            self.res[b].level = 0.0;
        }
        self.enqueue(b);
        self.touch(b);
        vb
    }

    /// A stream of group `g` starts, with `bytes` to send.
    pub(super) fn start(&mut self, groups: &mut [Group], g: usize, s: usize, bytes: f64, now: f64) {
        let (b, vb) = match groups[g].holder {
            NONE => {
                self.active += 1;
                (NONE, 0.0)
            }
            b => (b, self.detach(groups, g, now)),
        };
        groups[g].active.push(Reverse((OrdF64(vb + bytes), s)));
        let b = if b == NONE {
            // Where it would get least: settling moves it if that is wrong.
            let n = groups[g].streams();
            let share =
                |r: usize| (self.res[r].cap - self.res[r].foreign) / (self.res[r].streams + n * groups[g].uses(r));
            groups[g]
                .route
                .iter()
                .map(|&r| r as usize)
                .min_by(|&a, &b| share(a).total_cmp(&share(b)).then(a.cmp(&b)))
                .expect("a route crosses a resource")
        } else {
            b
        };
        self.attach(groups, g, b, vb, now);
    }

    /// The streams held at `r` that end by `now` (its earliest at least,
    /// whatever rounding says): `ended` sees each.
    pub(super) fn finish(&mut self, groups: &mut [Group], r: usize, now: f64, mut ended: impl FnMut(usize)) {
        self.advance(r, now);
        let mut first = true;
        while let Some(&Reverse((OrdF64(mark), g, stamp))) = self.finishes[r].peek() {
            if groups[g].holder != r || groups[g].stamp != stamp {
                self.finishes[r].pop();
                continue;
            }
            if !first && mark - self.res[r].clock > TOLERANCE * mark.abs().max(1.0) {
                break;
            }
            first = false;
            self.finishes[r].pop();
            let head = groups[g].first().expect("a held group has streams");
            let vb = self.detach(groups, g, now).max(head);
            while let Some(&Reverse((OrdF64(fin), s))) = groups[g].active.peek() {
                if fin - vb > TOLERANCE * fin.max(1.0) {
                    break;
                }
                groups[g].active.pop();
                ended(s);
            }
            if groups[g].active.is_empty() {
                self.active -= 1;
            } else {
                self.attach(groups, g, r, vb, now);
            }
        }
        self.touch(r);
    }

    /// Bring the levels to the max-min fair allocation after the changes
    /// at `now`, and the next ends up to date.
    pub(super) fn settle(&mut self, groups: &mut [Group], now: f64) {
        let mut steps = 0u64;
        loop {
            // Groups just placed go to the lowest holder on their route.
            while let Some(g) = self.placed.pop() {
                self.place(groups, g, now);
            }
            let Some(Reverse((_, r))) = self.queue.pop() else {
                break;
            };
            self.res[r].queued = false;
            steps += 1;
            if steps > self.step_limit {
                self.refill_all(groups, now);
                break;
            }
            self.settle_one(groups, r, now);
        }
        #[cfg(test)]
        if VERIFY.with(|v| v.get()) {
            self.verify(groups, now);
        }
        for i in 0..self.touched.len() {
            let r = self.touched[i];
            self.res[r].touched = false;
            self.refresh_end(groups, r);
        }
        self.touched.clear();
    }

    fn settle_one(&mut self, groups: &mut [Group], r: usize, now: f64) {
        if !self.is_holder(r) {
            if self.res[r].foreign > self.res[r].cap * (1.0 + TOLERANCE) {
                // Overloaded: the fastest groups through it are held here
                // (settling it again brings in any others that outpace it).
                let fastest = self.inn[r]
                    .iter()
                    .map(|&(a, _)| a as usize)
                    .max_by(|&a, &b| self.res[a].level.total_cmp(&self.res[b].level).then(b.cmp(&a)));
                match fastest {
                    Some(a) => self.switch_through(groups, a, r, now),
                    // Nothing crosses it: what is left of its load is
                    // rounding.
                    None => self.res[r].foreign = 0.0,
                }
            }
            return;
        }
        let new = (self.res[r].cap - self.res[r].foreign) / self.res[r].streams;
        let old = self.res[r].level;
        let fresh = std::mem::take(&mut self.res[r].fresh);
        if (new - old).abs() <= QUIET * new.abs().max(old.abs()) && !fresh {
            return;
        }
        self.advance(r, now);
        self.res[r].level = new;
        self.touch(r);
        for i in 0..self.out[r].len() {
            let (q, c) = self.out[r][i];
            self.add_foreign(q as usize, f64::from(c) * (new - old));
        }
        // A level that rose may now outpace a lower holder on the route of
        // a group held here; one that fell, a group held elsewhere through
        // here. A new holder's level was set unchecked: both.
        let slack = TOLERANCE * new.abs();
        let mut moving = std::mem::take(&mut self.scratch);
        if new > old || fresh {
            // Groups held here that a lower holder on their route should
            // hold go there.
            moving.extend(
                self.out[r]
                    .iter()
                    .filter(|&&(q, _)| self.is_holder(q as usize) && self.res[q as usize].level < new - slack)
                    .map(|&(q, _)| q as usize),
            );
            for &q in &moving {
                if self.is_holder(q) && self.res[q].level < self.res[r].level - slack {
                    self.switch_through(groups, r, q, now);
                }
            }
            moving.clear();
        }
        if new < old || fresh {
            // Groups held elsewhere that outpace this resource's own are
            // held here.
            moving.extend(
                self.inn[r]
                    .iter()
                    .filter(|&&(a, _)| self.res[a as usize].level > new + slack)
                    .map(|&(a, _)| a as usize),
            );
            for &a in &moving {
                if self.res[a].level > self.res[r].level + slack {
                    self.switch_through(groups, a, r, now);
                }
            }
        }
        moving.clear();
        self.scratch = moving;
    }

    /// A group just attached goes to the holder on its route with the
    /// lowest level, if that is lower than its own holder's.
    fn place(&mut self, groups: &mut [Group], g: usize, now: f64) {
        let b = groups[g].holder;
        if b == NONE {
            return;
        }
        let slack = TOLERANCE * self.res[b].level.abs();
        let lowest = groups[g]
            .route
            .iter()
            .map(|&q| q as usize)
            .filter(|&q| q != b && self.is_holder(q))
            .min_by(|&p, &q| self.res[p].level.total_cmp(&self.res[q].level).then(p.cmp(&q)));
        if let Some(q) = lowest.filter(|&q| self.res[q].level < self.res[b].level - slack) {
            let vb = self.detach(groups, g, now);
            self.attach(groups, g, q, vb, now);
        }
    }

    /// The groups held by `a` that cross `q` are held by `q` instead.
    fn switch_through(&mut self, groups: &mut [Group], a: usize, q: usize, now: f64) {
        let moving = match self.pairs.get(&pair_key(a, q)) {
            Some(pair) => pair.groups.clone(),
            None => return,
        };
        for g in moving {
            let g = g as usize;
            let vb = self.detach(groups, g, now);
            self.attach(groups, g, q, vb, now);
        }
    }

    /// A holder's next end from its first finish and level.
    fn refresh_end(&mut self, groups: &[Group], r: usize) {
        // Stale entries (groups gone or re-attached) outnumbering the live
        // ones: rebuild, so that the heap stays the size of what it holds.
        if self.finishes[r].len() > 4 * self.held[r].len() + 32 {
            self.finishes[r] = self.held[r]
                .iter()
                .filter_map(|&g| {
                    let group = &groups[g];
                    group
                        .first()
                        .map(|f| Reverse((OrdF64(f + group.offset), g, group.stamp)))
                })
                .collect();
        }
        let heap = &mut self.finishes[r];
        if !self.res[r].top_live {
            while let Some(&Reverse((_, g, stamp))) = heap.peek() {
                if groups[g].holder == r && groups[g].stamp == stamp {
                    break;
                }
                heap.pop();
            }
            self.res[r].top_live = true;
        }
        match heap.peek() {
            Some(&Reverse((OrdF64(mark), _, _))) if self.res[r].level > 0.0 => {
                let t = self.res[r].at + (mark - self.res[r].clock).max(0.0) / self.res[r].level;
                self.ends.set(r, t);
            }
            _ => self.ends.remove(r),
        }
    }

    /// Every active group refilled from scratch (progressive filling) and
    /// held by the resource that froze it.
    fn refill_all(&mut self, groups: &mut [Group], now: f64) {
        let (members, rates) = self.filling(groups);
        let served: Vec<f64> = members
            .iter()
            .map(|&g| {
                let b = groups[g].holder;
                self.res[b].clock + self.res[b].level * (now - self.res[b].at) - groups[g].offset
            })
            .collect();
        for r in 0..self.res.len() {
            // Only the capacity, the clock and a place in `touched` stay.
            let Res {
                cap, clock, touched, ..
            } = self.res[r];
            self.res[r] = Res {
                cap,
                clock,
                at: now,
                touched,
                ..Res::default()
            };
            self.held[r].clear();
            self.finishes[r].clear();
            self.out[r].clear();
            self.inn[r].clear();
            self.touch(r);
        }
        self.pairs.clear();
        for (k, &g) in members.iter().enumerate() {
            self.attach(groups, g, rates[k].1, served[k], now);
        }
        for (k, &g) in members.iter().enumerate() {
            self.res[groups[g].holder].level = rates[k].0;
        }
        for q in 0..self.res.len() {
            self.res[q].foreign = self.inn[q]
                .iter()
                .map(|&(a, c)| f64::from(c) * self.res[a as usize].level)
                .sum();
            self.res[q].edits = 0;
            self.res[q].queued = false;
            self.res[q].fresh = false;
        }
        self.queue.clear();
        self.placed.clear();
    }

    /// The active groups in order, and the rate and bottleneck progressive
    /// filling of them all gives each.
    fn filling(&self, groups: &[Group]) -> (Vec<usize>, Vec<(f64, usize)>) {
        let mut members: Vec<usize> = self.held.iter().flatten().copied().collect();
        members.sort_unstable();
        let routes: Vec<&[u32]> = members.iter().map(|&g| groups[g].route.as_slice()).collect();
        let weights: Vec<f64> = members.iter().map(|&g| groups[g].streams()).collect();
        let mut filler = Filler::new(self.res.iter().map(|r| r.cap).collect());
        let rates = filler.rates(&routes, &weights);
        (members, rates)
    }
}

#[cfg(test)]
thread_local! {
    /// Whether each settle is checked against progressive filling (tests).
    pub(super) static VERIFY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
impl Levels {
    /// (Tests, where `VERIFY` is set.) Panic, with the whole state, unless
    /// every active group's level is the rate progressive filling of all
    /// active groups gives it.
    fn verify(&self, groups: &[Group], now: f64) {
        let (members, rates) = self.filling(groups);
        for (k, &g) in members.iter().enumerate() {
            let mine = self.res[groups[g].holder].level;
            if (mine - rates[k].0).abs() > 1e-9 * rates[k].0.max(1e-12) {
                let mut dump = String::new();
                for (k, &g) in members.iter().enumerate() {
                    dump += &format!(
                        "  g{g} route {:?} n {} holder {} level {} fill {} at {}\n",
                        groups[g].route,
                        groups[g].streams(),
                        groups[g].holder,
                        self.res[groups[g].holder].level,
                        rates[k].0,
                        rates[k].1
                    );
                }
                for r in 0..self.res.len() {
                    dump += &format!(
                        "  r{r} cap {} streams {} level {} foreign {} out {:?} inn {:?}\n",
                        self.res[r].cap,
                        self.res[r].streams,
                        self.res[r].level,
                        self.res[r].foreign,
                        self.out[r],
                        self.inn[r]
                    );
                }
                panic!("at {now}: group {g} level {mine} vs filling {}\n{dump}", rates[k].0);
            }
        }
    }
}
