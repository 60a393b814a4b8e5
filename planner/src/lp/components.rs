//! Both phases split into independent LPs: commodities and multicasts
//! whose columns share no row with any outside them.

use std::collections::HashMap;

use super::model::{row_loads, Fractions, LpData, Phase1, Route};
use super::LpPlanner;
use crate::Result;

/// Commodities and multicasts whose columns share no row with any outside
/// them, with the rows they use: the LP splits into one independent LP per
/// component (the rails and pipeline stages of a data-parallel change at
/// 16k GPUs are dozens of them), each far cheaper to solve than their sum.
pub(super) struct Component {
    pub(super) comms: Vec<usize>,
    pub(super) mcasts: Vec<usize>,
    pub(super) rows: Vec<usize>,
}

/// Union-find root with path halving.
pub(crate) fn root(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// The independent components of an LP's columns, ordered by their first
/// commodity (so plans stay deterministic). Pinned commodities (no
/// columns, no multicast) belong to none.
pub(super) fn components(lp: &LpData<'_>) -> Vec<Component> {
    let (nc, nm, nres) = (lp.routes.len(), lp.mroutes.len(), lp.caps.len());
    // Vertices: rows, then commodities, then multicasts.
    let mut parent: Vec<usize> = (0..nres + nc + nm).collect();
    let join = |parent: &mut Vec<usize>, a: usize, b: usize| {
        let (ra, rb) = (root(parent, a), root(parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    };
    for (ci, opts) in lp.routes.iter().enumerate() {
        for &(r, _) in opts.iter().flatten() {
            join(&mut parent, nres + ci, r);
        }
        for &(mi, _) in &lp.shares[ci] {
            join(&mut parent, nres + ci, nres + nc + mi);
        }
    }
    for (mi, opts) in lp.mroutes.iter().enumerate() {
        for &(r, _) in opts.iter().flatten() {
            join(&mut parent, nres + nc + mi, r);
        }
    }
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut out: Vec<Component> = Vec::new();
    let mut of = |parent: &mut Vec<usize>, v: usize, out: &mut Vec<Component>| -> usize {
        let r = root(parent, v);
        *index.entry(r).or_insert_with(|| {
            out.push(Component {
                comms: Vec::new(),
                mcasts: Vec::new(),
                rows: Vec::new(),
            });
            out.len() - 1
        })
    };
    for ci in (0..nc).filter(|&ci| !(lp.routes[ci].is_empty() && lp.shares[ci].is_empty())) {
        let k = of(&mut parent, nres + ci, &mut out);
        out[k].comms.push(ci);
    }
    for mi in 0..nm {
        let k = of(&mut parent, nres + nc + mi, &mut out);
        out[k].mcasts.push(mi);
    }
    for r in 0..nres {
        // A row no column uses has no component (and no load but its
        // fixed one).
        if let Some(&k) = index.get(&root(&mut parent, r)) {
            out[k].rows.push(r);
        }
    }
    out
}

/// One component's LP, its rows renumbered from 0.
pub(super) struct SubLp {
    pub(super) routes: Vec<Vec<Route>>,
    pub(super) mroutes: Vec<Vec<Route>>,
    pub(super) shares: Vec<Vec<(usize, f64)>>,
    pub(super) caps: Vec<f64>,
    pub(super) fixed: Vec<f64>,
    pub(super) costs: Vec<Vec<f64>>,
    pub(super) mcosts: Vec<Vec<f64>>,
}

impl SubLp {
    pub(super) fn new(lp: &LpData<'_>, c: &Component) -> SubLp {
        let local: HashMap<usize, usize> = c.rows.iter().enumerate().map(|(i, &r)| (r, i)).collect();
        let mlocal: HashMap<usize, usize> = c.mcasts.iter().enumerate().map(|(i, &m)| (m, i)).collect();
        let remap = |opts: &Vec<Route>| -> Vec<Route> {
            opts.iter()
                .map(|route| route.iter().map(|&(r, k)| (local[&r], k)).collect())
                .collect()
        };
        SubLp {
            routes: c.comms.iter().map(|&ci| remap(&lp.routes[ci])).collect(),
            mroutes: c.mcasts.iter().map(|&mi| remap(&lp.mroutes[mi])).collect(),
            shares: c
                .comms
                .iter()
                .map(|&ci| lp.shares[ci].iter().map(|&(m, k)| (mlocal[&m], k)).collect())
                .collect(),
            caps: c.rows.iter().map(|&r| lp.caps[r]).collect(),
            fixed: c.rows.iter().map(|&r| lp.fixed[r]).collect(),
            costs: c.comms.iter().map(|&ci| lp.costs[ci].clone()).collect(),
            mcosts: c.mcasts.iter().map(|&mi| lp.mcosts[mi].clone()).collect(),
        }
    }

    pub(super) fn lp(&self) -> LpData<'_> {
        LpData {
            routes: &self.routes,
            mroutes: &self.mroutes,
            shares: &self.shares,
            caps: &self.caps,
            fixed: &self.fixed,
            costs: &self.costs,
            mcosts: &self.mcosts,
        }
    }
}

impl LpPlanner {
    /// Phase 1 solved one independent component at a time (in parallel):
    /// the makespan is the largest component's (or a row's fixed load),
    /// and the duals are those of the components that reach it (the others'
    /// rows are slack in the whole LP, so its duals price them at zero too).
    pub(super) fn phase1_split(&self, lp: &LpData<'_>) -> Result<Phase1> {
        use rayon::prelude::*;
        let comps = components(lp);
        if comps.len() <= 1 {
            return self.phase1(lp);
        }
        let solved: Vec<Phase1> = comps
            .par_iter()
            .map(|c| self.phase1(&SubLp::new(lp, c).lp()))
            .collect::<Result<_>>()?;
        // Rows in no component carry only fixed load.
        let mut in_some = vec![false; lp.caps.len()];
        for &r in comps.iter().flat_map(|c| &c.rows) {
            in_some[r] = true;
        }
        let fixed_only = (0..lp.caps.len())
            .filter(|&r| !in_some[r])
            .map(|r| lp.fixed[r] / lp.caps[r])
            .fold(0.0, f64::max);
        let t_star = solved.iter().map(|p| p.0).fold(fixed_only, f64::max);
        let mut duals = vec![0.0; lp.caps.len()];
        let (fractions, mfractions) = assemble(lp, &comps, solved.iter().map(|p| (&p.2, &p.3)));
        for (c, (t, d, _, _)) in comps.iter().zip(&solved) {
            // Only the components that set the makespan have priced rows.
            if *t >= t_star * (1.0 - 1e-9) {
                for (&r, &y) in c.rows.iter().zip(d) {
                    duals[r] = y;
                }
            }
        }
        Ok((t_star, duals, fractions, mfractions))
    }

    /// Phase 2 solved one independent component at a time (in parallel):
    /// its objective and its rows separate along the components.
    pub(super) fn phase2_split(&self, lp: &LpData<'_>, bound: f64) -> Result<(Fractions, Fractions)> {
        use rayon::prelude::*;
        let comps = components(lp);
        if comps.len() <= 1 {
            return self.phase2(lp, bound);
        }
        let solved: Vec<(Fractions, Fractions)> = comps
            .par_iter()
            .map(|c| self.phase2(&SubLp::new(lp, c).lp(), bound))
            .collect::<Result<_>>()?;
        Ok(assemble(lp, &comps, solved.iter().map(|p| (&p.0, &p.1))))
    }
}

/// The whole LP's fractions from its components' (pinned commodities keep
/// none).
fn assemble<'a>(
    lp: &LpData<'_>,
    comps: &[Component],
    solved: impl Iterator<Item = (&'a Fractions, &'a Fractions)>,
) -> (Fractions, Fractions) {
    let mut fractions: Fractions = vec![Vec::new(); lp.routes.len()];
    let mut mfractions: Fractions = vec![Vec::new(); lp.mroutes.len()];
    for (c, (f, mf)) in comps.iter().zip(solved) {
        for (&ci, v) in c.comms.iter().zip(f) {
            fractions[ci] = v.clone();
        }
        for (&mi, v) in c.mcasts.iter().zip(mf) {
            mfractions[mi] = v.clone();
        }
    }
    (fractions, mfractions)
}

/// The LP without some rows (a fabric's switch links): every route with
/// their entries dropped, so that components no longer join through them.
pub(super) struct Relaxed {
    routes: Vec<Vec<Route>>,
    mroutes: Vec<Vec<Route>>,
}

impl Relaxed {
    /// `lp` without the rows `dropped` marks, or `None` where it marks none
    /// or that leaves one component (nothing to split: the whole LP is no
    /// dearer).
    pub(super) fn new(lp: &LpData<'_>, dropped: &[bool]) -> Option<Relaxed> {
        if !dropped.contains(&true) {
            return None;
        }
        let strip = |routes: &[Vec<Route>]| -> Vec<Vec<Route>> {
            routes
                .iter()
                .map(|opts| {
                    opts.iter()
                        .map(|route| route.iter().copied().filter(|&(r, _)| !dropped[r]).collect())
                        .collect()
                })
                .collect()
        };
        let relaxed = Relaxed {
            routes: strip(lp.routes),
            mroutes: strip(lp.mroutes),
        };
        (components(&relaxed.lp(lp)).len() > 1).then_some(relaxed)
    }

    /// The relaxed LP, with `lp`'s capacities, fixed loads and costs.
    pub(super) fn lp<'a>(&'a self, lp: &LpData<'a>) -> LpData<'a> {
        LpData {
            routes: &self.routes,
            mroutes: &self.mroutes,
            ..*lp
        }
    }
}

/// The rows that fractions of `lp`'s columns load past their capacity at
/// makespan `t` (with the solver's relative tolerance).
pub(super) fn overloaded(lp: &LpData<'_>, fractions: &Fractions, mfractions: &Fractions, t: f64) -> Vec<usize> {
    let loads = row_loads(&[(lp.routes, fractions), (lp.mroutes, mfractions)], lp.caps.len());
    (0..loads.len())
        .filter(|&r| loads[r] + lp.fixed[r] > lp.caps[r] * t * (1.0 + FIT_TOLERANCE) + FIT_TOLERANCE)
        .collect()
}

/// Relative tolerance of [`overloaded`], about HiGHS's primal feasibility
/// tolerance.
const FIT_TOLERANCE: f64 = 1e-7;
