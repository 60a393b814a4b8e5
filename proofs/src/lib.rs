//! Independent proofs about tenplan plans.
//!
//! - [`check`]: the plan checker. From a plan's two layouts and cluster alone
//!   it proves that every element of every target piece is written exactly
//!   once with the value of the same logical element, read from a live device
//!   that holds it; that padding is zero-filled; and that nothing is written
//!   out of bounds. Otherwise it names the tensor, box and device at fault.
//!   It depends on the PTC types only, never on a planner.
//! - [`run_and_compare`]: the reference interpreter, which executes a plan
//!   element by element on random bytes and compares every target buffer with
//!   one built directly from the global tensors.
//! - [`random_problem`] and, with the `proptest` feature, strategies for
//!   property tests.
//!
//! ```
//! use std::sync::Arc;
//! use tenplan_proofs::{check, Violation};
//! use tenplan_ptc::*;
//!
//! let tensors: Arc<[TensorSpec]> = vec![TensorSpec::new("w", DType::F32, [4])].into();
//! let on = |d: u32| {
//!     let piece = Piece { tensor: 0, region: Region::full(&[4]), offset: 0 };
//!     let buffer = Buffer { name: "w".into(), dtype: DType::F32, len: 4, pieces: vec![piece], partial: false };
//!     Layout::new(tensors.clone(), vec![Shard { name: "s".into(), devices: vec![d], buffers: vec![buffer] }]).unwrap()
//! };
//! let problem = Problem::new(on(0), on(1), Cluster::parse("1x2").unwrap()).unwrap();
//! let copy = BoxCopy { src: 0, dst: 1, via: vec![], tensor: 0, region: Region::new([0..3]).unwrap(), buffer: 0, offset: 0, reduce: false, round: 0, fanout: vec![] };
//! let plan = Plan { planner: "hand".into(), problem, copies: vec![copy], fills: vec![], paces: vec![] };
//! // Element 3 is never written:
//! assert!(matches!(check(&plan), Err(Violation::NotWritten { written: 3, total: 4, .. })));
//! ```
#![deny(missing_docs)]

mod checker;
mod interpreter;
mod random;
mod splitmix;

pub use checker::{check, verify, Certificate, Verified, Violation};
pub use interpreter::{addends, compare, execute, materialize, random_tensors, run_and_compare, Mismatch, State};
#[cfg(feature = "proptest")]
pub use random::strategies;
pub use random::{random_layout, random_problem, relabel};
pub use splitmix::SplitMix64;
