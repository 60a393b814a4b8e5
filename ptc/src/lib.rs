//! The parallelizable tensor collection (PTC) of tenplan, and the plan format.
//!
//! A job's state is a set of logical tensors ([`TensorSpec`]). A [`Layout`]
//! slices each tensor into boxes ([`Region`]), groups the boxes into shards
//! (one per model-parallel rank), places them as [`Piece`]s in device
//! [`Buffer`]s, and allocates every shard to one or more devices of a
//! [`Cluster`]. A [`Problem`] asks to move the state from one layout to
//! another; a [`Plan`] answers it with copies and zero-fills.
//!
//! Values are validated on construction: a `Layout` that exists tiles every
//! tensor exactly.
//!
//! ```
//! use std::sync::Arc;
//! use tenplan_ptc::{Buffer, DType, Layout, Piece, Region, Shard, TensorSpec};
//!
//! let tensors: Arc<[TensorSpec]> = vec![TensorSpec::new("w", DType::BF16, [4, 8])].into();
//! // Two tensor-parallel ranks, each holding half of the rows.
//! let shard = |k: u64| Shard {
//!     name: format!("tp{k}"),
//!     devices: vec![k as u32],
//!     buffers: vec![Buffer {
//!         name: "w".into(),
//!         dtype: DType::BF16,
//!         len: 16,
//!         pieces: vec![Piece { tensor: 0, region: Region::new([2 * k..2 * k + 2, 0..8]).unwrap(), offset: 0 }],
//!         partial: false,
//!     }],
//! };
//! let layout = Layout::new(tensors, vec![shard(0), shard(1)]).unwrap();
//! assert_eq!(layout.sub_tensors(0).len(), 2);
//! ```
#![deny(missing_docs)]

pub mod box_io;
mod cluster;
pub mod dataset;
mod described;
mod dtype;
mod error;
pub mod fabric;
mod layout;
pub mod limits;
mod plan;
mod problem;
mod region;
pub mod rng;
mod tensor;

pub use box_io::{add_box, copy_box, read_box, SourceBox, PREAD_RUN};
pub use cluster::{Bandwidths, Cluster, ClusterData, DeviceId, Preset, RailFabric, PRESETS};
pub use dataset::{DataError, DatasetFields, DatasetState, JobState, MicroBatch};
pub use described::{HeldBox, RankHolding};
pub use dtype::{bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32, DType};
pub use error::{Error, Result};
pub use fabric::{rail_optimized, FabricData, FabricLink, SwitchData, Topology, TOPOLOGY_FORMAT};
pub use layout::{validate_tensors, Buffer, Layout, Piece, Shard, SubTensor};
pub use plan::{BoxCopy, Fill, Forward, Pace, Plan, StreamKey, PLAN_FORMAT, PLAN_VERSION};
pub use problem::{Forwarding, Problem, PROBLEM_FORMAT, PROBLEM_VERSION};
pub use region::Region;
pub use rng::{Purpose, RngState, Stream};
pub use tensor::{TensorId, TensorSpec};
