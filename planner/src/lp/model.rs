//! The LP itself: its rows (demand, capacity, multicast), phase 1 (the
//! makespan) and phase 2 (least traffic at that makespan), solved by HiGHS.

use good_lp::{highs, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use tenplan_ptc::{Cluster, DeviceId};

use super::columns::RestrictedLp;
use super::commodities::Commodity;
use super::{LpPlanner, Row};
use crate::cost::capacity;
use crate::{Error, Result, SolverFailure};

/// Capacity of every row, in LP units.
pub(super) fn capacities(cluster: &Cluster, rows: &[Row], fastest: f64) -> Vec<f64> {
    rows.iter()
        .map(|&r| match r {
            Row::Link(r) => capacity(cluster, r) / fastest,
            Row::Issue(_) => 1.0,
        })
        .collect()
}

/// Cost weight of a route in phase 2: local copies are free, intra-node
/// copies cheaper than cross-node ones.
pub(super) fn traffic_weight(cluster: &Cluster, s: DeviceId, d: DeviceId) -> f64 {
    if s == d {
        0.0
    } else if cluster.node_of(s) == cluster.node_of(d) {
        1.0
    } else {
        4.0
    }
}

/// What phase 1 solves: the routes of the commodities' paths and of the
/// multicasts' options, what each multicast delivers to each commodity, and
/// the rows' capacities.
#[derive(Clone, Copy)]
pub(super) struct Phase1Lp<'a> {
    pub(super) routes: &'a [Vec<Route>],
    pub(super) mroutes: &'a [Vec<Route>],
    pub(super) shares: &'a [Vec<(usize, f64)>],
    pub(super) caps: &'a [f64],
    pub(super) nres: usize,
}

/// Phase 1's answer: makespan, row duals, path fractions, multicast fractions.
pub(super) type Phase1 = (f64, Vec<f64>, Fractions, Fractions);

/// One non-negative variable per option of every commodity (or multicast).
pub(super) fn add_columns(vars: &mut ProblemVariables, routes: &[Vec<Route>]) -> Vec<Vec<Variable>> {
    routes
        .iter()
        .map(|opts| vars.add_vector(variable().min(0.0), opts.len()))
        .collect()
}

/// The solved value of every variable, per commodity (or multicast).
pub(super) fn values(sol: &impl Solution, vars: &[Vec<Variable>]) -> Fractions {
    vars.iter()
        .map(|xs| xs.iter().map(|&v| sol.value(v)).collect())
        .collect()
}

/// Every commodity is delivered whole: its paths' fractions plus what the
/// multicasts it belongs to deliver (as fractions of it) add up to 1.
pub(super) fn add_demand_rows(
    model: &mut impl SolverModel,
    x: &[Vec<Variable>],
    y: &[Vec<Variable>],
    shares: &[Vec<(usize, f64)>],
) {
    for (xs, share) in x.iter().zip(shares) {
        let mut e = Expression::with_capacity(xs.len());
        for &v in xs {
            e.add_mul(1.0, v);
        }
        for &(m, k) in share {
            for &v in &y[m] {
                e.add_mul(k, v);
            }
        }
        model.add_constraint(e.eq(1.0));
    }
}

/// A multicast delivers at most its bytes (rows after the capacity rows, so
/// that the duals of those keep their indices).
pub(super) fn add_multicast_rows(model: &mut impl SolverModel, y: &[Vec<Variable>]) {
    for ys in y {
        let mut e = Expression::with_capacity(ys.len());
        for &v in ys {
            e.add_mul(1.0, v);
        }
        model.add_constraint(e.leq(1.0));
    }
}

/// One row per resource: `load ≤ cap · T` (phase 1, `t` given) or
/// `load ≤ cap · bound` (phase 2), added after the demand rows. Returns the
/// row index of each resource (HiGHS numbers rows in insertion order).
pub(super) fn add_capacity_rows(
    model: &mut impl SolverModel,
    columns: &[Columns<'_, Variable>],
    caps: &[f64],
    t: Option<Variable>,
    bound: f64,
    nres: usize,
) -> Vec<usize> {
    let mut loads: Vec<Expression> = (0..nres).map(|_| Expression::default()).collect();
    for &(routes, x) in columns {
        for (opts, xs) in routes.iter().zip(x) {
            for (route, &v) in opts.iter().zip(xs) {
                for &(r, k) in route {
                    loads[r].add_mul(k, v);
                }
            }
        }
    }
    let first = columns.first().map_or(0, |c| c.0.len());
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

pub(super) fn check_status(sol: &impl Solution) -> Result<()> {
    match sol.status() {
        good_lp::SolutionStatus::Optimal => Ok(()),
        good_lp::SolutionStatus::TimeLimit => Err(Error::Solver(SolverFailure::TimeLimit)),
        good_lp::SolutionStatus::GapLimit => Ok(()),
    }
}

pub(super) fn solver_error(e: good_lp::ResolutionError) -> Error {
    Error::Solver(match e {
        good_lp::ResolutionError::Infeasible => SolverFailure::Infeasible,
        good_lp::ResolutionError::Unbounded => SolverFailure::Unbounded,
        good_lp::ResolutionError::Other(s) => SolverFailure::Other(s.to_string()),
        good_lp::ResolutionError::Str(s) => SolverFailure::Other(s),
    })
}

/// Load of every row (in LP units) under fractions of columns (commodity
/// paths, multicast options).
pub(super) fn row_loads(columns: &[Columns<'_, f64>], nres: usize) -> Vec<f64> {
    let mut loads = vec![0.0; nres];
    for &(routes, fractions) in columns {
        for (opts, fs) in routes.iter().zip(fractions) {
            for (route, &f) in opts.iter().zip(fs) {
                for &(r, k) in route {
                    loads[r] += k * f.max(0.0);
                }
            }
        }
    }
    loads
}

/// The rows an option loads, with its coefficient for the whole commodity.
pub(super) type Route = Vec<(usize, f64)>;

/// Per commodity (or multicast), a value for each of its options.
pub(super) type Fractions = Vec<Vec<f64>>;

/// A set of LP columns: the routes of each item's options, with a variable
/// or a value for each.
pub(super) type Columns<'a, T> = (&'a [Vec<Route>], &'a [Vec<T>]);

impl LpPlanner {
    /// Phase 1: the makespan, the row duals and the fractions of the
    /// commodities' paths and of the multicasts' options.
    pub(super) fn phase1(&self, lp: &Phase1Lp<'_>) -> Result<Phase1> {
        match self.phase1_with(lp, self.ipm) {
            // The interior-point method misreports some badly scaled
            // instances (message costs far above transfer times) as
            // infeasible, which this LP never is; the simplex method does not.
            Err(Error::Solver(SolverFailure::Infeasible | SolverFailure::Other(_))) if self.ipm => {
                self.phase1_with(lp, false)
            }
            other => other,
        }
    }

    pub(super) fn phase1_with(&self, lp: &Phase1Lp<'_>, ipm: bool) -> Result<Phase1> {
        let Phase1Lp {
            routes,
            mroutes,
            shares,
            caps,
            nres,
        } = *lp;
        let mut vars = ProblemVariables::new();
        let t = vars.add(variable().min(0.0));
        let (x, y) = (add_columns(&mut vars, routes), add_columns(&mut vars, mroutes));
        let mut model = self.configure_with(vars.minimise(t).using(highs), ipm);
        add_demand_rows(&mut model, &x, &y, shares);
        add_capacity_rows(&mut model, &[(routes, &x), (mroutes, &y)], caps, Some(t), 1.0, nres);
        add_multicast_rows(&mut model, &y);
        let sol = model.solve().map_err(solver_error)?;
        check_status(&sol)?;
        let t_star = sol.value(t);
        let (fractions, mfractions) = (values(&sol, &x), values(&sol, &y));
        let duals = sol.into_inner().dual_rows().to_vec();
        Ok((t_star, duals, fractions, mfractions))
    }
}

impl LpPlanner {
    /// Phase 2: least traffic at the optimal makespan `t_star`, with a
    /// little slack so that it stays feasible under the solver's
    /// tolerances.
    pub(super) fn phase2(
        &self,
        cluster: &Cluster,
        comms: &[Commodity],
        lp: &RestrictedLp,
        caps: &[f64],
        t_star: f64,
    ) -> Result<(Fractions, Fractions)> {
        let units = lp.units;
        let mut vars = ProblemVariables::new();
        let (x, y) = (add_columns(&mut vars, &lp.routes), add_columns(&mut vars, &lp.mroutes));
        let mut objective = Expression::with_capacity(x.iter().map(Vec::len).sum());
        for ((c, ps), xs) in comms.iter().zip(&lp.paths).zip(&x) {
            for (p, &v) in ps.iter().zip(xs) {
                let stops = p.stops(c.dst);
                let w: f64 = stops.windows(2).map(|h| traffic_weight(cluster, h[0], h[1])).sum();
                objective.add_mul(w * c.bytes as f64 / units.bytes, v);
            }
        }
        for (m, ys) in lp.mcasts.iter().zip(&y) {
            for ((src, k), &v) in m.options().zip(ys) {
                let l = m.members[k];
                let w = traffic_weight(cluster, src, l)
                    + m.members.iter().map(|&e| traffic_weight(cluster, l, e)).sum::<f64>();
                objective.add_mul(w * m.bytes as f64 / units.bytes, v);
            }
        }
        let mut model = self.configure(vars.minimise(objective).using(highs));
        add_demand_rows(&mut model, &x, &y, &lp.shares);
        add_capacity_rows(
            &mut model,
            &[(&lp.routes, &x), (&lp.mroutes, &y)],
            caps,
            None,
            t_star * (1.0 + 1e-6) + 1e-7,
            lp.res.list.len(),
        );
        add_multicast_rows(&mut model, &y);
        let sol = model.solve().map_err(solver_error)?;
        check_status(&sol)?;
        Ok((values(&sol, &x), values(&sol, &y)))
    }
}
