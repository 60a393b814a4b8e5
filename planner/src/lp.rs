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
use crate::intersect::{fragments, padding_fills, Fragment};
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
    /// Bytes of each commodity sent by each of its holders.
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
        let routes: Vec<Vec<Route>> = comms
            .iter()
            .map(|c| {
                // Per whole commodity: its bytes on every link of the route,
                // and its messages' issue time on the sender.
                let bytes = c.bytes as f64 / units.bytes;
                let issue = cluster.latency_s() * c.fragments.len() as f64 / units.seconds;
                c.holders
                    .iter()
                    .map(|&s| {
                        let mut route: Route = hop(cluster, s, c.dst)
                            .into_iter()
                            .map(|r| (res.id(Row::Link(r)), bytes))
                            .collect();
                        if issue > 0.0 {
                            route.push((res.id(Row::Issue(s)), issue));
                        }
                        route
                    })
                    .collect()
            })
            .collect();
        let caps: Vec<f64> = res
            .list
            .iter()
            .map(|&r| match r {
                Row::Link(r) => capacity(cluster, r) / fastest,
                Row::Issue(_) => 1.0,
            })
            .collect();
        if comms.is_empty() {
            return Ok(LpSolution {
                objective_s: 0.0,
                split: Vec::new(),
                bound: Some(LowerBound {
                    seconds: 0.0,
                    reason: "nothing to move".into(),
                }),
            });
        }

        // Phase 1: minimise T.
        let (t_star, (links, prices, phase1)) = {
            let mut vars = ProblemVariables::new();
            let t = vars.add(variable().min(0.0));
            let x: Vec<Vec<Variable>> = comms
                .iter()
                .map(|c| vars.add_vector(variable().min(0.0), c.holders.len()))
                .collect();
            let mut model = self.configure(vars.minimise(t).using(highs));
            add_demand_rows(&mut model, &x);
            let rows = add_capacity_rows(&mut model, &routes, &x, &caps, Some(t), 1.0, res.list.len());
            let sol = model.solve().map_err(solver_error)?;
            check_status(&sol)?;
            let t_star = sol.value(t);
            let phase1: Vec<Vec<f64>> = x.iter().map(|xs| xs.iter().map(|&v| sol.value(v)).collect()).collect();
            let duals = sol.into_inner().dual_rows().to_vec();
            let mut links = Vec::new();
            let mut prices = Vec::new();
            for (&row, &r) in rows.iter().zip(&res.list) {
                if let Row::Link(link) = r {
                    links.push(link);
                    prices.push(duals.get(row).copied().unwrap_or(0.0).abs());
                }
            }
            (t_star, (links, prices, phase1))
        };
        let bound = (phases != Phases::PlanOnly).then(|| certified_bound(problem, comms, &links, &prices));
        if phases == Phases::BoundOnly {
            return Ok(LpSolution {
                objective_s: t_star * units.seconds,
                split: Vec::new(),
                bound,
            });
        }

        // Phase 2: least traffic at the optimal makespan, with a little slack
        // so that it stays feasible under the solver's tolerances. Should it
        // fail anyway, the phase-1 split is optimal for the makespan too.
        let phase2 = || -> Result<Vec<Vec<f64>>> {
            let mut vars = ProblemVariables::new();
            let x: Vec<Vec<Variable>> = comms
                .iter()
                .map(|c| vars.add_vector(variable().min(0.0), c.holders.len()))
                .collect();
            let mut objective = Expression::with_capacity(x.iter().map(Vec::len).sum());
            for (c, xs) in comms.iter().zip(&x) {
                for (&s, &v) in c.holders.iter().zip(xs) {
                    objective.add_mul(traffic_weight(cluster, s, c.dst) * c.bytes as f64 / units.bytes, v);
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
            split,
            bound,
        })
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
/// The cheapest route is taken over everything the cost model allows: a
/// local copy, a direct copy, or a copy relayed through any device. The
/// bound is therefore valid whatever the solver's accuracy; with the optimal
/// prices of the phase-1 LP it equals the LP's optimum when relays do not
/// help.
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
        }
    }
    // Must match `hop` exactly: the price of one hop from a to b.
    let hop_price = |a: DeviceId, b: DeviceId| {
        if a == b {
            mem[a as usize]
        } else if cluster.node_of(a) == cluster.node_of(b) {
            send[a as usize] + recv[b as usize]
        } else {
            nic_out[cluster.nic_of(a) as usize] + nic_in[cluster.nic_of(b) as usize]
        }
    };
    // Cheapest relayed route s -> v -> d. Relaying through s or d itself
    // never beats the direct hop, so v ranges over every live device. The
    // first hop is intra-node when v shares s's node and crosses the network
    // otherwise, so per destination it suffices to know, for each node, the
    // cheapest (last hop + ingress of the first hop) over its devices.
    let gpn = cluster.gpus_per_node();
    let nodes = cluster.nodes() as usize;
    let relay_prices = |d: DeviceId| {
        let mut intra = vec![f64::INFINITY; nodes];
        let mut cross = vec![f64::INFINITY; nodes];
        for v in (0..cluster.num_devices()).filter(|&v| cluster.is_live(v)) {
            let last = hop_price(v, d);
            let n = (v / gpn) as usize;
            intra[n] = intra[n].min(recv[v as usize] + last);
            cross[n] = cross[n].min(nic_in[cluster.nic_of(v) as usize] + last);
        }
        // The two best nodes for a cross-node first hop.
        let mut best = [(f64::INFINITY, usize::MAX); 2];
        for (n, &c) in cross.iter().enumerate() {
            if c < best[0].0 {
                best = [(c, n), best[0]];
            } else if c < best[1].0 {
                best[1] = (c, n);
            }
        }
        RelayPrices { intra, cross: best }
    };
    let mut cache: BTreeMap<DeviceId, RelayPrices> = BTreeMap::new();
    let mut total = 0.0;
    for c in comms {
        let RelayPrices { intra, cross } = cache.entry(c.dst).or_insert_with(|| relay_prices(c.dst));
        let mut best = f64::INFINITY;
        for &s in &c.holders {
            let n = (s / gpn) as usize;
            let other = if cross[0].1 != n { cross[0].0 } else { cross[1].0 };
            best = best
                .min(hop_price(s, c.dst))
                .min(send[s as usize] + intra[n])
                .min(nic_out[cluster.nic_of(s) as usize] + other);
        }
        total += c.bytes as f64 * best;
    }
    LowerBound {
        seconds: total,
        reason: "LP dual prices (weak duality, relays included)".into(),
    }
}

/// Per destination: the cheapest relay via each node after an intra-node
/// first hop, and the two best nodes for a cross-node first hop.
struct RelayPrices {
    intra: Vec<f64>,
    cross: [(f64, usize); 2],
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
        for (c, split) in comms.iter().zip(&solution.split) {
            disaggregate(problem, &frags, c, split, &mut copies);
        }
        let copies = crate::schedule::issue_order(copies, problem.tensors());
        let mut plan = Plan {
            planner: self.name().to_string(),
            problem: problem.clone(),
            copies,
            fills: padding_fills(problem),
            paces: Vec::new(),
        };
        plan.paces = crate::schedule::paces(&plan);
        Ok(plan)
    }
}

/// Split a commodity's fragments among its holders so that holder `i` sends
/// `split[i]` bytes, up to one element. Holders with the smallest quotas are
/// served first, from the largest fragments, so that a minor source sends a
/// few large messages rather than many small ones; a fragment is cut in its
/// own row-major order (at most 2·ndim−1 boxes per side of a cut).
fn disaggregate(problem: &Problem, frags: &[Fragment], c: &Commodity, split: &[u64], out: &mut Vec<Copy>) {
    let tensors = problem.tensors();
    let mut quotas: Vec<(DeviceId, u64)> = c
        .holders
        .iter()
        .copied()
        .zip(split.iter().copied())
        .filter(|q| q.1 > 0)
        .collect();
    if quotas.is_empty() {
        quotas.push((c.holders[0], c.bytes));
    }
    // Stable: ties keep holder order.
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
            let (src, quota) = quotas[q];
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
                            src,
                            dst: f.dst,
                            via: None,
                            tensor: f.tensor,
                            region,
                            buffer: f.buffer,
                            offset: f.offset,
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
