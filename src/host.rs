//! The host: the only driver of the physical GPU, and the owner of every VM's partition — the
//! role of GPUvm's A3 aggregator plus dom0's nouveau (which initialised the GPU).
//!
//! [`GpuHost::new`] brings the physical GF100 up (`host/init.rs`: PMC, PFIFO, the physical USERD pages
//! mapped at physical BAR1 VA 0, interrupts on) and reserves the start of VRAM for the
//! hypervisor. [`GpuHost::create_vgpu`] carves a partition out of what is left for each VM
//! profile, first fit:
//!
//! | Resource | Rule |
//! |---|---|
//! | VRAM slice | `profile.vram_mib`, 1 MiB aligned, after the hypervisor region |
//! | channels | a contiguous range of `profile.channels` of the 128 physical channels |
//! | DMA window | a naturally aligned power-of-two range of the IOVA space `[1 MiB, 2^40)` (SYSRAM PTEs carry 40-bit addresses), first fit: [`HostConfig::iova_window`] bytes, or sized from the VM's RAM with [`GpuHost::create_vgpu_for_ram`] (so that many small VMs fit: 64 VMs of 32 MiB take 2 GiB of IOVA space, not 64 x 32 GiB) |
//! | BAR1 / BAR3 arenas | parts of the physical BAR1 (after the host's 512 KiB of USERD pages) and BAR3, proportional to the VM's share of VRAM |
//!
//! The arenas are bookkeeping only: every guest BAR access is emulated today (GPUvm also never
//! remapped BAR1). A later BAR-remap optimization (GPUvm's `--bar3-remapping`) maps the guest's
//! BAR pages into its arena so that the VMM can map them into the guest directly; reserving the
//! arena at creation keeps that from failing later. A profile that does not fit is refused with
//! a [`HostError`] naming the resource.
//!
//! **Locking: a host lock for what is GPU-wide, a lock per VM, and a fast path beside them.**
//! The host lock (`HostShared::state`, a write lock) holds the GPU-wide state: the merged
//! runlist, the physical channels, the scheduler, the VRAM and IOVA allocators, interrupt
//! routing, the shadow instance blocks in shared hypervisor VRAM. Each VM's state (registers,
//! shadows, channels, counters) is in a cell of its own (`vgpu::cell`), which the host locks
//! when it works on that VM and the VM's vGPU locks alone for an access that involves only the
//! VM while the host has nothing to service (`host/local.rs`: register reads, USERD reads,
//! doorbells that announce nothing) — so many VMs' trapped accesses run side by side. Lock
//! order: host, then VMs, then the physical GPU's own lock; checked in debug builds. Every
//! other access is one consistent transaction under the host lock, as before. The physical
//! GPU's interrupt line is an atomic flag ([`IrqFlag`]) that never takes a lock (the simulator
//! raises it from its engine worker or from calls the host makes); physical interrupts and
//! completions are serviced at the end of every access that takes the host lock and in
//! [`GpuHost::poll`]. VM interrupt lines are driven after the lock is released.

pub(crate) mod dispatch;
mod hold;
#[cfg(test)]
pub(crate) use hold::spawn_until_asleep;
mod init;
pub(crate) mod irq_route;
mod local;
pub mod migrate;
mod policy;
mod reclaim;
mod report;
pub(crate) mod runlist;
pub(crate) mod runtime;
mod teardown;
mod vm_map;
mod window;

pub use hold::{HoldUsage, LockHolds, TimedMutex, HOLD_BUCKETS};
pub(crate) use report::Counters;
pub use report::HostStats;

use parking_lot::{RwLock, RwLockWriteGuard};
use std::collections::BTreeSet;
use std::sync::Arc;

use gf100::pci::{BAR1_SIZE, BAR3_SIZE};
use gf100::{pfifo, userd};

use crate::addr::{HostVram, Iova};
use crate::channels::Effect;
use crate::channels::VChan;
use crate::clock::Clock;
use crate::guest_mem::VmMem;
use crate::guest_mem::VramSlice;
use crate::host::dispatch::InFlight;
use crate::host::runtime::{ChannelClock, Cursor};
use crate::irq::IrqFlag;
use crate::mmio::pci::PciConfig;
use crate::mmio::vregs::VRegs;
use crate::phys::PhysicalGpu;
use crate::profile::{ProfileError, VgpuProfile};
use crate::sched::{Accounting, Policy, SchedParams, SchedStats, Scheduler};
use crate::shadow_pt::ShadowPt;
use crate::stats::RateLimit;
use crate::vgpu::aperture::GuestBars;
use crate::vgpu::{GpuPort, LineSlot, Vgpu, VmCx, VmState};
use crate::vram_alloc::{HypVram, RangeAllocator};

use crate::layout::HostLayout;
pub use crate::sched::VmId;

/// Host-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// VRAM reserved for the hypervisor at the start of VRAM (shadow page tables, shadow
    /// instance blocks, USERD pages, runlists, the host's BAR1 tables). Default 256 MiB.
    pub hypervisor_vram: u64,
    /// Size of the DMA (IOVA) window of a VM created with [`GpuHost::create_vgpu`] (whose RAM
    /// size is not known at creation); the VM's RAM must fit in it. Default 32 GiB, which
    /// leaves room for 31 such VMs below 2^40. [`GpuHost::create_vgpu_for_ram`] sizes a VM's
    /// window from its RAM instead.
    pub iova_window: u64,
    /// Most submissions in flight on the GPU at once (all of one VM). Default 4.
    pub max_inflight: usize,
    /// Hypervisor VRAM reserved for each VM's shadow page tables (directories and tables).
    /// A VM's shadows never grow beyond it, and a VM is only admitted if its reservation fits
    /// next to the others', so no VM can starve another of shadow memory. Default 8 MiB: 32
    /// small-page tables, i.e. 4 GiB of GPU VA mapped in 4 KiB pages (plus large-page tables).
    pub shadow_vram_per_vm: u64,
    /// The hang watchdog, in ns of GPU time (the host's clock): a submission that has run
    /// half this long since its dispatch is asked off the GPU (its engine operation ends, the
    /// rest is queued again); still on it this long after its dispatch and half this long after
    /// it was asked, it is taken to be hung. The host then resets the
    /// engine running it (PMC ENABLE bit toggle, which aborts the operation), kills the guest
    /// channel (STATE RUNNABLE cleared and kept clear until the guest unbinds it; the guest
    /// sees PFIFO SCHED_ERROR 0x0a CTXSW_TIMEOUT, PFIFO INTR bit 8), drops the channel's queued
    /// submissions, charges the time to the VM and counts the kill (`watchdog_kills`); the GPU
    /// goes on with the other VMs' work. Default 2 s (no submission of the Gdev workloads comes
    /// near it); 0 turns the watchdog off.
    pub watchdog_ns: u64,
    /// The time slice, in ns of GPU time: a VM whose work has held the GPU this long while
    /// another VM has work the policy could run is preempted (its channels disabled and switched
    /// out at the next method boundary, after the engine operation in flight), and the policy
    /// decides who runs next (`crate::host::dispatch`). Default 10 ms: the longest kernel of the
    /// isolation experiment and a third of BAND's 30 ms period; Fermi cannot preempt inside a
    /// kernel, so a slice much shorter than the kernels buys nothing. 0: no slices (caps still
    /// preempt).
    pub timeslice_ns: u64,
    /// Guest register reads that involve only their VM run under that VM's lock, beside other
    /// VMs' accesses, while the host has nothing to service (`host/local.rs`). Default on; off,
    /// every access takes the host lock for writing (for comparison: `gpuvm exp traps
    /// --no-fast-path`).
    pub local_fast_path: bool,
}

/// The default time slice: 10 ms of GPU time.
pub const DEFAULT_TIMESLICE_NS: u64 = 10_000_000;

/// The default hang watchdog: 2 s of GPU time.
pub const DEFAULT_WATCHDOG_NS: u64 = 2_000_000_000;

/// Smallest per-VM shadow reservation: a page directory and one small-page table.
pub const MIN_SHADOW_VRAM_PER_VM: u64 = 1 << 20;

/// Hypervisor VRAM kept for shadow instance blocks (one 4 KiB block per physical channel).
const SHADOW_INSTANCE_RESERVE: u64 = pfifo::CHANNELS as u64 * gf100::inst::SIZE;

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            hypervisor_vram: 256 << 20,
            iova_window: 32 << 30,
            max_inflight: 4,
            shadow_vram_per_vm: 8 << 20,
            watchdog_ns: DEFAULT_WATCHDOG_NS,
            timeslice_ns: DEFAULT_TIMESLICE_NS,
            local_fast_path: true,
        }
    }
}

/// Why the host could not be set up or a VM not be created.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The GPU is not a Fermi.
    #[error("the physical GPU is not a Fermi (BOOT_0 = {boot0:#010x})")]
    NotFermi {
        /// What BOOT_0 read.
        boot0: u32,
    },
    /// A configuration value is unusable.
    #[error("invalid host configuration: {0}")]
    Config(String),
    /// The hypervisor region is too small for the host's own structures.
    #[error("hypervisor VRAM exhausted ({what})")]
    HypervisorVram {
        /// What was being allocated.
        what: &'static str,
    },
    /// The profile is invalid.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// Not enough contiguous VRAM left.
    #[error("profile '{profile}' needs {want} MiB of VRAM but the largest free range is smaller ({free} MiB free in total)")]
    NoVram {
        /// Profile name.
        profile: String,
        /// MiB wanted.
        want: u64,
        /// MiB free in total.
        free: u64,
    },
    /// Not enough contiguous channels left.
    #[error(
        "profile '{profile}' needs {want} contiguous channels but only {free} of 128 are free"
    )]
    NoChannels {
        /// Profile name.
        profile: String,
        /// Channels wanted.
        want: u32,
        /// Channels free.
        free: u32,
    },
    /// The IOVA space below 2^40 has no aligned free range for the VM's DMA window.
    #[error("no DMA window left: profile '{profile}' needs a {window:#x}-byte IOVA window but only {free:#x} bytes of the 2^40-byte IOVA space are free ({vms} VMs hold the rest); size windows from the VMs' RAM (GpuHost::create_vgpu_for_ram) or lower HostConfig::iova_window")]
    NoDmaWindow {
        /// Profile name.
        profile: String,
        /// Window size wanted.
        window: u64,
        /// IOVA bytes free in total.
        free: u64,
        /// VMs alive.
        vms: usize,
    },
    /// The IOVA space has no aligned free range for the larger DMA window a VM's RAM needs
    /// ([`GpuHost::resize_dma_window`]); the VM keeps its window.
    #[error("no DMA window left: {vm} needs a {window:#x}-byte IOVA window for guest RAM ending at {ram_end:#x} (it has {current:#x} bytes), but the 2^40-byte IOVA space has no free aligned range that large ({free:#x} bytes free in all, {vms} VMs hold the rest)")]
    NoLargerDmaWindow {
        /// The VM.
        vm: VmId,
        /// Where its RAM ends.
        ram_end: u64,
        /// Window size wanted.
        window: u64,
        /// Its window now.
        current: u64,
        /// IOVA bytes free in total, its own window included.
        free: u64,
        /// VMs alive.
        vms: usize,
    },
    /// A VM's DMA window cannot be moved: something may hold an address inside it.
    #[error("{vm}'s DMA window cannot be resized: {why}")]
    DmaWindowInUse {
        /// The VM.
        vm: VmId,
        /// What may use the window.
        why: &'static str,
    },
    /// No room in the physical BAR1/BAR3 for the VM's arena.
    #[error("no room left in the physical {bar} for the VM's arena")]
    NoBarSpace {
        /// "BAR1" or "BAR3".
        bar: &'static str,
    },
    /// The vGPU does not belong to this host or was already destroyed.
    #[error("no such VM ({0})")]
    NoSuchVm(VmId),
}

/// What is free in the partitionable resources.
#[derive(Debug)]
pub(crate) struct Partition {
    pub vram: RangeAllocator,
    pub chans: RangeAllocator,
    /// The IOVA space of DMA windows, `[IOVA_BASE, 2^40)`.
    pub iova: RangeAllocator,
    pub bar1: RangeAllocator,
    pub bar3: RangeAllocator,
    /// Owner of each physical channel.
    pub owner: Vec<Option<VmId>>,
}

/// Everything behind the big lock.
pub(crate) struct HostState {
    pub hyp: HypVram,
    pub layout: HostLayout,
    pub part: Partition,
    pub vms: vm_map::VmMap,
    pub sched: Box<dyn Scheduler>,
    pub inflight: Vec<InFlight>,
    /// A buffer `host::dispatch::progress` reuses for the scheduler's view of `inflight`.
    pub decide_buf: Vec<crate::sched::Submission>,
    /// GPU time per VM (`crate::sched::account`).
    pub acct: Accounting,
    /// GPU time each physical channel ran, as charged (`crate::host::runtime`).
    pub runtime: ChannelClock,
    /// The end of the scheduler's deliberate wait, if one is running.
    pub sched_timer: Option<u64>,
    /// The watchdog's view of the engines: a physical channel seen busy on an engine without
    /// a submission in flight, and since when (`crate::host::dispatch`).
    pub engine_watch: Option<(u32, u64)>,
    /// The time base of scheduling and accounting (the physical GPU's clock); `None`: the
    /// GPU's PTIMER.
    pub clock: Option<Arc<dyn Clock>>,
    /// VMs that had work on the GPU since the last non-stall interrupt was serviced.
    pub nonstall: BTreeSet<VmId>,
    /// VMs being quiesced for a snapshot or migration: their doorbells are not submitted
    /// (`host/migrate.rs`).
    pub frozen: BTreeSet<VmId>,
    /// Channels whose work left the GPU unfinished and waits to be queued again
    /// (`crate::host::dispatch`).
    pub parked: BTreeSet<(VmId, u32)>,
    /// The VM whose work holds the GPU and since when (its time slice).
    pub slice: Option<(VmId, u64)>,
    pub runlist_next: usize,
    pub counters: Counters,
    pub next_id: u32,
    /// Hypervisor VRAM in use right after bring-up (the host's own structures).
    pub hyp_baseline: u64,
}

/// What [`GpuHost`] and every [`Vgpu`] share.
pub(crate) struct HostShared {
    pub phys: Arc<dyn PhysicalGpu>,
    pub cfg: HostConfig,
    pub irq: Arc<IrqFlag>,
    /// Eventually fair (parking_lot): waiters queue in order, and about every 0.5 ms a contended
    /// unlock hands the lock to the first of them instead of letting the releasing thread take
    /// it straight back, so busy VMs cannot starve another VM's exits indefinitely (std's Mutex
    /// has no such bound). Not a hand-off at every contended unlock: `FairMutex` did that and
    /// cut the soak's in-process throughput 13x. docs/experiments.md, "Host lock fairness".
    pub state: RwLock<HostState>,
    /// How long `state` is held (`host/hold.rs`).
    pub holds: hold::HoldTimes,
    /// Until when an access that involves only its VM need not service the GPU
    /// (`host/local.rs`); kept by every write-locked access and poll.
    pub quiet_until: std::sync::atomic::AtomicU64,
    /// Fast-path accesses of destroyed VMs (`host/local.rs`; the live VMs' are in their cells).
    pub fast_gone: std::sync::atomic::AtomicU64,
    /// Times the physical GPU reported work it finished on its own thread (its event waker,
    /// [`PhysicalGpu::set_event_waker`]; possibly later than its next event said).
    pub gpu_events: Arc<std::sync::atomic::AtomicU64>,
    /// Set by such a report, taken by the first poll or fast-path write of any VM that comes
    /// next, which then services the GPU (`host/local.rs`): the completion is handled at once
    /// instead of when the date the GPU could not give comes. One taker per report, so a
    /// completion does not send every VM's next access the slow way.
    pub gpu_event_pending: Arc<std::sync::atomic::AtomicBool>,
    /// The host's structures in VRAM (fixed at bring-up; a copy of `HostState::layout` for
    /// the fast path).
    pub layout: HostLayout,
}

/// A hold of the host lock this long or longer ends with a fair hand-off
/// (`RwLockWriteGuard::unlock_fair`): an access parked on the lock gets it before the holder —
/// or anyone not yet waiting — can take it again. Shorter holds release it as usual, letting a
/// running thread take it straight back (a hand-off to a parked thread costs its wake-up, with
/// the lock idle meanwhile). Without it a neighbour whose holds are long and back to back (PV
/// batches, up to 0.25-0.7 ms each) took the lock again before the woken waiters ran, until the
/// lock's own fairness timer (0.5 ms on average) stepped in: on the 16-core machine the longest
/// wait for the lock beside a `pv-switch` neighbour was 1.06-1.41 ms while the longest hold was
/// under 0.71 ms, and 0.40-0.50 ms with the hand-off (`gpuvm exp lockhold`, six runs each;
/// docs/benchmarks.md, fifteenth round). Host policy, not hardware: the many-VM `exp scale`
/// holds are nearly all shorter, and its figures did not move, in-process or under KVM.
/// Handing over also to any access that had waited this long, whatever the hold, was tried:
/// under KVM it passed the lock from one parked vCPU thread to the next, idle through every
/// wake-up (16 guests 4x slower), and was reverted.
pub(crate) const FAIR_HANDOFF_AFTER_NS: u64 = 100_000;

/// The host lock, held: records how long when dropped, and hands the lock over fairly after a
/// long hold ([`FAIR_HANDOFF_AFTER_NS`]).
pub(crate) struct Held<'a> {
    /// `None` only once the hold has ended (in `drop`).
    guard: Option<RwLockWriteGuard<'a, HostState>>,
    since: std::time::Instant,
    /// Where the lock was taken.
    at: &'static std::panic::Location<'static>,
    holds: &'a hold::HoldTimes,
    /// The holder's thread usage when the hold began, if holds read it.
    usage: Option<hold::ThreadUsage>,
    /// `HostShared::quiet_until` when the hold began.
    quiet_before: u64,
    /// The GPU, told when the hold ends (`PhysicalGpu::end_batch`).
    phys: &'a dyn PhysicalGpu,
}

impl std::ops::Deref for Held<'_> {
    type Target = HostState;
    fn deref(&self) -> &HostState {
        match &self.guard {
            Some(g) => g,
            None => unreachable!("the guard is only taken when the hold ends"),
        }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut HostState {
        match &mut self.guard {
            Some(g) => g,
            None => unreachable!("the guard is only taken when the hold ends"),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let held_ns = self.holds.record(self.since, self.usage, self.at);
        self.phys.end_batch();
        match self.guard.take() {
            Some(g) if held_ns >= FAIR_HANDOFF_AFTER_NS => RwLockWriteGuard::unlock_fair(g),
            g => drop(g),
        }
    }
}

/// (line, change number, level) to apply after the lock is released.
type LineChange = (Arc<LineSlot>, u64, bool);

impl HostShared {
    #[track_caller]
    fn lock(&self) -> Held<'_> {
        let at = std::panic::Location::caller();
        crate::vgpu::cell::order::acquiring_host();
        // The hold is timed from the acquisition: everything after it keeps the lock from the
        // others, `begin_batch` included.
        let (guard, since, usage) = self
            .holds
            .acquire(|| self.state.try_write(), || self.state.write());
        // Whatever this hold changes, fast-path accesses wait for the service until a holder
        // that ends with one says otherwise (`keep_quiet_until`).
        let quiet_before = self
            .quiet_until
            .swap(0, std::sync::atomic::Ordering::AcqRel);
        // One hold, one bounded batch of the GPU backend's own work (the simulator's engines).
        self.phys.begin_batch();
        Held {
            guard: Some(guard),
            usage,
            since,
            at,
            holds: &self.holds,
            quiet_before,
            phys: &*self.phys,
        }
    }

    /// Runs `f` on VM `id` (if it exists) under the lock and nothing else: no effects, no
    /// service of the GPU (for cheap queries a VMM makes after every exit).
    #[track_caller]
    pub(crate) fn peek<R>(&self, id: VmId, f: impl FnOnce(&mut VmCx) -> R) -> Option<R> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let r = st.vms.get_mut(&id).map(|mut vm| {
            let mut cx = VmCx::new(&*self.phys, &mut st.hyp, &st.layout, &mut vm);
            f(&mut cx)
        });
        // A query changes nothing the host services.
        self.quiet_until
            .store(guard.quiet_before, std::sync::atomic::Ordering::Release);
        r
    }

    /// Runs `f` on VM `id` (if it exists) under the lock, applies the access's host-level
    /// effects, services the physical GPU, and updates interrupt lines.
    #[track_caller]
    pub(crate) fn access<R>(&self, id: VmId, f: impl FnOnce(&mut VmCx) -> R) -> Option<R> {
        let (r, lines) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let r = match st.vms.get_mut(&id) {
                Some(mut vm) => {
                    let mut cx = VmCx::new(&*self.phys, &mut st.hyp, &st.layout, &mut vm);
                    Some(f(&mut cx))
                }
                None => None,
            };
            if r.is_some() {
                st.apply_effects(&*self.phys, id);
                // A shadow rebuild in progress goes on in its own VM's exits first.
                st.shadow_step(&*self.phys, Some(id));
            }
            st.service(&*self.phys, &self.irq, &self.cfg);
            if st.clock.is_some() {
                self.keep_quiet_until(st);
            }
            (r, st.line_changes())
        };
        apply_lines(lines);
        r
    }

    /// Records until when fast-path accesses may skip the service (`host/local.rs`).
    fn keep_quiet_until(&self, st: &HostState) -> Option<u64> {
        let next = st.next_event(&*self.phys, &self.cfg);
        self.quiet_until
            .store(st.quiet_until(next), std::sync::atomic::Ordering::Release);
        next
    }

    /// The physical GPU's event waker ([`PhysicalGpu::set_event_waker`]): work finished on the
    /// GPU's own thread, so whatever waits for it is due now. It holds the two counters,
    /// not the host: the GPU's thread never keeps the host alive (nor drops it).
    fn event_waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        use std::sync::atomic::Ordering;
        let (events, pending) = (self.gpu_events.clone(), self.gpu_event_pending.clone());
        Arc::new(move || {
            events.fetch_add(1, Ordering::Relaxed);
            pending.store(true, Ordering::Release);
        })
    }

    /// See [`GpuHost::next_event_ns`].
    pub(crate) fn next_event_ns(&self) -> Option<u64> {
        let st = self.lock();
        self.keep_quiet_until(&st)
    }

    /// Services the physical GPU.
    pub(crate) fn poll(&self) {
        let lines = {
            let mut st = self.lock();
            self.phys.poll();
            st.service(&*self.phys, &self.irq, &self.cfg);
            if st.clock.is_some() {
                self.keep_quiet_until(&st);
            }
            st.line_changes()
        };
        apply_lines(lines);
    }
}

fn apply_lines(lines: Vec<LineChange>) {
    for (slot, seq, level) in lines {
        slot.apply(seq, level);
    }
}

impl HostState {
    /// Applies the host-level effects VM `id`'s last access queued.
    fn apply_effects(&mut self, phys: &dyn PhysicalGpu, id: VmId) {
        let effects = match self.vms.get_mut(&id) {
            Some(mut vm) if !vm.effects.is_empty() => std::mem::take(&mut vm.effects),
            _ => return,
        };
        let mut runlist = false;
        for e in effects {
            match e {
                Effect::RunlistChanged => runlist = true,
                Effect::Doorbell(g) => crate::host::dispatch::doorbell(self, phys, id, g),
                Effect::ChannelGone(g) => {
                    let now = self.now(phys);
                    self.drop_channel_work(phys, id, g, now);
                }
            }
        }
        if runlist {
            crate::host::runlist::submit_physical(self, phys);
        }
    }

    /// Drops the queued and in-flight submissions of VM `id`'s guest channel `g` (unbound or
    /// killed): the GPU time they took until `now` is still the VM's, and they count as
    /// aborted. Returns how many were dropped.
    pub(crate) fn drop_channel_work(
        &mut self,
        phys: &dyn PhysicalGpu,
        id: VmId,
        g: u32,
        now: u64,
    ) -> usize {
        let dropped = self.sched.remove_channel(id, g);
        let before = self.inflight.len();
        let ended: Vec<_> = self
            .inflight
            .iter()
            .filter(|f| f.sub.vm == id && f.sub.guest_chid == g)
            .map(|f| f.sub)
            .collect();
        self.inflight
            .retain(|f| !(f.sub.vm == id && f.sub.guest_chid == g));
        if !ended.is_empty() {
            let more = self.inflight.iter().any(|f| f.sub.vm == id);
            let wall = self.acct.retired(id, now, more);
            let mut gpu_ns = self.charge_ran(phys, id, now).unwrap_or(wall);
            for s in &ended {
                self.sched.complete(s, now, std::mem::take(&mut gpu_ns));
            }
        }
        let gone = dropped + before - self.inflight.len();
        self.counters.aborted += gone as u64;
        if let Some(mut vm) = self.vms.get_mut(&id) {
            vm.stats.aborted += gone as u64;
        }
        gone
    }

    /// Measured mode: charges VM `id` the GPU time its channels ran since its last charge and
    /// returns it (`None` where the backend cannot measure: the caller charges the interval).
    pub(crate) fn charge_ran(&mut self, phys: &dyn PhysicalGpu, id: VmId, now: u64) -> Option<u64> {
        let chans = self.vms.get(&id)?.ran_chans();
        let (acct, sched) = self.runtime.take_both(phys, chans)?;
        self.acct.charge_measured(id, acct, now);
        Some(sched)
    }

    /// Measured mode: brings every VM's accounted GPU time up to date (what its channels ran,
    /// also outside any submission), without touching what the scheduler will be told.
    fn charge_all_ran(&mut self, phys: &dyn PhysicalGpu) {
        if !self.runtime.measured() {
            return;
        }
        let now = self.now(phys);
        let vms: Vec<(VmId, std::ops::Range<u32>)> = self
            .vms
            .values()
            .map(|vm| (vm.id, vm.ran_chans()))
            .collect();
        for (id, chans) in vms {
            if let Some(ns) = self.runtime.take(phys, chans, Cursor::Acct) {
                self.acct.charge_measured(id, ns, now);
            }
        }
    }

    /// One budgeted step of a shadow rebuild in progress (`crate::shadow_pt`): of VM `id`'s
    /// if given, else of the first VM with one (so that a VM that makes no exits still gets its
    /// rebuild finished, one budget per hold of the lock). Finished directories get their
    /// physical TLB flush. Returns true if a step was done.
    pub(crate) fn shadow_step(&mut self, phys: &dyn PhysicalGpu, id: Option<VmId>) -> bool {
        let vm = match id {
            Some(id) => self.vms.get_mut(&id),
            None => self.vms.values_mut().find(|vm| vm.shadow.rebuilding()),
        };
        let Some(mut vm) = vm.filter(|vm| vm.shadow.rebuilding()) else {
            return false;
        };
        let mut cx = VmCx::new(phys, &mut self.hyp, &self.layout, &mut vm);
        let pds = {
            let (sh, mut scx) = cx.shadow();
            sh.step(&mut scx)
        };
        cx.phys_tlb_flush(&pds);
        true
    }

    /// Services physical interrupts, completions and dispatch.
    fn service(&mut self, phys: &dyn PhysicalGpu, irq: &IrqFlag, cfg: &HostConfig) {
        if irq.is_asserted() {
            crate::host::irq_route::service(self, phys);
        }
        if !self.inflight.is_empty()
            || self.sched.queued() > 0
            || self.sched_timer.is_some()
            || self.engine_watch.is_some()
            || !self.parked.is_empty()
        {
            crate::host::dispatch::progress(self, phys, cfg);
        }
        if !self.parked.is_empty() {
            // Work parked behind a shadow rebuild of a VM that makes no exits.
            self.shadow_step(phys, None);
        }
        reclaim::reclaim(self, phys, irq);
    }

    /// The time of scheduling and accounting: the GPU's clock if the host was given it, else
    /// the GPU's PTIMER (32 ns resolution on GF100).
    pub(crate) fn now(&self, phys: &dyn PhysicalGpu) -> u64 {
        match &self.clock {
            Some(c) => c.now_ns(),
            None => crate::host::dispatch::gpu_now(phys),
        }
    }

    fn sched_stats(&self, phys: &dyn PhysicalGpu) -> SchedStats {
        let now = self.now(phys);
        self.acct
            .stats(now, self.sched.name(), self.sched.snapshot())
    }

    /// Recomputes the interrupt line of every VM that may have changed it; returns the
    /// changes. Only the VMs unlocked with their level differing from the one last applied
    /// are looked at (`vgpu::cell::LineDirty`), not every VM after every access.
    fn line_changes(&mut self) -> Vec<LineChange> {
        let mut out = Vec::new();
        for id in self.vms.take_line_dirty() {
            let Some(mut vm) = self.vms.get_mut(&id) else {
                continue;
            };
            let level = vm.regs.line_level();
            if level != vm.line_level {
                vm.line_level = level;
                vm.line_seq += 1;
                out.push((vm.line.clone(), vm.line_seq, level));
            }
        }
        out
    }
}

/// The physical GPU and the VMs sharing it.
pub struct GpuHost {
    shared: Arc<HostShared>,
}

#[cfg(test)]
impl GpuHost {
    /// Runs `f` inside one write-locked hold that ends as an access's does (the host's quiet
    /// time recomputed): what another VM's access looks like to this VM's fast path.
    pub(crate) fn in_a_hold<R>(&self, f: impl FnOnce() -> R) -> R {
        let st = self.shared.lock();
        let r = f();
        self.shared.keep_quiet_until(&st);
        r
    }
}

impl std::fmt::Debug for GpuHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuHost")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

/// Alignment of VRAM slices (the sizing registers report whole MiB).
const SLICE_ALIGN: u64 = 1 << 20;
/// Granularity of the BAR arenas (the BAR page size of a future remap: 64 KiB keeps them
/// usable with 4 KiB and 64 KiB host pages).
const ARENA_ALIGN: u64 = 64 << 10;
/// The host's USERD pages at the start of the physical BAR1.
const HOST_BAR1_BYTES: u64 = pfifo::CHANNELS as u64 * userd::SIZE;
/// The lowest IOVA a DMA window may use (IOVA 0 stays unmapped, so a zeroed SYSRAM PTE never
/// reaches guest RAM).
const IOVA_BASE: u64 = 1 << 20;
/// The smallest DMA window.
pub const MIN_DMA_WINDOW: u64 = 1 << 20;

/// The largest DMA window: half the IOVA space below 2^40 (the reach of a SYSRAM page-table
/// entry), so that one VM can never take all of it.
pub const MAX_DMA_WINDOW: u64 = gf100::mmu::VA_LIMIT / 2;

/// [`dma_window_for`]`(ram_end)`, refused above [`MAX_DMA_WINDOW`].
fn ram_window(ram_end: u64) -> Result<u64, HostError> {
    let window = dma_window_for(ram_end);
    if window > MAX_DMA_WINDOW {
        return Err(HostError::Config(format!(
            "guest RAM ending at {ram_end:#x} needs a DMA window above the largest, \
             {MAX_DMA_WINDOW:#x} bytes (2^39: half the 40-bit IOVA space of SYSRAM page-table \
             entries)"
        )));
    }
    Ok(window)
}

/// The DMA window [`GpuHost::create_vgpu_for_ram`] gives a VM whose RAM ends at guest-physical
/// address `ram_end`: the next power of two, at least [`MIN_DMA_WINDOW`].
pub fn dma_window_for(ram_end: u64) -> u64 {
    ram_end
        .max(MIN_DMA_WINDOW)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
}

impl GpuHost {
    /// Takes over `phys` (the host is its only driver), brings it up and reserves the
    /// hypervisor region.
    pub fn new(phys: Arc<dyn PhysicalGpu>, cfg: HostConfig) -> Result<GpuHost, HostError> {
        let vram = phys.vram_size();
        if cfg.max_inflight == 0 {
            return Err(HostError::Config("max_inflight must be at least 1".into()));
        }
        if !cfg.iova_window.is_power_of_two()
            || cfg.iova_window < SLICE_ALIGN
            || cfg.iova_window >= gf100::mmu::VA_LIMIT / 2
        {
            return Err(HostError::Config(format!(
                "iova_window {:#x} must be a power of two from 1 MiB to 2^38",
                cfg.iova_window
            )));
        }
        let hyp_size = cfg.hypervisor_vram.next_multiple_of(SLICE_ALIGN);
        if hyp_size < init::MIN_HYPERVISOR_VRAM || hyp_size >= vram {
            return Err(HostError::Config(format!(
                "hypervisor_vram {:#x} must be at least {:#x} and below the GPU's {:#x} bytes of VRAM",
                cfg.hypervisor_vram,
                init::MIN_HYPERVISOR_VRAM,
                vram
            )));
        }
        if cfg.shadow_vram_per_vm < MIN_SHADOW_VRAM_PER_VM {
            return Err(HostError::Config(format!(
                "shadow_vram_per_vm {:#x} must be at least {MIN_SHADOW_VRAM_PER_VM:#x}",
                cfg.shadow_vram_per_vm
            )));
        }
        let mut hyp = HypVram::quarantined(0, hyp_size);
        let layout = init::bring_up(&*phys, &mut hyp)?;
        let irq = Arc::new(IrqFlag::new());
        phys.set_irq_line(irq.clone());
        let iova = RangeAllocator::new(IOVA_BASE, gf100::mmu::VA_LIMIT - IOVA_BASE);
        let slots = iova.aligned_fits(cfg.iova_window);
        let runtime = ChannelClock::new(&*phys);
        let state = HostState {
            hyp_baseline: hyp.used(),
            hyp,
            layout: layout.clone(),
            part: Partition {
                vram: RangeAllocator::new(hyp_size, vram - hyp_size),
                chans: RangeAllocator::new(0, u64::from(pfifo::CHANNELS)),
                iova,
                bar1: RangeAllocator::new(HOST_BAR1_BYTES, BAR1_SIZE - HOST_BAR1_BYTES),
                bar3: RangeAllocator::new(0, BAR3_SIZE),
                owner: vec![None; pfifo::CHANNELS as usize],
            },
            vms: vm_map::VmMap::default(),
            sched: Policy::Fifo.create(&SchedParams::default()),
            inflight: Vec::new(),
            decide_buf: Vec::new(),
            acct: {
                let mut acct = Accounting::default();
                acct.set_measured(runtime.measured());
                acct
            },
            runtime,
            sched_timer: None,
            engine_watch: None,
            clock: None,
            nonstall: BTreeSet::new(),
            frozen: BTreeSet::new(),
            parked: BTreeSet::new(),
            slice: None,
            runlist_next: 0,
            counters: Counters::default(),
            next_id: 0,
        };
        log::info!(
            "gpuvm host: {} MiB VRAM, {} MiB for the hypervisor, room for {} default DMA windows",
            vram >> 20,
            hyp_size >> 20,
            slots
        );
        let host = GpuHost {
            shared: Arc::new(HostShared {
                phys,
                cfg,
                irq,
                state: RwLock::new(state),
                holds: hold::HoldTimes::default(),
                quiet_until: std::sync::atomic::AtomicU64::new(0),
                fast_gone: std::sync::atomic::AtomicU64::new(0),
                gpu_events: Arc::new(std::sync::atomic::AtomicU64::new(0)),
                gpu_event_pending: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                layout: layout.clone(),
            }),
        };
        host.shared.phys.set_event_waker(host.shared.event_waker());
        Ok(host)
    }

    /// Replaces the scheduling policy (only while no VM exists).
    pub fn set_scheduler(&self, sched: Box<dyn Scheduler>) -> Result<(), HostError> {
        let mut st = self.shared.lock();
        if !st.vms.is_empty() {
            return Err(HostError::Config(
                "the scheduler can only be replaced while no VM exists".into(),
            ));
        }
        st.sched = sched;
        st.sched_timer = None;
        Ok(())
    }

    /// Makes scheduling and accounting use `clock`, the physical GPU's own clock (for the
    /// simulated GPU, the clock it was built with: `gpuvm_sim::SimGpu::clock`). Without
    /// it they read the GPU's PTIMER, whose low 5 bits are zero on GF100, so accounted times are
    /// only exact to 32 ns.
    pub fn set_clock(&self, clock: Arc<dyn Clock>) {
        let mut st = self.shared.lock();
        for mut vm in st.vms.values_mut() {
            vm.clock = Some(clock.clone());
        }
        st.clock = Some(clock);
    }

    /// When something next happens without anyone touching the GPU: the earliest of the physical
    /// GPU's next event, the end of the scheduler's deliberate wait and the hang watchdog's next
    /// deadline ([`HostConfig::watchdog_ns`] after the dispatch of the oldest submission in
    /// flight). A driver of a simulated
    /// clock advances it to this time and calls [`GpuHost::poll`] (or lets a guest access the
    /// device); `None` when nothing is pending.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.shared.next_event_ns()
    }

    /// GPU time per VM, shares over the sliding window, utilisation, and the policy's state.
    pub fn sched_stats(&self) -> SchedStats {
        let mut st = self.shared.lock();
        st.charge_all_ran(&*self.shared.phys);
        st.sched_stats(&*self.shared.phys)
    }

    /// Creates a vGPU for `profile` with a DMA window of [`HostConfig::iova_window`] bytes, or
    /// says which resource is missing.
    pub fn create_vgpu(&self, profile: &VgpuProfile) -> Result<Arc<Vgpu>, HostError> {
        self.create_vgpu_with_window(profile, self.shared.cfg.iova_window)
    }

    /// Creates a vGPU for `profile` whose RAM will end at guest-physical address `ram_end`
    /// (the highest RAM address + 1): its DMA window is [`dma_window_for`]`(ram_end)`, so that
    /// small VMs take little IOVA space. RAM attached later must fit in that window.
    pub fn create_vgpu_for_ram(
        &self,
        profile: &VgpuProfile,
        ram_end: u64,
    ) -> Result<Arc<Vgpu>, HostError> {
        self.create_vgpu_with_window(profile, ram_window(ram_end)?)
    }

    fn create_vgpu_with_window(
        &self,
        profile: &VgpuProfile,
        window: u64,
    ) -> Result<Arc<Vgpu>, HostError> {
        profile.validate()?;
        let cfg = &self.shared.cfg;
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let slice_size = profile.vram_bytes();
        let assignable = st.part.vram.size();
        let Some(iova_base) = st.part.iova.alloc(window, window) else {
            return Err(HostError::NoDmaWindow {
                profile: profile.name.clone(),
                window,
                free: st.part.iova.size() - st.part.iova.used(),
                vms: st.vms.len(),
            });
        };
        let release_iova = |st: &mut HostState| {
            st.part.iova.free(iova_base, window);
        };
        let shadow_pool = st
            .hyp
            .size()
            .saturating_sub(st.hyp_baseline)
            .saturating_sub(SHADOW_INSTANCE_RESERVE);
        if (st.vms.len() as u64 + 1).saturating_mul(cfg.shadow_vram_per_vm) > shadow_pool {
            release_iova(st);
            return Err(HostError::HypervisorVram {
                what: "shadow page tables: every VM reserves shadow_vram_per_vm",
            });
        }
        let Some(base) = st.part.vram.alloc(slice_size, SLICE_ALIGN) else {
            release_iova(st);
            return Err(HostError::NoVram {
                profile: profile.name.clone(),
                want: profile.vram_mib,
                free: (assignable - st.part.vram.used()) >> 20,
            });
        };
        let Some(chan_base) = st.part.chans.alloc(u64::from(profile.channels), 1) else {
            st.part.vram.free(base, slice_size);
            release_iova(st);
            return Err(HostError::NoChannels {
                profile: profile.name.clone(),
                want: profile.channels,
                free: (u64::from(pfifo::CHANNELS) - st.part.chans.used()) as u32,
            });
        };
        let arena = |alloc: &mut RangeAllocator| {
            let share = (u128::from(alloc.size()) * u128::from(slice_size)
                / u128::from(assignable.max(1))) as u64;
            let size = (share / ARENA_ALIGN * ARENA_ALIGN).max(ARENA_ALIGN);
            alloc.alloc(size, ARENA_ALIGN).map(|o| (o, size))
        };
        let Some(bar1_arena) = arena(&mut st.part.bar1) else {
            st.part.vram.free(base, slice_size);
            st.part.chans.free(chan_base, u64::from(profile.channels));
            release_iova(st);
            return Err(HostError::NoBarSpace { bar: "BAR1" });
        };
        let Some(bar3_arena) = arena(&mut st.part.bar3) else {
            st.part.vram.free(base, slice_size);
            st.part.chans.free(chan_base, u64::from(profile.channels));
            st.part.bar1.free(bar1_arena.0, bar1_arena.1);
            release_iova(st);
            return Err(HostError::NoBarSpace { bar: "BAR3" });
        };
        let id = VmId(st.next_id);
        st.next_id += 1;
        let chan_base = chan_base as u32;
        for o in &mut st.part.owner[chan_base as usize..(chan_base + profile.channels) as usize] {
            *o = Some(id);
        }
        // The slice is scrubbed at destroy; a never-used slice of a fresh GPU reads zero, but
        // scrub anyway so that the guarantee does not depend on history.
        self.shared.phys.fill_vram(HostVram(base), slice_size, 0);
        let line = Arc::new(LineSlot::default());
        let vm = VmState {
            id,
            profile: profile.clone(),
            window: (iova_base, window),
            mem: VmMem {
                slice: VramSlice {
                    base: HostVram(base),
                    size: slice_size,
                },
                ram: None,
                iova_base: Iova(iova_base),
                log: None,
            },
            dma_windows: Vec::new(),
            chan_base,
            bar1_arena,
            bar3_arena,
            shadow: {
                let mut shadow = ShadowPt::new(profile.shadow);
                shadow.set_shadow_limit(cfg.shadow_vram_per_vm);
                shadow
            },
            regs: VRegs::default(),
            bars: GuestBars::default(),
            chans: (0..profile.channels).map(|_| VChan::default()).collect(),
            runlist: Vec::new(),
            inst_pages: Default::default(),
            map_gen: 0,
            pci: PciConfig::firmware_enabled(),
            line: line.clone(),
            line_level: false,
            line_seq: 0,
            cap_ppm: None,
            stats: Default::default(),
            log: RateLimit::default(),
            effects: Vec::new(),
            retired_insts: Vec::new(),
            gone: false,
            clock: st.clock.clone(),
        };
        let now = st.now(&*self.shared.phys);
        // The VM is charged only what its channels run from now on.
        for c in [Cursor::Acct, Cursor::Sched] {
            st.runtime.take(
                &*self.shared.phys,
                chan_base..chan_base + profile.channels,
                c,
            );
        }
        st.sched.add_vm(id, profile.weight, now);
        st.acct.add_vm(id, profile.weight, now);
        let cell = st.vms.insert(id, vm);
        log::info!(
            "{id} ('{}'): VRAM {:#x}+{:#x}, channels {}..{}, DMA window {:#x}+{:#x}, shadow {}",
            profile.name,
            base,
            slice_size,
            chan_base,
            chan_base + profile.channels,
            iova_base,
            window,
            profile.shadow
        );
        drop(guard);
        Ok(Arc::new(Vgpu {
            id,
            cell,
            profile: profile.clone(),
            port: self.shared.clone(),
            line,
            phys_chans: chan_base..chan_base + profile.channels,
            slice: VramSlice {
                base: HostVram(base),
                size: slice_size,
            },
            tap: Default::default(),
        }))
    }

    /// Destroys a vGPU: stops and unbinds its channels, removes them from the runlist, drops its
    /// work, frees its shadows, scrubs its VRAM slice, unmaps its DMA windows and frees its
    /// partition. Afterwards its accesses read all-ones and
    /// its writes are dropped.
    pub fn destroy_vgpu(&self, v: &Vgpu) -> Result<(), HostError> {
        if !std::ptr::addr_eq(Arc::as_ptr(&self.shared), Arc::as_ptr(&v.port)) {
            return Err(HostError::NoSuchVm(v.id));
        }
        self.shared.destroy(v.id)
    }

    /// Lets the physical GPU make progress; services its interrupts and completions and
    /// dispatches queued work. Call it while every guest is idle.
    pub fn poll(&self) {
        self.shared.poll();
    }

    /// The physical GPU.
    pub fn phys(&self) -> &Arc<dyn PhysicalGpu> {
        &self.shared.phys
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.shared.cfg
    }

    /// Starts a new maximum of [`HostStats::lock_holds`] (to measure one phase of a run).
    pub fn reset_lock_hold_max(&self) {
        self.shared.holds.reset_max();
    }

    /// [`HostStats::lock_holds`] read without taking the host lock (its figures are atomics):
    /// a measurement's own read neither waits for the lock nor holds it, so it adds no wait and
    /// no hold to what it measures.
    pub fn lock_holds(&self) -> LockHolds {
        self.shared.holds.snapshot()
    }

    /// Whether every hold of the host lock reads its thread's usage, so that
    /// [`LockHolds::max_usage`] says why the longest hold was long (on a CPU, preempted or
    /// asleep). Two reads of the holder's CPU clock and schedstat a hold (about a microsecond
    /// each): for experiments, off by default.
    pub fn measure_hold_thread_usage(&self, on: bool) {
        self.shared.holds.set_thread_usage(on);
    }

    /// Host-wide counters and free resources.
    pub fn stats(&self) -> HostStats {
        let mut st = self.shared.lock();
        st.charge_all_ran(&*self.shared.phys);
        let c = st.counters;
        let stats = HostStats {
            vms: st.vms.len(),
            vram_assignable: st.part.vram.size(),
            vram_free: st.part.vram.size() - st.part.vram.used(),
            hypervisor_vram_used: st.hyp.used(),
            hypervisor_vram_host: st.hyp_baseline,
            hypervisor_vram: st.hyp.size(),
            channels_free: (u64::from(pfifo::CHANNELS) - st.part.chans.used()) as u32,
            dma_windows_free: st.part.iova.aligned_fits(self.shared.cfg.iova_window),
            iova_free: st.part.iova.size() - st.part.iova.used(),
            scheduler: st.sched.name().to_string(),
            queued: st.sched.queued(),
            inflight: st.inflight.len(),
            dispatched: c.dispatched,
            completed: c.completed,
            aborted: c.aborted,
            watchdog_kills: c.watchdog_kills,
            runlist_submits: c.runlist_submits,
            irq_services: c.irq_services,
            phys_faults: c.phys_faults,
            phys_pbdma_errors: c.phys_pbdma_errors,
            phys_nonstall: c.phys_nonstall,
            phys_fifo_errors: c.phys_fifo_errors,
            gpu_events: self
                .shared
                .gpu_events
                .load(std::sync::atomic::Ordering::Relaxed),
            unrouted: c.unrouted,
            hypervisor_vram_quarantined: st.hyp.retired_bytes(),
            hypervisor_vram_released: c.hyp_released,
            withheld_partitions: c.withheld_partitions,
            lock_holds: self.shared.holds.snapshot(),
            fast_path_accesses: self.shared.fast_path_accesses(&st),
            gpu: self.shared.phys.stats(),
            sched: st.sched_stats(&*self.shared.phys),
        };
        // A monitoring call (a metrics scrape) should not send every VM's next access the slow
        // way: the host's next event is recomputed from the state the charge left.
        if st.clock.is_some() {
            self.shared.keep_quiet_until(&st);
        }
        stats
    }
}

impl GpuPort for HostShared {
    fn phys(&self) -> &Arc<dyn PhysicalGpu> {
        &self.phys
    }

    #[track_caller]
    fn access_dyn(&self, id: VmId, f: &mut dyn FnMut(&mut VmCx)) -> bool {
        self.access(id, f).is_some()
    }

    #[track_caller]
    fn peek_dyn(&self, id: VmId, f: &mut dyn FnMut(&mut VmCx)) -> bool {
        self.peek(id, f).is_some()
    }

    fn access_local_dyn(
        &self,
        cell: &crate::vgpu::cell::VmCell,
        f: &mut dyn FnMut(&dyn PhysicalGpu, &HostLayout, &mut VmState) -> bool,
    ) -> bool {
        self.access_local(cell, f)
    }

    fn access_local_write_dyn(
        &self,
        cell: &crate::vgpu::cell::VmCell,
        f: &mut dyn FnMut(&dyn PhysicalGpu, &HostLayout, &mut VmState) -> bool,
    ) -> bool {
        self.access_local_write(cell, f)
    }

    fn poll_from(&self, cell: &crate::vgpu::cell::VmCell) {
        if !self.poll_is_idle(cell) {
            HostShared::poll(self);
        }
    }

    fn next_event_ns(&self) -> Option<u64> {
        HostShared::next_event_ns(self)
    }

    fn destroy(&self, id: VmId) {
        // Already gone (an explicit destroy came first) is the only error.
        let _ = HostShared::destroy(self, id);
    }
}
