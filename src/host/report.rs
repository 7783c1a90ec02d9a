//! What the host reports: [`HostStats`] (`GpuHost::stats`) and the counters it keeps under its
//! lock.

use super::LockHolds;
use crate::phys::GpuStats;
use crate::sched::SchedStats;

/// Host-wide counters and what is free.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HostStats {
    /// VMs alive.
    pub vms: usize,
    /// VRAM available to VMs (after the hypervisor region), bytes.
    pub vram_assignable: u64,
    /// Of that, not assigned to any VM.
    pub vram_free: u64,
    /// Hypervisor VRAM in use (host structures, shadows), bytes.
    pub hypervisor_vram_used: u64,
    /// Of that, the host's own structures (USERD pages, BAR1 tables, runlists): what stays in
    /// use when no VM exists.
    pub hypervisor_vram_host: u64,
    /// Hypervisor VRAM in total.
    pub hypervisor_vram: u64,
    /// Physical channels not assigned to any VM.
    pub channels_free: u32,
    /// How many more [`HostConfig::iova_window`]-sized DMA windows fit in the free IOVA space.
    pub dma_windows_free: usize,
    /// IOVA space not held by any VM's DMA window, bytes.
    pub iova_free: u64,
    /// The scheduling policy.
    pub scheduler: String,
    /// Submissions waiting in the scheduler.
    pub queued: usize,
    /// Submissions on the GPU.
    pub inflight: usize,
    /// Submissions dispatched so far.
    pub dispatched: u64,
    /// Submissions the GPU finished.
    pub completed: u64,
    /// Submissions that ended without finishing (error, unbind, parked, taken off the GPU by
    /// a time slice, a cap or the watchdog's ask with the rest queued again, VM destroyed,
    /// watchdog kill).
    pub aborted: u64,
    /// Channels killed by the hang watchdog ([`HostConfig::watchdog_ns`]).
    pub watchdog_kills: u64,
    /// Physical runlists submitted.
    pub runlist_submits: u64,
    /// Physical interrupt services.
    pub irq_services: u64,
    /// Physical MMU faults (routed or not).
    pub phys_faults: u64,
    /// Physical PBDMA errors.
    pub phys_pbdma_errors: u64,
    /// Physical non-stall interrupts.
    pub phys_nonstall: u64,
    /// Physical channel-table and scheduling errors (the host caused them; should be 0).
    pub phys_fifo_errors: u64,
    /// Times the physical GPU reported work it finished on its own thread
    /// (`PhysicalGpu::set_event_waker`: the simulator's engine worker with a real clock), each
    /// making the host's service due at once.
    pub gpu_events: u64,
    /// Faults and errors that could not be routed to a VM.
    pub unrouted: u64,
    /// Hypervisor VRAM freed by the device model but not yet released, because a channel that
    /// may still use it has not been seen off the GPU (the quarantine), bytes.
    pub hypervisor_vram_quarantined: u64,
    /// Hypervisor VRAM released from the quarantine so far, bytes.
    pub hypervisor_vram_released: u64,
    /// How long the host lock has been held (every guest access, poll and management call): the
    /// longest is the longest one VM can make another's exit wait.
    pub lock_holds: LockHolds,
    /// Guest register reads done on the fast path, under only their VM's lock (`host/local.rs`):
    /// these took the host lock for reading and are not in `lock_holds`.
    pub fast_path_accesses: u64,
    /// Destroyed VMs whose VRAM slice, channels and DMA window were withheld from reuse because
    /// a channel could not be taken off the GPU (should be 0; a GPU that ignores preemption
    /// and engine reset).
    pub withheld_partitions: u64,
    /// The physical GPU's counters.
    pub gpu: GpuStats,
    /// GPU time per VM as the scheduler accounts it, and the policy's state.
    pub sched: SchedStats,
}

/// Host-wide counters kept under the lock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    pub dispatched: u64,
    pub preemptions: u64,
    pub completed: u64,
    pub aborted: u64,
    pub watchdog_kills: u64,
    pub runlist_submits: u64,
    pub irq_services: u64,
    pub phys_faults: u64,
    pub phys_pbdma_errors: u64,
    pub phys_nonstall: u64,
    pub phys_fifo_errors: u64,
    pub unrouted: u64,
    pub hyp_released: u64,
    pub withheld_partitions: u64,
}
