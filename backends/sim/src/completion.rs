//! What a copy owes when it completes: the semaphore it releases and whether it raises the
//! non-stall interrupt. Planned by a copy class (`copy`, `m2mf`) and carried by the engine's job
//! (`engine`) until the copy's last piece lands; a file of its own so the engine need not know
//! the copy classes.

/// The semaphore a copy releases when it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SemRelease {
    /// Semaphore VA.
    pub va: u64,
    /// Value written.
    pub payload: u32,
    /// Four-word release (payload, 0, 64-bit timestamp) instead of the payload alone.
    pub four_word: bool,
}

/// What must happen when a copy completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyDone {
    /// Semaphore release, if requested.
    pub sem: Option<SemRelease>,
    /// Raise the non-stall interrupt.
    pub non_stall: bool,
}
