//! Planner errors: "no plan exists" is data, rendered by [`Infeasible::report`].

use std::fmt;

use tenplan_ptc::{DeviceId, Region};

/// A box of the target state that no live device holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// Tensor name.
    pub tensor: String,
    /// The box no live device holds.
    pub region: Region,
    /// The devices that held it, all dead.
    pub dead_holders: Vec<DeviceId>,
}

/// Why no plan exists: every target box whose source is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Infeasible {
    /// Every missing (tensor, box), in tensor order, deduplicated.
    pub missing: Vec<Missing>,
}

impl Infeasible {
    /// A multi-line report listing every missing box.
    pub fn report(&self) -> String {
        let mut s = format!("no plan exists: {} boxes have no live holder\n", self.missing.len());
        for m in &self.missing {
            s += &format!(
                "  {} {} (held only by dead devices {:?})\n",
                m.tensor, m.region, m.dead_holders
            );
        }
        s
    }
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.missing.len();
        match self.missing.first() {
            Some(m) => write!(
                f,
                "no plan exists: {bytes} boxes have no live holder, first `{}` {} (held only by dead devices {:?})",
                m.tensor, m.region, m.dead_holders
            ),
            None => write!(f, "no plan exists"),
        }
    }
}

/// Why planning failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Some target state has no live source.
    #[error("{0}")]
    Infeasible(Infeasible),
    /// No planner of that name.
    #[error("unknown planner `{name}` (known: {known})")]
    UnknownPlanner {
        /// The name given.
        name: String,
        /// Known planners.
        known: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
