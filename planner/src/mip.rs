//! The integer variant of the optimal planner (`--integral`): every fragment
//! moves whole, from one holder, on its direct path, and every message costs
//! its sender the cluster's latency. A MIP (HiGHS branch and bound) with a
//! time limit, for small instances; it reports its status and its gap to the
//! certified lower bound of the problem.
//!
//! Variables: `x[f][h] ∈ {0, 1}`, fragment `f` sent by holder `h`; `T ≥ 0`.
//! Minimise `T` subject to `Σ_h x[f][h] = 1` for every fragment, every
//! resource's load (bytes over capacity) `≤ T`, and every device's issue time
//! (messages × latency) `≤ T`.

use std::collections::BTreeMap;

use good_lp::solvers::highs::highs;
use good_lp::{variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use tenplan_ptc::{Plan, Problem};

use crate::cost::{capacity, hop, Resource};
use crate::intersect::fragments;
use crate::{lower_bound, Error, Planner, Result, SolverFailure};

/// What the MIP reached.
#[derive(Clone, Debug, PartialEq)]
pub struct MipReport {
    /// Makespan of the chosen assignment under the cost model (max load,
    /// issue time included).
    pub makespan_s: f64,
    /// The certified lower bound of the problem (fractional, any relays).
    pub lower_bound_s: f64,
    /// `makespan / lower bound − 1`: at least the MIP's own gap.
    pub gap: f64,
    /// Whether branch and bound finished (false: the time limit hit first and
    /// this is the best assignment found).
    pub optimal: bool,
    /// Binary variables in the model.
    pub binaries: usize,
}

/// The integer planner. Refuses instances with more than `max_binaries`
/// choices (a typed error, not a long wait).
#[derive(Clone, Debug, PartialEq)]
pub struct MipPlanner {
    /// Solver time limit in seconds.
    pub time_limit_s: f64,
    /// HiGHS threads.
    pub threads: u32,
    /// Largest model accepted.
    pub max_binaries: usize,
}

impl Default for MipPlanner {
    fn default() -> MipPlanner {
        MipPlanner {
            time_limit_s: 10.0,
            threads: 1,
            max_binaries: 20_000,
        }
    }
}

impl MipPlanner {
    /// Plan, and say how good the plan is.
    pub fn plan_with_report(&self, problem: &Problem) -> Result<(Plan, MipReport)> {
        let cluster = problem.cluster();
        let frags = fragments(problem)?;
        let binaries: usize = frags.iter().map(|f| f.holders.len()).filter(|&n| n > 1).sum();
        if binaries > self.max_binaries {
            return Err(Error::Solver(SolverFailure::Other(format!(
                "--integral: {binaries} binary choices exceed the limit of {}; use the lp planner for instances this size",
                self.max_binaries
            ))));
        }
        // Seconds are scaled so the largest single load is 1.
        let mut res: BTreeMap<Resource, usize> = BTreeMap::new();
        let mut routes: Vec<Vec<Vec<(usize, f64)>>> = Vec::with_capacity(frags.len());
        let latency = cluster.latency_s();
        for f in &frags {
            let mut per_holder = Vec::with_capacity(f.holders.len());
            for &h in f.holders.iter() {
                let mut route = Vec::new();
                for r in hop(cluster, h, f.dst) {
                    let n = res.len();
                    let id = *res.entry(r).or_insert(n);
                    route.push((id, f.bytes as f64 / capacity(cluster, r)));
                }
                if latency > 0.0 {
                    let n = res.len();
                    let id = *res.entry(Resource::Issue(h)).or_insert(n);
                    route.push((id, latency));
                }
                per_holder.push(route);
            }
            routes.push(per_holder);
        }
        let scale = routes
            .iter()
            .flatten()
            .flatten()
            .map(|&(_, s)| s)
            .fold(0.0f64, f64::max)
            .max(1e-12);
        let mut vars = ProblemVariables::new();
        let t = vars.add(variable().min(0.0));
        let x: Vec<Vec<Variable>> = frags
            .iter()
            .map(|f| {
                if f.holders.len() == 1 {
                    vec![vars.add(variable().min(1.0).max(1.0))]
                } else {
                    vars.add_vector(variable().binary(), f.holders.len())
                }
            })
            .collect();
        let mut model = vars
            .minimise(t)
            .using(highs)
            .set_time_limit(self.time_limit_s)
            .set_mip_rel_gap(1e-4)
            .map_err(|e| Error::Solver(SolverFailure::Other(e.to_string())))?
            .set_threads(self.threads);
        let mut loads: Vec<Expression> = (0..res.len()).map(|_| Expression::default()).collect();
        for (xs, per_holder) in x.iter().zip(&routes) {
            let mut one = Expression::default();
            for (&v, route) in xs.iter().zip(per_holder) {
                one.add_mul(1.0, v);
                for &(r, s) in route {
                    loads[r].add_mul(s / scale, v);
                }
            }
            model.add_constraint(one.eq(1.0));
        }
        for mut load in loads {
            load.add_mul(-1.0, t);
            model.add_constraint(load.leq(0.0));
        }
        let sol = model.solve().map_err(|e| {
            Error::Solver(match e {
                good_lp::ResolutionError::Infeasible => SolverFailure::Infeasible,
                good_lp::ResolutionError::Unbounded => SolverFailure::Unbounded,
                other => SolverFailure::Other(other.to_string()),
            })
        })?;
        let optimal = matches!(sol.status(), good_lp::SolutionStatus::Optimal);
        let mut copies = Vec::with_capacity(frags.len());
        let mut load_s: BTreeMap<Resource, f64> = BTreeMap::new();
        let ids: Vec<Resource> = {
            let mut v = vec![Resource::Memory(0); res.len()];
            for (&r, &i) in &res {
                v[i] = r;
            }
            v
        };
        for ((f, xs), per_holder) in frags.iter().zip(&x).zip(&routes) {
            // The holder the solver chose (the largest value: integral up to tolerance).
            let (k, _) = xs
                .iter()
                .map(|&v| sol.value(v))
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |a, (i, v)| if v > a.1 { (i, v) } else { a });
            for &(r, s) in &per_holder[k] {
                *load_s.entry(ids[r]).or_default() += s;
            }
            copies.push(f.copy(f.holders[k], Vec::new(), f.region.clone()));
        }
        let plan = crate::issue::finish(self.name(), problem, copies);
        let makespan_s = load_s.values().copied().fold(0.0, f64::max);
        let lower_bound_s = lower_bound(problem)?.seconds;
        let gap = if lower_bound_s > 0.0 {
            makespan_s / lower_bound_s - 1.0
        } else {
            0.0
        };
        Ok((
            plan,
            MipReport {
                makespan_s,
                lower_bound_s,
                gap,
                optimal,
                binaries,
            },
        ))
    }
}

impl Planner for MipPlanner {
    fn name(&self) -> &'static str {
        "lp-integral"
    }

    fn plan(&self, problem: &Problem) -> Result<Plan> {
        Ok(self.plan_with_report(problem)?.0)
    }
}
