//! Performs verified plans: on host memory, on states stored in files (a
//! new tenplan checkpoint, or the target state loaded into memory, read
//! through [`tenplan_formats`]), on CUDA devices (behind the `cuda`
//! feature), and compiles them into per-device message-passing programs
//! that the Python package's torch.distributed executor runs across
//! processes ([`program`]), whose copies between CPU tensors it performs
//! as compiled `memcpy`s ([`strided`]).
//!
//! The executor is thin on purpose: it takes a [`Verified`] plan (only the
//! independent checker makes one), reads every source box where the source
//! layout puts it, and writes it where the target layout wants it. A box copy
//! runs as a sequence of `memcpy`s of the longest contiguous stretch that the
//! source and destination pieces share ([`tenplan_ptc::box_io`]); destination
//! devices run in parallel (rayon), which is safe because the checker proved
//! that no two copies write the same element. It plans nothing: it depends
//! on neither the planner nor the LP solver.
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
mod cuda;
pub mod generate;
mod host;
pub mod program;
mod reshard;
pub mod strided;

pub use buffer::HostBuffer;
pub use cuda::{cuda_device_count, CudaExecutor, CudaRun};
pub use host::{execute, HostMemory};
pub use program::{run_programs, run_programs_with, DeviceProgram, ALONE_MIN_BYTES};
pub use reshard::{load, reshard, reshard_to_dcp, PlanReader, Resharded};
pub use strided::{HostRange, StridedCopies, StridedCopy, STREAMING_BYTES};
pub use tenplan_proofs::Verified;
use tenplan_ptc::DeviceId;

/// Why a plan could not be executed.
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
    /// A plan that does not fit the state it is asked to run on.
    #[error("plan does not fit: {what}")]
    PlanMismatch {
        /// What differs.
        what: String,
    },
    /// State held as partial sums cannot be run here.
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
    /// A strided copy that does not fit the memory it was given
    /// ([`StridedCopies`]).
    #[error("copy {copy} of a strided set: {what}")]
    StridedCopy {
        /// Index of the copy.
        copy: usize,
        /// What is wrong with it.
        what: String,
    },
    /// Reading or writing the files of a stored state failed.
    #[error(transparent)]
    Format(#[from] tenplan_formats::Error),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
