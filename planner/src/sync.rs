//! Weight sync (RL post-training): after every optimizer step the trainer's
//! weights go to the inference engines' serving layout. The question is
//! the same every step, so its plan is made once — planned, checked by the
//! independent checker, bounded, simulated — and then fetched from a
//! [`SyncCache`] in microseconds.
//!
//! ```
//! use tenplan_models::find;
//! use tenplan_planner::sync::{SyncCache, SyncRequest};
//! use tenplan_ptc::{Cluster, DType};
//!
//! let req = SyncRequest {
//!     model: find("llama-tiny").unwrap().clone(),
//!     trainer: "tp=2,dp=2".into(),
//!     engines: "tp=2,dp=2,devices=4-7".into(),
//!     cluster: Cluster::parse("2x4").unwrap(),
//!     dtype: DType::BF16,
//!     trainer_dtype: None,
//!     planner: "lp".into(),
//! };
//! let cache = SyncCache::new();
//! let first = cache.get_or_plan(&req).unwrap();
//! assert!(first.report.verified);
//! // Every later step: the same plan, without planning.
//! assert!(std::sync::Arc::ptr_eq(&first, &cache.get(&req).unwrap()));
//! ```
//!
//! A trainer that holds fp32 weights and engines that serve bf16 ask for the
//! conversion with [`SyncRequest::trainer_dtype`]: each trainer rank converts
//! its pieces before sending (so bf16 bytes travel, half of fp32's), and the
//! plan, its check, bound and simulation are those of the bf16 weights.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tenplan_models::{ModelSpec, ModelState, ParallelConfig, StateKind};
use tenplan_ptc::{Cluster, DType, Forwarding, Layout, Plan, Problem};

use crate::{broadcast_floor, evaluate_knowing, planner, BroadcastFloor, Error, PlanReport, Result};

/// One weight-sync question: a model's weights from the trainer's layout to
/// the engines' serving layout on a cluster, with one planner.
#[derive(Clone, Debug)]
pub struct SyncRequest {
    /// The model.
    pub model: ModelSpec,
    /// The trainer's parallel configuration (`tp=8,pp=8,dp=4,devices=0-255`).
    pub trainer: String,
    /// The engines': `tp` ranks per engine, `dp` engine replicas, `devices`
    /// (see [`ModelState::serving_layout`]).
    pub engines: String,
    /// The cluster both run on.
    pub cluster: Cluster,
    /// Element type of the weights the engines get (and the plan moves).
    pub dtype: DType,
    /// Element type the trainer holds the weights in, when it differs from
    /// `dtype`: asking for the conversion (`Some(F32)` with a `BF16`
    /// `dtype`: fp32 master weights to bf16 engines, rounded to nearest
    /// even). Each trainer rank converts its pieces before it sends them
    /// ([`SyncRequest::trainer_layout`] is what it holds, the problem's
    /// source what it sends). Floating-point types only. `None`: `dtype`.
    pub trainer_dtype: Option<DType>,
    /// Planner name (see [`crate::PLANNERS`] and [`crate::SYNC_PLANNERS`]).
    pub planner: String,
}

// The cache's key: cheap fields hash, the whole request compares (the
// cluster by value, so two clusters that share a name never share a plan).
impl Hash for SyncRequest {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.model.name.hash(h);
        self.trainer.hash(h);
        self.engines.hash(h);
        self.cluster.name().hash(h);
        self.cluster.num_devices().hash(h);
        self.dtype.hash(h);
        self.trainer_dtype().hash(h);
        self.planner.hash(h);
    }
}

impl PartialEq for SyncRequest {
    fn eq(&self, o: &SyncRequest) -> bool {
        self.trainer == o.trainer
            && self.engines == o.engines
            && self.dtype == o.dtype
            && self.trainer_dtype() == o.trainer_dtype()
            && self.planner == o.planner
            && self.model == o.model
            && self.cluster == o.cluster
    }
}

// A cluster's capacities are finite (checked when it is built), so
// equality is an equivalence.
impl Eq for SyncRequest {}

/// A planned weight sync: the checked plan and what it costs.
#[derive(Clone, Debug, Serialize)]
pub struct Sync {
    /// The plan (every step performs it; shared, not copied, by lookups).
    #[serde(skip)]
    pub plan: Arc<Plan>,
    /// The plan checked, bounded and simulated.
    pub report: PlanReport,
    /// The least time checkpoint-engine's policy (a bucketed broadcast of
    /// every weight to every engine device) could take instead.
    pub broadcast_floor: BroadcastFloor,
    /// The element-type conversion each trainer rank makes before sending,
    /// when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversion: Option<Conversion>,
}

/// An element-type conversion at the senders of a weight sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Conversion {
    /// What the trainer holds.
    pub from: DType,
    /// What is sent and what the engines get.
    pub to: DType,
    /// Whether values can change (a narrowing such as f32 to bf16).
    pub lossy: bool,
}

impl SyncRequest {
    /// The element type the trainer holds.
    pub fn trainer_dtype(&self) -> DType {
        self.trainer_dtype.unwrap_or(self.dtype)
    }

    /// The conversion the trainer's ranks make before sending, if any; a
    /// non-floating-point type on either side is an error.
    pub fn conversion(&self) -> Result<Option<Conversion>> {
        let (from, to) = (self.trainer_dtype(), self.dtype);
        if from == to {
            return Ok(None);
        }
        if !from.is_float() || !to.is_float() {
            return Err(Error::Conversion { from, to });
        }
        Ok(Some(Conversion {
            from,
            to,
            lossy: from.narrows_to(to),
        }))
    }

    /// The trainer's weights as it holds them (in
    /// [`SyncRequest::trainer_dtype`]): what its ranks convert from. The
    /// problem's source is the same layout in `dtype`.
    pub fn trainer_layout(&self) -> Result<Layout> {
        self.conversion()?;
        let state = ModelState::new(&self.model, StateKind::Weights(self.trainer_dtype()));
        let trainer = self.side(&self.trainer);
        let from: ParallelConfig = self.trainer.parse().map_err(&trainer)?;
        state.layout(&from).map_err(trainer)
    }

    /// Errors of one side's layout, named by it.
    fn side(&self, layout: &str) -> impl Fn(tenplan_models::Error) -> Error {
        let layout = layout.to_string();
        move |source| Error::Layout {
            layout: layout.clone(),
            source: Box::new(source),
        }
    }

    /// The reconfiguration problem: the trainer's weights, as its ranks
    /// send them (in `dtype`, converted where asked), to the engines'
    /// serving layout. Errors name the side and what is wrong (a tp that
    /// does not divide the heads, pp in an engine, a layout that does not
    /// fit the cluster, a conversion that cannot be made). The engines may
    /// forward weights among themselves across the cluster, as
    /// checkpoint-engine's broadcast does ([`Forwarding::Cluster`]).
    pub fn problem(&self) -> Result<Problem> {
        self.conversion()?;
        let state = ModelState::new(&self.model, StateKind::Weights(self.dtype));
        let (trainer, engines) = (self.side(&self.trainer), self.side(&self.engines));
        let from: ParallelConfig = self.trainer.parse().map_err(&trainer)?;
        let to: ParallelConfig = self.engines.parse().map_err(&engines)?;
        state.check_plannable(&from, &self.cluster).map_err(&trainer)?;
        to.check_cluster(&self.cluster).map_err(&engines)?;
        let source = state.layout(&from).map_err(&trainer)?;
        let target = state.serving_layout(&to).map_err(&engines)?;
        Ok(Problem::new(source, target, self.cluster.clone())?.with_forwarding(Forwarding::Cluster))
    }

    /// Plan the sync, check the plan with the independent checker, bound
    /// and simulate it. A plan the checker rejects is an error.
    pub fn plan(&self) -> Result<Sync> {
        self.plan_problem(&self.problem()?)
    }

    /// [`SyncRequest::plan`] on this request's problem, built before (by
    /// [`SyncRequest::problem`]): several planners compared on one sync
    /// build its layouts once.
    pub fn plan_problem(&self, problem: &Problem) -> Result<Sync> {
        let p = planner(&self.planner)?;
        let start = Instant::now();
        let (plan, bound) = p.plan_with_bound(problem)?;
        let report = evaluate_knowing(&plan, start.elapsed().as_secs_f64(), bound.as_ref());
        if !report.verified {
            return Err(Error::Rejected {
                planner: self.planner.clone(),
                verdict: report.verdict,
            });
        }
        Ok(Sync {
            broadcast_floor: broadcast_floor(problem),
            plan: Arc::new(plan),
            report,
            conversion: self.conversion()?,
        })
    }
}

/// Weight-sync plans by question, shared by the threads of a training loop.
pub type SyncCache = crate::cache::PlanCache<SyncRequest, Sync>;

impl SyncCache {
    /// The cached sync, or plan it now and remember it.
    pub fn get_or_plan(&self, req: &SyncRequest) -> Result<Arc<Sync>> {
        self.get_or_insert_with(req, || req.plan())
    }
}

#[cfg(test)]
mod tests {
    use tenplan_models::find;

    use super::*;

    fn req(cluster: &str) -> SyncRequest {
        SyncRequest {
            model: find("mixtral-tiny").unwrap().clone(),
            trainer: "tp=2,dp=2".into(),
            engines: "tp=2,dp=2,devices=4-7".into(),
            cluster: Cluster::parse(cluster).unwrap(),
            dtype: DType::BF16,
            trainer_dtype: None,
            planner: "lp".into(),
        }
    }

    #[test]
    fn a_question_is_planned_once() {
        let cache = SyncCache::new();
        let r = req("2x4");
        assert!(cache.get(&r).is_none());
        let a = cache.get_or_plan(&r).unwrap();
        let b = cache.get_or_plan(&r).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(cache.len(), 1);
        assert!(a.report.verified);
        assert!(a.report.makespan_s >= a.report.lower_bound_s * 0.999);
    }

    #[test]
    fn every_part_of_the_question_is_in_the_key() {
        let cache = SyncCache::new();
        let base = req("2x4");
        cache.get_or_plan(&base).unwrap();
        let mut other_planner = base.clone();
        other_planner.planner = "static-p2p".into();
        let mut other_engines = base.clone();
        other_engines.engines = "tp=1,dp=4,devices=4-7".into();
        let mut other_dtype = base.clone();
        other_dtype.dtype = DType::F32;
        let mut converted = base.clone();
        converted.trainer_dtype = Some(DType::F32);
        // Naming the trainer's type when it is the engines' asks nothing.
        let mut same = base.clone();
        same.trainer_dtype = Some(DType::BF16);
        assert!(Arc::ptr_eq(
            &cache.get_or_plan(&same).unwrap(),
            &cache.get(&base).unwrap()
        ));
        // Same name and size, slower messages: a different cluster.
        let mut slower = base.clone();
        let mut data = slower.cluster.data().clone();
        data.latency_s *= 10.0;
        slower.cluster = Cluster::new(data).unwrap();
        for r in [&other_planner, &other_engines, &other_dtype, &converted, &slower] {
            assert!(cache.get(r).is_none(), "{r:?}");
            cache.get_or_plan(r).unwrap();
        }
        assert_eq!(cache.len(), 6);
        let slow = cache.get(&slower).unwrap().report.makespan_s;
        assert!(slow > cache.get(&base).unwrap().report.makespan_s);
    }

    #[test]
    fn fp32_master_weights_sync_as_bf16() {
        let mut r = req("2x4");
        r.trainer_dtype = Some(DType::F32);
        let s = r.plan().unwrap();
        let same = req("2x4").plan().unwrap();
        // bf16 bytes travel: the plan is the bf16 sync's.
        assert_eq!(s.plan.copies, same.plan.copies);
        assert_eq!(s.report.bytes_moved, same.report.bytes_moved);
        assert_eq!(
            s.conversion,
            Some(Conversion {
                from: DType::F32,
                to: DType::BF16,
                lossy: true
            })
        );
        let bytes = |l: &Layout| -> u64 { l.shards().iter().flat_map(|s| &s.buffers).map(|b| b.bytes()).sum() };
        assert_eq!(bytes(&r.trainer_layout().unwrap()), 2 * bytes(s.plan.problem.source()));
        r.trainer_dtype = Some(DType::I32);
        let e = r.plan().unwrap_err().to_string();
        assert_eq!(
            e,
            "weight sync: cannot convert the weights from i32 to bf16 (floating-point types only)"
        );
    }

    #[test]
    fn a_bad_side_is_named() {
        let mut r = req("2x4");
        r.engines = "tp=3,devices=4-6".into();
        let e = r.plan().unwrap_err().to_string();
        assert!(e.starts_with("layout `tp=3,devices=4-6`"), "{e}");
        let mut r = req("2x4");
        r.trainer = "tp=2,dp=8".into();
        let e = SyncCache::new().get_or_plan(&r).unwrap_err().to_string();
        assert!(e.starts_with("layout `tp=2,dp=8`"), "{e}");
    }
}
