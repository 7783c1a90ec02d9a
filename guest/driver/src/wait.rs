//! Bounded waiting, the way nouveau's `nvkm_msec`/`nvkm_usec` loops poll hardware: test, delay,
//! repeat until a timeout. Time is measured by the delays the driver asks the platform for (the
//! driver has no clock of its own, and a simulated clock only moves when the driver waits), so a
//! loop can never spin forever: every iteration spends budget.
//!
//! Delays back off exponentially from [`Backoff::MIN_NS`] up to an eighth of the time already
//! waited (capped at [`Backoff::MAX_NS`]), so short waits react quickly and long waits (a long
//! kernel on a simulated clock) take a logarithmic number of iterations while overshooting the
//! true completion time by at most about 12 %.

use crate::hal::Platform;

/// A polling budget with exponential back-off.
#[derive(Debug, Clone)]
pub struct Backoff {
    remaining: u64,
    waited: u64,
    next: u64,
}

impl Backoff {
    /// Smallest delay between two polls.
    pub const MIN_NS: u64 = 1_000;
    /// Largest delay between two polls.
    pub const MAX_NS: u64 = 1_000_000;
    /// What an interrupt wake-up is charged against the budget (so an interrupt storm from a
    /// broken device still ends in a timeout).
    pub const IRQ_CHARGE_NS: u64 = 1_000;

    /// A budget of `timeout_ns`.
    pub fn new(timeout_ns: u64) -> Backoff {
        Backoff {
            remaining: timeout_ns,
            waited: 0,
            next: Self::MIN_NS,
        }
    }

    /// True once the budget is spent.
    pub fn expired(&self) -> bool {
        self.remaining == 0
    }

    /// Budget left, in nanoseconds.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The next delay to use (already bounded by the remaining budget).
    pub fn next_delay(&self) -> u64 {
        self.next.min(self.remaining).max(1)
    }

    /// Charges `ns` against the budget and grows the next delay.
    pub fn charge(&mut self, ns: u64) {
        self.remaining = self.remaining.saturating_sub(ns);
        self.waited = self.waited.saturating_add(ns);
        let grown = self
            .next
            .saturating_mul(2)
            .min((self.waited / 8).max(Self::MIN_NS));
        self.next = grown.clamp(Self::MIN_NS, Self::MAX_NS);
    }

    /// Delays once on `platform`; returns false if the budget was already spent.
    pub fn delay<P: Platform + ?Sized>(&mut self, platform: &mut P) -> bool {
        if self.expired() {
            return false;
        }
        let d = self.next_delay();
        platform.delay_ns(d);
        self.charge(d);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(u64, u32);
    impl Platform for Count {
        fn delay_ns(&mut self, ns: u64) {
            self.0 += ns;
            self.1 += 1;
        }
    }

    #[test]
    fn budget_is_bounded_and_iterations_logarithmic() {
        let mut p = Count(0, 0);
        let mut b = Backoff::new(10_000_000_000);
        while b.delay(&mut p) {}
        assert_eq!(p.0, 10_000_000_000);
        // 1 ms cap: about 10_000 iterations for 10 s, and far fewer for the first ms.
        assert!(p.1 < 11_000, "{}", p.1);
        let mut p = Count(0, 0);
        let mut b = Backoff::new(1_000_000);
        while b.delay(&mut p) {}
        assert!(p.1 < 100, "{}", p.1);
    }

    #[test]
    fn zero_budget_never_waits() {
        let mut p = Count(0, 0);
        let mut b = Backoff::new(0);
        assert!(!b.delay(&mut p));
        assert_eq!(p.1, 0);
    }
}
