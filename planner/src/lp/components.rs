//! Phase 1 split into independent LPs: commodities and multicasts whose
//! columns share no row with any outside them.

use std::collections::HashMap;

use super::model::{Fractions, Phase1, Phase1Lp, Route};
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
pub(super) fn root(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// The independent components of an LP's columns, ordered by their first
/// commodity (so plans stay deterministic).
pub(super) fn components(lp: &Phase1Lp<'_>) -> Vec<Component> {
    let (nc, nm, nres) = (lp.routes.len(), lp.mroutes.len(), lp.nres);
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
    for ci in 0..nc {
        let k = of(&mut parent, nres + ci, &mut out);
        out[k].comms.push(ci);
    }
    for mi in 0..nm {
        let k = of(&mut parent, nres + nc + mi, &mut out);
        out[k].mcasts.push(mi);
    }
    for r in 0..nres {
        // A row no column uses has no component (and no load).
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
}

impl SubLp {
    pub(super) fn new(lp: &Phase1Lp<'_>, c: &Component) -> SubLp {
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
        }
    }

    pub(super) fn lp(&self) -> Phase1Lp<'_> {
        Phase1Lp {
            routes: &self.routes,
            mroutes: &self.mroutes,
            shares: &self.shares,
            caps: &self.caps,
            nres: self.caps.len(),
        }
    }
}

impl LpPlanner {
    /// Phase 1 solved one independent component at a time (in parallel):
    /// the makespan is the largest component's, and the duals are those of
    /// the components that reach it (the others' rows are slack in the
    /// whole LP, so its duals price them at zero too). Returned in the
    /// whole LP's numbering: demand rows, then capacity rows.
    pub(super) fn phase1_split(&self, lp: &Phase1Lp<'_>) -> Result<Phase1> {
        use rayon::prelude::*;
        let comps = components(lp);
        if comps.len() <= 1 {
            return self.phase1(lp);
        }
        let solved: Vec<Phase1> = comps
            .par_iter()
            .map(|c| self.phase1(&SubLp::new(lp, c).lp()))
            .collect::<Result<_>>()?;
        let t_star = solved.iter().map(|p| p.0).fold(0.0, f64::max);
        let nc = lp.routes.len();
        let mut duals = vec![0.0; nc + lp.nres];
        let mut fractions: Fractions = vec![Vec::new(); nc];
        let mut mfractions: Fractions = vec![Vec::new(); lp.mroutes.len()];
        for (c, (t, d, f, mf)) in comps.iter().zip(solved) {
            for (&ci, v) in c.comms.iter().zip(f) {
                fractions[ci] = v;
            }
            for (&mi, v) in c.mcasts.iter().zip(mf) {
                mfractions[mi] = v;
            }
            // Only the components that set the makespan have priced rows;
            // their duals follow one demand row per commodity.
            if t >= t_star * (1.0 - 1e-9) {
                for (&r, &y) in c.rows.iter().zip(&d[c.comms.len()..]) {
                    duals[nc + r] = y;
                }
            }
        }
        Ok((t_star, duals, fractions, mfractions))
    }
}
