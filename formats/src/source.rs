//! A state stored in files, as plans and digests read it.

use std::path::Path;

use tenplan_ptc::{Layout, SourceBox};

use crate::Checkpoint;

/// A state stored in files that a verified plan reads from: a tenplan
/// [`Checkpoint`], or a PyTorch DCP checkpoint mapped onto a model
/// ([`crate::dcp::DcpSource`]).
pub trait Source: Sync {
    /// Where it is stored (for messages).
    fn location(&self) -> &Path;
    /// Its layout: the source layout of the plans that read it.
    fn layout(&self) -> &Layout;
    /// The stored boxes of every tensor, in tensor order (memory maps;
    /// nothing is read yet).
    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>>;
    /// Ask the kernel to start reading what every reshard reads.
    fn prefetch(&self);
    /// The digests the state records, in tensor order, when it records
    /// them: what a reshard's output must match.
    fn digests(&self) -> Option<Vec<String>>;
}

impl Source for Checkpoint {
    fn location(&self) -> &Path {
        self.dir()
    }

    fn layout(&self) -> &Layout {
        Checkpoint::layout(self)
    }

    fn all_boxes(&self) -> Vec<Vec<SourceBox<'_>>> {
        Checkpoint::all_boxes(self)
    }

    fn prefetch(&self) {
        Checkpoint::prefetch(self)
    }

    fn digests(&self) -> Option<Vec<String>> {
        Some(Checkpoint::digests(self))
    }
}
