//! The files a job's state lives in: tenplan checkpoints ([`checkpoint`]:
//! one safetensors file per rank and a manifest), PyTorch DCP checkpoints
//! ([`dcp`], with the [`pickle`] reader its metadata needs), Hugging Face
//! model directories ([`hf`] to read, [`hf_export`] to write), and the
//! digests ([`diff`]) that compare any two of them.
//!
//! Every stored state opens as a [`Source`]: its layout, and each tensor's
//! stored boxes in memory maps ([`tenplan_ptc::SourceBox`]), nothing read
//! until asked. Every writer takes a fill closure that produces the bytes of
//! a box, so a new file's contents come from wherever the caller says (a
//! verified plan's copies, a generator, another format) and are written
//! atomically: a directory appears only once complete.
//!
//! ```
//! use tenplan_formats::checkpoint::{self, Checkpoint, CheckpointInfo};
//! use tenplan_formats::Source;
//! use tenplan_models::{find, ModelState, StateKind};
//! use tenplan_ptc::{Cluster, JobState};
//!
//! let spec = find("gpt-tiny").unwrap();
//! let state = ModelState::new(spec, StateKind::Training);
//! let layout = state.layout(&"tp=2".parse().unwrap()).unwrap();
//! let dir = std::env::temp_dir().join(format!("tenplan-formats-doc-{}", std::process::id()));
//! let info = CheckpointInfo {
//!     model: Some(spec.clone()),
//!     config: Some("tp=2".into()),
//!     state: Some("training".into()),
//!     cluster: Cluster::parse("1x2").unwrap(),
//!     job: JobState::default(),
//!     hf_config: None,
//!     scalars: Vec::new(),
//! };
//! // Every byte 7.
//! checkpoint::write(&dir, &layout, &info, None, |_, _, out| { out.fill(7); Ok(()) }, &|_| {}).unwrap();
//! let c = Checkpoint::open(&dir).unwrap();
//! assert_eq!(c.layout(), &layout);
//! assert_eq!(c.all_boxes()[0][0].data[0], 7);
//! c.verify().unwrap();
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```
#![deny(missing_docs)]

pub mod checkpoint;
pub mod dcp;
pub mod diff;
mod digest;
pub mod hf;
pub mod hf_export;
pub mod pickle;
pub mod pickle_writer;
mod source;
mod stream;
pub mod torchtitan;

use std::path::PathBuf;

pub use checkpoint::{Checkpoint, CheckpointInfo, Destination, Manifest, StoredBox, Written};
pub use digest::{digest_from, format_digest, tensor_digest};
pub use source::Source;

/// Why a file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// A file is malformed or disagrees with its manifest or metadata.
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
    /// A state that cannot be written as a Hugging Face model.
    #[error("cannot export: {what}")]
    Export {
        /// Why.
        what: String,
    },
    /// State held as partial sums cannot be stored.
    #[error("tensor `{tensor}` is held as partial sums: {what}")]
    Partial {
        /// Tensor name.
        tensor: String,
        /// What cannot be done.
        what: &'static str,
    },
    /// A fill closure failed; its message.
    #[error("{0}")]
    Fill(String),
    /// A model description that cannot be built or read.
    #[error(transparent)]
    Model(#[from] tenplan_models::Error),
    /// A layout or cluster that is invalid.
    #[error(transparent)]
    Ptc(#[from] tenplan_ptc::Error),
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

/// Write one file atomically (a plan, a problem, a benchmark's results):
/// under a temporary name in the same directory, synced, then renamed over
/// `path`, and the directory synced; a failed write leaves nothing behind.
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| Error::file(path, "is not a file path"))?;
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(Error::io("create", &tmp))?;
        f.write_all(bytes).map_err(Error::io("write", &tmp))?;
        f.sync_all().map_err(Error::io("sync", &tmp))?;
        std::fs::rename(&tmp, path).map_err(Error::io("write", path))?;
        // The rename is durable once the directory is.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
