//! Max-min fair rates from scratch, by progressive filling.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::OrdF64;

/// Progressive filling: repeatedly saturate the resource with the smallest
/// fair share and freeze the groups through it. Dense arrays and a lazy
/// min-heap keep one call near-linear in the routes' length.
pub(super) struct Filler {
    caps: Vec<f64>,
    left: Vec<f64>,
    count: Vec<f64>,
    users: Vec<Vec<usize>>,
    touched: Vec<usize>,
}

impl Filler {
    pub(super) fn new(caps: Vec<f64>) -> Filler {
        let n = caps.len();
        Filler {
            caps,
            left: vec![0.0; n],
            count: vec![0.0; n],
            users: vec![Vec::new(); n],
            touched: Vec::new(),
        }
    }

    /// The fair rate per stream of each of `active` (routes and stream
    /// counts), and the resource that froze it (its bottleneck).
    pub(super) fn rates(&mut self, routes: &[&[u32]], weights: &[f64]) -> Vec<(f64, usize)> {
        for &r in &self.touched {
            self.count[r] = 0.0;
            self.users[r].clear();
        }
        self.touched.clear();
        for (i, route) in routes.iter().enumerate() {
            for &r in route.iter() {
                let r = r as usize;
                if self.users[r].is_empty() {
                    self.touched.push(r);
                    self.left[r] = self.caps[r];
                }
                self.count[r] += weights[i];
                self.users[r].push(i);
            }
        }
        let mut heap: BinaryHeap<Reverse<(OrdF64, usize)>> = self
            .touched
            .iter()
            .map(|&r| Reverse((OrdF64(self.left[r] / self.count[r]), r)))
            .collect();
        let mut out = vec![(-1.0, usize::MAX); routes.len()];
        // Once every group is frozen the entries left can freeze nothing.
        let mut unfrozen = routes.len();
        while unfrozen > 0 {
            let Some(Reverse((OrdF64(share), r))) = heap.pop() else {
                break;
            };
            if self.count[r] <= 0.0 || share != self.left[r] / self.count[r] {
                continue; // stale entry, or nothing left to freeze here
            }
            let share = share.max(0.0);
            let users = std::mem::take(&mut self.users[r]);
            for &i in &users {
                if out[i].0 >= 0.0 {
                    continue;
                }
                out[i] = (share, r);
                unfrozen -= 1;
                for &q in routes[i] {
                    let q = q as usize;
                    self.left[q] -= share * weights[i];
                    self.count[q] -= weights[i];
                    if q != r && self.count[q] > 0.0 {
                        heap.push(Reverse((OrdF64(self.left[q] / self.count[q]), q)));
                    }
                }
            }
            self.users[r] = users;
        }
        out
    }
}
