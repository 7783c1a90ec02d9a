//! How long the host lock is held: every guest access, poll and management call takes the one
//! host-wide lock (`crate::host`), so the longest hold is the longest any other VM's exit can be
//! made to wait. The isolation review found holds of seconds (another VM's kernels simulated
//! inside a victim's register read) and of 210 ms (a PV batch of table switches); the bounds
//! that fixed them are measured here, not assumed: a log2 histogram of hold times, kept with
//! atomics (recording costs two clock reads per hold) and read through `HostStats::lock_holds`.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Buckets of the histogram: bucket `i` counts holds of `[2^i, 2^(i+1))` ns (bucket 0 also
/// counts 0 ns); the last one everything longer.
pub const HOLD_BUCKETS: usize = 40;

/// The histogram, shared by every holder.
#[derive(Debug)]
pub(crate) struct HoldTimes {
    count: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
    /// Where the longest hold's lock was taken (`#[track_caller]` up to the host's API).
    max_at: parking_lot::Mutex<Option<&'static Location<'static>>>,
    buckets: [AtomicU64; HOLD_BUCKETS],
    waits: AtomicU64,
    waited_ns: AtomicU64,
    fast_waits: AtomicU64,
    fast_waited_ns: AtomicU64,
}

impl Default for HoldTimes {
    fn default() -> Self {
        HoldTimes {
            count: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            max_at: parking_lot::Mutex::new(None),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            waits: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
            fast_waits: AtomicU64::new(0),
            fast_waited_ns: AtomicU64::new(0),
        }
    }
}

impl HoldTimes {
    /// Records one hold that started at `since`, its lock taken at `at`.
    pub(crate) fn record(&self, since: Instant, at: &'static Location<'static>) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        if self.max_ns.fetch_max(ns, Ordering::Relaxed) < ns {
            // A new maximum (rare): where it was taken.
            *self.max_at.lock() = Some(at);
        }
        let b = (63 - ns.max(1).leading_zeros() as usize).min(HOLD_BUCKETS - 1);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
    }

    /// Records that a taker found the lock held and waited for it since `since`.
    pub(crate) fn record_wait(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.waited_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Records that a fast-path access found a hold in progress and waited since `since` for it
    /// to end (`host/local.rs`: it then looks again, and may take the usual path).
    pub(crate) fn record_fast_wait(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.fast_waits.fetch_add(1, Ordering::Relaxed);
        self.fast_waited_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Starts a new maximum (the histogram goes on).
    pub(crate) fn reset_max(&self) {
        self.max_ns.store(0, Ordering::Relaxed);
        *self.max_at.lock() = None;
    }

    /// A snapshot.
    pub(crate) fn snapshot(&self) -> LockHolds {
        LockHolds {
            count: self.count.load(Ordering::Relaxed),
            total_ns: self.total_ns.load(Ordering::Relaxed),
            max_ns: self.max_ns.load(Ordering::Relaxed),
            max_at: self
                .max_at
                .lock()
                .map(|l| format!("{}:{}", l.file(), l.line())),
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            waits: self.waits.load(Ordering::Relaxed),
            waited_ns: self.waited_ns.load(Ordering::Relaxed),
            fast_waits: self.fast_waits.load(Ordering::Relaxed),
            fast_waited_ns: self.fast_waited_ns.load(Ordering::Relaxed),
        }
    }
}

/// Hold times of the host lock so far (wall-clock time, whatever clock the GPU runs on).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LockHolds {
    /// Holds recorded.
    pub count: u64,
    /// Their total, ns.
    pub total_ns: u64,
    /// The longest, ns.
    pub max_ns: u64,
    /// Where the longest hold's lock was taken (source file and line of the host API call
    /// that took it), if any.
    pub max_at: Option<String>,
    /// `buckets[i]`: holds of `[2^i, 2^(i+1))` ns ([`HOLD_BUCKETS`] of them).
    pub buckets: Vec<u64>,
    /// Takers (write holds) that found the lock held and waited.
    pub waits: u64,
    /// How long they waited in all, ns.
    pub waited_ns: u64,
    /// Fast-path accesses (`host/local.rs`) that found a hold in progress and waited for it to
    /// end (not holds: they then run beside other VMs or take the usual path, counted above).
    pub fast_waits: u64,
    /// How long they waited in all, ns.
    pub fast_waited_ns: u64,
}

impl LockHolds {
    /// The holds recorded since `earlier` (a snapshot of the same host); `max_ns` is the
    /// maximum since the host's last `GpuHost::reset_lock_hold_max`.
    pub fn since(&self, earlier: &LockHolds) -> LockHolds {
        LockHolds {
            count: self.count - earlier.count.min(self.count),
            total_ns: self.total_ns.saturating_sub(earlier.total_ns),
            max_ns: self.max_ns,
            max_at: self.max_at.clone(),
            buckets: self
                .buckets
                .iter()
                .zip(earlier.buckets.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            waits: self.waits.saturating_sub(earlier.waits),
            waited_ns: self.waited_ns.saturating_sub(earlier.waited_ns),
            fast_waits: self.fast_waits.saturating_sub(earlier.fast_waits),
            fast_waited_ns: self.fast_waited_ns.saturating_sub(earlier.fast_waited_ns),
        }
    }

    /// The smallest bucket bound (2^(i+1) ns) at or below which a fraction `q` of the holds
    /// fall; 0 without holds.
    pub fn quantile_bound_ns(&self, q: f64) -> u64 {
        let want = (self.count as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if want > 0 && seen >= want {
                return 1u64 << (i + 1).min(63);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_land_in_log2_buckets() {
        let h = HoldTimes::default();
        h.record(Instant::now(), Location::caller());
        let s = h.snapshot();
        assert_eq!(s.count, 1);
        assert!(s.max_at.is_some_and(|a| a.contains("hold.rs")));
        assert_eq!(s.buckets.iter().sum::<u64>(), 1);
        assert!(s.max_ns >= s.total_ns);
        let mut l = LockHolds {
            count: 4,
            total_ns: 0,
            max_ns: 9,
            max_at: None,
            buckets: vec![0; HOLD_BUCKETS],
            ..LockHolds::default()
        };
        l.buckets[1] = 3; // [2, 4) ns
        l.buckets[3] = 1; // [8, 16) ns
        assert_eq!(l.quantile_bound_ns(0.5), 4);
        assert_eq!(l.quantile_bound_ns(1.0), 16);
        let d = l.since(&LockHolds {
            count: 1,
            buckets: {
                let mut b = vec![0; HOLD_BUCKETS];
                b[1] = 1;
                b
            },
            ..LockHolds::default()
        });
        assert_eq!((d.count, d.buckets[1], d.buckets[3]), (3, 2, 1));
        let before = h.snapshot();
        h.record_wait(Instant::now());
        let w = h.snapshot().since(&before);
        assert_eq!((w.count, w.waits, w.fast_waits), (0, 1, 0));
        h.record_fast_wait(Instant::now());
        let w = h.snapshot().since(&before);
        assert_eq!((w.count, w.waits, w.fast_waits), (0, 1, 1));
    }
}
