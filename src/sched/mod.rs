//! Scheduling of GPU work between VMs (GPUvm §"GPU scheduling"; DESIGN §5 "Scheduling"): a guest's
//! doorbell (GP_PUT write) does not reach the physical GPU directly. The device model turns it
//! into a [`Submission`] — "channel c of VM v advanced GP_PUT to p" — and hands it to a
//! [`Scheduler`], which alone decides when it is written to the physical GPU.
//!
//! The trait is event-driven, like Gdev's `on_arrival` / `on_completion`: [`Scheduler::submit`]
//! when a doorbell arrives, [`Scheduler::complete`] when the GPU has finished a submission, and
//! [`Scheduler::pick`] whenever the GPU could take more work. The device model enforces the two
//! rules every policy shares: work of two different VMs never overlaps on the GPU (GPU work is
//! not preemptive, so fairness comes from what is let in), and at most `max_inflight`
//! submissions are in flight. Policies here: [`fifo::FifoScheduler`] (arrival order); the fair
//! ones (BAND, CREDIT) are their own module set.

pub mod fifo;

pub use fifo::FifoScheduler;

/// Identity of a VM on a [`crate::host::GpuHost`]; never reused while the host lives.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct VmId(pub u32);

impl std::fmt::Display for VmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vm{}", self.0)
    }
}

/// One unit of work: the guest advanced GP_PUT of one of its channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submission {
    /// The VM.
    pub vm: VmId,
    /// The guest's channel id.
    pub guest_chid: u32,
    /// The physical channel it is bound to.
    pub phys_chid: u32,
    /// The new GP_PUT (GPFIFO ring index).
    pub put: u32,
}

/// A scheduling policy. Implementations keep their own queues; the device model calls these on
/// the events named and never dispatches anything the policy did not pick.
pub trait Scheduler: Send {
    /// Short name for reports (`fifo`, `band`, ...).
    fn name(&self) -> &'static str;

    /// A VM was created with this share weight (1-100).
    fn add_vm(&mut self, vm: VmId, weight: u32);

    /// A VM was destroyed: forget it and drop its queued submissions; returns how many.
    fn remove_vm(&mut self, vm: VmId) -> usize;

    /// A doorbell arrived at GPU time `now_ns`. A policy may coalesce it with a queued
    /// submission of the same channel (a later GP_PUT covers an earlier one).
    fn submit(&mut self, s: Submission, now_ns: u64);

    /// Drops the queued submissions of one channel (it was unbound); returns how many.
    fn remove_channel(&mut self, vm: VmId, guest_chid: u32) -> usize;

    /// The GPU finished `s` at `now_ns` after `gpu_ns` of GPU time (for accounting).
    fn complete(&mut self, s: &Submission, now_ns: u64, gpu_ns: u64);

    /// The next submission to dispatch, given what is in flight, or `None` to wait. The device
    /// model calls this repeatedly while it returns something; an implementation must only
    /// return a submission [`dispatchable`] with `inflight` and `max_inflight`.
    fn pick(
        &mut self,
        inflight: &[Submission],
        max_inflight: usize,
        now_ns: u64,
    ) -> Option<Submission>;

    /// Submissions waiting.
    fn queued(&self) -> usize;
}

/// The rules every policy obeys: nothing beyond `max_inflight`; no overlap of two VMs' work; at
/// most one submission per channel in flight (so completion is exactly "GP_GET reached PUT").
pub fn dispatchable(s: &Submission, inflight: &[Submission], max_inflight: usize) -> bool {
    inflight.len() < max_inflight
        && inflight
            .iter()
            .all(|f| f.vm == s.vm && f.phys_chid != s.phys_chid)
}

/// Creates a scheduler by name (`fifo`); `None` for an unknown name.
pub fn by_name(name: &str) -> Option<Box<dyn Scheduler>> {
    match name {
        "fifo" => Some(Box::new(FifoScheduler::new())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(vm: u32, chid: u32) -> Submission {
        Submission {
            vm: VmId(vm),
            guest_chid: chid,
            phys_chid: vm * 16 + chid,
            put: 1,
        }
    }

    #[test]
    fn dispatch_rules() {
        assert!(dispatchable(&sub(0, 0), &[], 1));
        assert!(!dispatchable(&sub(0, 0), &[], 0));
        assert!(
            !dispatchable(&sub(1, 0), &[sub(0, 0)], 4),
            "two VMs never overlap"
        );
        assert!(
            !dispatchable(&sub(0, 0), &[sub(0, 0)], 4),
            "one per channel"
        );
        assert!(dispatchable(&sub(0, 1), &[sub(0, 0)], 4));
        assert!(!dispatchable(&sub(0, 1), &[sub(0, 0)], 1));
        assert_eq!(by_name("fifo").unwrap().name(), "fifo");
        assert!(by_name("lottery").is_none());
        assert_eq!(VmId(3).to_string(), "vm3");
    }
}
