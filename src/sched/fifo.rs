//! FIFO scheduling: submissions reach the GPU in the order their doorbells arrived (GPUvm's and
//! Gdev's FIFO baseline, `gdev_vsched_fifo.c`). No fairness: a VM with long kernels delays
//! everyone behind it, and the share a VM gets is decided by how long its kernels are, not by
//! its weight. A doorbell for a channel that already has a queued submission only moves that
//! submission's GP_PUT forward (GPUvm queues "fire" commands per VM the same way), keeping its
//! place. The head of the queue blocks the rest (no overtaking): when it may not run yet (another
//! VM's work is on the GPU, or its channel is busy) nothing is dispatched. No period, no wait.

use std::collections::{BTreeMap, VecDeque};

use super::{
    dispatchable, share_ppm, Decision, PolicySnapshot, PolicyVm, Scheduler, Submission, VmId,
};

/// First come, first served.
#[derive(Debug, Default)]
pub struct FifoScheduler {
    queue: VecDeque<Submission>,
    weights: BTreeMap<VmId, u32>,
}

impl FifoScheduler {
    /// An empty queue.
    pub fn new() -> FifoScheduler {
        FifoScheduler::default()
    }
}

impl Scheduler for FifoScheduler {
    fn others_waiting(&self, vm: VmId) -> bool {
        self.queue.iter().any(|s| s.vm != vm)
    }

    /// The VM's time slice ended while others waited: its queued submissions go behind the
    /// others' (arrival order among the rest is kept), so a VM with many channels' work
    /// queued cannot hold the GPU for more than a slice while others wait.
    fn slice_expired(&mut self, vm: VmId, _now_ns: u64) {
        let (mine, rest): (VecDeque<Submission>, VecDeque<Submission>) =
            self.queue.drain(..).partition(|s| s.vm == vm);
        self.queue = rest;
        self.queue.extend(mine);
    }

    fn name(&self) -> &'static str {
        "fifo"
    }

    fn add_vm(&mut self, vm: VmId, weight: u32, _now_ns: u64) {
        self.weights.insert(vm, weight);
    }

    fn remove_vm(&mut self, vm: VmId) -> usize {
        self.weights.remove(&vm);
        let before = self.queue.len();
        self.queue.retain(|s| s.vm != vm);
        before - self.queue.len()
    }

    fn submit(&mut self, s: Submission, _now_ns: u64) {
        match self
            .queue
            .iter_mut()
            .find(|q| q.vm == s.vm && q.phys_chid == s.phys_chid)
        {
            Some(q) => q.put = s.put,
            None => self.queue.push_back(s),
        }
    }

    fn remove_channel(&mut self, vm: VmId, guest_chid: u32) -> usize {
        let before = self.queue.len();
        self.queue
            .retain(|s| !(s.vm == vm && s.guest_chid == guest_chid));
        before - self.queue.len()
    }

    fn complete(&mut self, _s: &Submission, _now_ns: u64, _gpu_ns: u64) {}

    fn decide(&mut self, inflight: &[Submission], max_inflight: usize, _now_ns: u64) -> Decision {
        match self.queue.front() {
            Some(head) if dispatchable(head, inflight, max_inflight) => {
                let s = *head;
                self.queue.pop_front();
                Decision::Dispatch(s)
            }
            _ => Decision::Idle,
        }
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }

    fn snapshot(&self) -> PolicySnapshot {
        let total: u64 = self.weights.values().map(|&w| u64::from(w)).sum();
        PolicySnapshot {
            vms: self
                .weights
                .iter()
                .map(|(&vm, &weight)| PolicyVm {
                    vm,
                    weight,
                    share_ppm: share_ppm(weight, total),
                    queued: self.queue.iter().filter(|s| s.vm == vm).count(),
                    credit_ns: None,
                    util_ppm: None,
                    position: None,
                    held_by_buffer: false,
                })
                .collect(),
            ..PolicySnapshot::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(vm: u32, chid: u32, put: u32) -> Submission {
        Submission {
            vm: VmId(vm),
            guest_chid: chid,
            phys_chid: vm * 16 + chid,
            put,
        }
    }

    #[test]
    fn arrival_order_without_overlap() {
        let mut f = FifoScheduler::new();
        f.submit(sub(0, 0, 1), 0);
        f.submit(sub(1, 0, 1), 0);
        f.submit(sub(0, 1, 1), 0);
        assert_eq!(f.queued(), 3);
        let a = f.pick(&[], 4, 0).unwrap();
        assert_eq!(a, sub(0, 0, 1));
        assert_eq!(f.pick(&[a], 4, 0), None, "vm1 waits for vm0's work");
        let b = f.pick(&[], 4, 0).unwrap();
        assert_eq!(b.vm, VmId(1));
        assert_eq!(f.pick(&[], 4, 0), Some(sub(0, 1, 1)));
        assert_eq!(f.pick(&[], 4, 0), None);
    }

    #[test]
    fn later_doorbells_coalesce_and_channels_can_be_dropped() {
        let mut f = FifoScheduler::new();
        f.submit(sub(0, 0, 1), 0);
        f.submit(sub(2, 3, 1), 0);
        f.submit(sub(0, 0, 5), 0);
        assert_eq!(f.queued(), 2);
        assert_eq!(f.pick(&[], 1, 0), Some(sub(0, 0, 5)));
        f.submit(sub(0, 0, 6), 0);
        assert_eq!(f.remove_channel(VmId(0), 0), 1);
        assert_eq!(f.remove_vm(VmId(2)), 1);
        assert_eq!(f.queued(), 0);
    }
}
