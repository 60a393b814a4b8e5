//! Parallel where it pays: waking rayon's pool costs tens of
//! microseconds, more than the whole of a small problem's work (a
//! scheduler's reduced problems: hundreds of fragments, answered in a
//! millisecond), so work on fewer than [`SMALL`] items runs on the calling
//! thread.

/// Items (fragments, pieces) below which work stays on the calling thread.
pub(crate) const SMALL: usize = 4096;

/// `rayon::join` where `parallel`, else `a` then `b` here.
pub(crate) fn join<A, B, RA, RB>(parallel: bool, a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    if parallel {
        rayon::join(a, b)
    } else {
        (a(), b())
    }
}
