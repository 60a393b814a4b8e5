//! Model inventories (GPT-3, LLaMA-2/3, Mixtral) and their Megatron-LM
//! parallel layouts (DP, TP, PP, ZeRO-1, EP) as parallelizable tensor collections.
//!
//! ```
//! use tenplan_models::{find, ModelState, StateKind};
//!
//! let state = ModelState::new(find("gpt3-1.3b").unwrap(), StateKind::Training);
//! let layout = state.layout(&"tp=4,pp=2,dp=1".parse().unwrap()).unwrap();
//! assert_eq!(layout.shards().len(), 8);
//! // tp=3 does not divide 16 heads: a typed error that names the numbers.
//! assert!(state.layout(&"tp=3".parse().unwrap()).is_err());
//! ```
#![deny(missing_docs)]

mod catalog;
mod config;
mod error;
mod families;
mod hf_config;
mod megatron_dist;
mod mesh;
mod state;

pub use catalog::{find, Family, Mla, ModelSpec, MODELS};
pub use config::ParallelConfig;
pub use error::{Error, Result};
pub use families::{family_beyond_catalog, hf_family, hf_layout, transformers_version, HfFamily, TpStyle};
pub use hf_config::{from_config_path, from_hf_config, resolve, to_hf_config};
pub use megatron_dist::{torch_dist_layout, DistributedOptimizerFormat};
pub use mesh::{
    chunk, is_mesh, is_unsharded_buffer, pipeline_schedule, pipeline_stages, MeshConfig, TensorPlacement, TpPlacement,
};
pub use state::{adam_moment, ModelState, StateKind, ADAM_MOMENTS};
