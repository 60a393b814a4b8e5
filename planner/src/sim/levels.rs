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

use super::ends::Ends;
use super::filling::Filler;
use crate::OrdF64;

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

/// Streams with the same route: they always get the same rate. A paced
/// stream is a group of its own, its pace a resource only it crosses.
pub(super) struct Group {
    /// The resources it crosses, sorted.
    pub(super) route: Vec<usize>,
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
    pub(super) fn new(route: Vec<usize>) -> Group {
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

    fn first(&self) -> Option<f64> {
        self.active.peek().map(|&Reverse((OrdF64(f), _))| f)
    }
}

/// The levels, what they rest on, and the next end of each holder.
pub(super) struct Levels {
    caps: Vec<f64>,
    /// Rate per stream of the groups each resource holds (0 if none).
    level: Vec<f64>,
    /// Streams each resource holds, and the groups.
    streams: Vec<f64>,
    held: Vec<Vec<usize>>,
    /// Load on each resource of the groups held elsewhere, and the edits
    /// since it was last summed afresh.
    foreign: Vec<f64>,
    edits: Vec<u32>,
    /// Bytes served per held stream up to `at` (a virtual clock).
    clock: Vec<f64>,
    at: Vec<f64>,
    /// Each holder's groups by first finish on its clock, lazily:
    /// (clock at which the group's first stream ends, group, stamp).
    finishes: Vec<BinaryHeap<Reverse<(OrdF64, usize, u32)>>>,
    /// Streams held by `a` that cross `q`: in `out[a]` as (q, count), in
    /// `inn[q]` as (a, count); `pos` says where each pair sits in both.
    out: Vec<Vec<(usize, u32)>>,
    inn: Vec<Vec<(usize, u32)>>,
    pos: FxHashMap<(usize, usize), (usize, usize)>,
    /// Resources to settle, and whether they are queued.
    queue: BinaryHeap<Reverse<(OrdF64, usize)>>,
    queued: Vec<bool>,
    /// Resources that became holders since they were last settled: groups
    /// through them held elsewhere may outpace them.
    fresh: Vec<bool>,
    /// Groups just attached, whose route must be checked for a lower
    /// holder; scratch lists of resources.
    placed: Vec<usize>,
    over: Vec<usize>,
    /// Holders whose next end must be recomputed.
    touched: Vec<usize>,
    is_touched: Vec<bool>,
    /// The next end of each holder.
    pub(super) ends: Ends,
    /// Active groups.
    pub(super) active: usize,
    /// Settling steps after which everything is refilled instead.
    step_limit: u64,
    /// How many times everything was refilled.
    pub(super) refills: u64,
    filler: Filler,
}

impl Levels {
    pub(super) fn new(caps: Vec<f64>) -> Levels {
        let n = caps.len();
        Levels {
            filler: Filler::new(caps.clone()),
            caps,
            level: vec![0.0; n],
            streams: vec![0.0; n],
            held: vec![Vec::new(); n],
            foreign: vec![0.0; n],
            edits: vec![0; n],
            clock: vec![0.0; n],
            at: vec![0.0; n],
            finishes: vec![BinaryHeap::new(); n],
            out: vec![Vec::new(); n],
            inn: vec![Vec::new(); n],
            pos: FxHashMap::default(),
            queue: BinaryHeap::new(),
            queued: vec![false; n],
            fresh: vec![false; n],
            placed: Vec::new(),
            over: Vec::new(),
            touched: Vec::new(),
            is_touched: vec![false; n],
            ends: Ends::new(n),
            active: 0,
            step_limit: 16 * n as u64 + 100_000,
            refills: 0,
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
        self.streams[r] > 0.0
    }

    fn advance(&mut self, r: usize, now: f64) {
        self.clock[r] += self.level[r] * (now - self.at[r]);
        self.at[r] = now;
    }

    fn enqueue(&mut self, r: usize) {
        if !self.queued[r] {
            self.queued[r] = true;
            // Lowest levels first, as progressive filling saturates them.
            let key = if self.is_holder(r) {
                self.level[r]
            } else {
                f64::NEG_INFINITY
            };
            self.queue.push(Reverse((OrdF64(key), r)));
        }
    }

    fn touch(&mut self, r: usize) {
        if !self.is_touched[r] {
            self.is_touched[r] = true;
            self.touched.push(r);
        }
    }

    /// Change the count of streams held by `a` that cross `q`.
    fn add_count(&mut self, a: usize, q: usize, k: i64) {
        match self.pos.get(&(a, q)).copied() {
            Some((i, j)) => {
                let c = i64::from(self.out[a][i].1) + k;
                debug_assert!(c >= 0);
                if c == 0 {
                    self.pos.remove(&(a, q));
                    self.out[a].swap_remove(i);
                    if let Some(&(moved, _)) = self.out[a].get(i) {
                        self.pos.get_mut(&(a, moved)).expect("listed").0 = i;
                    }
                    self.inn[q].swap_remove(j);
                    if let Some(&(moved, _)) = self.inn[q].get(j) {
                        self.pos.get_mut(&(moved, q)).expect("listed").1 = j;
                    }
                } else {
                    self.out[a][i].1 = c as u32;
                    self.inn[q][j].1 = c as u32;
                }
            }
            None => {
                debug_assert!(k > 0);
                self.pos.insert((a, q), (self.out[a].len(), self.inn[q].len()));
                self.out[a].push((q, k as u32));
                self.inn[q].push((a, k as u32));
            }
        }
    }

    /// Change the load that groups held elsewhere put on `q`.
    fn add_foreign(&mut self, q: usize, d: f64) {
        self.edits[q] += 1;
        if self.edits[q] as usize >= (RESUM as usize).max(self.inn[q].len()) {
            self.edits[q] = 0;
            self.foreign[q] = self.inn[q].iter().map(|&(a, c)| f64::from(c) * self.level[a]).sum();
        } else {
            self.foreign[q] += d;
        }
        // A holder's level moves; a resource that holds nothing matters
        // only once it is overloaded.
        if self.is_holder(q) || self.foreign[q] > self.caps[q] * (1.0 + TOLERANCE) {
            self.enqueue(q);
        }
    }

    /// Hold a group at `b`, its streams having been served `vb` bytes.
    fn attach(&mut self, groups: &mut [Group], g: usize, b: usize, vb: f64, now: f64) {
        self.advance(b, now);
        let n = groups[g].streams();
        if !self.is_holder(b) {
            // A new holder: its level is what the others leave it.
            self.level[b] = (self.caps[b] - self.foreign[b]) / n;
            self.fresh[b] = true;
        }
        self.streams[b] += n;
        let group = &mut groups[g];
        group.holder = b;
        group.slot = self.held[b].len();
        group.offset = self.clock[b] - vb;
        group.stamp = group.stamp.wrapping_add(1);
        self.held[b].push(g);
        if let Some(f) = group.first() {
            self.finishes[b].push(Reverse((OrdF64(f + group.offset), g, group.stamp)));
        }
        let level = self.level[b];
        for k in 0..groups[g].route.len() {
            let q = groups[g].route[k];
            if q != b {
                self.add_count(b, q, n as i64);
                self.add_foreign(q, n * level);
            }
        }
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
        let vb = self.clock[b] - groups[g].offset;
        let slot = groups[g].slot;
        self.held[b].swap_remove(slot);
        if let Some(&moved) = self.held[b].get(slot) {
            groups[moved].slot = slot;
        }
        groups[g].holder = NONE;
        groups[g].stamp = groups[g].stamp.wrapping_add(1);
        self.streams[b] -= n;
        let level = self.level[b];
        for k in 0..groups[g].route.len() {
            let q = groups[g].route[k];
            if q != b {
                self.add_count(b, q, -(n as i64));
                self.add_foreign(q, -n * level);
            }
        }
        if !self.is_holder(b) {
            self.level[b] = 0.0;
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
            let share = |r: usize| (self.caps[r] - self.foreign[r]) / (self.streams[r] + n);
            groups[g]
                .route
                .iter()
                .copied()
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
            if !first && mark - self.clock[r] > TOLERANCE * mark.abs().max(1.0) {
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
            self.queued[r] = false;
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
            self.is_touched[r] = false;
            self.refresh_end(groups, r);
        }
        self.touched.clear();
    }

    fn settle_one(&mut self, groups: &mut [Group], r: usize, now: f64) {
        if !self.is_holder(r) {
            if self.foreign[r] > self.caps[r] * (1.0 + TOLERANCE) {
                // Overloaded: the fastest groups through it are held here
                // (settling it again brings in any others that outpace it).
                let fastest = self.inn[r]
                    .iter()
                    .map(|&(a, _)| a)
                    .max_by(|&a, &b| self.level[a].total_cmp(&self.level[b]).then(b.cmp(&a)))
                    .expect("an overloaded resource has groups through it");
                self.switch_through(groups, fastest, r, now);
            }
            return;
        }
        let new = (self.caps[r] - self.foreign[r]) / self.streams[r];
        let old = self.level[r];
        let fresh = std::mem::take(&mut self.fresh[r]);
        if (new - old).abs() <= QUIET * new.abs().max(old.abs()) && !fresh {
            return;
        }
        self.advance(r, now);
        self.level[r] = new;
        self.touch(r);
        for i in 0..self.out[r].len() {
            let (q, c) = self.out[r][i];
            self.add_foreign(q, f64::from(c) * (new - old));
        }
        // A level that rose may now outpace a lower holder on the route of
        // a group held here; one that fell, a group held elsewhere through
        // here. A new holder's level was set unchecked: both.
        let slack = TOLERANCE * new.abs();
        let mut moving = std::mem::take(&mut self.over);
        if new > old || fresh {
            // Groups held here that a lower holder on their route should
            // hold go there.
            moving.extend(
                self.out[r]
                    .iter()
                    .filter(|&&(q, _)| self.is_holder(q) && self.level[q] < new - slack)
                    .map(|&(q, _)| q),
            );
            for &q in &moving {
                if self.is_holder(q) && self.level[q] < self.level[r] - slack {
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
                    .filter(|&&(a, _)| self.level[a] > new + slack)
                    .map(|&(a, _)| a),
            );
            for &a in &moving {
                if self.level[a] > self.level[r] + slack {
                    self.switch_through(groups, a, r, now);
                }
            }
        }
        moving.clear();
        self.over = moving;
    }

    /// A group just attached goes to the holder on its route with the
    /// lowest level, if that is lower than its own holder's.
    fn place(&mut self, groups: &mut [Group], g: usize, now: f64) {
        let b = groups[g].holder;
        if b == NONE {
            return;
        }
        let slack = TOLERANCE * self.level[b].abs();
        let lowest = groups[g]
            .route
            .iter()
            .copied()
            .filter(|&q| q != b && self.is_holder(q))
            .min_by(|&p, &q| self.level[p].total_cmp(&self.level[q]).then(p.cmp(&q)));
        if let Some(q) = lowest.filter(|&q| self.level[q] < self.level[b] - slack) {
            let vb = self.detach(groups, g, now);
            self.attach(groups, g, q, vb, now);
        }
    }

    /// The groups held by `a` that cross `q` are held by `q` instead.
    fn switch_through(&mut self, groups: &mut [Group], a: usize, q: usize, now: f64) {
        let moving: Vec<usize> = self.held[a]
            .iter()
            .copied()
            .filter(|&g| groups[g].route.binary_search(&q).is_ok())
            .collect();
        for g in moving {
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
        while let Some(&Reverse((_, g, stamp))) = heap.peek() {
            if groups[g].holder == r && groups[g].stamp == stamp {
                break;
            }
            heap.pop();
        }
        match heap.peek() {
            Some(&Reverse((OrdF64(mark), _, _))) if self.level[r] > 0.0 => {
                let t = self.at[r] + (mark - self.clock[r]).max(0.0) / self.level[r];
                self.ends.set(r, t);
            }
            _ => self.ends.remove(r),
        }
    }

    /// Every active group refilled from scratch (progressive filling) and
    /// held by the resource that froze it.
    fn refill_all(&mut self, groups: &mut [Group], now: f64) {
        self.refills += 1;
        let mut members: Vec<usize> = self.held.iter().flatten().copied().collect();
        members.sort_unstable();
        let served: Vec<f64> = members
            .iter()
            .map(|&g| {
                let b = groups[g].holder;
                self.clock[b] + self.level[b] * (now - self.at[b]) - groups[g].offset
            })
            .collect();
        for r in 0..self.caps.len() {
            self.held[r].clear();
            self.streams[r] = 0.0;
            self.level[r] = 0.0;
            self.foreign[r] = 0.0;
            self.edits[r] = 0;
            self.at[r] = now;
            self.finishes[r].clear();
            self.out[r].clear();
            self.inn[r].clear();
            self.queued[r] = false;
            self.fresh[r] = false;
            self.touch(r);
        }
        self.pos.clear();
        self.queue.clear();
        let routes: Vec<&[usize]> = members.iter().map(|&g| groups[g].route.as_slice()).collect();
        let weights: Vec<f64> = members.iter().map(|&g| groups[g].streams()).collect();
        let rates = self.filler.rates(&routes, &weights);
        for (k, &g) in members.iter().enumerate() {
            self.attach(groups, g, rates[k].1, served[k], now);
        }
        for (k, &g) in members.iter().enumerate() {
            self.level[groups[g].holder] = rates[k].0;
        }
        for q in 0..self.caps.len() {
            self.foreign[q] = self.inn[q].iter().map(|&(a, c)| f64::from(c) * self.level[a]).sum();
            self.edits[q] = 0;
            self.queued[q] = false;
            self.fresh[q] = false;
        }
        self.queue.clear();
        self.placed.clear();
    }
}

#[cfg(test)]
thread_local! {
    pub(super) static VERIFY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
impl Levels {
    fn verify(&mut self, groups: &[Group], now: f64) {
        let mut members: Vec<usize> = self.held.iter().flatten().copied().collect();
        members.sort_unstable();
        let routes: Vec<&[usize]> = members.iter().map(|&g| groups[g].route.as_slice()).collect();
        let weights: Vec<f64> = members.iter().map(|&g| groups[g].streams()).collect();
        let rates = self.filler.rates(&routes, &weights);
        for (k, &g) in members.iter().enumerate() {
            let mine = self.level[groups[g].holder];
            if (mine - rates[k].0).abs() > 1e-9 * rates[k].0.max(1e-12) {
                let mut dump = String::new();
                for (k, &g) in members.iter().enumerate() {
                    dump += &format!(
                        "  g{g} route {:?} n {} holder {} level {} fill {} at {}\n",
                        groups[g].route,
                        weights[k],
                        groups[g].holder,
                        self.level[groups[g].holder],
                        rates[k].0,
                        rates[k].1
                    );
                }
                for r in 0..self.caps.len() {
                    dump += &format!(
                        "  r{r} cap {} streams {} level {} foreign {} out {:?} inn {:?}\n",
                        self.caps[r], self.streams[r], self.level[r], self.foreign[r], self.out[r], self.inn[r]
                    );
                }
                panic!("at {now}: group {g} level {mine} vs filling {}\n{dump}", rates[k].0);
            }
        }
    }
}
