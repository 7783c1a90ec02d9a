//! A virtual GF100 for one VM (GPUvm's per-VM device model, the QEMU `nvc0` device plus its
//! share of the A3 aggregator): PCI configuration space, the three BARs, guest memory, the
//! interrupt line and the VM's counters.
//!
//! [`Vgpu`] is what a VMM embeds, in the style of vm-superio: plain `bar_read` / `bar_write` at an
//! offset of a BAR, `config_read` / `config_write`, an [`IrqLine`] for the interrupt. Every access
//! is trapped unless the VMM maps BAR1/BAR3 pages of the direct-map plan straight into the
//! guest ([`Vgpu::direct_map`], GPUvm's BAR remap), and handled under the host's single lock
//! (see [`crate::host`]):
//!
//! - BAR0 registers (`bar0`) go through the region table (`crate::mmio::regions`, deny by
//!   default) to the per-VM register file (`vregs`), the channel code (`crate::channels`) or
//!   the shadow page tables;
//! - the PRAMIN window and the BAR1/BAR3 apertures (`aperture`) are translated in software
//!   through the guest's own window base and BAR page tables into the VM's memory;
//! - the guest's USERD pages inside its BAR1 poll area are emulated (`crate::channels::userd`):
//!   GP_PUT writes are doorbells for the scheduler.
//!
//! After each access the host services the physical GPU (interrupts, completions, dispatch) and
//! updates the interrupt lines of every VM.

pub(crate) mod aperture;
mod bar0;
pub(crate) mod cell;
pub mod direct_map;
pub(crate) mod port;
mod pv;
pub mod state;
pub mod tap;

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use gf100::Target;
use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use crate::addr::{Gpa, HostVram, Iova};
use crate::channels::{ChanCx, ChanVm, Effect, VChan};
use crate::guest_mem::{GuestMem, GuestRam, VmMem, VramSlice};
use crate::irq::IrqLine;
use crate::layout::HostLayout;
use crate::mmio::pci::PciConfig;
use crate::mmio::regions::{Policy, BAR0_REGIONS};
use crate::phys::{Bar, DmaError, PhysicalGpu};
use crate::profile::VgpuProfile;
use crate::sched::VmId;
use crate::shadow_pt::{ShadowCtx, ShadowPt};
use crate::vram_alloc::HypVram;

pub use crate::mmio::vbios;
pub use crate::stats::{self, PciCounts, VgpuStats, ViolationKind};
pub use direct_map::{DirectMap, DirectRun};
pub use state::{ChanState, DeviceState, StateError, DEVICE_STATE_VERSION};
pub use tap::AccessTap;

use crate::mmio::vregs::VRegs;
use crate::stats::RateLimit;
use aperture::GuestBars;
pub(crate) use port::GpuPort;

/// Why a vGPU operation failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VgpuError {
    /// The vGPU was destroyed.
    #[error("the vGPU was destroyed")]
    Destroyed,
    /// Guest memory was already attached.
    #[error("guest memory is already attached")]
    AlreadyAttached,
    /// A RAM region does not fit in the VM's IOVA window.
    #[error("guest RAM region at {gpa} of {len:#x} bytes does not fit in the {window:#x}-byte DMA window")]
    RamTooLarge {
        /// Start of the region.
        gpa: Gpa,
        /// Its length.
        len: u64,
        /// The window size.
        window: u64,
    },
    /// The physical GPU refused the DMA window.
    #[error("DMA window: {0}")]
    Dma(#[from] DmaError),
}

/// One region of a BAR as a VMM sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BarRegion {
    /// The BAR.
    #[serde(serialize_with = "ser_bar")]
    pub bar: Bar,
    /// First offset.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
    /// Name.
    pub name: String,
    /// What the device model does with accesses.
    pub policy: Policy,
    /// True if the VMM must trap accesses (forward them to [`Vgpu::bar_read`] /
    /// [`Vgpu::bar_write`]); false if it may map the region straight into the guest. Always true
    /// here: every region is emulated or translated; which *pages* of BAR1/BAR3 may be mapped
    /// at a given moment is the direct-map plan ([`Vgpu::direct_map`], BAR remap).
    pub trapped: bool,
}

fn ser_bar<S: serde::Serializer>(b: &Bar, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u8(b.index())
}

/// The interrupt line of one VM, applied outside the host lock with sequence numbers so that a
/// late, stale level never overwrites a newer one (the simulator does the same).
#[derive(Default)]
pub(crate) struct LineSlot {
    inner: Mutex<LineOut>,
}

#[derive(Default)]
struct LineOut {
    line: Option<Arc<dyn IrqLine>>,
    applied: u64,
    level: bool,
}

impl LineSlot {
    /// Applies `level` computed as change number `seq`.
    pub(crate) fn apply(&self, seq: u64, level: bool) {
        let mut out = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if seq > out.applied {
            out.applied = seq;
            out.level = level;
            if let Some(l) = &out.line {
                l.set_level(level);
            }
        }
    }

    fn connect(&self, line: Arc<dyn IrqLine>) {
        let mut out = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        line.set_level(out.level);
        out.line = Some(line);
    }
}

impl fmt::Debug for LineSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LineSlot")
    }
}

/// Everything the host keeps about one VM (behind the host lock).
pub(crate) struct VmState {
    pub id: VmId,
    pub profile: VgpuProfile,
    /// The DMA window in the IOVA space: (base, size).
    pub window: (u64, u64),
    pub mem: VmMem,
    /// DMA windows registered for the VM's RAM regions.
    pub dma_windows: Vec<Iova>,
    /// First physical channel of the partition.
    pub chan_base: u32,
    /// BAR1 / BAR3 arenas (offset, size) in the physical BARs, reserved for BAR remapping.
    pub bar1_arena: (u64, u64),
    pub bar3_arena: (u64, u64),
    pub shadow: ShadowPt,
    pub regs: VRegs,
    pub bars: GuestBars,
    pub chans: Vec<VChan>,
    /// The VM's accepted runlist (guest channel ids, in order).
    pub runlist: Vec<u32>,
    /// Guest instance-block pages of bound channels: (sysram?, page address) -> guest chids.
    pub inst_pages: crate::channels::InstPages,
    /// Bumped whenever the direct-map plan of BAR1/BAR3 may have changed for a reason other
    /// than the tracked set (binding, TLB flush, poll area, instance pages): see `direct_map`.
    pub map_gen: u64,
    pub pci: PciConfig,
    pub line: Arc<LineSlot>,
    pub line_level: bool,
    pub line_seq: u64,
    /// The cap set for the VM (ppm), kept by the host so that it survives a change of policy.
    pub cap_ppm: Option<u32>,
    pub stats: VgpuStats,
    pub log: RateLimit,
    pub effects: Vec<Effect>,
    /// Shadow instance blocks freed but still in the hypervisor VRAM quarantine: faults the GPU
    /// reports for them are this VM's (`crate::host::irq_route`).
    pub retired_insts: Vec<crate::channels::RetiredInst>,
    /// Destroyed: the host no longer has the VM (its vGPU's fast path finds this).
    pub gone: bool,
    /// The host's clock (`GpuHost::set_clock`), for the fast path's "now".
    pub clock: Option<Arc<dyn crate::clock::Clock>>,
}

impl VmState {
    /// Physical channel of guest channel `g` (which must be < the partition size).
    pub(crate) fn phys_chid(&self, g: u32) -> u32 {
        self.chan_base + g
    }

    /// Number of channels of the partition.
    pub(crate) fn nchan(&self) -> u32 {
        self.chans.len() as u32
    }

    /// The physical channels that can have run for this VM: its partition up to the last
    /// channel it ever bound (an unbound physical channel never runs; the host makes a channel
    /// RUNNABLE only for a submission of a bound one). Reading the GPU's counters of the rest
    /// at each measured charge cost FV ~1.8 K instructions of a memcpy_dtoh run with a
    /// 128-channel partition (callgrind).
    pub(crate) fn ran_chans(&self) -> std::ops::Range<u32> {
        let used = self
            .chans
            .iter()
            .rposition(|c| c.ever_bound)
            .map_or(0, |i| i as u32 + 1);
        self.chan_base..self.chan_base + used
    }

    /// A snapshot of the counters, shadow counters included.
    pub(crate) fn stats_snapshot(&self) -> VgpuStats {
        let mut s = self.stats.clone();
        s.shadow = self.shadow.stats();
        s.violations.page_table = s.shadow.violations;
        s.violations.total += s.shadow.violations;
        s
    }
}

/// One VM's state plus what its handlers need from the host, for the duration of one access.
pub(crate) struct VmCx<'a> {
    pub phys: &'a dyn PhysicalGpu,
    pub hyp: &'a mut HypVram,
    pub layout: &'a HostLayout,
    pub vm: &'a mut VmState,
}

impl<'a> VmCx<'a> {
    /// The context of one access of `vm`: what it frees of the hypervisor VRAM is charged to
    /// it and quarantined until its channels have left the GPU (`crate::vram_alloc::HypVram`).
    pub(crate) fn new(
        phys: &'a dyn PhysicalGpu,
        hyp: &'a mut HypVram,
        layout: &'a HostLayout,
        vm: &'a mut VmState,
    ) -> VmCx<'a> {
        hyp.set_owner(Some((vm.id.0, vm.chan_base..vm.chan_base + vm.nchan())));
        VmCx {
            phys,
            hyp,
            layout,
            vm,
        }
    }

    /// The VM's memory view (every guest address goes through it).
    pub(crate) fn gmem(&self) -> GuestMem<'_> {
        self.vm.mem.view(self.phys)
    }

    /// The shadow page tables and the context they need.
    pub(crate) fn shadow(&mut self) -> (&mut ShadowPt, ShadowCtx<'_>) {
        let vm = &mut *self.vm;
        (
            &mut vm.shadow,
            ShadowCtx {
                mem: vm.mem.view(self.phys),
                hyp: &mut *self.hyp,
            },
        )
    }

    /// The channel code's view of this access (`crate::channels::ChanCx`).
    pub(crate) fn chan(&mut self) -> ChanCx<'_> {
        let vm = &mut *self.vm;
        ChanCx {
            phys: self.phys,
            hyp: &mut *self.hyp,
            layout: self.layout,
            vm: ChanVm {
                id: vm.id,
                name: &vm.profile.name,
                chan_base: vm.chan_base,
                chans: &mut vm.chans,
                runlist: &mut vm.runlist,
                inst_pages: &mut vm.inst_pages,
                retired_insts: &mut vm.retired_insts,
                effects: &mut vm.effects,
                map_gen: &mut vm.map_gen,
                regs: &mut vm.regs,
                stats: &mut vm.stats,
                log: &mut vm.log,
                mem: &vm.mem,
                shadow: &mut vm.shadow,
            },
        }
    }

    /// Counts a violation and logs it (rate-limited).
    pub(crate) fn violation(&mut self, kind: ViolationKind, what: impl FnOnce() -> String) {
        self.chan().violation(kind, what);
    }

    /// Flushes the physical TLB for each shadow page directory in `pds`.
    pub(crate) fn phys_tlb_flush(&mut self, pds: &[HostVram]) {
        self.chan().phys_tlb_flush(pds);
    }

    /// Writes `data` to guest memory at `addr` in `target` on the guest's behalf (PRAMIN, BAR1,
    /// BAR3), then lets the shadow page tables and the shadow instance blocks see the write.
    pub(crate) fn guest_write(
        &mut self,
        target: Target,
        addr: u64,
        data: &[u8],
    ) -> Result<(), crate::guest_mem::Violation> {
        self.gmem().write(target, addr, data)?;
        let len = data.len() as u64;
        {
            let (sh, mut scx) = self.shadow();
            sh.guest_wrote(&mut scx, target, addr, len);
        }
        crate::channels::on_guest_write(&mut self.chan(), target, addr, len);
        Ok(())
    }
}

/// A virtual GF100 given to one VM. Cheap to share (`Arc`); every method may be called from any
/// vCPU thread. Dropping the last reference destroys the VM (as [`crate::host::GpuHost::destroy_vgpu`]).
pub struct Vgpu {
    pub(crate) id: VmId,
    pub(crate) profile: VgpuProfile,
    pub(crate) port: Arc<dyn GpuPort>,
    pub(crate) line: Arc<LineSlot>,
    pub(crate) phys_chans: Range<u32>,
    pub(crate) slice: VramSlice,
    /// A hook around every BAR access (trace recording), set at most once.
    pub(crate) tap: OnceLock<Arc<dyn AccessTap>>,
    /// The VM's state and lock (the fast path locks only this: `host::local`).
    pub(crate) cell: Arc<cell::VmCell>,
}

impl fmt::Debug for Vgpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vgpu")
            .field("id", &self.id)
            .field("profile", &self.profile.name)
            .finish_non_exhaustive()
    }
}

impl Vgpu {
    /// The VM's identity on its host.
    pub fn id(&self) -> VmId {
        self.id
    }

    /// The profile the vGPU was created from.
    pub fn profile(&self) -> &VgpuProfile {
        &self.profile
    }

    /// The physical channels of the VM's partition (guest channel `g` is physical
    /// `start + g`).
    pub fn phys_channels(&self) -> Range<u32> {
        self.phys_chans.clone()
    }

    /// The VM's slice of physical VRAM (guest VRAM address 0 is at `base`).
    pub fn vram_slice(&self) -> VramSlice {
        self.slice
    }

    /// Bytes of the VRAM slice in use as far as the physical GPU can tell
    /// ([`PhysicalGpu::vram_resident_bytes`]: written and not scrubbed since), if it can.
    pub fn vram_in_use_bytes(&self) -> Option<u64> {
        self.port
            .phys()
            .vram_resident_bytes(self.slice.base, self.slice.size)
    }

    /// The physical GPU underneath (for harnesses that wait on its clock).
    pub fn phys(&self) -> &Arc<dyn PhysicalGpu> {
        self.port.phys()
    }

    /// Reads PCI configuration space (1, 2 or 4 bytes, naturally aligned; anything else, or a
    /// destroyed vGPU, reads all-ones).
    pub fn config_read(&self, offset: u16, data: &mut [u8]) {
        if self
            .port
            .access(self.id, |cx| cx.vm.pci.read(offset, data))
            .is_none()
        {
            data.fill(0xff);
        }
    }

    /// Writes PCI configuration space (BAR sizing, command register, MSI as on hardware).
    /// The command register is honoured: with memory decoding off every BAR reads all-ones and
    /// drops writes (and the direct-map plans are empty); with bus mastering off the VM's DMA
    /// windows are unmapped, so its GPU work reaches none of its RAM (see [`PciCounts`]).
    pub fn config_write(&self, offset: u16, data: &[u8]) {
        self.port.access(self.id, |cx| {
            let (mem0, bm0) = (cx.vm.pci.memory_enabled(), cx.vm.pci.bus_master());
            cx.vm.pci.write(offset, data);
            let (mem1, bm1) = (cx.vm.pci.memory_enabled(), cx.vm.pci.bus_master());
            if mem0 != mem1 {
                cx.vm.map_gen += 1;
            }
            if bm0 != bm1 {
                if bm1 {
                    map_windows(cx);
                } else {
                    cx.vm.stats.pci.bus_master_off += 1;
                    unmap_windows(cx);
                }
            }
        });
    }

    /// Reads `data` (any length) of the expansion ROM at `offset`: the generated VBIOS
    /// ([`vbios`]), zero past the image, all-ones beyond the 512 KiB BAR or while the ROM BAR
    /// does not decode (enable bit or memory decoding off; counted).
    pub fn rom_read(&self, offset: u64, data: &mut [u8]) {
        let done = self.port.access(self.id, |cx| {
            let inside = offset
                .checked_add(data.len() as u64)
                .is_some_and(|end| end <= gf100::pci::ROM_SIZE);
            if !cx.vm.pci.rom_enabled() || !inside {
                cx.vm.stats.pci.rom_refused += 1;
                data.fill(0xff);
                return;
            }
            cx.vm.stats.pci.rom_reads += 1;
            cx.vm.regs.board.rom(offset as usize, data);
        });
        if done.is_none() {
            data.fill(0xff);
        }
    }

    /// The MSI message the guest programmed (a VMM that delivers MSIs routes the interrupt line
    /// with it); `None` once destroyed.
    pub fn msi(&self) -> Option<crate::mmio::pci::MsiState> {
        self.port.access(self.id, |cx| cx.vm.pci.msi())
    }

    /// Reads `data.len()` (1, 2, 4 or 8) bytes of `bar` at `offset`.
    pub fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        match self.tap.get() {
            Some(tap) => tap.read(bar, offset, data, &mut |d| {
                self.bar_read_direct(bar, offset, d)
            }),
            None => self.bar_read_direct(bar, offset, data),
        }
    }

    fn bar_read_direct(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        // BAR3 has no fast path: not even the VM's lock is taken for it.
        if bar != Bar::Bar3
            && self
                .port
                .access_local_dyn(&self.cell, &mut |phys, layout, vm| {
                    vm.pci.memory_enabled()
                        && match bar {
                            Bar::Bar0 => {
                                let done = bar0::read_fast(phys, vm, offset, data);
                                if done {
                                    vm.stats.exits.bar0.count(false);
                                }
                                done
                            }
                            Bar::Bar1 if aperture::valid_width(data.len()) => {
                                let done =
                                    aperture::userd_read_fast(phys, layout, vm, offset, data)
                                        || aperture::aperture_read_fast(phys, vm, offset, data);
                                if done {
                                    vm.stats.exits.bar1.count(false);
                                }
                                done
                            }
                            Bar::Bar1 => false,
                            Bar::Bar3 => false,
                        }
                })
        {
            return;
        }
        let done = self.port.access(self.id, |cx| match bar {
            _ if !cx.vm.pci.memory_enabled() => {
                cx.vm.stats.pci.decode_off.count(false);
                data.fill(0xff);
            }
            Bar::Bar0 => {
                cx.vm.stats.exits.bar0.count(false);
                bar0::read(cx, offset, data)
            }
            Bar::Bar1 | Bar::Bar3 => aperture::bar_read(cx, bar, offset, data),
        });
        if done.is_none() {
            fill_dead(bar, data);
        }
    }

    /// Writes `data` (1, 2, 4 or 8 bytes) to `bar` at `offset`.
    pub fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        match self.tap.get() {
            Some(tap) => tap.write(bar, offset, data, &mut |d| {
                self.bar_write_direct(bar, offset, d)
            }),
            None => self.bar_write_direct(bar, offset, data),
        }
    }

    fn bar_write_direct(&self, bar: Bar, offset: u64, data: &[u8]) {
        if bar == Bar::Bar1
            && self.port.access_local_dyn(&self.cell, &mut |_, _, vm| {
                vm.pci.memory_enabled() && aperture::userd_doorbell_fast(vm, offset, data) && {
                    vm.stats.exits.bar1.count(true);
                    true
                }
            })
        {
            return;
        }
        if self
            .port
            .access_local_write_dyn(&self.cell, &mut |phys, layout, vm| {
                vm.pci.memory_enabled()
                    && match bar {
                        Bar::Bar0 => bar0::write_fast(phys, layout, vm, offset, data),
                        Bar::Bar1 | Bar::Bar3 => {
                            aperture::aperture_write_fast(phys, vm, bar, offset, data)
                        }
                    }
            })
        {
            return;
        }
        self.port
            .access(self.id, |cx| write_locked(cx, bar, offset, data));
    }

    /// Fills `len` bytes of `bar` from `offset` with `value` (a guest `memset_io`), as the
    /// naturally aligned 8/4/2/1-byte writes [`Vgpu::bar_write`] takes, with the same effect;
    /// but at most [`FILL_CHUNK`] bytes per acquisition of the host lock, so a transport need
    /// not pay one lock round trip and GPU service per 8 bytes of a large memset. With an
    /// access tap installed every piece goes through [`Vgpu::bar_write`] (the tap sees it).
    ///
    /// The fill is clipped to the BAR before anything is walked: the bytes beyond its end
    /// reach no register or memory (as on a bus where nothing decodes them), and a fill that
    /// starts or reaches beyond the BAR is counted as a dropped write.
    pub fn bar_fill(&self, bar: Bar, offset: u64, len: u64, value: u8) {
        let fill = [value; 8];
        let want_end = offset.saturating_add(len);
        let end = want_end.min(bar.size());
        if want_end > end && len > 0 {
            self.port.access(self.id, |cx| {
                cx.violation(crate::stats::ViolationKind::DroppedWrite, || {
                    format!(
                        "{bar:?} fill of {len:#x} bytes at {offset:#x} reaches beyond the {:#x}-byte BAR; the rest is dropped",
                        bar.size()
                    )
                })
            });
        }
        if offset >= end {
            return;
        }
        if self.tap.get().is_some() {
            for (off, n) in aligned_pieces(offset, end) {
                self.bar_write(bar, off, &fill[..n]);
            }
            return;
        }
        let mut at = offset;
        while at < end {
            let stop = end.min((at / FILL_CHUNK + 1) * FILL_CHUNK);
            self.port.access(self.id, |cx| {
                for (off, n) in aligned_pieces(at, stop) {
                    write_locked(cx, bar, off, &fill[..n]);
                }
            });
            at = stop;
        }
    }

    /// Installs a hook that sees and performs every later BAR access (see [`tap`]); a vGPU
    /// has at most one. Returns the tap back if one is already installed.
    pub fn set_access_tap(&self, tap: Arc<dyn AccessTap>) -> Result<(), Arc<dyn AccessTap>> {
        self.tap.set(tap)
    }

    /// The BAR regions and their trap policy: the BAR0 region table (deny by default: offsets
    /// not listed are unknown and read the bad-register code), and BAR1 and BAR3 as one
    /// translated region each. No region is static enough to map straight through; the pages of
    /// BAR1/BAR3 that may be are dynamic and come from [`Vgpu::direct_map`].
    pub fn regions(&self) -> Vec<BarRegion> {
        let mut v: Vec<BarRegion> = BAR0_REGIONS
            .iter()
            .filter(|r| {
                r.handler != Some(crate::mmio::regions::Handler::Paravirt)
                    || self.profile.shadow == crate::profile::ShadowMode::Pv
            })
            .map(|r| BarRegion {
                bar: Bar::Bar0,
                offset: u64::from(r.offset),
                size: u64::from(r.size),
                name: r.name.to_string(),
                policy: r.policy,
                trapped: true,
            })
            .collect();
        v.push(BarRegion {
            bar: Bar::Bar1,
            offset: 0,
            size: Bar::Bar1.size(),
            name: "BAR1 (VRAM aperture through the guest's BAR1 VM; USERD poll area emulated)"
                .into(),
            policy: Policy::Shadowed,
            trapped: true,
        });
        v.push(BarRegion {
            bar: Bar::Bar3,
            offset: 0,
            size: Bar::Bar3.size(),
            name: "BAR3 (instance memory through the guest's BAR3 VM)".into(),
            policy: Policy::Shadowed,
            trapped: true,
        });
        v
    }

    /// The direct-map plan of `bar` (BAR1 or BAR3; BAR0 and a destroyed vGPU: empty): the
    /// aperture pages a VMM may map straight onto physical VRAM (see [`direct_map`]). Reading it
    /// walks the guest's BAR page tables; call it only when
    /// [`Vgpu::direct_map_generation`] moved.
    pub fn direct_map(&self, bar: Bar) -> DirectMap {
        self.port
            .peek(self.id, |cx| direct_map::plan(cx, bar))
            .unwrap_or_default()
    }

    /// The generation of the direct-map plans (cheap: one lock, no GPU service); a new value
    /// means [`Vgpu::direct_map`] may answer differently.
    pub fn direct_map_generation(&self) -> u64 {
        self.port
            .peek(self.id, |cx| direct_map::generation(cx.vm))
            .unwrap_or(u64::MAX)
    }

    /// Attaches the VM's RAM: each region is mapped into the VM's IOVA window with the physical
    /// GPU's `map_dma` (GPA `g` at IOVA `window base + g`); from then on the guest's
    /// system-memory page-table entries may name it.
    pub fn attach_guest_memory(&self, mem: GuestMemoryMmap) -> Result<(), VgpuError> {
        self.port
            .access(self.id, |cx| {
                let window = cx.vm.window.1;
                attach_memory(cx, window, mem)
            })
            .unwrap_or(Err(VgpuError::Destroyed))
    }

    /// Detaches the VM's RAM: unmaps its DMA windows and forgets it, so that
    /// [`Vgpu::attach_guest_memory`] can attach a new set. A vfio-user client maps its RAM one
    /// region per DMA_MAP message, so the server re-attaches the whole set on each map and unmap.
    /// Guest page-table entries naming system memory that is no longer attached fault as any
    /// unmapped address does. A no-op if nothing is attached.
    pub fn detach_guest_memory(&self) -> Result<(), VgpuError> {
        self.port
            .access(self.id, detach_memory)
            .ok_or(VgpuError::Destroyed)
    }

    /// Connects the VM's interrupt line (level-triggered; it must not call back into the vGPU).
    pub fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        self.line.connect(line);
    }

    /// The VM's counters.
    pub fn stats(&self) -> VgpuStats {
        self.port
            .access(self.id, |cx| cx.vm.stats_snapshot())
            .unwrap_or_default()
    }

    /// The VM's counters as they stand, read under this VM's lock alone: no host lock and no
    /// service of the GPU, so a reader between a guest's runs (a harness, a monitor polling
    /// many VMs) makes no other VM's exit wait. What finished on the GPU since the last access
    /// or poll is not in it yet ([`Vgpu::stats`] services the GPU first); counters that only
    /// the VM's own accesses move (its exits, shadow work, doorbells) are exact. Zeros once
    /// the VM is destroyed, as [`Vgpu::stats`].
    pub fn stats_local(&self) -> VgpuStats {
        let vm = self.cell.lock();
        if vm.gone {
            return VgpuStats::default();
        }
        vm.stats_snapshot()
    }

    /// Lets the physical GPU make progress and delivers what it finished (the same as
    /// [`crate::host::GpuHost::poll`], except that while the host has nothing to service it
    /// returns at once, under this VM's lock alone: counted as `VgpuStats::idle_polls`). Every
    /// access does this too; call it while the guest is idle (waiting with `hlt`).
    pub fn poll(&self) {
        self.port.poll_from(&self.cell);
    }

    /// When something next happens on the shared GPU without anyone touching it (see
    /// [`crate::host::GpuHost::next_event_ns`]): what a guest waiting with a simulated clock
    /// advances to.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.port.next_event_ns()
    }
}

impl Drop for Vgpu {
    fn drop(&mut self) {
        // A VM still alive when its last handle goes is destroyed; an explicit destroy before
        // makes this a no-op.
        self.port.destroy(self.id);
    }
}

/// One guest BAR write under the host lock: dropped and counted while memory decoding is off,
/// else to the BAR0 dispatch or the BAR1/BAR3 aperture.
fn write_locked(cx: &mut VmCx, bar: Bar, offset: u64, data: &[u8]) {
    match bar {
        _ if !cx.vm.pci.memory_enabled() => cx.vm.stats.pci.decode_off.count(true),
        Bar::Bar0 => {
            cx.vm.stats.exits.bar0.count(true);
            bar0::write(cx, offset, data)
        }
        Bar::Bar1 | Bar::Bar3 => aperture::bar_write(cx, bar, offset, data),
    }
}

/// Bytes of a [`Vgpu::bar_fill`] done per acquisition of the host lock.
pub const FILL_CHUNK: u64 = 4096;

/// `[start, end)` as naturally aligned pieces of 8, 4, 2 or 1 bytes, largest first.
fn aligned_pieces(start: u64, end: u64) -> impl Iterator<Item = (u64, usize)> {
    let mut off = start;
    std::iter::from_fn(move || {
        if off >= end {
            return None;
        }
        let left = end - off;
        let n = [8u64, 4, 2, 1]
            .into_iter()
            .find(|&s| off.is_multiple_of(s) && s <= left)
            .unwrap_or(1);
        let piece = (off, n as usize);
        off += n;
        Some(piece)
    })
}

/// What a BAR access reads when the vGPU is gone.
fn fill_dead(bar: Bar, data: &mut [u8]) {
    match bar {
        Bar::Bar0 if data.len() == 4 => data.copy_from_slice(&gf100::BAD_REGISTER.to_le_bytes()),
        _ => data.fill(0xff),
    }
}

fn attach_memory(cx: &mut VmCx, window: u64, mem: GuestMemoryMmap) -> Result<(), VgpuError> {
    if cx.vm.mem.ram.is_some() {
        return Err(VgpuError::AlreadyAttached);
    }
    for r in mem.iter() {
        let (gpa, len) = (r.start_addr().0, r.len());
        let fits = matches!(gpa.checked_add(len), Some(end) if end <= window);
        if !fits {
            return Err(VgpuError::RamTooLarge {
                gpa: Gpa(gpa),
                len,
                window,
            });
        }
    }
    let base = cx.vm.mem.iova_base;
    cx.vm.mem.ram = Some(GuestRam {
        mem,
        iova_base: base,
    });
    // With bus mastering off the RAM is attached but not mapped: the windows appear when the
    // guest turns it on.
    if cx.vm.pci.bus_master() {
        if let Err(e) = try_map_windows(cx) {
            cx.vm.mem.ram = None;
            return Err(e);
        }
    }
    Ok(())
}

/// Maps each region of the VM's RAM into its IOVA window with the physical GPU's `map_dma`
/// (GPA `g` at IOVA `window base + g`); on failure nothing stays mapped.
fn try_map_windows(cx: &mut VmCx) -> Result<(), VgpuError> {
    let Some(ram) = cx.vm.mem.ram.as_ref() else {
        return Ok(());
    };
    if !cx.vm.dma_windows.is_empty() {
        return Ok(());
    }
    let base = ram.iova_base;
    let mut mapped = Vec::new();
    for r in ram.mem.iter() {
        let (gpa, len) = (r.start_addr().0, r.len());
        let iova = base.offset(gpa);
        if let Err(e) = cx.phys.map_dma(iova, len, ram.mem.clone(), Gpa(gpa)) {
            for m in mapped {
                let _ = cx.phys.unmap_dma(m);
            }
            return Err(e.into());
        }
        mapped.push(iova);
    }
    cx.vm.dma_windows = mapped;
    Ok(())
}

/// Bus mastering turned on: the VM's RAM becomes reachable by its GPU work again.
fn map_windows(cx: &mut VmCx) {
    if let Err(e) = try_map_windows(cx) {
        log::warn!("{}: remapping DMA windows: {e}", cx.vm.id);
    }
}

/// Bus mastering turned off (or RAM detached): the GPU's accesses to the VM's RAM hit no window
/// and master-abort (reads all-ones, writes dropped, counted by the physical GPU).
fn unmap_windows(cx: &mut VmCx) {
    for w in cx.vm.dma_windows.drain(..) {
        if let Err(e) = cx.phys.unmap_dma(w) {
            log::warn!("{}: unmapping DMA window {w}: {e}", cx.vm.id);
        }
    }
}

fn detach_memory(cx: &mut VmCx) {
    unmap_windows(cx);
    cx.vm.mem.ram = None;
}

#[cfg(test)]
pub(crate) mod tests;
