//! The planner trait, and planners by name: [`PlannerSpec`] is the one
//! place where a planner's name (and `lp-placed`'s meaning) is read.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use tenplan_ptc::{Plan, Problem};

use crate::LowerBound;
use crate::{
    Broadcast, Central, Error, HotSpa, LeastLoaded, LpPlanner, LpPlannerBuilder, Placement, Result, StaticP2p, Tenplex,
    Trees,
};

/// Something that plans reconfigurations.
pub trait Planner {
    /// The name used on the command line and in plan files.
    fn name(&self) -> &'static str;
    /// Plan the problem, or say why no plan exists.
    fn plan(&self, problem: &Problem) -> Result<Plan>;

    /// Plan the problem, with a lower bound on the makespan of every plan
    /// of the plan's problem where planning certified one on the way (the
    /// LP on a fabric); `None` where it did not.
    fn plan_with_bound(&self, problem: &Problem) -> Result<(Plan, Option<LowerBound>)> {
        Ok((self.plan(problem)?, None))
    }
}

/// Names of every planner, in the order reports list them.
pub const PLANNERS: &[&str] = &["lp", "lp-placed", "tenplex", "central", "least-loaded", "hotspa"];

/// Planners of weight syncs above all (RL post-training), beside
/// [`PLANNERS`]: the published point-to-point and broadcast policies, and
/// broadcast trees among the receivers (`tenplan sync`, the rl suite).
pub const SYNC_PLANNERS: &[&str] = &["static-p2p", "broadcast", "trees"];

/// The planners a weight sync is compared with unless asked otherwise
/// (`tenplan sync`, `tenplan-bench suite --suite rl`): the optimal planner, the
/// published sync policy, and the reshard baselines.
pub const SYNC_COMPARED: &[&str] = &["lp", "static-p2p", "broadcast", "hotspa", "least-loaded", "tenplex"];

/// The policies a planner can follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Policy {
    /// The LP planner (HiGHS), optimal under the cost model, with a
    /// certified bound; `lp-placed` when it also places the target ranks.
    Lp,
    /// Tenplex: every box from data-parallel rank 0.
    Tenplex,
    /// Everything through one node.
    Central,
    /// Fewest holders first, largest first, to the least-loaded source.
    LeastLoaded,
    /// HotSPa: the intra-node owner that has sent least.
    HotSpa,
    /// Static point-to-point weight sync (each engine rank from one trainer rank).
    StaticP2p,
    /// checkpoint-engine's bucketed broadcast.
    Broadcast,
    /// Broadcast trees among the receivers.
    Trees,
}

/// Which planner, and how it runs: its policy, solver threads, time
/// limit, placement and multicast. Built from a name ([`PlannerSpec::named`],
/// or `parse`), then adjusted; options that only the `lp` planner has are
/// refused for the others. A spec that exists describes a planner that can
/// be built.
///
/// ```
/// use tenplan_planner::{Placement, PlannerSpec};
///
/// let placed: PlannerSpec = "lp-placed".parse().unwrap();
/// assert_eq!(placed.placement(), Placement::Optimize);
/// assert_eq!(placed.name(), "lp-placed");
/// let lp = PlannerSpec::named("lp").unwrap().with_placement(Placement::Optimize).unwrap();
/// assert_eq!(lp, placed);
/// assert!(PlannerSpec::named("tenplex").unwrap().with_multicast(false).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannerSpec {
    policy: Policy,
    threads: u32,
    time_limit_s: Option<f64>,
    placement: Placement,
    multicast: bool,
}

impl PlannerSpec {
    /// The planner a name means (`lp`, `lp-placed`, `tenplex`, `central`,
    /// `least-loaded`, `hotspa`, `static-p2p`, `broadcast`, `trees`), with
    /// its defaults: one thread, no time limit, multicast on, and the fixed
    /// placement except for `lp-placed`.
    pub fn named(name: &str) -> Result<PlannerSpec> {
        let (policy, placement) = match name {
            "lp" => (Policy::Lp, Placement::Fixed),
            "lp-placed" => (Policy::Lp, Placement::Optimize),
            "tenplex" => (Policy::Tenplex, Placement::Fixed),
            "central" => (Policy::Central, Placement::Fixed),
            "least-loaded" => (Policy::LeastLoaded, Placement::Fixed),
            "hotspa" => (Policy::HotSpa, Placement::Fixed),
            "static-p2p" => (Policy::StaticP2p, Placement::Fixed),
            "broadcast" => (Policy::Broadcast, Placement::Fixed),
            "trees" => (Policy::Trees, Placement::Fixed),
            _ => {
                return Err(Error::UnknownPlanner {
                    name: name.to_string(),
                    known: [PLANNERS, SYNC_PLANNERS].concat().join(", "),
                })
            }
        };
        Ok(PlannerSpec {
            policy,
            threads: 1,
            time_limit_s: None,
            placement,
            multicast: true,
        })
    }

    /// Its name, as plans and reports carry it (`lp-placed` for the LP
    /// planner that places the target ranks).
    pub fn name(&self) -> &'static str {
        match self.policy {
            Policy::Lp if self.placement == Placement::Optimize => "lp-placed",
            Policy::Lp => "lp",
            Policy::Tenplex => "tenplex",
            Policy::Central => "central",
            Policy::LeastLoaded => "least-loaded",
            Policy::HotSpa => "hotspa",
            Policy::StaticP2p => "static-p2p",
            Policy::Broadcast => "broadcast",
            Policy::Trees => "trees",
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Solver threads (the `lp` planner's; 1 keeps plans deterministic).
    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// The LP solver's time limit, if any.
    pub fn time_limit_s(&self) -> Option<f64> {
        self.time_limit_s
    }

    /// Whether the planner chooses which device runs which target rank.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Whether a box several devices of a node need may cross the network once.
    pub fn multicast(&self) -> bool {
        self.multicast
    }

    /// With `threads` solver threads: at least 1, at most this machine's
    /// cores (more solver threads than cores only slow HiGHS down).
    pub fn with_threads(mut self, threads: u32) -> Result<PlannerSpec> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        if threads == 0 || threads > cores {
            return Err(Error::Threads { threads, cores });
        }
        self.threads = threads;
        Ok(self)
    }

    /// With a time limit for the LP solver (checked by
    /// [`tenplan_ptc::limits::check_time_limit`]).
    pub fn with_time_limit_s(mut self, seconds: f64) -> Result<PlannerSpec> {
        tenplan_ptc::limits::check_time_limit(seconds)?;
        self.time_limit_s = Some(seconds);
        Ok(self)
    }

    /// With another placement: choosing it (`Optimize`) is the `lp`
    /// planner's alone; `lp-placed` always chooses it.
    pub fn with_placement(mut self, placement: Placement) -> Result<PlannerSpec> {
        match (self.policy, placement) {
            (Policy::Lp, Placement::Fixed) if self.placement == Placement::Optimize => {}
            (Policy::Lp, p) => self.placement = p,
            (_, Placement::Fixed) => {}
            (_, _) => {
                return Err(Error::NeedsLp {
                    option: "--placement optimize",
                    planner: self.name(),
                })
            }
        }
        Ok(self)
    }

    /// With multicast on or off: turning it off is for the `lp` planner,
    /// which alone forwards within a node by choice.
    pub fn with_multicast(mut self, multicast: bool) -> Result<PlannerSpec> {
        if !multicast && self.policy != Policy::Lp {
            return Err(Error::NeedsLp {
                option: "--no-multicast",
                planner: self.name(),
            });
        }
        self.multicast = multicast;
        Ok(self)
    }

    /// The LP planner's builder with this spec's settings, for a caller
    /// that sets more of them (`None` for other policies).
    pub fn lp_builder(&self) -> Option<LpPlannerBuilder> {
        if self.policy != Policy::Lp {
            return None;
        }
        let mut b = LpPlanner::builder()
            .threads(self.threads)
            .placement(self.placement)
            .multicast(self.multicast);
        if let Some(t) = self.time_limit_s {
            b = b.time_limit_s(t);
        }
        Some(b)
    }

    /// The planner.
    pub fn build(&self) -> Box<dyn Planner> {
        match self.policy {
            Policy::Lp => Box::new(self.lp_builder().expect("an lp policy").build()),
            Policy::Tenplex => Box::new(Tenplex),
            Policy::Central => Box::new(Central),
            Policy::LeastLoaded => Box::new(LeastLoaded),
            Policy::HotSpa => Box::new(HotSpa),
            Policy::StaticP2p => Box::new(StaticP2p),
            Policy::Broadcast => Box::new(Broadcast),
            Policy::Trees => Box::new(Trees),
        }
    }
}

// A time limit is finite (checked when it is set), so equality is an
// equivalence, and equal specs hash alike.
impl Eq for PlannerSpec {}

impl std::hash::Hash for PlannerSpec {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.policy.hash(h);
        self.threads.hash(h);
        self.time_limit_s.map(f64::to_bits).hash(h);
        self.placement.hash(h);
        self.multicast.hash(h);
    }
}

impl FromStr for PlannerSpec {
    type Err = Error;

    fn from_str(name: &str) -> Result<PlannerSpec> {
        PlannerSpec::named(name)
    }
}

impl fmt::Display for PlannerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Placement {
    type Err = Error;

    /// `fixed` or `optimize`.
    fn from_str(s: &str) -> Result<Placement> {
        match s {
            "fixed" => Ok(Placement::Fixed),
            "optimize" => Ok(Placement::Optimize),
            other => Err(Error::UnknownPlacement {
                name: other.to_string(),
            }),
        }
    }
}

/// A planner by name, with its defaults (see [`PlannerSpec::named`]).
pub fn planner(name: &str) -> Result<Box<dyn Planner>> {
    Ok(PlannerSpec::named(name)?.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for name in PLANNERS.iter().chain(SYNC_PLANNERS) {
            let spec = PlannerSpec::named(name).unwrap();
            assert_eq!(spec.name(), *name);
            assert_eq!(spec.build().name(), *name);
        }
        let e = PlannerSpec::named("fastest").unwrap_err().to_string();
        assert!(e.starts_with("unknown planner `fastest` (known: lp, lp-placed"), "{e}");
    }

    #[test]
    fn lp_placed_means_optimized_placement_whatever_else_is_asked() {
        let placed = PlannerSpec::named("lp-placed").unwrap();
        assert_eq!(placed.clone().with_placement(Placement::Fixed).unwrap(), placed);
        let lp = PlannerSpec::named("lp").unwrap();
        assert_eq!(lp.with_placement(Placement::Optimize).unwrap().name(), "lp-placed");
        let e = PlannerSpec::named("hotspa")
            .unwrap()
            .with_placement(Placement::Optimize)
            .unwrap_err();
        assert_eq!(e.to_string(), "--placement optimize needs the lp planner, not hotspa");
        assert_eq!(
            "somewhere".parse::<Placement>().unwrap_err().to_string(),
            "unknown placement `somewhere` (expected fixed or optimize)"
        );
    }

    #[test]
    fn threads_are_checked_against_the_cores() {
        let lp = PlannerSpec::named("lp").unwrap();
        assert!(lp.clone().with_threads(1).is_ok());
        let e = lp.with_threads(0).unwrap_err().to_string();
        assert!(e.starts_with("0 solver threads: expected 1 to "), "{e}");
    }
}
