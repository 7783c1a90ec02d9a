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

    /// Lets `ns` nanoseconds pass: a simulated clock jumps, a real clock sleeps through most of
    /// a long wait and yields through the rest ([`RealClock`]). Used by drivers that poll with
    /// a delay (like nouveau's `nvkm_usec` and its fence wait's back-off).
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

    /// Sleeps for the wait's length less how late this thread's sleeps have been ending, then
    /// yields until the end: a wait ends on time (not a timer slack late), and a long one
    /// leaves the CPU to others as a kernel driver's back-off does (nouveau's legacy fence wait
    /// sleeps 1 us, 2 us, ... up to 1 ms in `schedule_hrtimeout`; only short delays spin, as
    /// `udelay` does). Waits not much longer than that lateness only yield.
    ///
    /// Spinning through every wait made each in-process guest waiting for its fence a busy
    /// thread, taking CPU from the simulated GPU's engine worker and the VMs with work to do:
    /// three 16-VM runs of `gpuvm exp scale` on 2 cores made 634 K `sched_yield` calls and
    /// 592 K context switches (docs/benchmarks.md, "Twelfth round").
    fn wait_ns(&self, ns: u64) {
        let start = self.now_ns();
        let end = start.saturating_add(ns);
        let overshoot = SLEEP_OVERSHOOT_NS.with(|o| o.get());
        if ns > overshoot.saturating_add(MIN_SLEEP_NS) {
            let asked = ns - overshoot;
            std::thread::sleep(std::time::Duration::from_nanos(asked));
            let slept = self.now_ns().saturating_sub(start);
            // A moving average of how late this thread's sleeps end (timer slack and wake-up
            // latency), so the next sleep stops short of the end by about that much.
            let late = slept.saturating_sub(asked).min(MAX_OVERSHOOT_NS);
            SLEEP_OVERSHOOT_NS.with(|o| o.set((o.get() * 7 + late) / 8));
        }
        while self.now_ns() < end {
            std::thread::yield_now();
        }
    }

    fn is_simulated(&self) -> bool {
        false
    }
}

/// The shortest sleep a [`RealClock`] wait takes (below, it only yields).
const MIN_SLEEP_NS: u64 = 10_000;

/// The most a [`RealClock`] wait assumes a sleep overshoots (a sleep that ended much later —
/// the thread preempted — does not make every later wait spin).
const MAX_OVERSHOOT_NS: u64 = 200_000;

std::thread_local! {
    /// How late this thread's sleeps have been ending, ns (a moving average; Linux's default
    /// timer slack is 50 us, and a wake-up adds tens of microseconds under virtualization).
    static SLEEP_OVERSHOOT_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(60_000) };
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

    #[test]
    fn a_long_real_wait_sleeps_and_still_lasts_its_whole_length() {
        let c = RealClock::new();
        for ns in [100_000, 2_000_000] {
            let a = c.now_ns();
            let cpu = thread_cpu_ns();
            c.wait_ns(ns);
            let (b, used) = (c.now_ns(), thread_cpu_ns() - cpu);
            assert!(b >= a + ns, "{ns}: {a} -> {b}");
            // Asleep for most of a 2 ms wait: far less CPU than wall time (a spinning wait
            // uses about all of it).
            if ns == 2_000_000 {
                assert!(used < (b - a) / 2, "{used} ns on a CPU of {} ns", b - a);
            }
        }
    }

    /// The calling thread's CPU time, ns (`/proc/thread-self/schedstat`'s first field).
    fn thread_cpu_ns() -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}
