//! The poller's wake-up ([`Waker`]): what a VM's thread or the control socket uses to tell the
//! daemon's poller (`crate::daemon`) that something became due earlier than its timer is armed
//! for. Its own module because both the daemon (which owns the poller) and each VM's backend
//! (`crate::backend`, which nudges after an access) use it.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gpuvm::host::GpuHost;
use vmm_sys_util::eventfd::EventFd;

/// Wakes the poller when an access made something due earlier than it will wake by itself.
#[derive(Debug)]
pub struct Waker {
    pub(crate) kick: EventFd,
    /// The time the poller's timer is armed for (`u64::MAX`: disarmed).
    pub(crate) armed: AtomicU64,
    pub(crate) stop: AtomicBool,
    pub(crate) wakeups: AtomicU64,
    pub(crate) polls: AtomicU64,
    pub(crate) nudges: AtomicU64,
}

impl Waker {
    pub(crate) fn new() -> io::Result<Waker> {
        Ok(Waker {
            kick: EventFd::new(libc::EFD_NONBLOCK)?,
            armed: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            nudges: AtomicU64::new(0),
        })
    }

    /// After an access: wakes the poller if the host's next event is now earlier than the time
    /// its timer is armed for. Costs one lookup of `next_event_ns` (the host lock).
    pub fn nudge(&self, host: &GpuHost) {
        if let Some(t) = host.next_event_ns() {
            if t < self.armed.load(Ordering::SeqCst) {
                self.kick();
            }
        }
    }

    /// Wakes the poller unconditionally (after a control change: a new weight or cap may let
    /// queued work run).
    pub fn kick(&self) {
        self.nudges.fetch_add(1, Ordering::Relaxed);
        let _ = self.kick.write(1);
    }

    /// Times the poller woke up.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Times the poller called `GpuHost::poll`.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    /// Times a VM thread or the control socket woke the poller.
    pub fn nudges(&self) -> u64 {
        self.nudges.load(Ordering::Relaxed)
    }
}
