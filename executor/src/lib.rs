//! Performs verified plans: on host memory, on sharded safetensors
//! checkpoints, on CUDA devices (behind the `cuda` feature), and compiles
//! them into per-device message-passing programs that the Python package's
//! torch.distributed executor runs across processes ([`program`]).
//!
//! The executor is thin on purpose: it takes a [`Verified`] plan (only the
//! independent checker makes one), reads every source box where the source
//! layout puts it, and writes it where the target layout wants it. A box copy
//! runs as a sequence of `memcpy`s of the longest contiguous stretch that the
//! source and destination pieces share; destination devices run in parallel
//! (rayon), which is safe because the checker proved that no two copies write
//! the same element.
//!
//! ```
//! use tenplan_executor::HostMemory;
//! use tenplan_models::{find, ModelState, StateKind};
//! use tenplan_planner::planner;
//! use tenplan_ptc::{Cluster, Problem};
//!
//! let state = ModelState::new(find("gpt-tiny").unwrap(), StateKind::Training);
//! let from = state.layout(&"tp=2,dp=2".parse().unwrap()).unwrap();
//! let to = state.layout(&"tp=4".parse().unwrap()).unwrap();
//! let problem = Problem::new(from, to, Cluster::parse("1x4").unwrap()).unwrap();
//! let plan = planner("hotspa").unwrap().plan(&problem).unwrap();
//! let verified = tenplan_proofs::verify(&plan).unwrap();
//! let source = HostMemory::zeroed(problem.source());
//! let target = tenplan_executor::execute(&verified, &source).unwrap();
//! assert_eq!(target.devices().count(), 4);
//! ```
#![deny(missing_docs)]

mod buffer;
pub mod checkpoint;
mod cuda;
pub mod dcp;
pub mod diff;
mod digest;
mod fill;
pub mod generate;
pub mod hf;
pub mod hf_export;
mod host;
pub mod operations;
pub mod pickle;
pub mod program;
mod reshard;
mod stream;

use std::path::PathBuf;

pub use buffer::HostBuffer;
pub use checkpoint::{Checkpoint, CheckpointInfo, Manifest, StoredBox, Written};
pub use cuda::{cuda_device_count, CudaExecutor, CudaRun};
pub use digest::{digest_from, format_digest, tensor_digest};
pub use fill::{add_box, copy_box, read_box, SourceBox, PREAD_RUN};
pub use host::{execute, HostMemory};
pub use program::{run_programs, DeviceProgram};
pub use reshard::{load, reshard, Resharded, Source};
pub use tenplan_proofs::Verified;
use tenplan_ptc::DeviceId;

/// Why a plan could not be executed, or a checkpoint read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The source state lacks a device the plan reads from.
    #[error("no source buffers for device {device}")]
    MissingDevice {
        /// Device.
        device: DeviceId,
    },
    /// A buffer of the wrong size.
    #[error("device {device} buffer `{buffer}` has {got} bytes, the layout says {expected}")]
    BufferSize {
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// Bytes the layout needs.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// A file system operation failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was being done: `read`, `write`, `create`, ...
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The destination of a write already exists; nothing was written.
    #[error("destination {} already exists (use --overwrite to replace a checkpoint)", path.display())]
    DestinationExists {
        /// The path.
        path: PathBuf,
    },
    /// The destination is what an interrupted write left; nothing was written.
    #[error("destination {} is an incomplete write left by an interrupted tenplan run ({files} files, {bytes} bytes, no manifest); rerun with --overwrite to replace it", path.display())]
    DestinationIncomplete {
        /// The path.
        path: PathBuf,
        /// Files left in it.
        files: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// The destination holds something that is not a tenplan checkpoint.
    #[error("destination {} exists and is not a tenplan checkpoint (tenplan never removes it; choose another path)", path.display())]
    DestinationForeign {
        /// The path.
        path: PathBuf,
    },
    /// A checkpoint's manifest is unreadable or inconsistent.
    #[error("manifest {}: {what}", path.display())]
    Manifest {
        /// The manifest's path.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A safetensors file is malformed or disagrees with its manifest.
    #[error("{}: {what}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The files of a checkpoint do not hold each box of a tensor exactly once.
    #[error("tensor `{tensor}`: {what}")]
    Coverage {
        /// Tensor name.
        tensor: String,
        /// What is missing or repeated.
        what: String,
    },
    /// A tensor's contents do not match the digest its manifest records.
    #[error("tensor `{tensor}`: digest {got} does not match the manifest's {expected}")]
    DigestMismatch {
        /// Tensor name.
        tensor: String,
        /// The manifest's digest.
        expected: String,
        /// The digest of the data.
        got: String,
    },
    /// A plan that does not fit the state it is asked to run on.
    #[error("plan does not fit: {what}")]
    PlanMismatch {
        /// What differs.
        what: String,
    },
    /// A checkpoint that cannot be exported as a Hugging Face model.
    #[error("cannot export: {what}")]
    Export {
        /// Why.
        what: String,
    },
    /// State held as partial sums cannot be stored or run here.
    #[error("tensor `{tensor}` is held as partial sums: {what}")]
    Partial {
        /// Tensor name.
        tensor: String,
        /// What cannot be done.
        what: &'static str,
    },
    /// Buffers that cannot be converted to another layout's element types.
    #[error("device {device} buffer `{buffer}`: cannot convert {what}")]
    Conversion {
        /// Device.
        device: DeviceId,
        /// Buffer name.
        buffer: String,
        /// What does not convert.
        what: String,
    },
    /// This build has no CUDA support (build with `--features cuda`).
    #[error("this build of tenplan has no CUDA support: rebuild with `--features cuda`")]
    NotCompiledWithCuda,
    /// The CUDA driver reported an error, or no usable device exists.
    #[error("cuda: {what}")]
    Cuda {
        /// The driver's message.
        what: String,
    },
    /// A model or a parallel layout that cannot be built.
    #[error(transparent)]
    Model(#[from] tenplan_models::Error),
    /// A cluster, problem or layout that is invalid.
    #[error(transparent)]
    Ptc(#[from] tenplan_ptc::Error),
    /// The target layout does not fit the cluster.
    #[error("the target layout does not fit: {source}")]
    TargetLayout {
        /// Why.
        #[source]
        source: tenplan_ptc::Error,
    },
    /// Planning failed (an infeasible problem carries its missing boxes).
    #[error("planning: {0}")]
    Planning(#[from] tenplan_planner::Error),
    /// The independent checker rejected the plan; nothing was performed.
    #[error("plan rejected: {verdict}")]
    Rejected {
        /// The checker's verdict.
        verdict: String,
    },
    /// A request that contradicts what it names (a model given for a
    /// checkpoint that names its own, an output that is the source, ...).
    #[error("{what}")]
    Request {
        /// What is wrong.
        what: String,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }

    pub(crate) fn file(path: impl Into<PathBuf>, what: impl Into<String>) -> Error {
        Error::File {
            path: path.into(),
            what: what.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
