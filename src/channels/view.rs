//! What the channel code works on during one guest access: [`ChanCx`], a narrow view the per-VM
//! device hands down (`VmCx::chan` in `crate::vgpu`) — the VM's channel state, its register
//! file, shadow page tables, memory and counters, and the host pieces the channels need (the
//! physical GPU, the hypervisor VRAM, the host's layout). The channel code never sees the rest
//! of the VM or the host; what it needs the host to do afterwards it returns as [`Effect`]s.

use crate::addr::HostVram;
use crate::guest_mem::{GuestMem, VmMem};
use crate::layout::HostLayout;
use crate::mmio::vregs::VRegs;
use crate::phys::PhysicalGpu;
use crate::sched::VmId;
use crate::shadow_pt::{ShadowCtx, ShadowPt};
use crate::stats::{RateLimit, VgpuStats, ViolationKind};
use crate::vram_alloc::HypVram;

use super::{RetiredInst, VChan};

/// A host-level consequence of a guest access, applied by the host after the access (it needs
/// state beyond the VM: the scheduler, the merged runlist).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The VM's runlist changed: rebuild and submit the physical runlist.
    RunlistChanged,
    /// The guest rang the doorbell of its channel `g`.
    Doorbell(u32),
    /// Guest channel `g` was unbound: drop its queued and in-flight work.
    ChannelGone(u32),
}

/// The parts of one VM the channel code reads and changes (borrowed from the VM's state).
pub(crate) struct ChanVm<'a> {
    pub id: VmId,
    /// The profile's name (for log lines).
    pub name: &'a str,
    /// First physical channel of the partition.
    pub chan_base: u32,
    pub chans: &'a mut Vec<VChan>,
    /// The VM's accepted runlist (guest channel ids, in order).
    pub runlist: &'a mut Vec<u32>,
    /// Guest instance-block pages of bound channels: (sysram?, page address) -> guest chids.
    pub inst_pages: &'a mut crate::channels::InstPages,
    /// Shadow instance blocks freed but still quarantined (faults for them are this VM's).
    pub retired_insts: &'a mut Vec<RetiredInst>,
    /// Host-level effects queued by this access.
    pub effects: &'a mut Vec<Effect>,
    /// Bumped when the direct-map plan of BAR1/BAR3 may have changed.
    pub map_gen: &'a mut u64,
    pub regs: &'a mut VRegs,
    pub stats: &'a mut VgpuStats,
    pub log: &'a mut RateLimit,
    pub mem: &'a VmMem,
    pub shadow: &'a mut ShadowPt,
}

impl ChanVm<'_> {
    /// Physical channel of guest channel `g` (which must be < the partition size).
    pub(crate) fn phys_chid(&self, g: u32) -> u32 {
        self.chan_base + g
    }

    /// Number of channels of the partition.
    pub(crate) fn nchan(&self) -> u32 {
        self.chans.len() as u32
    }
}

/// One VM's channel state plus what the channel code needs from the host, for one access.
pub(crate) struct ChanCx<'a> {
    pub phys: &'a dyn PhysicalGpu,
    pub hyp: &'a mut HypVram,
    pub layout: &'a HostLayout,
    pub vm: ChanVm<'a>,
}

impl ChanCx<'_> {
    /// The VM's memory view (every guest address goes through it).
    pub(crate) fn gmem(&self) -> GuestMem<'_> {
        self.vm.mem.view(self.phys)
    }

    /// The shadow page tables and the context they need.
    pub(crate) fn shadow(&mut self) -> (&mut ShadowPt, ShadowCtx<'_>) {
        (
            &mut *self.vm.shadow,
            ShadowCtx {
                mem: self.vm.mem.view(self.phys),
                hyp: &mut *self.hyp,
            },
        )
    }

    /// Counts a violation and logs it (rate-limited).
    pub(crate) fn violation(&mut self, kind: ViolationKind, what: impl FnOnce() -> String) {
        self.vm.stats.violations.add(kind, 1);
        if self.vm.log.hit() {
            log::warn!(
                "{} ({}): violation {kind:?}: {} [{} logged events so far]",
                self.vm.id,
                self.vm.name,
                what(),
                self.vm.log.seen()
            );
        }
    }

    /// Flushes the physical TLB for each shadow page directory in `pds`.
    pub(crate) fn phys_tlb_flush(&mut self, pds: &[HostVram]) {
        for &pd in pds {
            crate::phys_driver::phys_tlb_flush(self.phys, &self.layout.tlb_flush, pd, false);
            self.vm.stats.phys_tlb_flushes += 1;
        }
    }
}
