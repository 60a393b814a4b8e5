#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub use tenplan_executor as executor;
pub use tenplan_models as models;
pub use tenplan_planner as planner;
pub use tenplan_proofs as proofs;
pub use tenplan_ptc as ptc;

/// What a plan costs and whether it is correct (the planner crate's `report`).
pub use tenplan_planner::report;
/// Hot switching between parallel strategies (the planner crate's `switch`).
pub use tenplan_planner::switch;
