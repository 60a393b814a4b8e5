//! The LP itself: its rows (demand, capacity, multicast), phase 1 (the
//! makespan) and phase 2 (least traffic at that makespan), solved by HiGHS.

use good_lp::{highs, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use tenplan_ptc::{Cluster, DeviceId};

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

/// What the phases solve: the routes of the commodities' paths and of the
/// multicasts' options, what each multicast delivers to each commodity, the
/// rows' capacities, and each column's traffic cost (phase 2's objective).
#[derive(Clone, Copy)]
pub(super) struct LpData<'a> {
    pub(super) routes: &'a [Vec<Route>],
    pub(super) mroutes: &'a [Vec<Route>],
    pub(super) shares: &'a [Vec<(usize, f64)>],
    /// Capacity of every row (their number is the LP's row count).
    pub(super) caps: &'a [f64],
    /// Load on each row that no variable carries (pinned commodities).
    pub(super) fixed: &'a [f64],
    /// Phase 2's cost of each commodity path and each multicast option.
    pub(super) costs: &'a [Vec<f64>],
    pub(super) mcosts: &'a [Vec<f64>],
}

/// Phase 1's answer: makespan, the duals of the capacity rows (one per
/// row, in row order), path fractions, multicast fractions.
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
/// Pinned commodities (no columns, no multicast) have no row. Returns the
/// number of rows added.
pub(super) fn add_demand_rows(
    model: &mut impl SolverModel,
    x: &[Vec<Variable>],
    y: &[Vec<Variable>],
    shares: &[Vec<(usize, f64)>],
) -> usize {
    let mut rows = 0;
    for (xs, share) in x.iter().zip(shares) {
        if xs.is_empty() && share.is_empty() {
            continue;
        }
        rows += 1;
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
    rows
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

/// One row per resource: `load + fixed ≤ cap · T` (phase 1, `t` given)
/// or `load + fixed ≤ cap · bound` (phase 2), added after the demand rows.
pub(super) fn add_capacity_rows(
    model: &mut impl SolverModel,
    columns: &[Columns<'_, Variable>],
    caps: &[f64],
    fixed: &[f64],
    t: Option<Variable>,
    bound: f64,
) {
    let nres = caps.len();
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
    for (r, mut load) in loads.into_iter().enumerate() {
        match t {
            Some(t) => {
                load.add_mul(-caps[r], t);
                model.add_constraint(load.leq(-fixed[r]));
            }
            None => {
                model.add_constraint(load.leq(caps[r] * bound - fixed[r]));
            }
        }
    }
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
    pub(super) fn phase1(&self, lp: &LpData<'_>) -> Result<Phase1> {
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

    pub(super) fn phase1_with(&self, lp: &LpData<'_>, ipm: bool) -> Result<Phase1> {
        let LpData {
            routes,
            mroutes,
            shares,
            caps,
            fixed,
            ..
        } = *lp;
        let mut vars = ProblemVariables::new();
        let t = vars.add(variable().min(0.0));
        let (x, y) = (add_columns(&mut vars, routes), add_columns(&mut vars, mroutes));
        let columns = routes.iter().chain(mroutes).map(Vec::len).sum();
        let mut model = self.configure_with(vars.minimise(t).using(highs), ipm, columns);
        let first = add_demand_rows(&mut model, &x, &y, shares);
        add_capacity_rows(&mut model, &[(routes, &x), (mroutes, &y)], caps, fixed, Some(t), 1.0);
        add_multicast_rows(&mut model, &y);
        let sol = model.solve().map_err(solver_error)?;
        check_status(&sol)?;
        let t_star = sol.value(t);
        let (fractions, mfractions) = (values(&sol, &x), values(&sol, &y));
        let duals = sol.into_inner().dual_rows()[first..first + caps.len()].to_vec();
        Ok((t_star, duals, fractions, mfractions))
    }
}

impl LpPlanner {
    /// Phase 2: least traffic (the columns' `costs`) with every row's load
    /// at most `capacity · bound`.
    pub(super) fn phase2(&self, lp: &LpData<'_>, bound: f64) -> Result<(Fractions, Fractions)> {
        let mut vars = ProblemVariables::new();
        let (x, y) = (add_columns(&mut vars, lp.routes), add_columns(&mut vars, lp.mroutes));
        let mut objective = Expression::with_capacity(x.iter().map(Vec::len).sum());
        for (xs, ws) in x.iter().zip(lp.costs).chain(y.iter().zip(lp.mcosts)) {
            for (&v, &w) in xs.iter().zip(ws) {
                objective.add_mul(w, v);
            }
        }
        let columns = lp.routes.iter().chain(lp.mroutes).map(Vec::len).sum();
        let mut model = self.configure(vars.minimise(objective).using(highs), columns);
        add_demand_rows(&mut model, &x, &y, lp.shares);
        add_capacity_rows(
            &mut model,
            &[(lp.routes, &x), (lp.mroutes, &y)],
            lp.caps,
            lp.fixed,
            None,
            bound,
        );
        add_multicast_rows(&mut model, &y);
        let sol = model.solve().map_err(solver_error)?;
        check_status(&sol)?;
        Ok((values(&sol, &x), values(&sol, &y)))
    }
}
