//! Weight sync (RL post-training): after every optimizer step the trainer's
//! weights go to the inference engines' serving layout. The question is
//! the same every step, so its plan is made once — planned, checked by the
//! independent checker, bounded, simulated — and then fetched from the
//! session's cache in well under a microsecond ([`Session::sync`]).
//!
//! ```
//! use tenplan_application::{Session, SyncRequest};
//! use tenplan_models::find;
//! use tenplan_ptc::{Cluster, DType};
//!
//! let req = SyncRequest {
//!     model: find("llama-tiny").unwrap().clone(),
//!     trainer: "tp=2,dp=2".parse().unwrap(),
//!     engines: "tp=2,dp=2,devices=4-7".parse().unwrap(),
//!     cluster: Cluster::parse("2x4").unwrap(),
//!     dtype: DType::BF16,
//!     trainer_dtype: None,
//!     planner: "lp".parse().unwrap(),
//! };
//! let session = Session::new();
//! let first = session.sync(&req).unwrap();
//! assert!(first.report.verified);
//! // Every later step: the same plan, without planning.
//! assert!(std::sync::Arc::ptr_eq(&first, &session.cached_sync(&req).unwrap()));
//! ```
//!
//! A trainer that holds fp32 weights and engines that serve bf16 ask for the
//! conversion with [`SyncRequest::trainer_dtype`]: each trainer rank converts
//! its pieces before sending (so bf16 bytes travel, half of fp32's), and the
//! plan, its check, bound and simulation are those of the bf16 weights.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::Serialize;
use tenplan_models::{ModelSpec, ModelState, StateKind};
use tenplan_planner::{broadcast_floor, BroadcastFloor, PlannerSpec};
use tenplan_ptc::{Cluster, DType, Forwarding, Layout, Plan, Problem};

use crate::assess::{assess, Bound, PlanReport};
use crate::cache::Weigh;
use crate::problem::{ClusterKey, Config};
use crate::{Error, Result, Session};

/// One weight-sync question: a model's weights from the trainer's layout to
/// the engines' serving layout on a cluster, with one planner.
#[derive(Clone, Debug)]
pub struct SyncRequest {
    /// The model.
    pub model: ModelSpec,
    /// The trainer's parallel configuration (`tp=8,pp=8,dp=4,devices=0-255`).
    pub trainer: Config,
    /// The engines': `tp` ranks per engine, `dp` engine replicas, `devices`
    /// (see [`ModelState::serving_layout`]).
    pub engines: Config,
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
    /// The planner.
    pub planner: PlannerSpec,
}

// The cache's key: cheap fields hash, the whole request compares.
impl Hash for SyncRequest {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.model.name.hash(h);
        self.trainer.hash(h);
        self.engines.hash(h);
        ClusterKey(self.cluster.clone()).hash(h);
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

impl Eq for SyncRequest {}

/// A planned weight sync: the checked plan and what it costs.
#[derive(Clone, Debug, Serialize)]
pub struct SyncPlan {
    /// The plan (every step performs it; shared, not copied, by lookups).
    #[serde(skip)]
    pub plan: Arc<Plan>,
    /// The plan checked, bounded and simulated.
    #[serde(flatten)]
    pub report: PlanReport,
    /// The least time checkpoint-engine's policy (a bucketed broadcast of
    /// every weight to every engine device) could take instead.
    pub broadcast_floor: BroadcastFloor,
    /// The element-type conversion each trainer rank makes before sending,
    /// when one was asked for.
    pub conversion: Option<Conversion>,
}

impl Weigh for SyncPlan {
    fn weight(&self) -> u64 {
        self.plan.weight()
    }
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
        state.layout(self.trainer.parsed()).map_err(named(&self.trainer))
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
        let (trainer, engines) = (named(&self.trainer), named(&self.engines));
        state
            .check_plannable(self.trainer.parsed(), &self.cluster)
            .map_err(&trainer)?;
        self.engines.parsed().check_cluster(&self.cluster).map_err(&engines)?;
        let source = state.layout(self.trainer.parsed()).map_err(&trainer)?;
        let target = state.serving_layout(self.engines.parsed()).map_err(&engines)?;
        Ok(Problem::new(source, target, self.cluster.clone())?.with_forwarding(Forwarding::Cluster))
    }
}

/// Errors of one side's layout, named by it as given.
fn named(layout: &Config) -> impl Fn(tenplan_models::Error) -> Error {
    let layout = layout.to_string();
    move |source| Error::Layout {
        layout: layout.clone(),
        source,
    }
}

/// One sync compared across planners (`tenplan sync`): every plan
/// checked, bounded and simulated, beside checkpoint-engine's floor.
#[derive(Clone, Debug, Serialize)]
pub struct SyncComparison {
    /// The model's name.
    pub model: String,
    /// The trainer's layout, as given.
    pub from: String,
    /// The engines' layout, as given.
    pub to: String,
    /// The cluster's name.
    pub cluster: String,
    /// Element type the engines get.
    pub dtype: String,
    /// Bytes of the weights the engines get.
    pub bytes: u64,
    /// The conversion each trainer rank makes before sending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversion: Option<Conversion>,
    /// One report per planner, in the order asked.
    pub rows: Vec<PlanReport>,
    /// The least time checkpoint-engine's policy (a bucketed broadcast of
    /// every weight to every engine device) could take here.
    pub broadcast_floor: BroadcastFloor,
}

/// Plan one sync with each of `planners` (the problem's layouts are built
/// once), checking, bounding and simulating every plan; a plan the checker
/// rejects is an error naming its planner. `req.planner` is not used.
pub fn compare_sync(req: &SyncRequest, planners: &[PlannerSpec]) -> Result<SyncComparison> {
    if planners.is_empty() {
        return Err(Error::request("no planner to compare"));
    }
    let conversion = req.conversion()?;
    let problem = req.problem()?;
    let rows = assess(&problem, planners, Bound::Shared)?
        .into_iter()
        .map(|a| a.verified().map(|a| a.report))
        .collect::<Result<Vec<_>>>()?;
    let floor = broadcast_floor(&problem);
    Ok(SyncComparison {
        model: req.model.name.to_string(),
        from: req.trainer.to_string(),
        to: req.engines.to_string(),
        cluster: req.cluster.name().to_string(),
        dtype: req.dtype.to_string(),
        bytes: floor.bytes,
        conversion,
        rows,
        broadcast_floor: floor,
    })
}

impl Session {
    /// The sync's plan: planned, checked, bounded and simulated the first
    /// time it is asked, then fetched from the cache.
    pub fn sync(&self, req: &SyncRequest) -> Result<Arc<SyncPlan>> {
        self.syncs.get_or_insert_with(req, || {
            let problem = req.problem()?;
            let a = assess(&problem, std::slice::from_ref(&req.planner), Bound::Shared)?
                .remove(0)
                .verified()?;
            Ok(SyncPlan {
                broadcast_floor: broadcast_floor(&problem),
                plan: a.plan,
                report: a.report,
                conversion: req.conversion()?,
            })
        })
    }

    /// The sync's plan if it was planned before (a lookup, no planning).
    pub fn cached_sync(&self, req: &SyncRequest) -> Option<Arc<SyncPlan>> {
        self.syncs.get(req)
    }
}

#[cfg(test)]
mod tests {
    use tenplan_models::find;

    use super::*;

    fn req(cluster: &str) -> SyncRequest {
        SyncRequest {
            model: find("mixtral-tiny").unwrap().clone(),
            trainer: "tp=2,dp=2".parse().unwrap(),
            engines: "tp=2,dp=2,devices=4-7".parse().unwrap(),
            cluster: Cluster::parse(cluster).unwrap(),
            dtype: DType::BF16,
            trainer_dtype: None,
            planner: "lp".parse().unwrap(),
        }
    }

    fn plan(r: &SyncRequest) -> Result<Arc<SyncPlan>> {
        Session::new().sync(r)
    }

    #[test]
    fn a_question_is_planned_once() {
        let session = Session::new();
        let r = req("2x4");
        assert!(session.cached_sync(&r).is_none());
        let a = session.sync(&r).unwrap();
        let b = session.sync(&r).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(session.syncs.len(), 1);
        assert!(a.report.verified);
        assert!(a.report.makespan_s >= a.report.lower_bound_s * 0.999);
        // Another spelling of the same layouts is the same question.
        let mut respelled = r.clone();
        respelled.trainer = "dp=2,tp=2".parse().unwrap();
        assert!(Arc::ptr_eq(&a, &session.sync(&respelled).unwrap()));
    }

    #[test]
    fn every_part_of_the_question_is_in_the_key() {
        let session = Session::new();
        let base = req("2x4");
        session.sync(&base).unwrap();
        let mut other_planner = base.clone();
        other_planner.planner = "static-p2p".parse().unwrap();
        let mut other_engines = base.clone();
        other_engines.engines = "tp=1,dp=4,devices=4-7".parse().unwrap();
        let mut other_dtype = base.clone();
        other_dtype.dtype = DType::F32;
        let mut converted = base.clone();
        converted.trainer_dtype = Some(DType::F32);
        // Naming the trainer's type when it is the engines' asks nothing.
        let mut same = base.clone();
        same.trainer_dtype = Some(DType::BF16);
        assert!(Arc::ptr_eq(
            &session.sync(&same).unwrap(),
            &session.cached_sync(&base).unwrap()
        ));
        // Same name and size, slower messages: a different cluster.
        let mut slower = base.clone();
        let mut data = slower.cluster.data().clone();
        data.latency_s *= 10.0;
        slower.cluster = Cluster::new(data).unwrap();
        for r in [&other_planner, &other_engines, &other_dtype, &converted, &slower] {
            assert!(session.cached_sync(r).is_none(), "{r:?}");
            session.sync(r).unwrap();
        }
        assert_eq!(session.syncs.len(), 6);
        let slow = session.cached_sync(&slower).unwrap().report.makespan_s;
        assert!(slow > session.cached_sync(&base).unwrap().report.makespan_s);
    }

    #[test]
    fn fp32_master_weights_sync_as_bf16() {
        let mut r = req("2x4");
        r.trainer_dtype = Some(DType::F32);
        let s = plan(&r).unwrap();
        let same = plan(&req("2x4")).unwrap();
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
        let e = plan(&r).unwrap_err().to_string();
        assert_eq!(
            e,
            "weight sync: cannot convert the weights from i32 to bf16 (floating-point types only)"
        );
    }

    #[test]
    fn a_bad_side_is_named() {
        let mut r = req("2x4");
        r.engines = "tp=3,devices=4-6".parse().unwrap();
        let e = plan(&r).unwrap_err().to_string();
        assert!(e.starts_with("layout `tp=3,devices=4-6`"), "{e}");
        let mut r = req("2x4");
        r.trainer = "tp=2,dp=8".parse().unwrap();
        let e = plan(&r).unwrap_err().to_string();
        assert!(e.starts_with("layout `tp=2,dp=8`"), "{e}");
    }
}
