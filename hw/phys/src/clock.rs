//! Time, real or simulated. The simulated GPU models each operation's duration against a
//! [`Clock`]; schedulers account GPU time against the same clock.
//!
//! [`SimClock`] only moves when told to ([`SimClock::advance`]), so runs on it are deterministic
//! and as fast as the host allows; [`RealClock`] follows the host's monotonic clock.
//! (This is a leaf module so that both `phys` and, later, `sched` can use it.)

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A monotonic nanosecond clock.
pub trait Clock: Send + Sync + Debug {
    /// Nanoseconds since the clock's epoch. Never decreases.
    fn now_ns(&self) -> u64;

    /// Lets `ns` nanoseconds pass: a simulated clock jumps, a real clock spins/yields until they
    /// have passed. Used by drivers that poll with a delay (like nouveau's `nvkm_usec`).
    fn wait_ns(&self, ns: u64);

    /// True for a simulated clock.
    fn is_simulated(&self) -> bool;
}

/// Which clock to use, as chosen on a command line or in a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockKind {
    /// Deterministic simulated time.
    #[default]
    Sim,
    /// The host's monotonic clock.
    Real,
}

impl ClockKind {
    /// Creates a clock of this kind.
    pub fn create(self) -> std::sync::Arc<dyn Clock> {
        match self {
            ClockKind::Sim => std::sync::Arc::new(SimClock::new()),
            ClockKind::Real => std::sync::Arc::new(RealClock::new()),
        }
    }
}

impl std::str::FromStr for ClockKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sim" => Ok(ClockKind::Sim),
            "real" => Ok(ClockKind::Real),
            other => Err(format!(
                "unknown clock '{other}' (expected 'sim' or 'real')"
            )),
        }
    }
}

/// Simulated time: starts at 0 and moves only by [`SimClock::advance`] / [`Clock::wait_ns`].
#[derive(Debug, Default)]
pub struct SimClock {
    ns: AtomicU64,
}

impl SimClock {
    /// A clock at time 0.
    pub fn new() -> SimClock {
        SimClock::default()
    }

    /// Moves time forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.ns.fetch_add(ns, Ordering::SeqCst);
    }

    /// Moves time forward to `t` if it is in the future.
    pub fn advance_to(&self, t: u64) {
        self.ns.fetch_max(t, Ordering::SeqCst);
    }
}

impl Clock for SimClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }

    fn wait_ns(&self, ns: u64) {
        self.advance(ns);
    }

    fn is_simulated(&self) -> bool {
        true
    }
}

/// The host's monotonic clock, with its epoch at creation.
#[derive(Debug)]
pub struct RealClock {
    epoch: Instant,
}

impl RealClock {
    /// A clock whose epoch is now.
    pub fn new() -> RealClock {
        RealClock {
            epoch: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock::new()
    }
}

impl Clock for RealClock {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn wait_ns(&self, ns: u64) {
        let end = self.now_ns().saturating_add(ns);
        while self.now_ns() < end {
            std::thread::yield_now();
        }
    }

    fn is_simulated(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_clock_moves_only_when_told() {
        let c = SimClock::new();
        assert_eq!(c.now_ns(), 0);
        c.advance(5);
        c.wait_ns(7);
        assert_eq!(c.now_ns(), 12);
        c.advance_to(3);
        assert_eq!(c.now_ns(), 12);
        c.advance_to(100);
        assert_eq!(c.now_ns(), 100);
    }

    #[test]
    fn real_clock_is_monotonic_and_waits() {
        let c = RealClock::new();
        let a = c.now_ns();
        c.wait_ns(1_000);
        let b = c.now_ns();
        assert!(b >= a + 1_000, "{a} -> {b}");
    }
}
