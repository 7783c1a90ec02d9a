//! Where the engine worker's time goes ([`WorkerTimes`]): wall time split by what the worker
//! was doing, measured with the host's monotonic clock at each change of activity. A diagnostic
//! for experiments (`gpuvm exp scale` reports it): whether the one engine worker bounds a run
//! (it computes or works under the lock nearly all the time) or waits for work (idle while the
//! host has not dispatched the next operation).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The engine worker's wall time by activity, ns, since the GPU was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkerTimes {
    /// Doing due work under the simulator's lock: copies, loads, gathering a block's operands,
    /// writing its results, completions.
    pub locked_ns: u64,
    /// Computing a matrix block with the lock released.
    pub computing_ns: u64,
    /// Waiting to take the lock back (another caller held it or was handed it).
    pub lock_wait_ns: u64,
    /// Reporting to the host with the lock released: the interrupt line, the event waker.
    pub notifying_ns: u64,
    /// Waiting for work in flight to come due (yielding or sleeping): the worker ahead of the
    /// GPU's modeled time.
    pub due_wait_ns: u64,
    /// Asleep with nothing in flight: the GPU idle.
    pub idle_ns: u64,
}

impl WorkerTimes {
    /// What was spent since `earlier`.
    pub fn since(&self, earlier: &WorkerTimes) -> WorkerTimes {
        WorkerTimes {
            locked_ns: self.locked_ns.saturating_sub(earlier.locked_ns),
            computing_ns: self.computing_ns.saturating_sub(earlier.computing_ns),
            lock_wait_ns: self.lock_wait_ns.saturating_sub(earlier.lock_wait_ns),
            notifying_ns: self.notifying_ns.saturating_sub(earlier.notifying_ns),
            due_wait_ns: self.due_wait_ns.saturating_sub(earlier.due_wait_ns),
            idle_ns: self.idle_ns.saturating_sub(earlier.idle_ns),
        }
    }
}

/// One of [`WorkerTimes`]' activities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activity {
    Locked = 0,
    Computing = 1,
    LockWait = 2,
    Notifying = 3,
    DueWait = 4,
    Idle = 5,
}

/// The shared totals (written by the worker only, read by anyone).
#[derive(Debug, Default)]
pub(crate) struct Totals([AtomicU64; 6]);

impl Totals {
    pub(crate) fn read(&self) -> WorkerTimes {
        let v = |a: Activity| self.0[a as usize].load(Ordering::Relaxed);
        WorkerTimes {
            locked_ns: v(Activity::Locked),
            computing_ns: v(Activity::Computing),
            lock_wait_ns: v(Activity::LockWait),
            notifying_ns: v(Activity::Notifying),
            due_wait_ns: v(Activity::DueWait),
            idle_ns: v(Activity::Idle),
        }
    }
}

/// The worker's meter: the activity it is in and since when.
pub(crate) struct Meter<'a> {
    totals: &'a Totals,
    now: Activity,
    since: Instant,
}

impl<'a> Meter<'a> {
    pub(crate) fn new(totals: &'a Totals, start: Activity) -> Meter<'a> {
        Meter::new_at(totals, start, Instant::now())
    }

    fn new_at(totals: &'a Totals, start: Activity, t: Instant) -> Meter<'a> {
        Meter {
            totals,
            now: start,
            since: t,
        }
    }

    /// The worker turns to `next`: the time since the last change goes to the activity it
    /// leaves.
    pub(crate) fn to(&mut self, next: Activity) {
        self.turn_at(next, Instant::now());
    }

    /// [`Meter::to`] at time `t`.
    fn turn_at(&mut self, next: Activity, t: Instant) {
        let ns = t.saturating_duration_since(self.since).as_nanos() as u64;
        self.totals.0[self.now as usize].fetch_add(ns, Ordering::Relaxed);
        self.now = next;
        self.since = t;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn time_goes_to_the_activity_left_and_since_subtracts() {
        let totals = Totals::default();
        let t0 = Instant::now();
        let mut m = Meter::new_at(&totals, Activity::Idle, t0);
        m.turn_at(Activity::Computing, t0 + Duration::from_micros(2_000));
        let first = totals.read();
        assert_eq!(first.idle_ns, 2_000_000, "{first:?}");
        assert_eq!(first.computing_ns, 0);
        m.turn_at(Activity::Locked, t0 + Duration::from_micros(3_000));
        let second = totals.read();
        assert_eq!(second.computing_ns, 1_000_000, "{second:?}");
        assert_eq!(second.idle_ns, first.idle_ns);
        // A time before the last change (clocks never go back; a caller's stale instant)
        // counts nothing rather than wrapping.
        m.turn_at(Activity::Idle, t0);
        assert_eq!(totals.read().locked_ns, 0);
        let d = second.since(&first);
        assert_eq!(d.idle_ns, 0);
        assert_eq!(d.computing_ns, second.computing_ns);
        assert_eq!(d.locked_ns, 0);
    }
}
