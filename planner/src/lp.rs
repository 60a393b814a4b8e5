//! The optimal planner: a linear program over the sub-tensor transfer graph,
//! solved with HiGHS, with a certified lower bound.
//!
//! 1. Fragments with the same destination and the same set of live holders
//!    form one commodity, so the LP's size follows the number of replica
//!    groups, not the number of tensors.
//! 2. Phase 1 minimises the makespan `T`: variables `x[c,s]` are the fraction of
//!    commodity `c` sent by holder `s`, `Σ_s x[c,s] = 1`, and every
//!    resource's load is at most `capacity · T`. Bytes are divisible, so the
//!    LP is exact for the cost model. Phase 2 keeps `T` and minimises
//!    traffic (local copies free, intra-node cheaper than cross-node).
//! 3. The lower bound does not trust the solver: it is recomputed by weak
//!    duality from the phase-1 resource prices (see [`certified_bound`]),
//!    over every route a plan may take, relays included.
//! 4. Fragments are split among their sources to match the LP's byte totals
//!    at element granularity (a flat range of a box is at most 2·ndim−1 boxes).

use std::collections::BTreeMap;

use good_lp::{highs, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use tenplan_ptc::{Cluster, Copy, DeviceId, Plan, Problem};

use crate::cost::{capacity, hop, Resource};
use crate::intersect::{fragments, Fragment};
use crate::OrdF64;
use crate::{Error, LowerBound, Planner, Result, SolverFailure};

/// Units of one LP instance: bytes are counted in units of the largest
/// commodity and time in the time that commodity takes on the fastest link,
/// so that every coefficient is near 1 whatever the problem's size.
#[derive(Clone, Copy, Debug)]
struct Units {
    bytes: f64,
    seconds: f64,
}

/// Fragments that share a destination and a set of live holders.
#[derive(Clone, Debug)]
pub struct Commodity {
    /// Destination device.
    pub dst: DeviceId,
    /// Live holders, in holder order.
    pub holders: Vec<DeviceId>,
    /// Total bytes.
    pub bytes: u64,
    /// Indices of its fragments.
    pub fragments: Vec<usize>,
}

/// Group fragments into commodities, in order of first appearance.
pub fn commodities(frags: &[Fragment]) -> Vec<Commodity> {
    let mut index: BTreeMap<(DeviceId, &[DeviceId]), usize> = BTreeMap::new();
    let mut out: Vec<Commodity> = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        let c = *index.entry((f.dst, &f.holders)).or_insert_with(|| {
            out.push(Commodity {
                dst: f.dst,
                holders: f.holders.clone(),
                bytes: 0,
                fragments: Vec::new(),
            });
            out.len() - 1
        });
        out[c].bytes += f.bytes;
        out[c].fragments.push(i);
    }
    out
}

/// Solver settings of the LP planner.
#[derive(Clone, Debug, PartialEq)]
pub struct LpPlanner {
    threads: u32,
    time_limit_s: Option<f64>,
    ipm: bool,
    placement: Placement,
    relays: bool,
}

/// Whether the planner may choose which device runs which target rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// Keep the target layout's rank-to-device assignment.
    #[default]
    Fixed,
    /// Re-assign target ranks among the target's devices to cut traffic
    /// (an assignment problem, solved exactly); the plan carries the chosen layout.
    Optimize,
}

/// Builder for [`LpPlanner`].
#[derive(Clone, Debug)]
pub struct LpPlannerBuilder {
    planner: LpPlanner,
}

impl Default for LpPlanner {
    fn default() -> Self {
        LpPlanner {
            threads: 1,
            time_limit_s: None,
            ipm: true,
            placement: Placement::Fixed,
            relays: true,
        }
    }
}

impl LpPlannerBuilder {
    /// HiGHS threads (default 1, which keeps plans deterministic).
    pub fn threads(mut self, threads: u32) -> Self {
        self.planner.threads = threads.max(1);
        self
    }

    /// Give up after this many seconds of solving (default: no limit).
    pub fn time_limit_s(mut self, seconds: f64) -> Self {
        self.planner.time_limit_s = Some(seconds);
        self
    }

    /// Use the simplex method instead of the interior-point method (IPM is
    /// the default: 7–40× faster on these min-max LPs).
    pub fn simplex(mut self) -> Self {
        self.planner.ipm = false;
        self
    }

    /// Whether copies may be relayed through another device of the source's
    /// or the destination's node (default: yes).
    pub fn relays(mut self, relays: bool) -> Self {
        self.planner.relays = relays;
        self
    }

    /// Whether target ranks may move between the target's devices.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.planner.placement = placement;
        self
    }

    /// The planner.
    pub fn build(self) -> LpPlanner {
        self.planner
    }
}

/// The LP's answer: the byte split and the certified bound.
#[derive(Clone, Debug)]
pub struct LpSolution {
    /// Makespan of the split under the cost model (max resource load), in seconds.
    pub objective_s: f64,
    /// The paths of each commodity the LP considered.
    pub paths: Vec<Vec<Path>>,
    /// Bytes of each commodity sent along each of its paths.
    pub split: Vec<Vec<u64>>,
    /// Bound certified from the phase-1 prices (`None` when only the plan was asked for).
    pub bound: Option<LowerBound>,
}

/// Which parts of the LP to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phases {
    /// Phase 1 and the certified bound (no plan).
    BoundOnly,
    /// Phases 1 and 2 (a plan, no bound).
    PlanOnly,
    /// Everything.
    Both,
}

/// What a row of the LP limits: a link of the cost model, or a device's
/// time spent issuing messages (each costs the cluster's latency, one at a
/// time). Issue time is a heuristic that keeps plans from shattering into
/// many small messages; only links enter the certified bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Link(Resource),
    Issue(DeviceId),
}

struct Resources {
    ids: BTreeMap<Row, usize>,
    list: Vec<Row>,
}

impl Resources {
    fn id(&mut self, r: Row) -> usize {
        *self.ids.entry(r).or_insert_with(|| {
            self.list.push(r);
            self.list.len() - 1
        })
    }
}

/// Rounds of column generation for relayed paths.
const MAX_RELAY_ROUNDS: usize = 6;

/// One way to deliver a commodity: from a holder, directly or relayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    /// The holder that sends.
    pub src: DeviceId,
    /// The devices that forward, in order (empty: direct).
    pub via: Vec<DeviceId>,
}

impl Path {
    /// The devices the data visits on its way to `dst`.
    fn stops(&self, dst: DeviceId) -> Vec<DeviceId> {
        std::iter::once(self.src)
            .chain(self.via.iter().copied())
            .chain(std::iter::once(dst))
            .collect()
    }
}

/// The cheapest path from `src` to `dst` on another node under row prices
/// `price` (`None` for rows the LP does not have yet, which cost nothing).
///
/// Under the cost model a relay on a third node only adds NIC traffic, and a
/// second intra-node hop only adds link traffic, so the cheapest route has at
/// most two relays: a peer on the source's node (to use its NIC) and a peer
/// on the destination's node. Their costs separate, so each side is chosen
/// on its own in O(devices per node).
fn cheapest_relay_path(
    cluster: &Cluster,
    src: DeviceId,
    dst: DeviceId,
    bytes: f64,
    issue: f64,
    price: &dyn Fn(Row) -> f64,
) -> (f64, Path) {
    let g = cluster.gpus_per_node();
    let link = |r: Resource| price(Row::Link(r)) * bytes;
    let send_issue = |d: DeviceId| price(Row::Issue(d)) * issue;
    // Source side: leave the node through src's own NIC, or through a peer's.
    let mut out = (link(Resource::NicOut(cluster.nic_of(src))), src);
    let node = cluster.node_of(src);
    for v in (node * g..(node + 1) * g).filter(|&v| v != src && cluster.is_live(v)) {
        let c = link(Resource::Send(src))
            + link(Resource::Recv(v))
            + send_issue(v)
            + link(Resource::NicOut(cluster.nic_of(v)));
        if c < out.0 {
            out = (c, v);
        }
    }
    // Destination side: enter through dst's own NIC, or through a peer's.
    let mut inn = (link(Resource::NicIn(cluster.nic_of(dst))), dst);
    let node = cluster.node_of(dst);
    for v in (node * g..(node + 1) * g).filter(|&v| v != dst && cluster.is_live(v)) {
        let c = link(Resource::NicIn(cluster.nic_of(v)))
            + send_issue(v)
            + link(Resource::Send(v))
            + link(Resource::Recv(dst));
        if c < inn.0 {
            inn = (c, v);
        }
    }
    let via: Vec<DeviceId> = [out.1, inn.1].into_iter().filter(|&v| v != src && v != dst).collect();
    (send_issue(src) + out.0 + inn.0, Path { src, via })
}

/// The rows a path loads, for a whole commodity.
fn route_of(cluster: &Cluster, c: &Commodity, p: &Path, units: Units, res: &mut Resources) -> Route {
    let bytes = c.bytes as f64 / units.bytes;
    let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
    let stops = p.stops(c.dst);
    let hops: Vec<(DeviceId, DeviceId)> = stops.windows(2).map(|w| (w[0], w[1])).collect();
    let mut route: Route = Vec::new();
    for &(a, z) in &hops {
        for r in hop(cluster, a, z) {
            route.push((res.id(Row::Link(r)), bytes));
        }
        if issue > 0.0 {
            route.push((res.id(Row::Issue(a)), issue));
        }
    }
    route
}

/// Capacity of every row, in LP units.
fn capacities(cluster: &Cluster, rows: &[Row], fastest: f64) -> Vec<f64> {
    rows.iter()
        .map(|&r| match r {
            Row::Link(r) => capacity(cluster, r) / fastest,
            Row::Issue(_) => 1.0,
        })
        .collect()
}

/// Cost weight of a route in phase 2: local copies are free, intra-node
/// copies cheaper than cross-node ones.
fn traffic_weight(cluster: &Cluster, s: DeviceId, d: DeviceId) -> f64 {
    if s == d {
        0.0
    } else if cluster.node_of(s) == cluster.node_of(d) {
        1.0
    } else {
        4.0
    }
}

impl LpPlanner {
    /// A builder with the default settings.
    pub fn builder() -> LpPlannerBuilder {
        LpPlannerBuilder {
            planner: LpPlanner::default(),
        }
    }

    fn configure(&self, model: good_lp::solvers::highs::HighsProblem) -> good_lp::solvers::highs::HighsProblem {
        let mut m = model.set_threads(self.threads);
        if self.ipm {
            m = m.set_option("solver", "ipm");
        }
        if let Some(t) = self.time_limit_s {
            m = m.set_time_limit(t);
        }
        m
    }

    /// Solve the LP for a set of commodities.
    pub fn solve(&self, problem: &Problem, comms: &[Commodity]) -> Result<LpSolution> {
        self.run(problem, comms, Phases::Both)
    }

    fn run(&self, problem: &Problem, comms: &[Commodity], phases: Phases) -> Result<LpSolution> {
        let cluster = problem.cluster();
        if comms.is_empty() {
            return Ok(LpSolution {
                objective_s: 0.0,
                paths: Vec::new(),
                split: Vec::new(),
                bound: Some(LowerBound {
                    seconds: 0.0,
                    reason: "nothing to move".into(),
                }),
            });
        }
        let mut res = Resources {
            ids: BTreeMap::new(),
            list: Vec::new(),
        };
        // Variables are fractions of commodities; every coefficient is
        // scaled by `units` so that the LP stays well conditioned from
        // kilobytes to terabytes.
        let max_bytes = comms.iter().map(|c| c.bytes).max().unwrap_or(1).max(1) as f64;
        let b = cluster.bandwidth();
        let fastest = b.intra_node.max(b.nic).max(b.device_memory);
        let units = Units {
            bytes: max_bytes,
            seconds: max_bytes / fastest,
        };
        // Start with the direct path from every holder.
        let mut paths: Vec<Vec<Path>> = comms
            .iter()
            .map(|c| c.holders.iter().map(|&src| Path { src, via: Vec::new() }).collect())
            .collect();
        let mut routes: Vec<Vec<Route>> = comms
            .iter()
            .zip(&paths)
            .map(|(c, ps)| ps.iter().map(|p| route_of(cluster, c, p, units, &mut res)).collect())
            .collect();

        // Phase 1: minimise T, adding relayed paths that the prices say are
        // cheaper than every path a commodity has (column generation).
        let mut round = 0;
        let mut previous = f64::INFINITY;
        let (t_star, duals, phase1) = loop {
            let caps = capacities(cluster, &res.list, fastest);
            let (t_star, duals, phase1) = self.phase1(&routes, &caps, res.list.len())?;
            round += 1;
            // Stop when relays stopped paying: a round that gains less than
            // 0.1% is not worth another solve.
            let stalled = t_star >= previous * (1.0 - 1e-3);
            previous = t_star;
            if !self.relays || round > MAX_RELAY_ROUNDS || stalled {
                break (t_star, duals, phase1);
            }
            // Prices: the duals, plus a congestion price on every saturated
            // row. Many rows often tie at the makespan (a degenerate LP) while
            // the duals single out one; pricing all of them lets one round
            // route around every bottleneck at once.
            let loads = row_loads(&routes, &phase1, res.list.len());
            let price_of: Vec<f64> = (0..res.list.len())
                .map(|r| {
                    let dual = duals.get(comms.len() + r).copied().unwrap_or(0.0).abs();
                    let tight = loads[r] >= caps[r] * t_star * (1.0 - 1e-6) && t_star > 0.0;
                    dual + if tight { 1.0 / caps[r] } else { 0.0 }
                })
                .collect();
            let price = |r: usize| price_of[r];
            let row_price = |row: Row| res.ids.get(&row).map_or(0.0, |&i| price(i));
            let mut new_paths = Vec::new();
            for (ci, c) in comms.iter().enumerate() {
                let cost = |route: &Route| -> f64 { route.iter().map(|&(r, k)| price(r) * k).sum() };
                let best = routes[ci].iter().map(cost).fold(f64::INFINITY, f64::min);
                let bytes = c.bytes as f64 / units.bytes;
                let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
                let mut candidate: Option<(f64, Path)> = None;
                for &src in c
                    .holders
                    .iter()
                    .filter(|&&s| cluster.node_of(s) != cluster.node_of(c.dst))
                {
                    let (pc, path) = cheapest_relay_path(cluster, src, c.dst, bytes, issue, &row_price);
                    if !path.via.is_empty() && !paths[ci].contains(&path) && candidate.as_ref().is_none_or(|x| pc < x.0)
                    {
                        candidate = Some((pc, path));
                    }
                }
                if let Some((pc, path)) = candidate {
                    if pc < best * (1.0 - 1e-6) {
                        new_paths.push((ci, path));
                    }
                }
            }
            let added = new_paths.len();
            for (ci, path) in new_paths {
                let route = route_of(cluster, &comms[ci], &path, units, &mut res);
                paths[ci].push(path);
                routes[ci].push(route);
            }
            if added == 0 {
                break (t_star, duals, phase1);
            }
        };
        let caps = capacities(cluster, &res.list, fastest);
        let bound = (phases != Phases::PlanOnly).then(|| {
            // Any non-negative prices give a valid bound. The duals of a
            // degenerate LP may leave one of several saturated links free,
            // which a relay-aware route then uses at no cost; pricing every
            // saturated link alike does not. Keep the better of the two.
            let loads = row_loads(&routes, &phase1, res.list.len());
            let mut links = Vec::new();
            let (mut duals_p, mut tight_p) = (Vec::new(), Vec::new());
            for (i, &r) in res.list.iter().enumerate() {
                if let Row::Link(link) = r {
                    links.push(link);
                    duals_p.push(duals.get(comms.len() + i).copied().unwrap_or(0.0).abs());
                    let tight = t_star > 0.0 && loads[i] >= caps[i] * t_star * (1.0 - 1e-3);
                    tight_p.push(if tight { 1.0 / capacity(cluster, link) } else { 0.0 });
                }
            }
            let by_duals = certified_bound(problem, comms, &links, &duals_p);
            let by_tight = certified_bound(problem, comms, &links, &tight_p);
            if by_tight.seconds > by_duals.seconds {
                by_tight
            } else {
                by_duals
            }
        });
        if phases == Phases::BoundOnly {
            return Ok(LpSolution {
                objective_s: t_star * units.seconds,
                paths,
                split: Vec::new(),
                bound,
            });
        }

        // Phase 2: least traffic at the optimal makespan, with a little slack
        // so that it stays feasible under the solver's tolerances. Should it
        // fail anyway, the phase-1 split is optimal for the makespan too.
        let phase2 = || -> Result<Vec<Vec<f64>>> {
            let mut vars = ProblemVariables::new();
            let x: Vec<Vec<Variable>> = paths
                .iter()
                .map(|ps| vars.add_vector(variable().min(0.0), ps.len()))
                .collect();
            let mut objective = Expression::with_capacity(x.iter().map(Vec::len).sum());
            for ((c, ps), xs) in comms.iter().zip(&paths).zip(&x) {
                for (p, &v) in ps.iter().zip(xs) {
                    let stops = p.stops(c.dst);
                    let w: f64 = stops.windows(2).map(|h| traffic_weight(cluster, h[0], h[1])).sum();
                    objective.add_mul(w * c.bytes as f64 / units.bytes, v);
                }
            }
            let mut model = self.configure(vars.minimise(objective).using(highs));
            add_demand_rows(&mut model, &x);
            add_capacity_rows(
                &mut model,
                &routes,
                &x,
                &caps,
                None,
                t_star * (1.0 + 1e-6) + 1e-7,
                res.list.len(),
            );
            let sol = model.solve().map_err(solver_error)?;
            check_status(&sol)?;
            Ok(x.iter().map(|xs| xs.iter().map(|&v| sol.value(v)).collect()).collect())
        };
        let chosen = phase2().unwrap_or(phase1);
        let split: Vec<Vec<u64>> = comms
            .iter()
            .zip(&chosen)
            .map(|(c, fs)| integral_split(c.bytes, &fs.iter().map(|f| f * c.bytes as f64).collect::<Vec<_>>()))
            .collect();
        let loads = loads_of(comms, &routes, &split, res.list.len());
        let objective_s = loads
            .iter()
            .zip(&caps)
            .zip(&res.list)
            .filter(|(_, r)| matches!(r, Row::Link(_)))
            .map(|((&l, &c), _)| l / c * units.seconds)
            .fold(0.0, f64::max);
        Ok(LpSolution {
            objective_s,
            paths,
            split,
            bound,
        })
    }

    /// Phase 1: the makespan, the row duals and the fractions.
    fn phase1(&self, routes: &[Vec<Route>], caps: &[f64], nres: usize) -> Result<(f64, Vec<f64>, Vec<Vec<f64>>)> {
        let mut vars = ProblemVariables::new();
        let t = vars.add(variable().min(0.0));
        let x: Vec<Vec<Variable>> = routes
            .iter()
            .map(|rs| vars.add_vector(variable().min(0.0), rs.len()))
            .collect();
        let mut model = self.configure(vars.minimise(t).using(highs));
        add_demand_rows(&mut model, &x);
        add_capacity_rows(&mut model, routes, &x, caps, Some(t), 1.0, nres);
        let sol = model.solve().map_err(solver_error)?;
        check_status(&sol)?;
        let t_star = sol.value(t);
        let fractions: Vec<Vec<f64>> = x.iter().map(|xs| xs.iter().map(|&v| sol.value(v)).collect()).collect();
        let duals = sol.into_inner().dual_rows().to_vec();
        Ok((t_star, duals, fractions))
    }
}

/// Every commodity is delivered whole: its fractions add up to 1.
fn add_demand_rows(model: &mut impl SolverModel, x: &[Vec<Variable>]) {
    for xs in x {
        let mut e = Expression::with_capacity(xs.len());
        for &v in xs {
            e.add_mul(1.0, v);
        }
        model.add_constraint(e.eq(1.0));
    }
}

/// One row per resource: `load ≤ cap · T` (phase 1, `t` given) or
/// `load ≤ cap · bound` (phase 2), added after the demand rows. Returns the
/// row index of each resource (HiGHS numbers rows in insertion order).
fn add_capacity_rows(
    model: &mut impl SolverModel,
    routes: &[Vec<Route>],
    x: &[Vec<Variable>],
    caps: &[f64],
    t: Option<Variable>,
    bound: f64,
    nres: usize,
) -> Vec<usize> {
    let mut loads: Vec<Expression> = (0..nres).map(|_| Expression::default()).collect();
    for (opts, xs) in routes.iter().zip(x) {
        for (route, &v) in opts.iter().zip(xs) {
            for &(r, k) in route {
                loads[r].add_mul(k, v);
            }
        }
    }
    let first = routes.len();
    for (r, mut load) in loads.into_iter().enumerate() {
        match t {
            Some(t) => {
                load.add_mul(-caps[r], t);
                model.add_constraint(load.leq(0.0));
            }
            None => {
                model.add_constraint(load.leq(caps[r] * bound));
            }
        }
    }
    (first..first + nres).collect()
}

fn check_status(sol: &impl Solution) -> Result<()> {
    match sol.status() {
        good_lp::SolutionStatus::Optimal => Ok(()),
        good_lp::SolutionStatus::TimeLimit => Err(Error::Solver(SolverFailure::TimeLimit)),
        good_lp::SolutionStatus::GapLimit => Ok(()),
    }
}

fn solver_error(e: good_lp::ResolutionError) -> Error {
    Error::Solver(match e {
        good_lp::ResolutionError::Infeasible => SolverFailure::Infeasible,
        good_lp::ResolutionError::Unbounded => SolverFailure::Unbounded,
        good_lp::ResolutionError::Other(s) => SolverFailure::Other(s.to_string()),
        good_lp::ResolutionError::Str(s) => SolverFailure::Other(s),
    })
}

/// Round an LP split (in bytes) to whole bytes that add up to `total`
/// exactly (largest remainder).
fn integral_split(total: u64, bytes: &[f64]) -> Vec<u64> {
    let want: Vec<f64> = bytes.iter().map(|&v| v.max(0.0).min(total as f64)).collect();
    let sum: f64 = want.iter().sum();
    let scaled: Vec<f64> = if sum > 0.0 {
        want.iter().map(|w| w * total as f64 / sum).collect()
    } else {
        let mut v = vec![0.0; bytes.len()];
        v[0] = total as f64;
        v
    };
    let mut out: Vec<u64> = scaled.iter().map(|&v| v.floor() as u64).collect();
    let mut left = total - out.iter().sum::<u64>().min(total);
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| {
        (scaled[b] - scaled[b].floor())
            .total_cmp(&(scaled[a] - scaled[a].floor()))
            .then(a.cmp(&b))
    });
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Load of every row (in LP units) under fractions of commodities.
fn row_loads(routes: &[Vec<Route>], fractions: &[Vec<f64>], nres: usize) -> Vec<f64> {
    let mut loads = vec![0.0; nres];
    for (opts, fs) in routes.iter().zip(fractions) {
        for (route, &f) in opts.iter().zip(fs) {
            for &(r, k) in route {
                loads[r] += k * f.max(0.0);
            }
        }
    }
    loads
}

/// Load of every row (in LP units) under a byte split.
fn loads_of(comms: &[Commodity], routes: &[Vec<Route>], split: &[Vec<u64>], nres: usize) -> Vec<f64> {
    let mut loads = vec![0.0; nres];
    for ((c, opts), bytes) in comms.iter().zip(routes).zip(split) {
        for (route, &b) in opts.iter().zip(bytes) {
            let fraction = b as f64 / c.bytes.max(1) as f64;
            for &(r, k) in route {
                loads[r] += k * fraction;
            }
        }
    }
    loads
}

/// The rows an option loads, with its coefficient for the whole commodity.
type Route = Vec<(usize, f64)>;

/// A lower bound on the makespan of every plan, by weak duality.
///
/// For any prices `y ≥ 0` on the resources, normalised so that
/// `Σ_r cap_r · y_r = 1`, and any plan with loads `L_r`:
/// `T ≥ max_r L_r / cap_r ≥ Σ_r y_r · L_r = Σ_copies bytes · price(route)`
/// `≥ Σ_c bytes(c) · (cheapest route from a holder of c to its destination)`.
/// The cheapest route is taken over everything a plan may do: a local copy,
/// a direct copy, or a copy through any list of relays. The bound is
/// therefore valid whatever the solver's accuracy; with the optimal prices of
/// the phase-1 LP (whose paths include the relays column generation found
/// worth having) it equals the LP's optimum.
pub fn certified_bound(problem: &Problem, comms: &[Commodity], resources: &[Resource], prices: &[f64]) -> LowerBound {
    let cluster = problem.cluster();
    let norm: f64 = resources
        .iter()
        .zip(prices)
        .map(|(&r, &y)| capacity(cluster, r) * y)
        .sum();
    if !(norm > 0.0 && norm.is_finite()) {
        return LowerBound {
            seconds: 0.0,
            reason: "LP prices are all zero".into(),
        };
    }
    // Prices per resource kind, in arrays indexed by device or NIC.
    let n = cluster.num_devices() as usize;
    let nics = (cluster.nodes() * cluster.nics_per_node()) as usize;
    let (mut send, mut recv, mut mem) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let (mut nic_out, mut nic_in) = (vec![0.0; nics], vec![0.0; nics]);
    for (&r, &y) in resources.iter().zip(prices) {
        let y = y / norm;
        match r {
            Resource::Send(d) => send[d as usize] = y,
            Resource::Recv(d) => recv[d as usize] = y,
            Resource::Memory(d) => mem[d as usize] = y,
            Resource::NicOut(i) => nic_out[i as usize] = y,
            Resource::NicIn(i) => nic_in[i as usize] = y,
            // Message issue is not a flow resource: the issue bound covers it.
            Resource::Issue(_) => {}
        }
    }
    // Cheapest route from every device to d, any relays included: shortest
    // paths in a compact graph with a vertex per device, one NVSwitch vertex
    // per node and one network vertex. Device a reaches device b of its node
    // through the switch (send a + recv b) and any device through the
    // network (egress of a's NIC + ingress of b's). A real route's price is
    // never below its path in this graph (the network path between two
    // devices of one node is cheaper than any real route through another
    // node), so the bound stays valid.
    let gpn = cluster.gpus_per_node();
    let nodes = cluster.nodes() as usize;
    let core = n + nodes;
    let live: Vec<bool> = (0..cluster.num_devices()).map(|d| cluster.is_live(d)).collect();
    let distances_to = |d: DeviceId| -> Vec<f64> {
        let mut dist = vec![f64::INFINITY; n + nodes + 1];
        let mut heap = std::collections::BinaryHeap::new();
        dist[d as usize] = 0.0;
        heap.push(std::cmp::Reverse((OrdF64(0.0), d as usize)));
        while let Some(std::cmp::Reverse((OrdF64(dx), x))) = heap.pop() {
            if dx > dist[x] {
                continue;
            }
            let mut relax = |y: usize, w: f64, heap: &mut std::collections::BinaryHeap<_>| {
                if dx + w < dist[y] {
                    dist[y] = dx + w;
                    heap.push(std::cmp::Reverse((OrdF64(dx + w), y)));
                }
            };
            if x < n {
                // Into a device: from its node's switch or from the network.
                let b = x as DeviceId;
                relax(n + (b / gpn) as usize, recv[x], &mut heap);
                relax(core, nic_in[cluster.nic_of(b) as usize], &mut heap);
            } else if x < core {
                // Into a switch: from the live devices of its node.
                let node = (x - n) as u32;
                for a in node * gpn..(node + 1) * gpn {
                    if live[a as usize] {
                        relax(a as usize, send[a as usize], &mut heap);
                    }
                }
            } else {
                // Into the network: from every live device.
                for a in 0..n {
                    if live[a] {
                        relax(a, nic_out[cluster.nic_of(a as DeviceId) as usize], &mut heap);
                    }
                }
            }
        }
        dist
    };
    let mut cache: BTreeMap<DeviceId, Vec<f64>> = BTreeMap::new();
    let mut total = 0.0;
    for c in comms {
        let dist = cache.entry(c.dst).or_insert_with(|| distances_to(c.dst));
        let best = c
            .holders
            .iter()
            .map(|&s| if s == c.dst { mem[s as usize] } else { dist[s as usize] })
            .fold(f64::INFINITY, f64::min);
        total += c.bytes as f64 * best;
    }
    LowerBound {
        seconds: total,
        reason: "LP dual prices (weak duality, relays included)".into(),
    }
}

/// The LP lower bound of a problem together with the trivial one: the larger
/// of the two, both valid for every plan.
pub fn lower_bound(problem: &Problem) -> Result<LowerBound> {
    let frags = fragments(problem)?;
    let trivial = crate::trivial_lower_bound(problem, &frags);
    let comms = commodities(&frags);
    let lp = LpPlanner::default()
        .run(problem, &comms, Phases::BoundOnly)?
        .bound
        .expect("asked for the bound");
    Ok(if lp.seconds >= trivial.seconds { lp } else { trivial })
}

impl Planner for LpPlanner {
    fn name(&self) -> &'static str {
        match self.placement {
            Placement::Fixed => "lp",
            Placement::Optimize => "lp-placed",
        }
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        let placed;
        let problem = match self.placement {
            Placement::Fixed => problem,
            Placement::Optimize => {
                placed = crate::placement::optimize_placement(problem)?.0;
                &placed
            }
        };
        let frags = fragments(problem)?;
        let comms = commodities(&frags);
        let solution = self.run(problem, &comms, Phases::PlanOnly)?;
        let mut copies = Vec::new();
        for ((c, paths), split) in comms.iter().zip(&solution.paths).zip(&solution.split) {
            disaggregate(problem, &frags, c, paths, split, &mut copies);
        }
        Ok(crate::schedule::finish(self.name(), problem, copies))
    }
}

/// Split a commodity's fragments among its holders so that holder `i` sends
/// `split[i]` bytes, up to one element. Holders with the smallest quotas are
/// served first, from the largest fragments, so that a minor source sends a
/// few large messages rather than many small ones; a fragment is cut in its
/// own row-major order (at most 2·ndim−1 boxes per side of a cut).
fn disaggregate(
    problem: &Problem,
    frags: &[Fragment],
    c: &Commodity,
    paths: &[Path],
    split: &[u64],
    out: &mut Vec<Copy>,
) {
    let tensors = problem.tensors();
    let mut quotas: Vec<(Path, u64)> = paths
        .iter()
        .cloned()
        .zip(split.iter().copied())
        .filter(|q| q.1 > 0)
        .collect();
    if quotas.is_empty() {
        let direct = Path {
            src: c.holders[0],
            via: Vec::new(),
        };
        quotas.push((direct, c.bytes));
    }
    // Stable: ties keep path order.
    quotas.sort_by_key(|q| q.1);
    let mut order: Vec<usize> = c.fragments.clone();
    order.sort_by_key(|&i| (std::cmp::Reverse(frags[i].bytes), i));
    let last = quotas.len() - 1;
    let mut q = 0;
    let mut pieces: Vec<(usize, Copy)> = Vec::new();
    for (rank, &fi) in order.iter().enumerate() {
        let f = &frags[fi];
        let elem = tensors[f.tensor as usize].dtype.size();
        let n = f.region.volume();
        let mut at = 0;
        while at < n {
            let (path, quota) = quotas[q].clone();
            let take = if q == last { n - at } else { (quota / elem).min(n - at) };
            if take > 0 {
                let boxes = if at == 0 && take == n {
                    vec![f.region.clone()]
                } else {
                    f.region.flat_range(at, at + take)
                };
                for region in boxes {
                    pieces.push((
                        rank,
                        Copy {
                            src: path.src,
                            dst: f.dst,
                            via: path.via.clone(),
                            tensor: f.tensor,
                            region,
                            buffer: f.buffer,
                            offset: f.offset,
                            reduce: f.reduce,
                            round: 0,
                        },
                    ));
                }
                quotas[q].1 = quota.saturating_sub(take * elem);
                at += take;
            }
            if at < n && q < last {
                q += 1;
            }
        }
    }
    // Emit in fragment order (stable within a fragment), so plans read in
    // the order of the target layout.
    let position: BTreeMap<usize, usize> = order.iter().enumerate().map(|(r, &fi)| (r, fi)).collect();
    pieces.sort_by_key(|(rank, _)| position[rank]);
    out.extend(pieces.into_iter().map(|(_, copy)| copy));
}

#[cfg(test)]
mod tests {
    use super::integral_split;

    #[test]
    fn splits_add_up_exactly() {
        assert_eq!(integral_split(10, &[3.0, 7.0]), vec![3, 7]);
        assert_eq!(integral_split(10, &[0.0, 0.0]), vec![10, 0]);
        let s = integral_split(1001, &[330.0, 330.0, 340.0]);
        assert_eq!(s.iter().sum::<u64>(), 1001);
    }
}
