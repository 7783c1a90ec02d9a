//! GPU time each physical channel actually ran: what the host charges each VM and what the
//! hang watchdog measures, where the backend can tell (`PhysicalGpu::channel_busy_ns`; the
//! simulator can, a real GF100 cannot — the host then falls back to dispatch-to-retire
//! intervals and dispatch-based deadlines, see `crate::sched::account` and
//! `crate::host::dispatch`).
//!
//! Why: intervals and deadlines counted from dispatch blame whoever is in flight for whatever
//! the GPU does meanwhile. A VM whose work started outside the scheduler (a channel enabled
//! after its doorbell, one resuming from a semaphore acquire) made the VM queued behind it pay
//! for its GPU time and get killed by the watchdog in its place (the isolation review's
//! findings 6 and 7). Counting what each channel ran charges and kills the VM that ran it.

use std::ops::Range;

use crate::phys::PhysicalGpu;

/// Who a charge is for: the accounting (totals and shares, brought up to date whenever they
/// are read) or the scheduler (told at each completion). Each has its own cursor, so reading
/// the totals never takes time away from what the scheduler is told next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cursor {
    Acct = 0,
    Sched = 1,
}

/// The per-channel GPU time the host has charged so far.
#[derive(Debug, Clone)]
pub(crate) struct ChannelClock {
    /// Counter value of each physical channel up to which its owner has been charged, per
    /// [`Cursor`]; `None` when the backend has no per-channel counters.
    seen: Option<[Vec<u64>; 2]>,
}

impl ChannelClock {
    /// Starts from what `phys`'s channels ran so far.
    pub(crate) fn new(phys: &dyn PhysicalGpu) -> ChannelClock {
        let seen = phys.channel_busy_ns(0).map(|_| {
            let v: Vec<u64> = (0..gf100::pfifo::CHANNELS)
                .map(|p| phys.channel_busy_ns(p).unwrap_or(0))
                .collect();
            [v.clone(), v]
        });
        ChannelClock { seen }
    }

    /// True when the backend measures per-channel time.
    pub(crate) fn measured(&self) -> bool {
        self.seen.is_some()
    }

    /// GPU time physical channel `p` ran so far (`None` without counters).
    pub(crate) fn ran(&self, phys: &dyn PhysicalGpu, p: u32) -> Option<u64> {
        self.seen.as_ref()?;
        phys.channel_busy_ns(p)
    }

    /// GPU time channels `chans` ran since the last call for them, now charged.
    pub(crate) fn take(
        &mut self,
        phys: &dyn PhysicalGpu,
        chans: Range<u32>,
        cursor: Cursor,
    ) -> Option<u64> {
        self.seen.as_ref()?;
        with_counters(phys, chans.clone(), |busy| {
            self.take_read(busy, chans, cursor)
        })
    }

    /// [`ChannelClock::take`] for both cursors from one read of the channels' counters (a
    /// completion charges the accounting and tells the scheduler at once; so does a running
    /// VM at every service).
    pub(crate) fn take_both(
        &mut self,
        phys: &dyn PhysicalGpu,
        chans: Range<u32>,
    ) -> Option<(u64, u64)> {
        self.seen.as_ref()?;
        with_counters(phys, chans.clone(), |busy| {
            let acct = self.take_read(busy, chans.clone(), Cursor::Acct)?;
            let sched = self.take_read(busy, chans, Cursor::Sched)?;
            Some((acct, sched))
        })
    }

    /// Charges `cursor` what `chans` ran up to `busy` (their counters, in order; a channel
    /// without one keeps its mark).
    fn take_read(
        &mut self,
        busy: Option<&[u64]>,
        chans: Range<u32>,
        cursor: Cursor,
    ) -> Option<u64> {
        let seen = &mut self.seen.as_mut()?[cursor as usize];
        let mut ns = 0u64;
        for (i, p) in chans.enumerate() {
            let Some(slot) = seen.get_mut(p as usize) else {
                continue;
            };
            let now = busy
                .as_ref()
                .and_then(|b| b.get(i).copied())
                .unwrap_or(*slot);
            ns = ns.saturating_add(now.saturating_sub(*slot));
            *slot = now.max(*slot);
        }
        Some(ns)
    }
}

/// Runs `f` on the busy-time counters of `chans`, in order (`None` where the backend has none):
/// one channel's alone — what a running VM is charged at every service — without the list a
/// range read returns.
fn with_counters<R>(
    phys: &dyn PhysicalGpu,
    chans: Range<u32>,
    f: impl FnOnce(Option<&[u64]>) -> R,
) -> R {
    if chans.len() == 1 {
        let busy = phys.channel_busy_ns(chans.start).map(|b| [b]);
        return f(busy.as_ref().map(|b| &b[..]));
    }
    f(phys.channels_busy_ns(chans).as_deref())
}
