#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod render;

pub use tenplan_application as application;
pub use tenplan_executor as executor;
pub use tenplan_formats as formats;
pub use tenplan_models as models;
pub use tenplan_planner as planner;
pub use tenplan_proofs as proofs;
pub use tenplan_ptc as ptc;
