//! The engines' work budget: how much engine work one simulator call — or one host batch of
//! calls, or one batch of the engine worker's — may do ([`WORK_BUDGET`], [`Budget`]), and the
//! counters that show it ([`EngineWorkStats`]). A call's budget bounds how long the work it
//! finds due keeps the simulator's lock (and, inline, the caller's own lock); the worker's
//! batch also ends after the piece it is at while a call waits for the lock
//! (`Budget::callers_waiting`). The budget changes no modeled time.

/// Most units of engine work one simulator call — or, once the host batches its calls
/// (`PhysicalGpu::begin_batch`), one batch — does (MODEL choice, `docs/sim-cost-model.md`).
/// One unit is 4 bytes moved by a copy or memset, or one element operation of a kernel (one
/// multiply-add of a matrix kernel); 4 Mi units is 16 MiB of copy or 4 rows of a 1024x1024
/// matrix product (a few milliseconds of host CPU: `gpuvm exp lockhold` measures the holds).
/// A piece larger than the whole budget runs alone in a call of its own, so that work always
/// progresses (no piece is: the largest are 64 KiB moved or ~64 Ki multiply-adds).
pub const WORK_BUDGET: u64 = 4 << 20;
/// Counters of engine work, for tests and diagnostics (not modeled time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineWorkStats {
    /// Pieces of engine operations performed.
    pub pieces: u64,
    /// Most units of engine work done within one simulator call.
    pub max_call_units: u64,
    /// Calls that stopped because the budget was used up while more work was due.
    pub deferred_calls: u64,
    /// Of `pieces`, those the engine worker performed (`Executor::Worker`).
    pub worker_pieces: u64,
    /// Matrix blocks the engine worker gathered ahead of the one it was at, to compute a run
    /// of blocks with the lock released once ([`crate::worker`]).
    pub gathered_ahead: u64,
}

/// The per-call allowance of engine work.
#[derive(Debug)]
pub(crate) struct Budget {
    used: u64,
    limit: u64,
    deferred: bool,
    /// Whether this is a batch of the engine worker's (`Budget::new_worker_batch`).
    pub(crate) worker: bool,
    pub stats: EngineWorkStats,
    /// Calls waiting for the simulator's lock (`Shared::callers_waiting`): while one does, the
    /// engine worker's batch ends after the piece it is at.
    pub callers_waiting: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            used: 0,
            limit: WORK_BUDGET,
            deferred: false,
            worker: false,
            stats: EngineWorkStats::default(),
            callers_waiting: Default::default(),
        }
    }
}

impl Budget {
    /// A new simulator call starts.
    pub(crate) fn new_call(&mut self) {
        self.used = 0;
        self.limit = WORK_BUDGET;
        self.deferred = false;
        self.worker = false;
    }

    /// Counts a piece done.
    pub(crate) fn count_piece(&mut self) {
        self.stats.pieces += 1;
        self.stats.worker_pieces += self.worker as u64;
    }

    /// A batch of the engine worker's, of at most `limit` units, starts.
    pub(crate) fn new_worker_batch(&mut self, limit: u64) {
        self.used = 0;
        self.limit = limit;
        self.deferred = false;
        self.worker = true;
    }

    /// Takes `units` if they fit in what is left of this call's budget.
    pub(crate) fn take(&mut self, units: u64) -> bool {
        // A piece larger than the whole budget still runs, alone, so that work always
        // progresses.
        let caller_waits = self.worker
            && self
                .callers_waiting
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0;
        if self.used > 0 && (self.used + units > self.limit || caller_waits) {
            if !self.deferred {
                self.deferred = true;
                self.stats.deferred_calls += 1;
            }
            return false;
        }
        self.used += units;
        self.stats.max_call_units = self.stats.max_call_units.max(self.used);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Budget;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_worker_batch_ends_after_its_piece_while_a_call_waits() {
        let mut b = Budget::default();
        b.new_worker_batch(1000);
        assert!(b.take(10) && b.take(10), "nobody waits: the batch goes on");
        b.callers_waiting.store(1, Ordering::Relaxed);
        assert!(
            !b.take(10),
            "a call waits: the batch ends after the piece it was at"
        );
        b.new_worker_batch(1000);
        assert!(
            b.take(10),
            "a new batch always does one piece, so work progresses"
        );
        assert!(!b.take(10));
        // A call's own budget (the inline executor) is not cut short by other callers.
        b.new_call();
        assert!(b.take(10) && b.take(10));
        b.callers_waiting.store(0, Ordering::Relaxed);
        b.new_worker_batch(1000);
        assert!(b.take(10) && b.take(10));
    }
}
