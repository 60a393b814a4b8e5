//! A flow-level simulator: links shared max-min fairly, plus per-message costs.
//!
//! Model:
//! - A device issues its messages one at a time in plan order, each costing
//!   the cluster's message latency: message k of a device is issued at
//!   `(k + 1) · latency`.
//! - Messages from one device to one peer (through one relay, if any) travel
//!   in order over one stream, as over one NCCL channel or TCP connection. A
//!   stream starts when its first message is issued and ends when its bytes
//!   have arrived, and no earlier than its last message's issue time.
//! - A relayed copy is pipelined (forwarded chunk by chunk): its stream uses
//!   the resources of both hops at once. So is a multicast: its stream uses
//!   the hops to its destination and from there to every forwarded-to
//!   device at once, and the destination issues one message per forward.
//! - Active streams share every resource max-min fairly (progressive filling).
//!   Streams with the same route always get the same rate, so they are
//!   simulated as one group with a virtual clock. An event (a stream starts
//!   or ends) refills only the rates it can change, found through each
//!   group's bottleneck and checked against the max-min condition, so it
//!   costs about what it changes rather than the number of active groups;
//!   the result equals refilling everything (a property test compares the
//!   two).
//! - A stream the plan paces (`Plan::paces`) never exceeds its pace: it is
//!   its own group, with its pace as one more capacity in the filling, so
//!   paces that oversubscribe a link degrade to fair sharing rather than
//!   being trusted.
//! - Where re-sharing is global, exactness costs the number of groups per
//!   event: in an all-to-all (every new device fed by every old one) each
//!   stream end moves every rate a little, through every link. Once a
//!   simulation has refilled [`EXACT_WORK`] group rates, and its updates
//!   refilled on average at least a sixteenth of the active groups, it
//!   batches re-sharing: bandwidth freed by an end (under 5% of each of its
//!   links) and a new stream that would get under 5% of a busy link (one
//!   shared by at least twenty groups) wait for the next
//!   re-sharing, at most [`RESHARE_FRACTION`] of the plan's load bound
//!   later; larger changes re-share at once, each judged alone (one that
//!   re-shares at once leaves the others waiting: where each large change
//!   flushed them all, nine in ten batched updates of a baseline at 16,384
//!   GPUs were flushes). The report says so
//!   ([`SimReport::reshare_s`]). Rates stay feasible; ends are still timed
//!   exactly at the rates in force. Measured against the exact simulation:
//!   +0.05% on an all-to-all of 128 GPUs, at most +0.21% (median 0) on the
//!   paper and large suites' plans forced to batch from the start.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use tenplan_ptc::{Copy, Plan, StreamKey};

use crate::cost::{capacity, copy_bytes, stream_resources, Resource};
use crate::OrdF64;

/// What the simulator measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Time until the last byte lands, in seconds.
    pub makespan_s: f64,
    /// Messages (copies) simulated.
    pub messages: usize,
    /// Streams (distinct source, relay, destination) simulated.
    pub streams: usize,
    /// The longest a stream's freed bandwidth waited to be re-shared, in
    /// seconds: 0 when every stream end re-shared it at once (the exact
    /// max-min simulation), positive when the simulation switched to
    /// batched re-sharing (see the module docs).
    pub reshare_s: f64,
}

struct Stream {
    bytes: f64,
    start: f64,
    last_issue: f64,
    group: usize,
}

/// Streams with the same route (or one paced stream): they share one rate.
struct Group {
    resources: Vec<usize>,
    /// Where the group sits in `Sharing::users` of each of its resources
    /// while it is active.
    slots: Vec<usize>,
    /// Rate limit of each stream of the group (paced streams).
    pace: Option<f64>,
    /// Bytes served to each active stream up to time `at`.
    virtual_bytes: f64,
    at: f64,
    /// Active streams: (virtual bytes at which they finish, stream).
    active: BinaryHeap<Reverse<(OrdF64, usize)>>,
    /// The first of those finishes (infinite when none): read at every
    /// rate change, kept here rather than behind the heap's pointer.
    first: f64,
    rate: f64,
    /// Bumped whenever the rate changes: older completion events are stale.
    version: u32,
    /// The load the group puts on each of its resources (streams x rate),
    /// as counted in `Sharing::load`.
    counted: f64,
    /// The resource that holds the group's rate (or `PACE`, or `NONE`), and
    /// a stamp that tells its current entry in `Sharing::held` from old ones.
    bottleneck: usize,
    stamp: u32,
}

impl Group {
    fn streams(&self) -> f64 {
        self.active.len() as f64
    }

    /// Serve bytes at the current rate up to `now`.
    fn advance(&mut self, now: f64) {
        self.virtual_bytes += self.rate * (now - self.at);
        self.at = now;
    }

    /// When the group's first stream finishes at its current rate.
    fn next_finish(&self) -> Option<f64> {
        (self.rate > 0.0 && self.first.is_finite())
            .then(|| self.at + (self.first - self.virtual_bytes).max(0.0) / self.rate)
    }

    /// A stream joins, finishing once `bytes` more are served.
    fn start(&mut self, bytes: f64, s: usize) {
        let fin = self.virtual_bytes + bytes;
        self.active.push(Reverse((OrdF64(fin), s)));
        self.first = self.first.min(fin);
    }

    /// Take off the streams that have finished (the first of them whatever
    /// rounding says, the others within the tolerance); `ended` sees each.
    fn finish(&mut self, mut ended: impl FnMut(usize)) {
        if self.first.is_finite() {
            self.virtual_bytes = self.virtual_bytes.max(self.first);
        }
        while let Some(&Reverse((OrdF64(fin), s))) = self.active.peek() {
            if fin - self.virtual_bytes > TOLERANCE * fin.max(1.0) {
                break;
            }
            self.active.pop();
            ended(s);
        }
        self.first = self
            .active
            .peek()
            .map_or(f64::INFINITY, |&Reverse((OrdF64(fin), _))| fin);
    }
}

/// Group rates a simulation refills exactly before it batches re-sharing
/// (about a second or two of simulation; the paper and large suites stay
/// well below it).
pub const EXACT_WORK: u64 = 4_000_000;

/// Re-sharing is widespread when the updates so far refilled at least
/// 1/WIDESPREAD of the groups active at the time, on average.
const WIDESPREAD: u64 = 16;

/// Once re-sharing is batched, freed bandwidth waits at most this fraction
/// of the plan's load bound (its busiest resource's bytes over capacity).
pub const RESHARE_FRACTION: f64 = 1e-3;

/// Batching, a stream end whose freed bandwidth exceeds this share of a
/// link's capacity is re-shared at once.
const SMALL_SHARE: f64 = 0.05;

/// Relative tolerance of the fair-share conditions (saturation, largest rate).
const TOLERANCE: f64 = 1e-9;

/// Simulate a plan; the plan is assumed to be valid (run the checker first).
/// Staging rounds run one after another, each from a clean start.
pub fn simulate(plan: &Plan) -> SimReport {
    let last = plan.copies.iter().map(|c| c.round).max().unwrap_or(0);
    if last == 0 {
        return simulate_copies(plan, &plan.copies.iter().collect::<Vec<_>>());
    }
    let mut by_round: BTreeMap<u32, Vec<&Copy>> = BTreeMap::new();
    for c in &plan.copies {
        by_round.entry(c.round).or_default().push(c);
    }
    let mut total = SimReport {
        makespan_s: 0.0,
        messages: 0,
        streams: 0,
        reshare_s: 0.0,
    };
    for copies in by_round.values() {
        let r = simulate_copies(plan, copies);
        total.makespan_s += r.makespan_s;
        total.messages += r.messages;
        total.streams += r.streams;
        total.reshare_s = total.reshare_s.max(r.reshare_s);
    }
    total
}

/// The streams of some copies, their groups and the resources' capacities.
fn streams_of(plan: &Plan, copies: &[&Copy]) -> (Vec<Stream>, Vec<Group>, Vec<f64>) {
    let cluster = plan.problem.cluster();
    let latency = cluster.latency_s();
    let mut resource_ids: HashMap<Resource, usize> = HashMap::new();
    let mut caps: Vec<f64> = Vec::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut streams: Vec<Stream> = Vec::new();
    // Streams numbered in order of first appearance, with no key built per
    // direct copy (millions at thousands of GPUs).
    let (stream_of, keys) = crate::schedule::stream_ids(copies.iter().copied());
    let mut issued = vec![0.0; cluster.num_devices() as usize];
    let paces: HashMap<StreamKey, f64> = plan
        .paces
        .iter()
        .filter(|p| p.bytes_per_s.is_finite() && p.bytes_per_s > 0.0)
        .map(|p| (p.stream(), p.bytes_per_s))
        .collect();
    for (&c, &s) in copies.iter().zip(&stream_of) {
        let at = &mut issued[c.src as usize];
        *at += latency;
        let at = *at;
        // A multicast's destination issues one forward per device; the
        // stream cannot end before the last of them.
        let forwarded = if c.fanout.is_empty() {
            at
        } else {
            let f = &mut issued[c.dst as usize];
            *f += latency * c.fanout.len() as f64;
            *f
        };
        let bytes = copy_bytes(plan, c) as f64;
        let s = s as usize;
        if s == streams.len() {
            let mut route: Vec<usize> = stream_resources(cluster, &keys[s])
                .into_iter()
                .map(|r| {
                    *resource_ids.entry(r).or_insert_with(|| {
                        caps.push(capacity(cluster, r));
                        caps.len() - 1
                    })
                })
                .collect();
            route.sort_unstable();
            let pace = paces.get(&keys[s]).copied();
            let new_group = |route: Vec<usize>, groups: &mut Vec<Group>| {
                groups.push(Group {
                    slots: vec![0; route.len()],
                    resources: route,
                    pace,
                    virtual_bytes: 0.0,
                    at: 0.0,
                    active: BinaryHeap::new(),
                    first: f64::INFINITY,
                    rate: 0.0,
                    version: 0,
                    counted: 0.0,
                    bottleneck: NONE,
                    stamp: 0,
                });
                groups.len() - 1
            };
            // A paced stream is a group of its own.
            let g = match pace {
                Some(_) => new_group(route, &mut groups),
                None => *group_of
                    .entry(route.clone())
                    .or_insert_with(|| new_group(route, &mut groups)),
            };
            streams.push(Stream {
                bytes: 0.0,
                start: at,
                last_issue: at,
                group: g,
            });
        }
        streams[s].bytes += bytes;
        streams[s].last_issue = streams[s].last_issue.max(at.max(forwarded));
    }
    (streams, groups, caps)
}

/// Simulate some of a plan's copies (one round, or all of them).
///
/// Events are stream starts and stream ends. After each, only the rates that
/// can change are recomputed ([`Sharing::update`]), and each group's next end
/// sits in one heap, so an event costs about what it changes, not the number
/// of active streams.
fn simulate_copies(plan: &Plan, copies: &[&Copy]) -> SimReport {
    simulate_with(plan, copies, EXACT_WORK)
}

/// The busiest resource's bytes over its capacity: no schedule of these
/// streams ends sooner.
fn load_bound(streams: &[Stream], groups: &[Group], caps: &[f64]) -> f64 {
    let mut load = vec![0.0f64; caps.len()];
    for s in streams {
        for &r in &groups[s.group].resources {
            load[r] += s.bytes;
        }
    }
    load.iter().zip(caps).map(|(l, c)| l / c).fold(0.0, f64::max)
}

/// [`simulate_copies`], exact until `exact_work` group rates have been
/// refilled, then with batched re-sharing where re-sharing is widespread
/// (`exact_work` 0: batched from the first update, for tests).
fn simulate_with(plan: &Plan, copies: &[&Copy], exact_work: u64) -> SimReport {
    let (streams, mut groups, caps) = streams_of(plan, copies);
    let mut releases: Vec<usize> = (0..streams.len()).collect();
    releases.sort_by(|&a, &b| streams[a].start.total_cmp(&streams[b].start).then(a.cmp(&b)));
    let mut next_release = 0;
    let mut ends = Ends::new(groups.len());
    let mut sharing = Sharing::new(caps, groups.len());
    // Groups whose streams came or went and wait for the next re-sharing;
    // those of them that lost a stream at this event; streams waiting to
    // join. Then the groups and streams of this event that re-share now.
    let mut changed: Vec<usize> = Vec::new();
    let mut ended: Vec<usize> = Vec::new();
    let mut joining: Vec<usize> = Vec::new();
    let mut hot: Vec<usize> = Vec::new();
    let mut hot_joining: Vec<usize> = Vec::new();
    let mut makespan = 0.0f64;
    // Group rates refilled, and the active groups summed over updates.
    let mut work = 0u64;
    let mut active_sum = 0u64;
    // How long freed bandwidth may wait (0: re-share at every event), and
    // when the oldest wait began.
    let mut window = 0.0f64;
    let mut waiting_since: Option<f64> = None;
    loop {
        // The next event: a stream starts, a group's first stream ends, or
        // freed bandwidth has waited long enough.
        let next_end = ends.peek().map(|(t, _)| t);
        let next_start = releases.get(next_release).map(|&s| streams[s].start);
        let next_reshare = waiting_since.map(|t| t + window);
        let Some(now) = [next_end, next_start, next_reshare]
            .into_iter()
            .flatten()
            .reduce(f64::min)
        else {
            break;
        };
        // Changes that re-share at once (every change while exact), apart
        // from those that may wait for the next re-sharing.
        let due = window == 0.0 || next_reshare.is_some_and(|t| t <= now);
        while let Some((t, g)) = ends.peek() {
            if t > now {
                break;
            }
            ends.remove(g);
            let group = &mut groups[g];
            group.advance(now);
            let group_rate = group.rate;
            // The stream this event was due for ends now.
            let mut freed = 0.0;
            group.finish(|s| {
                makespan = makespan.max(now.max(streams[s].last_issue));
                freed += group_rate;
            });
            // Bandwidth that matters to a link is re-shared at once.
            let urgent = due
                || groups[g]
                    .resources
                    .iter()
                    .any(|&r| freed > SMALL_SHARE * sharing.filler.caps[r]);
            if urgent {
                hot.push(g);
            } else {
                changed.push(g);
                ended.push(g);
            }
        }
        while next_release < releases.len() && streams[releases[next_release]].start <= now {
            let s = releases[next_release];
            // A stream may wait where it would get a small share of a busy
            // link anyway (one of thousands of streams through a central
            // node's NIC: waiting only for idle links to be busy re-shared
            // at nearly every start, a minute at 16,384 GPUs).
            let g = streams[s].group;
            if due || !groups[g].resources.iter().any(|&r| sharing.crowded(r)) {
                hot_joining.push(s);
            } else {
                joining.push(s);
            }
            next_release += 1;
        }
        if due {
            hot.append(&mut changed);
            hot_joining.append(&mut joining);
        }
        // The groups that lost a stream and wait keep their rate until the
        // re-sharing (a change re-shared at once may re-share them sooner).
        for &g in &ended {
            match groups[g].next_finish() {
                Some(t) => ends.set(g, t),
                None => ends.remove(g),
            }
        }
        ended.clear();
        waiting_since = if changed.is_empty() && joining.is_empty() {
            None
        } else {
            waiting_since.or(Some(now))
        };
        if hot.is_empty() && hot_joining.is_empty() {
            continue;
        }
        // A new stream joins its group only now (before, it would overload
        // the group's links).
        for s in hot_joining.drain(..) {
            let g = streams[s].group;
            let group = &mut groups[g];
            group.advance(now);
            group.start(streams[s].bytes, s);
            hot.push(g);
        }
        let set = sharing.update(&mut groups, &hot, now);
        work += set.len() as u64;
        ends.set_all(&groups, &set);
        hot.clear();
        active_sum += sharing.active as u64;
        // Batch only where re-sharing is widespread (each update refills a
        // good share of the active groups, as in an all-to-all): where it
        // is local, batching saves little and makes each update bigger.
        let widespread = work * WIDESPREAD >= active_sum;
        if window == 0.0 && work > exact_work && (exact_work == 0 || widespread) {
            window = RESHARE_FRACTION * load_bound(&streams, &groups, &sharing.filler.caps);
            sharing.batched = true;
        }
    }
    if sharing.active > 0 {
        // Streams left with no rate (a resource rounded down to nothing):
        // never report a makespan that leaves bytes in flight.
        makespan = f64::INFINITY;
    }
    SimReport {
        makespan_s: makespan,
        messages: copies.len(),
        streams: streams.len(),
        reshare_s: window,
    }
}

/// The next end of each group, earliest first (ties by group): a binary
/// heap that holds one entry per group and moves it when its rate changes.
/// (A heap of events with stale entries left behind grew to millions of
/// entries where hundreds of groups share a link: most of a baseline's
/// simulation at 16,384 GPUs went to popping them.)
struct Ends {
    heap: Vec<(f64, usize)>,
    /// Where each group sits in `heap`, or `ABSENT`.
    at: Vec<usize>,
}

const ABSENT: usize = usize::MAX;

impl Ends {
    fn new(groups: usize) -> Ends {
        Ends {
            heap: Vec::new(),
            at: vec![ABSENT; groups],
        }
    }

    fn peek(&self) -> Option<(f64, usize)> {
        self.heap.first().copied()
    }

    fn less(a: (f64, usize), b: (f64, usize)) -> bool {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
    }

    /// Set (or move) a group's next end.
    fn set(&mut self, g: usize, t: f64) {
        let i = match self.at[g] {
            ABSENT => {
                self.heap.push((t, g));
                self.heap.len() - 1
            }
            i => {
                self.heap[i].0 = t;
                i
            }
        };
        self.at[g] = i;
        let i = self.up(i);
        self.down(i);
    }

    /// Set the next end of each group of `set` from its rate: one by one
    /// when they are few, by rebuilding the heap when they are many.
    fn set_all(&mut self, groups: &[Group], set: &[usize]) {
        if set.len() < 64 || set.len() * 4 < self.heap.len() {
            for &g in set {
                match groups[g].next_finish() {
                    Some(t) => self.set(g, t),
                    None => self.remove(g),
                }
            }
            return;
        }
        for &g in set {
            match (groups[g].next_finish(), self.at[g]) {
                (Some(t), ABSENT) => self.heap.push((t, g)),
                (Some(t), i) => self.heap[i].0 = t,
                (None, ABSENT) => {}
                (None, i) => {
                    self.heap[i].0 = f64::NAN; // dropped below
                    self.at[g] = ABSENT;
                }
            }
        }
        self.heap.retain(|e| !e.0.is_nan());
        for (i, e) in self.heap.iter().enumerate() {
            self.at[e.1] = i;
        }
        for i in (0..self.heap.len() / 2).rev() {
            self.down(i);
        }
    }

    /// Forget a group's next end, if it has one.
    fn remove(&mut self, g: usize) {
        let i = self.at[g];
        if i == ABSENT {
            return;
        }
        self.at[g] = ABSENT;
        let last = self.heap.pop().expect("a listed group is in the heap");
        if i < self.heap.len() {
            self.heap[i] = last;
            self.at[last.1] = i;
            let i = self.up(i);
            self.down(i);
        }
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.at[self.heap[i].1] = i;
        self.at[self.heap[j].1] = j;
    }

    fn up(&mut self, mut i: usize) -> usize {
        while i > 0 {
            let parent = (i - 1) / 2;
            if !Ends::less(self.heap[i], self.heap[parent]) {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
        i
    }

    fn down(&mut self, mut i: usize) -> usize {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.heap.len() && Ends::less(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < self.heap.len() && Ends::less(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                return i;
            }
            self.swap(i, m);
            i = m;
        }
    }
}

/// Max-min fair rates, kept up to date as streams come and go.
///
/// An allocation is the max-min fair one if and only if it is feasible and
/// every group has a bottleneck: its pace, or a saturated resource on which
/// no group gets more. Each group records one such bottleneck. After a
/// change, [`Sharing::update`] refills the changed groups and the groups
/// held by the resources they use (progressive filling over the capacity
/// the others leave), then checks the condition where it can have broken:
/// for the refilled groups, and for the groups held by a resource whose load
/// or largest rate moved. A group that fails joins the refilled set (with
/// whoever outpaces it), until none fails. The result is the allocation a
/// refill of everything gives, found by touching what moved.
struct Sharing {
    /// Active groups on each resource.
    users: Vec<Vec<usize>>,
    /// How many groups are active.
    active: usize,
    /// Load of each resource (sum of `Group::counted`), and how many edits
    /// it has had since it was last summed afresh.
    load: Vec<f64>,
    edits: Vec<u32>,
    /// Largest rate on each resource: a lazy max-heap of (rate, group, version).
    tops: Vec<BinaryHeap<(OrdF64, usize, u32)>>,
    /// Groups whose recorded bottleneck is each resource: lazy (group, stamp).
    held: Vec<Vec<(usize, u32)>>,
    /// Scratch flags per group: in the refilled set; already checked.
    in_set: Vec<bool>,
    seen: Vec<bool>,
    /// Scratch flags per resource: its held groups already gathered.
    scanned: Vec<bool>,
    /// Whether re-sharing is batched (then a set that grows to a good
    /// share of the active groups is refilled all at once).
    batched: bool,
    filler: Filler,
}

/// `Group::bottleneck` of a group held by its pace, and of one with none.
const PACE: usize = usize::MAX - 1;
const NONE: usize = usize::MAX;

/// Batching, once the refilled set holds this share (1/EVERYTHING) of the
/// active groups, everything is refilled at once.
const EVERYTHING: usize = 4;

/// Below this many active groups the set grows pass by pass whatever its
/// share (cheap there).
const EVERYTHING_FROM: usize = 1024;

/// A resource's summed load is refreshed after this many edits, and at
/// least as many as it has users (see `Sharing::count`), so that rounding
/// cannot drift.
const RESUM: u32 = 64;

impl Sharing {
    fn new(caps: Vec<f64>, groups: usize) -> Sharing {
        let n = caps.len();
        Sharing {
            filler: Filler::new(caps),
            users: vec![Vec::new(); n],
            active: 0,
            load: vec![0.0; n],
            edits: vec![0; n],
            tops: vec![BinaryHeap::new(); n],
            held: vec![Vec::new(); n],
            in_set: vec![false; groups],
            seen: vec![false; groups],
            scanned: vec![false; n],
            batched: false,
        }
    }

    /// Put a group on its resources' user lists, or take it off.
    fn list(&mut self, groups: &mut [Group], g: usize, on: bool) {
        if on {
            self.active += 1;
        } else {
            self.active -= 1;
        }
        for k in 0..groups[g].resources.len() {
            let r = groups[g].resources[k];
            if on {
                groups[g].slots[k] = self.users[r].len();
                self.users[r].push(g);
            } else {
                let slot = groups[g].slots[k];
                self.users[r].swap_remove(slot);
                if let Some(&moved) = self.users[r].get(slot) {
                    let j = groups[moved].resources.iter().position(|&q| q == r).expect("listed");
                    groups[moved].slots[j] = slot;
                }
            }
        }
    }

    fn is_listed(&self, groups: &[Group], g: usize) -> bool {
        let group = &groups[g];
        let (Some(&r), Some(&slot)) = (group.resources.first(), group.slots.first()) else {
            return false;
        };
        self.users[r].get(slot) == Some(&g)
    }

    /// Take a group's load off its resources, or put it back.
    fn count(&mut self, groups: &mut [Group], g: usize, on: bool) {
        let counted = if on { groups[g].streams() * groups[g].rate } else { 0.0 };
        let delta = counted - groups[g].counted;
        groups[g].counted = counted;
        if delta == 0.0 {
            return;
        }
        for &r in &groups[g].resources {
            self.edits[r] += 1;
            // At least as many edits as users between sums, so that a
            // resource thousands of groups share (a central node's NIC,
            // every one of them refilled at each event) is summed in time
            // proportional to its edits, not to edits times users.
            if self.edits[r] as usize >= (RESUM as usize).max(self.users[r].len()) {
                self.edits[r] = 0;
                self.load[r] = self.users[r].iter().map(|&u| groups[u].counted).sum();
            } else {
                self.load[r] += delta;
            }
        }
    }

    /// The largest rate of the active groups on a resource.
    fn top(&mut self, groups: &[Group], r: usize) -> f64 {
        self.compact_top(groups, r);
        let heap = &mut self.tops[r];
        while let Some(&(OrdF64(rate), u, v)) = heap.peek() {
            if groups[u].version == v && !groups[u].active.is_empty() {
                return rate;
            }
            heap.pop();
        }
        0.0
    }

    /// Rebuild a resource's heap of rates from its active groups once stale
    /// entries outnumber them: amortized, it costs a few operations per push,
    /// and it bounds the heap (left alone between reads, the heaps of paced
    /// plans at 16,384 GPUs grew to gigabytes).
    fn compact_top(&mut self, groups: &[Group], r: usize) {
        if self.tops[r].len() > 4 * self.users[r].len() + 32 {
            self.tops[r] = self.users[r]
                .iter()
                .map(|&u| (OrdF64(groups[u].rate), u, groups[u].version))
                .collect();
        }
    }

    fn saturated(&self, r: usize) -> bool {
        self.load[r] >= self.filler.caps[r] * (1.0 - TOLERANCE)
    }

    /// Saturated and shared by so many groups that one more would get less
    /// than [`SMALL_SHARE`] of it.
    fn crowded(&self, r: usize) -> bool {
        self.saturated(r) && self.users[r].len() as f64 * SMALL_SHARE >= 1.0
    }

    /// Whether a group is held (bottlenecked) by a resource.
    fn holds(&mut self, groups: &[Group], g: usize, r: usize) -> bool {
        self.saturated(r) && groups[g].rate >= self.top(groups, r) * (1.0 - TOLERANCE)
    }

    /// Record a group's bottleneck, if it has one; false if it has none.
    fn rebind(&mut self, groups: &mut [Group], g: usize) -> bool {
        let group = &groups[g];
        if group.pace.is_some_and(|p| group.rate >= p * (1.0 - TOLERANCE)) {
            groups[g].bottleneck = PACE;
            return true;
        }
        let first = groups[g].bottleneck;
        if first < self.filler.caps.len() && self.holds(groups, g, first) {
            return true;
        }
        for k in 0..groups[g].resources.len() {
            let r = groups[g].resources[k];
            if r != first && self.holds(groups, g, r) {
                groups[g].stamp = groups[g].stamp.wrapping_add(1);
                self.held[r].push((g, groups[g].stamp));
                groups[g].bottleneck = r;
                return true;
            }
        }
        false
    }

    /// Drop the entries of `held[r]` that no longer hold: what is left are
    /// the groups the resource holds.
    fn prune_held(&mut self, groups: &[Group], r: usize) {
        self.held[r].retain(|&(g, stamp)| {
            groups[g].stamp == stamp && groups[g].bottleneck == r && !groups[g].active.is_empty()
        });
    }

    fn enter(&mut self, groups: &mut [Group], g: usize, now: f64, members: &mut Vec<usize>) {
        if !self.in_set[g] && !groups[g].active.is_empty() {
            self.in_set[g] = true;
            groups[g].advance(now);
            members.push(g);
        }
    }

    fn enter_all(&mut self, groups: &mut [Group], now: f64, members: &mut Vec<usize>) {
        for r in 0..self.users.len() {
            for j in 0..self.users[r].len() {
                let h = self.users[r][j];
                self.enter(groups, h, now, members);
            }
        }
    }

    /// Refill every active group from scratch and rebuild what the
    /// incremental updates keep (loads, largest rates, held groups): the
    /// fair allocation by construction, in one pass over the routes.
    fn refill_all(&mut self, groups: &mut [Group], now: f64, members: &mut Vec<usize>) {
        self.enter_all(groups, now, members);
        self.filler.rates(groups, members, |_, _| 0.0);
        for &g in members.iter() {
            let group = &mut groups[g];
            group.counted = group.streams() * group.rate;
            group.version = group.version.wrapping_add(1);
            group.stamp = group.stamp.wrapping_add(1);
        }
        let nres = self.users.len();
        for r in 0..nres {
            let users = &self.users[r];
            self.load[r] = users.iter().map(|&u| groups[u].counted).sum();
            self.edits[r] = 0;
            self.tops[r] = users
                .iter()
                .map(|&u| (OrdF64(groups[u].rate), u, groups[u].version))
                .collect();
            self.held[r].clear();
        }
        for &g in members.iter() {
            let b = groups[g].bottleneck;
            if b < nres {
                self.held[b].push((g, groups[g].stamp));
            }
        }
    }

    /// Bring the rates up to date after the streams of `changed` groups came
    /// or went at time `now`. Returns the groups whose rate was set (each
    /// served up to `now` first), in a deterministic order.
    fn update(&mut self, groups: &mut [Group], changed: &[usize], now: f64) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        let mut members: Vec<usize> = Vec::new();
        let mut hot: Vec<usize> = Vec::new();
        for &g in changed {
            if self.seen[g] {
                continue;
            }
            self.seen[g] = true;
            hot.push(g);
            groups[g].advance(now);
            self.count(groups, g, false);
            let listed = self.is_listed(groups, g);
            let active = !groups[g].active.is_empty();
            if active && !listed {
                self.list(groups, g, true);
            } else if !active && listed {
                self.list(groups, g, false);
                groups[g].rate = 0.0;
                groups[g].bottleneck = NONE;
                groups[g].version = groups[g].version.wrapping_add(1);
                out.push(g); // its stale end event must go
            }
        }
        // The changed groups, and the groups held where they run.
        for &g in &hot {
            self.seen[g] = false;
            self.enter(groups, g, now, &mut members);
            for k in 0..groups[g].resources.len() {
                let r = groups[g].resources[k];
                self.prune_held(groups, r);
                for j in 0..self.held[r].len() {
                    let h = self.held[r][j].0;
                    self.enter(groups, h, now, &mut members);
                }
            }
        }
        let mut done = 0;
        while done < members.len() {
            if self.batched && self.active >= EVERYTHING_FROM && members.len() >= self.active / EVERYTHING {
                // Most rates move (an all-to-all): one refill of everything
                // costs less than growing the set pass by pass.
                self.refill_all(groups, now, &mut members);
                break;
            }
            done = members.len();
            self.fill(groups, &members);
            // Where the condition can have broken: the members, and the
            // groups held by a resource the members use (each resource
            // scanned once: hundreds of members may share one NIC).
            let mut check: Vec<usize> = Vec::new();
            let mut scanned: Vec<usize> = Vec::new();
            for &g in &members {
                for k in 0..groups[g].resources.len() {
                    let r = groups[g].resources[k];
                    if self.scanned[r] {
                        continue;
                    }
                    self.scanned[r] = true;
                    scanned.push(r);
                    self.prune_held(groups, r);
                    for &(h, _) in &self.held[r] {
                        if !self.in_set[h] && !self.seen[h] {
                            self.seen[h] = true;
                            check.push(h);
                        }
                    }
                }
            }
            for &h in &check {
                self.seen[h] = false;
            }
            for r in scanned {
                self.scanned[r] = false;
            }
            let unfair: Vec<usize> = members
                .iter()
                .copied()
                .chain(check)
                .filter(|&g| !self.rebind(groups, g))
                .collect();
            for &g in &unfair {
                if !self.in_set[g] {
                    self.enter(groups, g, now, &mut members);
                    continue;
                }
                // A member outpaced on its resources: refill who outpaces it.
                for k in 0..groups[g].resources.len() {
                    let r = groups[g].resources[k];
                    for j in 0..self.users[r].len() {
                        let u = self.users[r][j];
                        if groups[u].rate > groups[g].rate * (1.0 + TOLERANCE) {
                            self.enter(groups, u, now, &mut members);
                        }
                    }
                }
            }
            if done == members.len() && !unfair.is_empty() && members.len() < self.active {
                // Unfair by rounding alone: refill everything.
                self.enter_all(groups, now, &mut members);
            }
        }
        for &g in &members {
            self.in_set[g] = false;
        }
        out.extend(members);
        out.sort_unstable();
        out
    }

    /// Progressive filling of `members` (each served up to now by
    /// [`Sharing::enter`]) over what the other groups leave.
    fn fill(&mut self, groups: &mut [Group], members: &[usize]) {
        for &g in members {
            self.count(groups, g, false);
        }
        let load = &self.load;
        self.filler.rates(groups, members, |r, _| load[r]);
        for &g in members {
            self.count(groups, g, true);
            let group = &mut groups[g];
            group.version = group.version.wrapping_add(1);
            let entry = (OrdF64(group.rate), g, group.version);
            for k in 0..groups[g].resources.len() {
                let r = groups[g].resources[k];
                self.tops[r].push(entry);
                self.compact_top(groups, r);
            }
            let group = &mut groups[g];
            let b = group.bottleneck;
            if b < self.filler.caps.len() {
                group.stamp = group.stamp.wrapping_add(1);
                self.held[b].push((g, group.stamp));
            }
        }
    }
}

/// Max-min fair rates by progressive filling: repeatedly saturate the
/// resource with the smallest fair share and freeze the groups through it.
/// Dense arrays and a lazy min-heap keep one call near-linear.
struct Filler {
    caps: Vec<f64>,
    left: Vec<f64>,
    count: Vec<f64>,
    users: Vec<Vec<usize>>,
    touched: Vec<usize>,
}

impl Filler {
    fn new(caps: Vec<f64>) -> Filler {
        let n = caps.len();
        Filler {
            caps,
            left: vec![0.0; n],
            count: vec![0.0; n],
            users: vec![Vec::new(); n],
            touched: Vec::new(),
        }
    }

    /// Fill the `active` groups; `fixed(r)` is the load other groups keep on
    /// resource `r`.
    fn rates(&mut self, groups: &mut [Group], active: &[usize], fixed: impl Fn(usize, &[Group]) -> f64) {
        for &r in &self.touched {
            self.count[r] = 0.0;
            self.users[r].clear();
        }
        self.touched.clear();
        for &gi in active {
            let n = groups[gi].streams();
            groups[gi].rate = -1.0;
            for k in 0..groups[gi].resources.len() {
                let r = groups[gi].resources[k];
                if self.users[r].is_empty() {
                    self.touched.push(r);
                    self.left[r] = self.caps[r];
                }
                self.count[r] += n;
                self.users[r].push(gi);
            }
        }
        for &r in &self.touched {
            self.left[r] = (self.left[r] - fixed(r, groups)).max(0.0);
        }
        let mut heap: BinaryHeap<Reverse<(OrdF64, usize)>> = self
            .touched
            .iter()
            .map(|&r| Reverse((OrdF64(self.left[r] / self.count[r]), r)))
            .collect();
        // A paced group's pace is one more capacity, its own: entry nres + gi.
        let nres = self.caps.len();
        for &gi in active {
            if let Some(p) = groups[gi].pace {
                heap.push(Reverse((OrdF64(p), nres + gi)));
            }
        }
        // Once every group is frozen the entries left can freeze nothing:
        // stop (a central node's NIC shared by 4,000 groups froze them all
        // at its first entry, then popped the other 4,000 resources').
        let mut unfrozen = active.len();
        while unfrozen > 0 {
            let Some(Reverse((OrdF64(share), r))) = heap.pop() else {
                break;
            };
            if r >= nres {
                let gi = r - nres;
                if groups[gi].rate < 0.0 {
                    self.freeze(groups, gi, share, None, &mut heap);
                    unfrozen -= 1;
                }
                continue;
            }
            if self.count[r] <= 0.0 || share != self.left[r] / self.count[r] {
                continue; // stale entry, or nothing left to freeze here
            }
            let share = share.max(0.0);
            let users = std::mem::take(&mut self.users[r]);
            for &gi in &users {
                if groups[gi].rate < 0.0 {
                    self.freeze(groups, gi, share, Some(r), &mut heap);
                    unfrozen -= 1;
                }
            }
            self.users[r] = users;
        }
    }

    /// Fix a group's rate and take it out of its resources' remaining capacity.
    fn freeze(
        &mut self,
        groups: &mut [Group],
        gi: usize,
        share: f64,
        skip: Option<usize>,
        heap: &mut BinaryHeap<Reverse<(OrdF64, usize)>>,
    ) {
        groups[gi].rate = share;
        groups[gi].bottleneck = skip.unwrap_or(PACE);
        let n = groups[gi].active.len() as f64;
        for &q in &groups[gi].resources {
            self.left[q] -= share * n;
            self.count[q] -= n;
            if Some(q) != skip && self.count[q] > 0.0 {
                heap.push(Reverse((OrdF64(self.left[q] / self.count[q]), q)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenplan_ptc::{
        Buffer, Cluster, ClusterData, Copy, DType, Layout, Piece, Plan, Problem, Region, Shard, TensorSpec,
    };

    use std::cmp::Reverse;

    use proptest::prelude::*;

    use super::simulate;
    use crate::OrdF64;

    /// One u8 tensor of `n` elements per source device; devices 4.. receive.
    fn plan(copies: &[(u32, u32, Option<u32>)], n: u64, latency_s: f64) -> Plan {
        let sized: Vec<_> = copies.iter().map(|&(s, d, v)| (s, d, v, n)).collect();
        plan_sized(&sized, latency_s)
    }

    /// Copy i moves tensor i, of its own size, from its source to its destination.
    fn plan_sized(copies: &[(u32, u32, Option<u32>, u64)], latency_s: f64) -> Plan {
        plan_on("2x4", copies, latency_s)
    }

    /// Copies of their own tensors on a cluster (NVLink 10x the NIC).
    fn plan_on(cluster: &str, copies: &[(u32, u32, Option<u32>, u64)], latency_s: f64) -> Plan {
        let tensors: Arc<[TensorSpec]> = copies
            .iter()
            .enumerate()
            .map(|(i, c)| TensorSpec::new(format!("t{i}"), DType::U8, [c.3]))
            .collect();
        let buf = |i: usize| {
            let n = copies[i].3;
            Buffer {
                name: format!("t{i}"),
                dtype: DType::U8,
                len: n,
                pieces: vec![Piece {
                    tensor: i as u32,
                    region: Region::full(&[n]),
                    offset: 0,
                }],
                partial: false,
            }
        };
        // One shard per device, holding the tensors placed on it.
        let layout = |devs: Vec<u32>| {
            let mut on: std::collections::BTreeMap<u32, Vec<Buffer>> = Default::default();
            for (i, &d) in devs.iter().enumerate() {
                on.entry(d).or_default().push(buf(i));
            }
            let shards = on
                .into_iter()
                .map(|(d, buffers)| Shard {
                    name: format!("s{d}"),
                    devices: vec![d],
                    buffers,
                })
                .collect();
            Layout::new(tensors.clone(), shards).unwrap()
        };
        let mut data: ClusterData = Cluster::parse(cluster).unwrap().data().clone();
        data.latency_s = latency_s;
        data.bandwidth.intra_node = 100.0;
        data.bandwidth.nic = 10.0;
        let problem = Problem::new(
            layout(copies.iter().map(|c| c.0).collect()),
            layout(copies.iter().map(|c| c.1).collect()),
            Cluster::new(data).unwrap(),
        )
        .unwrap();
        let copies = copies
            .iter()
            .enumerate()
            .map(|(i, &(src, dst, via, n))| Copy {
                src,
                dst,
                via: via.into_iter().collect(),
                tensor: i as u32,
                region: Region::full(&[n]),
                // The destination's buffers are its tensors in copy order.
                buffer: copies[..i].iter().filter(|c| c.1 == dst).count() as u32,
                offset: 0,
                reduce: false,
                round: 0,
                fanout: Vec::new(),
            })
            .collect();
        Plan {
            planner: "test".into(),
            problem,
            copies,
            fills: vec![],
            paces: vec![],
        }
    }

    /// The simulation as first written: every event refills every active
    /// group from scratch. Slow and plainly right; the incremental
    /// simulator must agree with it.
    fn reference(plan: &Plan) -> f64 {
        let copies: Vec<&Copy> = plan.copies.iter().collect();
        let (streams, mut groups, caps) = super::streams_of(plan, &copies);
        let mut releases: Vec<usize> = (0..streams.len()).collect();
        releases.sort_by(|&a, &b| streams[a].start.total_cmp(&streams[b].start).then(a.cmp(&b)));
        let (mut next_release, mut now, mut makespan) = (0, 0.0f64, 0.0f64);
        let mut active: Vec<usize> = Vec::new();
        let mut filler = super::Filler::new(caps);
        loop {
            while next_release < releases.len() && streams[releases[next_release]].start <= now {
                let s = releases[next_release];
                next_release += 1;
                let g = &mut groups[streams[s].group];
                if g.active.is_empty() {
                    active.push(streams[s].group);
                }
                g.active.push(Reverse((OrdF64(g.virtual_bytes + streams[s].bytes), s)));
            }
            if active.is_empty() {
                match releases.get(next_release) {
                    Some(&s) => {
                        now = streams[s].start;
                        continue;
                    }
                    None => break,
                }
            }
            filler.rates(&mut groups, &active, |_, _| 0.0);
            let mut dt = f64::INFINITY;
            for &gi in &active {
                let g = &groups[gi];
                let Reverse((OrdF64(fin), _)) = *g.active.peek().unwrap();
                dt = dt.min((fin - g.virtual_bytes).max(0.0) / g.rate);
            }
            if let Some(&s) = releases.get(next_release) {
                dt = dt.min(streams[s].start - now);
            }
            now += dt;
            active.retain(|&gi| {
                let g = &mut groups[gi];
                g.virtual_bytes += g.rate * dt;
                while let Some(&Reverse((OrdF64(fin), s))) = g.active.peek() {
                    if fin - g.virtual_bytes > 1e-9 * fin.max(1.0) {
                        break;
                    }
                    g.active.pop();
                    makespan = makespan.max(now.max(streams[s].last_issue));
                }
                !g.active.is_empty()
            });
        }
        makespan
    }

    fn agrees_with_reference(plan: &Plan) {
        let fast = simulate(plan).makespan_s;
        let slow = reference(plan);
        assert!(
            (fast - slow).abs() <= 1e-9 * slow.max(1e-12),
            "incremental {fast} vs reference {slow}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random copies on two nodes of four devices (NVLink 10x the NIC),
        /// relayed or not, some paced, with and without message latency.
        #[test]
        fn incremental_rates_match_refilling_everything(
            copies in prop::collection::vec((0u32..8, 0u32..8, prop::option::of(0u32..8), 1u64..5000), 1..40),
            latency in prop::sample::select(vec![0.0, 0.5, 3.0]),
            paced in prop::collection::vec((0usize..40, 1u32..40), 0..4),
        ) {
            let copies: Vec<_> = copies
                .into_iter()
                .map(|(s, d, v, n)| (s, d, v.filter(|&v| v != s && v != d && s != d), n))
                .collect();
            let mut p = plan_sized(&copies, latency);
            for (i, rate) in paced {
                if let Some(c) = p.copies.get(i) {
                    let key = c.stream();
                    p.paces.push(tenplan_ptc::Pace { src: key.src, via: key.via, dst: key.dst, fanout: key.fanout, bytes_per_s: f64::from(rate) });
                }
            }
            p.paces.sort_by(|a, b| (a.src, a.dst, &a.via).cmp(&(b.src, b.dst, &b.via)));
            p.paces.dedup_by(|a, b| (a.src, a.dst, &a.via) == (b.src, b.dst, &b.via));
            agrees_with_reference(&p);
        }
    }

    /// An all-to-all between 40 and 40 single-device nodes: 1,600 streams
    /// on routes of their own, and most rates move at every end (the exact
    /// simulation refills everything at once there). Exact, it agrees with
    /// the reference; batched, it stays within 0.5% of it.
    #[test]
    fn an_all_to_all_is_exact_and_batches_close_to_exact() {
        let copies: Vec<_> = (0..40u32)
            .flat_map(|s| (0..40u32).map(move |d| (s, 40 + d, None, 1000 + u64::from((s * 7 + d * 13) % 97) * 10)))
            .collect();
        let plan = plan_on("80x1", &copies, 0.0);
        let all: Vec<&Copy> = plan.copies.iter().collect();
        let slow = reference(&plan);
        let exact = super::simulate_with(&plan, &all, u64::MAX);
        assert_eq!(exact.reshare_s, 0.0);
        assert!(
            (exact.makespan_s - slow).abs() <= 1e-9 * slow,
            "{} vs {slow}",
            exact.makespan_s
        );
        let batched = super::simulate_with(&plan, &all, 0);
        assert!(batched.reshare_s > 0.0);
        let ratio = batched.makespan_s / slow;
        assert!(
            (0.999..=1.005).contains(&ratio),
            "batched {} vs exact {slow}",
            batched.makespan_s
        );
    }

    /// Every baseline's plan of a real reshard, and `lp`'s, `least-loaded`'s
    /// and `hotspa`'s of random problems (failures, storage, uneven layouts).
    fn baseline_plans() -> Vec<Plan> {
        let mut plans = Vec::new();
        let problem = crate::gpt3_reshard();
        for name in ["lp", "tenplex", "central", "least-loaded", "hotspa"] {
            plans.push(crate::planner(name).unwrap().plan(&problem).unwrap());
        }
        for seed in 0..20 {
            let problem = tenplan_proofs::random_problem(seed);
            for name in ["lp", "least-loaded", "hotspa"] {
                if let Ok(plan) = crate::planner(name).unwrap().plan(&problem) {
                    plans.push(plan);
                }
            }
        }
        plans
    }

    /// Batched re-sharing on the baseline plans: within 0.5% of exact.
    #[test]
    fn batched_resharing_stays_close_to_exact_on_baseline_plans() {
        for plan in &baseline_plans() {
            let all: Vec<&Copy> = plan.copies.iter().collect();
            let exact = super::simulate_with(plan, &all, u64::MAX).makespan_s;
            let batched = super::simulate_with(plan, &all, 0).makespan_s;
            let ratio = batched / exact;
            assert!(
                (0.999..=1.005).contains(&ratio),
                "{}: batched {batched} vs exact {exact}",
                plan.planner
            );
        }
    }

    #[test]
    fn incremental_rates_match_refilling_everything_on_baseline_plans() {
        for plan in &baseline_plans() {
            agrees_with_reference(plan);
        }
    }

    #[test]
    fn one_copy_takes_bytes_over_bandwidth_plus_latency() {
        let r = simulate(&plan(&[(0, 1, None)], 1000, 0.5));
        assert!((r.makespan_s - (0.5 + 10.0)).abs() < 1e-9, "{}", r.makespan_s);
    }

    #[test]
    fn flows_through_one_nic_share_it() {
        // Devices 0 and 1 share node 0's NIC towards node 1: 2000 B at 10 B/s.
        let r = simulate(&plan(&[(0, 4, None), (1, 5, None)], 1000, 0.0));
        assert!((r.makespan_s - 200.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn max_min_gives_leftover_capacity_to_unconstrained_flows() {
        // 0->4 crosses the NIC (10 B/s); 1->2 uses NVLink alone (100 B/s).
        let r = simulate(&plan(&[(0, 4, None), (1, 2, None)], 1000, 0.0));
        assert!((r.makespan_s - 100.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn a_pace_caps_its_stream() {
        let mut p = plan(&[(0, 1, None)], 1000, 0.0);
        p.paces = vec![tenplan_ptc::Pace {
            src: 0,
            via: vec![],
            dst: 1,
            fanout: vec![],
            bytes_per_s: 2.0,
        }];
        let r = simulate(&p);
        assert!((r.makespan_s - 500.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn oversubscribed_paces_fall_back_to_fair_sharing() {
        // Both paced at the NIC's full 10 B/s: they get 5 B/s each.
        let mut p = plan(&[(0, 4, None), (1, 5, None)], 1000, 0.0);
        p.paces = [(0, 4), (1, 5)]
            .iter()
            .map(|&(src, dst)| tenplan_ptc::Pace {
                src,
                via: vec![],
                dst,
                fanout: vec![],
                bytes_per_s: 10.0,
            })
            .collect();
        let r = simulate(&p);
        assert!((r.makespan_s - 200.0).abs() < 1e-6, "{}", r.makespan_s);
    }

    #[test]
    fn relays_use_both_hops_at_once() {
        // 0 -> 1 -> 5: NVLink then the NIC, pipelined: the NIC bounds it.
        let r = simulate(&plan(&[(0, 5, Some(1))], 1000, 0.0));
        assert!((r.makespan_s - 100.0).abs() < 1e-6, "{}", r.makespan_s);
        assert_eq!(r.streams, 1);
    }
}
