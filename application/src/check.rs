//! Check a stored state against what it says of itself, reading every
//! byte: a tenplan checkpoint against its manifest's digests, a PyTorch DCP
//! checkpoint (and Megatron-Core's `torch_dist`, which is one) against its
//! metadata.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tenplan_formats::dcp::{self, Dcp};
use tenplan_formats::Checkpoint;

use crate::Result;

/// What a check found (every byte read and checked).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Checked {
    /// The checkpoint.
    pub dir: PathBuf,
    /// Always true: a check that fails is an error.
    pub ok: bool,
    /// What kind of checkpoint it is, and what it holds.
    #[serde(flatten)]
    pub kind: CheckedKind,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds the check took.
    pub seconds: f64,
}

/// The kinds of checkpoint a check reads.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "format")]
#[non_exhaustive]
pub enum CheckedKind {
    /// A tenplan checkpoint: every tensor's digest matches its manifest.
    #[serde(rename = "tenplan")]
    Tenplan {
        /// Model named by the manifest.
        model: Option<String>,
        /// Layout named by the manifest.
        layout: Option<String>,
        /// Files.
        files: usize,
        /// Tensors.
        tensors: usize,
    },
    /// A PyTorch DCP checkpoint: every chunk found where the metadata says,
    /// of its type and shape, the chunks of each tensor covering it.
    #[serde(rename = "PyTorch DCP")]
    Dcp {
        /// Ranks that wrote it.
        ranks: u32,
        /// Files.
        files: usize,
        /// Tensors.
        tensors: usize,
        /// Chunks.
        chunks: usize,
        /// Entries that are not tensors.
        other_entries: Vec<String>,
    },
    /// A Megatron-Core `torch_dist` checkpoint: its DCP files checked as a
    /// DCP checkpoint's, its `metadata.json` and `common.pt` read.
    #[serde(rename = "Megatron-Core torch_dist")]
    Megatron {
        /// Ranks that wrote it.
        ranks: u32,
        /// Tensor-parallel size, as far as the chunks tell.
        tp: Option<u32>,
        /// Pipeline-parallel size, as far as the chunks tell.
        pp: Option<u32>,
        /// Expert-parallel size, as far as the chunks tell.
        ep: Option<u32>,
        /// The layer implementation whose names it holds (Transformer
        /// Engine's or Megatron's local layers), where its norms tell.
        transformer_impl: Option<dcp::TransformerImpl>,
        /// Files.
        files: usize,
        /// Tensors (layers stacked, as Megatron saves them).
        tensors: usize,
        /// Chunks.
        chunks: usize,
        /// Entries of the DCP files that are not tensors (`_extra_state`
        /// objects).
        other_entries: Vec<String>,
        /// The entries of `common.pt`.
        common_entries: Vec<String>,
        /// How the distributed optimizer's state is saved, if it is.
        optimizer: Option<tenplan_models::DistributedOptimizerFormat>,
    },
}

/// Check a tenplan or DCP checkpoint, reading every byte.
pub fn check(dir: &Path) -> Result<Checked> {
    let start = Instant::now();
    let (kind, bytes) = if dcp::is_dcp(dir) {
        let d = Dcp::open(dir)?;
        let bytes = dcp::read_all(&d);
        let kind = match d.megatron() {
            Some(m) => {
                let p = d.megatron_parallelism();
                CheckedKind::Megatron {
                    ranks: d.ranks(),
                    tp: p.map(|p| p.tp),
                    pp: p.map(|p| p.pp),
                    ep: p.map(|p| p.ep),
                    transformer_impl: d.megatron_impl(),
                    files: d.files().count(),
                    tensors: d.tensors().len(),
                    chunks: d.tensors().iter().map(|t| t.chunks.len()).sum(),
                    other_entries: d.others().to_vec(),
                    common_entries: m.common_entries(),
                    optimizer: tenplan_models::DistributedOptimizerFormat::of(
                        d.tensors().iter().map(|t| t.name.as_str()),
                    ),
                }
            }
            None => CheckedKind::Dcp {
                ranks: d.ranks(),
                files: d.files().count(),
                tensors: d.tensors().len(),
                chunks: d.tensors().iter().map(|t| t.chunks.len()).sum(),
                other_entries: d.others().to_vec(),
            },
        };
        (kind, bytes)
    } else {
        let c = Checkpoint::open(dir)?;
        let bytes = c.verify()?;
        let m = c.manifest();
        (
            CheckedKind::Tenplan {
                model: m.model.clone(),
                layout: m.config.clone(),
                files: m.files.len(),
                tensors: m.tensors.len(),
            },
            bytes,
        )
    };
    Ok(Checked {
        dir: dir.to_path_buf(),
        ok: true,
        kind,
        bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}
