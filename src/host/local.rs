//! The fast path: a guest access that involves only its own VM runs under that VM's lock alone
//! (`host::vm_map`), beside other VMs' accesses, instead of under the host lock held for
//! writing like everything else.
//!
//! Which accesses: BAR0 register reads of the VM's virtual registers (`vgpu::bar0::read_fast`:
//! PMC, PTIMER, PFIFO's virtual interrupt and configuration registers, the board, PMU and PGRAPH
//! facades, ...) — what a driver polls — and, in BAR1, USERD GP_GET/GP_PUT reads, doorbells that
//! announce nothing new and memory reads within one page (fences, results: `vgpu::aperture`);
//! and, quiet host or not, memory writes through BAR1, BAR3 or the PRAMIN window that reach
//! only the VM's memory and its page tables, writes of registers that only store their value,
//! and guest TLB flushes where the shadows are already current
//! ([`HostShared::access_local_write`]). BAR accesses
//! translate through the VM's BAR TLB or a walk of its BAR page tables that meets no fault.
//! Everything else (writes with effects, PRAMIN reads, writes reaching a page directory or a
//! bound channel's instance block, the channel table, the para-virtual interface) takes the
//! usual path.
//!
//! When: the usual path does, after every access, what the access asked of the host (none, for
//! a register read) and a service of the physical GPU: completions, interrupts, dispatch, the
//! scheduler's timers, re-checking parked acquires. A fast read skips that service, so it is
//! taken only while the service would find nothing to do: the physical interrupt line is low,
//! the host's next timed event (the GPU's next event, the scheduler's timer, the watchdog, the
//! time slice: `HostState::next_event`, recorded as [`HostShared`]'s `quiet_until` by the last
//! write-locked access or poll) has not come, no work is parked (an acquire released from the
//! CPU is no event: parked work is re-checked by polling), the VM's shadows are not mid-rebuild,
//! and the host was given its clock (`GpuHost::set_clock`; without it "now" is a GPU register
//! read). Otherwise the access takes the usual path, whose result is the same.
//!
//! The physical GPU may also report work it finished on its own thread (its event waker:
//! `HostShared::gpu_event_pending`); the next VM poll or fast-path write takes the report and
//! services the GPU, one taker per report.
//!
//! A VM's poll (`Vgpu::poll`: a guest waiting for its fence, or idle) under the same
//! conditions does nothing, under that VM's lock alone ([`HostShared::poll_is_idle`], counted
//! as `VgpuStats::idle_polls`): the service it would run would find nothing to do. Measured by
//! `gpuvm exp overhead`, this was most of what FV cost over native for the small workloads. A
//! poll that finds a hold in progress waits for it to end and looks again, as a fast read does
//! (16 VMs on 16 cores: ~850 of a run's ~950 polls that took the host lock did so only because
//! another VM's hold was in progress; `gpuvm exp scale` host-lock holds at 16 VMs halved).
//!
//! Not measured by `LockHolds` (which times write holds: what makes other VMs wait); counted
//! as `HostStats::fast_path_accesses`. Their waits for a hold in progress to end are in
//! `LockHolds::fast_waits` and `fast_waited_ns` (`gpuvm exp scale --json`: `host_lock`).

use std::sync::atomic::Ordering;

use super::{HostShared, HostState};
use crate::host::HostConfig;
use crate::layout::HostLayout;
use crate::phys::PhysicalGpu;
use crate::vgpu::cell::VmCell;
use crate::vgpu::VmState;

impl HostShared {
    /// Runs `f` (true: it did the access) on the VM of `cell` on the fast path if the host is
    /// quiet, holding that VM's lock and nothing else; false if the access must take the usual
    /// path (`f` not run, or it declined).
    pub(crate) fn access_local(
        &self,
        cell: &VmCell,
        f: &mut dyn FnMut(&dyn PhysicalGpu, &HostLayout, &mut VmState) -> bool,
    ) -> bool {
        if !self.cfg.local_fast_path {
            return false;
        }
        for attempt in 0..2 {
            // Looked at again after waiting out a hold: the hold may have left one pending.
            if self.irq.is_asserted() {
                return false;
            }
            let mut vm = cell.lock();
            // Read with the VM's lock held: a write-locked hold in progress has set it to 0.
            let quiet_until = self.quiet_until.load(Ordering::Acquire);
            // Not cloned: one `Arc` of the clock is shared by every VM, and its count would be
            // a cache line all of them write.
            let Some(now) = vm.clock.as_ref().map(|c| c.now_ns()) else {
                return false;
            };
            if vm.gone || vm.shadow.rebuilding() {
                return false;
            }
            if now < quiet_until {
                if !f(&*self.phys, &self.layout, &mut vm) {
                    return false;
                }
                cell.fast_accesses.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            drop(vm);
            if !self.wait_out_hold(quiet_until, attempt) {
                return false;
            }
        }
        false
    }

    /// Called by a fast-path access or poll that found `quiet_until` not in the future, on its
    /// `attempt`th look: if it is zero because a write-locked hold is in progress, waits for
    /// that hold to end and returns true (look again, once), instead of queueing for the host
    /// lock. Fast readers that turn into writers behind one hold keep the lock busy for each
    /// other and never come back (measured on 16 cores: 16 VMs fell to 2.7 M accesses/s from
    /// 29 M at 8 VMs, 2 % of accesses slow; and 16 VMs waiting for their fences made ~850
    /// polls a run that took the lock only because another hold was in progress). The wait is
    /// a read lock — parked, not spinning — taken without the VM's lock, which the holder may
    /// want.
    fn wait_out_hold(&self, quiet_until: u64, attempt: usize) -> bool {
        if quiet_until != 0 || attempt > 0 || !self.state.is_locked_exclusive() {
            return false;
        }
        let since = std::time::Instant::now();
        drop(self.state.read());
        self.holds.record_fast_wait(since);
        true
    }

    /// Runs the write `f` (true: it did the access) on the VM of `cell` holding that VM's lock
    /// and nothing else, quiet host or not: for writes whose only effect is inside the VM
    /// (`vgpu::aperture`, `vgpu::bar0`: page-table, instance-memory and data writes through a
    /// BAR or the PRAMIN window, register writes that only store their value), which give the
    /// host nothing to do. The usual path services the GPU after every access; this
    /// one does so afterwards, with the host lock, only if something is due by then (a hold in
    /// progress services on its own). False if the access must take the usual path.
    pub(crate) fn access_local_write(
        &self,
        cell: &VmCell,
        f: &mut dyn FnMut(&dyn PhysicalGpu, &HostLayout, &mut VmState) -> bool,
    ) -> bool {
        if !self.cfg.local_fast_path {
            return false;
        }
        let due = {
            let mut vm = cell.lock();
            let Some(now) = vm.clock.as_ref().map(|c| c.now_ns()) else {
                return false;
            };
            if vm.gone || vm.shadow.rebuilding() || !f(&*self.phys, &self.layout, &mut vm) {
                return false;
            }
            cell.fast_accesses.fetch_add(1, Ordering::Relaxed);
            let quiet_until = self.quiet_until.load(Ordering::Acquire);
            (quiet_until != 0 && now >= quiet_until) || self.take_gpu_event()
        };
        if due || self.irq.is_asserted() {
            self.poll();
        }
        true
    }

    /// True if a poll from the VM of `cell` (`Vgpu::poll`) would find nothing to do: the
    /// condition of the fast path's reads (interrupt line low, the host's next event not come,
    /// nothing parked, the VM's shadows not mid-rebuild, a clock), looked at under that VM's
    /// lock alone. The poll is then done:
    /// a guest waiting for its fence no longer takes the host lock to learn that nothing is
    /// due.
    pub(crate) fn poll_is_idle(&self, cell: &VmCell) -> bool {
        if !self.cfg.local_fast_path {
            return false;
        }
        for attempt in 0..2 {
            if self.irq.is_asserted() {
                return false;
            }
            let mut vm = cell.lock();
            if vm.gone || vm.shadow.rebuilding() {
                return false;
            }
            // Read with the VM's lock held, as `access_local` does.
            let quiet_until = self.quiet_until.load(Ordering::Acquire);
            let Some(now) = vm.clock.as_ref().map(|c| c.now_ns()) else {
                return false;
            };
            if now < quiet_until {
                let idle = !self.take_gpu_event();
                if idle {
                    vm.stats.idle_polls += 1;
                }
                return idle;
            }
            drop(vm);
            // A hold in progress (another VM's submission, say) says nothing of whether this
            // poll has anything to do: wait for it to end and look again, as a fast read does.
            if !self.wait_out_hold(quiet_until, attempt) {
                return false;
            }
        }
        false
    }

    /// Takes the GPU's report of finished work (`HostShared::gpu_event_pending`), if one is
    /// pending: the taker services the GPU.
    fn take_gpu_event(&self) -> bool {
        self.gpu_event_pending.load(Ordering::Relaxed)
            && self.gpu_event_pending.swap(false, Ordering::AcqRel)
    }

    /// Fast-path accesses so far, destroyed VMs' included.
    pub(crate) fn fast_path_accesses(&self, st: &HostState) -> u64 {
        st.vms
            .cells()
            .map(|c| c.fast_accesses.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.fast_gone.load(Ordering::Relaxed)
    }
}

impl HostState {
    /// When the host next has something to do on its own: the GPU's next event, the scheduler's
    /// timer, the watchdog's and the time slice's deadlines.
    pub(crate) fn next_event(&self, phys: &dyn PhysicalGpu, cfg: &HostConfig) -> Option<u64> {
        let watchdog = crate::host::dispatch::watchdog_deadline(self, phys, cfg.watchdog_ns);
        let slice = crate::host::dispatch::slice_deadline(self, phys, cfg.timeslice_ns);
        [phys.next_event_ns(), self.sched_timer, watchdog, slice]
            .into_iter()
            .flatten()
            .min()
    }

    /// Until when a fast-path access may skip the service (0: not now), given the host's
    /// [`HostState::next_event`].
    pub(crate) fn quiet_until(&self, next_event: Option<u64>) -> u64 {
        if self.clock.is_none() || !self.parked.is_empty() {
            return 0;
        }
        next_event.unwrap_or(u64::MAX)
    }
}
