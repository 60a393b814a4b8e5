//! Phase 1 kept warm across the rounds of column generation: one HiGHS
//! model (the `highs` crate, which good_lp wraps but rebuilds on every
//! solve) to which each round adds only its new rows and columns, in one
//! batch each, then re-solved by the primal simplex method from the last
//! basis (new columns enter at zero, so the basis stays primal feasible).

use highs::{ColProblem, HighsModelStatus, Model, Sense};
use highs_sys::HighsInt;

use super::columns::RestrictedLp;
use super::model::{Phase1, Route};
use super::LpPlanner;
use crate::{Error, Result, SolverFailure};

/// The live model and where every row and column of the restricted LP
/// sits in it (rows and columns are numbered in the order added).
pub(super) struct WarmPhase1 {
    model: Option<Model>,
    rows: usize,
    cols: usize,
    /// Per commodity: the index of its demand row, if it has one.
    demand: Vec<Option<usize>>,
    /// Per capacity row of the restricted LP (its resource order).
    capacity: Vec<usize>,
    /// Per commodity and per multicast: the columns added so far.
    columns: Vec<Vec<usize>>,
    mcolumns: Vec<Vec<usize>>,
}

/// The makespan variable is the model's first column.
const T: usize = 0;

/// Columns or rows to add in one batch, in compressed sparse form.
#[derive(Default)]
struct Batch {
    cost: Vec<f64>,
    lower: Vec<f64>,
    upper: Vec<f64>,
    starts: Vec<HighsInt>,
    index: Vec<HighsInt>,
    value: Vec<f64>,
}

impl Batch {
    fn push(&mut self, cost: f64, lower: f64, upper: f64, entries: impl IntoIterator<Item = (usize, f64)>) {
        self.cost.push(cost);
        self.lower.push(lower);
        self.upper.push(upper);
        self.starts.push(self.index.len() as HighsInt);
        // HiGHS refuses an index twice in one column or row: a route may
        // load a row twice (a multicast's hops through one link).
        let mut entries: Vec<(usize, f64)> = entries.into_iter().collect();
        entries.sort_unstable_by_key(|e| e.0);
        for (i, v) in entries {
            if self.index.len() > *self.starts.last().expect("pushed above") as usize
                && self.index.last() == Some(&(i as HighsInt))
            {
                *self.value.last_mut().expect("an entry") += v;
            } else {
                self.index.push(i as HighsInt);
                self.value.push(v);
            }
        }
    }

    fn len(&self) -> usize {
        self.lower.len()
    }
}

fn ffi_error(what: &str, status: HighsInt) -> Error {
    Error::Solver(SolverFailure::Other(format!("HiGHS {what} returned status {status}")))
}

/// HiGHS's batch calls, which the `highs` crate does not wrap (it adds one
/// column at a time, and each addition copies the matrix). Both read only
/// the arrays of `batch`, whose lengths agree with the counts passed.
#[allow(unsafe_code)]
fn add(model: &mut Model, batch: &Batch, columns: bool) -> Result<()> {
    if batch.len() == 0 {
        return Ok(());
    }
    let n = batch.len() as HighsInt;
    let nz = batch.index.len() as HighsInt;
    let ptr = model.as_mut_ptr();
    // SAFETY: `ptr` is the live Highs instance `model` owns; every array
    // holds `n` (bounds, costs, starts) or `nz` (index, value) elements,
    // and every index names an existing row (columns) or column (rows).
    let status = unsafe {
        if columns {
            highs_sys::Highs_addCols(
                ptr,
                n,
                batch.cost.as_ptr(),
                batch.lower.as_ptr(),
                batch.upper.as_ptr(),
                nz,
                batch.starts.as_ptr(),
                batch.index.as_ptr(),
                batch.value.as_ptr(),
            )
        } else {
            highs_sys::Highs_addRows(
                ptr,
                n,
                batch.lower.as_ptr(),
                batch.upper.as_ptr(),
                nz,
                batch.starts.as_ptr(),
                batch.index.as_ptr(),
                batch.value.as_ptr(),
            )
        }
    };
    // kHighsStatusOk = 0, kHighsStatusWarning = 1, kHighsStatusError = -1.
    if status < 0 {
        return Err(ffi_error(if columns { "addCols" } else { "addRows" }, status));
    }
    Ok(())
}

impl WarmPhase1 {
    /// The model of the restricted LP as it stands.
    pub(super) fn new(planner: &LpPlanner, lp: &RestrictedLp, caps: &[f64]) -> Result<WarmPhase1> {
        let mut model = ColProblem::default().optimise(Sense::Minimise);
        model.make_quiet();
        model.set_option("threads", planner.threads as i32);
        // Presolve would rebuild the LP on every solve and lose the basis.
        model.set_option("presolve", "off");
        if let Some(limit) = planner.time_limit_s {
            model.set_option("time_limit", limit);
        }
        let mut t = Batch::default();
        t.push(1.0, 0.0, f64::INFINITY, []);
        add(&mut model, &t, true)?;
        let mut warm = WarmPhase1 {
            model: Some(model),
            rows: 0,
            cols: 1,
            demand: Vec::new(),
            capacity: Vec::new(),
            columns: vec![Vec::new(); lp.routes.len()],
            mcolumns: vec![Vec::new(); lp.mroutes.len()],
        };
        // Demand rows (a commodity with columns or multicast shares), then
        // the multicasts' limits; capacity rows come with `sync`.
        let mut rows = Batch::default();
        for (routes, share) in lp.routes.iter().zip(&lp.shares) {
            let has = !(routes.is_empty() && share.is_empty());
            warm.demand.push(has.then(|| warm.rows + rows.len()));
            if has {
                rows.push(0.0, 1.0, 1.0, []);
            }
        }
        let limits: Vec<usize> = (0..lp.mroutes.len()).map(|i| warm.rows + rows.len() + i).collect();
        for _ in &lp.mroutes {
            rows.push(0.0, f64::NEG_INFINITY, 1.0, []);
        }
        warm.add_rows(&rows)?;
        warm.sync(lp, caps)?;
        // The multicasts' columns: fixed from the start. What each
        // delivers to which commodity, by multicast.
        let mut delivers: Vec<Vec<(usize, f64)>> = vec![Vec::new(); lp.mroutes.len()];
        for (ci, share) in lp.shares.iter().enumerate() {
            for &(mi, k) in share {
                delivers[mi].push((ci, k));
            }
        }
        let mut cols = Batch::default();
        let mut mcolumns = vec![Vec::new(); lp.mroutes.len()];
        for (mi, routes) in lp.mroutes.iter().enumerate() {
            for route in routes {
                let demand = delivers[mi]
                    .iter()
                    .filter_map(|&(ci, k)| warm.demand[ci].map(|row| (row, k)));
                let entries = warm
                    .route_entries(route)
                    .chain(demand)
                    .chain(std::iter::once((limits[mi], 1.0)));
                mcolumns[mi].push(warm.cols + cols.len());
                cols.push(0.0, 0.0, f64::INFINITY, entries.collect::<Vec<_>>());
            }
        }
        warm.add_cols(&cols)?;
        warm.mcolumns = mcolumns;
        Ok(warm)
    }

    fn route_entries<'a>(&'a self, route: &'a Route) -> impl Iterator<Item = (usize, f64)> + 'a {
        route.iter().map(|&(r, k)| (self.capacity[r], k))
    }

    fn add_rows(&mut self, batch: &Batch) -> Result<()> {
        self.add_batch(batch, false)
    }

    fn add_cols(&mut self, batch: &Batch) -> Result<()> {
        self.add_batch(batch, true)
    }

    fn add_batch(&mut self, batch: &Batch, columns: bool) -> Result<()> {
        add(self.model.as_mut().expect("a live model"), batch, columns)?;
        *if columns { &mut self.cols } else { &mut self.rows } += batch.len();
        Ok(())
    }

    /// Add the capacity rows and commodity columns the restricted LP has
    /// gained since the last call.
    pub(super) fn sync(&mut self, lp: &RestrictedLp, caps: &[f64]) -> Result<()> {
        let mut rows = Batch::default();
        let known = self.capacity.len();
        for (&cap, &fixed) in caps.iter().zip(&lp.fixed).skip(known) {
            // load − cap · T ≤ −fixed
            self.capacity.push(self.rows + rows.len());
            rows.push(0.0, f64::NEG_INFINITY, -fixed, [(T, -cap)]);
        }
        self.add_rows(&rows)?;
        let mut cols = Batch::default();
        for ci in 0..lp.routes.len() {
            for p in self.columns[ci].len()..lp.routes[ci].len() {
                let demand = self.demand[ci].map(|row| (row, 1.0));
                let entries: Vec<(usize, f64)> = self.route_entries(&lp.routes[ci][p]).chain(demand).collect();
                let c = self.cols + cols.len();
                cols.push(0.0, 0.0, f64::INFINITY, entries);
                self.columns[ci].push(c);
            }
        }
        self.add_cols(&cols)
    }

    /// Solve from the last basis: the makespan, the capacity rows' duals
    /// (in the restricted LP's row order) and the fractions.
    pub(super) fn solve(&mut self) -> Result<Phase1> {
        let model = self.model.take().expect("a live model");
        let solved = model
            .try_solve()
            .map_err(|e| Error::Solver(SolverFailure::Other(format!("HiGHS: {e:?}"))))?;
        match solved.status() {
            HighsModelStatus::Optimal => {}
            HighsModelStatus::ReachedTimeLimit => return Err(Error::Solver(SolverFailure::TimeLimit)),
            HighsModelStatus::Infeasible => return Err(Error::Solver(SolverFailure::Infeasible)),
            HighsModelStatus::Unbounded | HighsModelStatus::UnboundedOrInfeasible => {
                return Err(Error::Solver(SolverFailure::Unbounded))
            }
            other => return Err(Error::Solver(SolverFailure::Other(format!("HiGHS status {other:?}")))),
        }
        let sol = solved.get_solution();
        let (values, duals) = (sol.columns(), sol.dual_rows());
        let t_star = values[T];
        let capacity_duals = self.capacity.iter().map(|&i| duals[i]).collect();
        let pick = |cols: &Vec<Vec<usize>>| -> Vec<Vec<f64>> {
            cols.iter().map(|cs| cs.iter().map(|&c| values[c]).collect()).collect()
        };
        let (fractions, mfractions) = (pick(&self.columns), pick(&self.mcolumns));
        let mut model = Model::from(solved);
        // New columns keep the basis primal feasible (they enter at zero)
        // but not dual feasible: the primal simplex method goes on from it
        // (the dual simplex method, HiGHS's default, restarted far away).
        model.set_option("simplex_strategy", 4);
        self.model = Some(model);
        Ok((t_star, capacity_duals, fractions, mfractions))
    }
}
