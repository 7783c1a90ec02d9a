//! Memory apertures of the virtual GPU: the PRAMIN window (BAR0 0x700000, base in PMEM 0x1700)
//! and the BAR1 / BAR3 apertures, all resolved **in software** against the VM's own memory —
//! GPUvm emulates BAR1 the same way ("BAR1 accesses are emulated by walking the guest BAR1 page
//! table"), and BAR3 until its remap optimization.
//!
//! A guest BAR binding (0x1704 BAR1, 0x1714 BAR3) in VM mode names a guest instance block whose
//! page-directory base and limit are loaded when the binding is written and again on every guest
//! TLB flush (as the hardware reloads them). An access is translated page by page: limit check,
//! PDE, small-page table first then large-page table (the GF100 walk `gf100::mmu` describes),
//! read-only check; every table read and the final page go through the VM's memory check
//! ([`crate::guest_mem`]), so a guest BAR page table can only reach the VM's own slice and RAM.
//! Successful translations are kept in a small software TLB, emptied by a binding write and by
//! a guest TLB flush of all page directories or of BAR1's or BAR3's (a flush of another address
//! space leaves them, as the hardware's flush by page directory does).
//! A failing translation behaves like the hardware's: the read returns all-ones, the rest of the
//! write is dropped, and an MMU fault (unit BAR1 4 / BAR3 5, client BAR_READ / BAR_WRITE, hub) is
//! raised on *this VM's* virtual PFIFO only. A page-table entry that leads outside the VM's memory
//! is treated as not present (and counted as a violation), like the shadow page tables do.
//!
//! Every guest write that lands in memory goes through [`VmCx::guest_write`], which lets the
//! shadow page tables (write-tracked page tables) and the shadow instance blocks see it.

use gf100::fault::{self, FaultFlags};
use gf100::mmu::{self, Pde, Pte};
use gf100::pci::Bar;
use gf100::{inst, pbus, Target};

use crate::channels::userd;
use crate::guest_mem::{GuestMem, Violation};
use crate::layout::HostLayout;
use crate::mmio::vregs::VFault;
use crate::phys::PhysicalGpu;
use crate::vgpu::{ViolationKind, VmCx, VmState};

/// How a guest BAR reaches memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum BarVm {
    /// Binding bit 31 clear: BAR offset = guest VRAM address.
    #[default]
    Direct,
    /// Through the guest's page tables.
    Vm {
        /// Page directory; `None` if the PDB is invalid (every access faults).
        pd: Option<(u64, Target)>,
        /// Highest valid offset.
        limit: u64,
    },
    /// VM mode with the invalid instance target: every access faults NO_CHANNEL.
    NoInstance,
}

/// One translated 4 KiB page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tr {
    target: Target,
    /// Guest address of the 4 KiB page.
    page: u64,
    read_only: bool,
}

/// Entries of the software TLB (a power of two).
const TLB_SLOTS: usize = 512;

/// The software TLB: direct-mapped, like a hardware TLB set of one way — a page's slot is its
/// page number's low bits (BAR3 and BAR1 pages apart), so a lookup is one compare instead of
/// hashing a guest-chosen key, and a guest that touches more pages than it holds only evicts
/// its own translations. A flush bumps the generation instead of clearing every slot: a slot
/// counts only if it was filled in the current generation.
#[derive(Debug)]
struct SoftTlb {
    /// `(generation, key, translation)`; key = page number << 1 | BAR3.
    slots: Box<[(u32, u64, Tr)]>,
    generation: u32,
}

impl Default for SoftTlb {
    fn default() -> Self {
        let empty = Tr {
            target: Target::Vram,
            page: 0,
            read_only: true,
        };
        SoftTlb {
            // Generation 0 is never current (`generation` starts at 1).
            slots: vec![(0, 0, empty); TLB_SLOTS].into_boxed_slice(),
            generation: 1,
        }
    }
}

impl SoftTlb {
    fn key(bar: Bar, va: u64) -> u64 {
        (va >> gf100::PAGE_SHIFT) << 1 | u64::from(bar == Bar::Bar3)
    }

    fn get(&self, key: u64) -> Option<Tr> {
        let (g, k, tr) = self.slots[key as usize & (TLB_SLOTS - 1)];
        (g == self.generation && k == key).then_some(tr)
    }

    fn insert(&mut self, key: u64, tr: Tr) {
        self.slots[key as usize & (TLB_SLOTS - 1)] = (self.generation, key, tr);
    }

    fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // Wrapped: slots of an old generation 1.. could look current again; drop them.
            self.slots.iter_mut().for_each(|s| s.0 = 0);
            self.generation = 1;
        }
    }
}

/// The guest's BAR1 and BAR3 bindings and the software TLB.
#[derive(Debug, Default)]
pub(crate) struct GuestBars {
    bar1: BarVm,
    bar3: BarVm,
    tlb: SoftTlb,
}

impl GuestBars {
    /// Forgets every cached translation (a guest TLB flush).
    pub(crate) fn flush(&mut self) {
        self.tlb.clear();
    }

    pub(crate) fn vm(&self, bar: Bar) -> BarVm {
        if bar == Bar::Bar3 {
            self.bar3
        } else {
            self.bar1
        }
    }

    /// The cached translation of `bar`'s page holding `va`: `Err` (the fault reason) for a
    /// write to a read-only page; `None` if none is cached.
    fn cached(&self, bar: Bar, va: u64, write: bool) -> Option<Result<Tr, u32>> {
        let tr = self.tlb.get(SoftTlb::key(bar, va))?;
        Some(if write && tr.read_only {
            Err(fault::REASON_PAGE_READ_ONLY)
        } else {
            Ok(tr)
        })
    }

    /// Caches `tr` for `bar`'s page holding `va` (evicting the page that shared its slot).
    fn keep(&mut self, bar: Bar, va: u64, tr: Tr) {
        self.tlb.insert(SoftTlb::key(bar, va), tr);
    }
}

/// Why the BAR bindings are reloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reload {
    /// A binding register was written, or the state restored: every translation goes.
    Binding,
    /// A guest TLB flush of one page directory (`Some`) or of all (`None`, ALL_PDB).
    Flush(Option<(u64, Target)>),
}

impl Reload {
    /// True if the software TLB must be emptied, given the bindings before and after: always
    /// for a binding write, a changed binding or a flush of all directories; for a flush of one
    /// directory only if it is BAR1's or BAR3's — a flush of another address space leaves the
    /// BARs' translations as they were, as the hardware's TLB flush by page directory does.
    fn clears_tlb(self, before: &GuestBars, after: (BarVm, BarVm)) -> bool {
        match self {
            Reload::Binding => true,
            Reload::Flush(pd) => {
                (before.bar1, before.bar3) != after || flushes_bar_tables(before, pd)
            }
        }
    }
}

/// Reloads both BAR bindings from the guest's registers and instance blocks (after a binding
/// write or a guest TLB flush) and empties the software TLB as `why` says.
pub(crate) fn reload(cx: &mut VmCx, why: Reload) {
    let b1 = load_binding(cx, cx.vm.regs.bar1_inst, "BAR1");
    let b3 = load_binding(cx, cx.vm.regs.bar3_inst, "BAR3");
    if why.clears_tlb(&cx.vm.bars, (b1, b3)) {
        cx.vm.bars.tlb.clear();
    }
    if (b1, b3) != (cx.vm.bars.bar1, cx.vm.bars.bar3) {
        // The direct-map plan follows the bindings (a flush of their tables bumps it too, see
        // `flushes_bar_tables`).
        cx.vm.map_gen += 1;
    }
    cx.vm.bars.bar1 = b1;
    cx.vm.bars.bar3 = b3;
}

/// True if a guest TLB flush of `pd` (`None`: every page directory) may change what BAR1 or
/// BAR3 translate to (their page directory is flushed).
pub(crate) fn flushes_bar_tables(bars: &GuestBars, pd: Option<(u64, gf100::Target)>) -> bool {
    let Some(pd) = pd else { return true };
    [bars.bar1, bars.bar3]
        .iter()
        .any(|b| matches!(b, BarVm::Vm { pd: Some(p), .. } if *p == pd))
}

/// The guest tables BAR1's and BAR3's translations read: each VM-mode BAR's page directory and
/// the page tables its PDEs (up to the BAR's size and limit) point to. A write to any other
/// table cannot change what the BARs translate to (a para-virtual batch that writes none of
/// these leaves the direct-map plans alone).
pub(crate) fn bar_tables(cx: &VmCx) -> Vec<(u64, Target)> {
    let mut out = Vec::new();
    for (bar, vm) in [(Bar::Bar1, cx.vm.bars.bar1), (Bar::Bar3, cx.vm.bars.bar3)] {
        let BarVm::Vm {
            pd: Some((pd, target)),
            limit,
        } = vm
        else {
            continue;
        };
        out.push((pd, target));
        let end = bar.size().min(limit.saturating_add(1));
        let mut base = 0u64;
        while base < end {
            let at = pd + mmu::pde_index(base) * mmu::ENTRY_SIZE;
            if let Ok(raw) = cx.gmem().read_u64(target, at) {
                let pde = Pde::decode(raw);
                out.extend(
                    pde.small
                        .iter()
                        .chain(&pde.large)
                        .map(|t| (t.addr, t.target)),
                );
            }
            base += mmu::PDE_COVERAGE;
        }
    }
    out
}

fn load_binding(cx: &mut VmCx, reg: u32, name: &str) -> BarVm {
    match load_binding_in(&cx.gmem(), reg) {
        Ok(b) => b,
        Err((inst, v)) => {
            cx.violation(v.into(), || format!("{name} instance block {inst:#x}: {v}"));
            BarVm::Vm { pd: None, limit: 0 }
        }
    }
}

/// The BAR binding register `reg` names, read in the VM's memory `m`; the instance block and
/// the violation if reading it met one.
fn load_binding_in(m: &GuestMem, reg: u32) -> Result<BarVm, (u64, Violation)> {
    if reg & pbus::BAR_INST_VM_MODE == 0 {
        return Ok(BarVm::Direct);
    }
    let Some((inst, target)) = pbus::bar_inst_decode(reg) else {
        return Ok(BarVm::NoInstance);
    };
    // PDB and LIMIT are adjacent (0x200..0x210): one read of the VM's memory.
    const _: () = assert!(inst::LIMIT_LO == inst::PDB_LO + 8);
    let mut b = [0u8; 16];
    let r = m.read(target, inst + inst::PDB_LO, &mut b).map(|()| {
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        (word(0), word(8))
    });
    match r {
        Ok((pdb, limit)) => Ok(BarVm::Vm {
            pd: inst::pdb_decode(pdb),
            limit,
        }),
        Err(v) => Err((inst, v)),
    }
}

/// [`reload`] with only the VM's state (a TLB flush on the fast path): false, nothing changed,
/// if reading a binding's instance block meets a violation (the usual path counts it).
pub(crate) fn reload_local(phys: &dyn PhysicalGpu, vm: &mut VmState, why: Reload) -> bool {
    let m = vm.mem.view(phys);
    let (Ok(b1), Ok(b3)) = (
        load_binding_in(&m, vm.regs.bar1_inst),
        load_binding_in(&m, vm.regs.bar3_inst),
    ) else {
        return false;
    };
    if why.clears_tlb(&vm.bars, (b1, b3)) {
        vm.bars.tlb.clear();
    }
    if (b1, b3) != (vm.bars.bar1, vm.bars.bar3) {
        vm.map_gen += 1;
    }
    vm.bars.bar1 = b1;
    vm.bars.bar3 = b3;
    true
}

/// Walks the guest BAR VM for `va`; `Err(reason)` is a fault. Table reads that leave the VM's
/// memory are counted as violations.
fn walk(cx: &mut VmCx, vm: BarVm, va: u64, write: bool) -> Result<Tr, u32> {
    let mut found = Vec::new();
    let r = walk_in(&cx.gmem(), vm, va, write, &mut found);
    for (v, what) in found {
        cx.violation(v.into(), || what);
    }
    r
}

/// [`walk`] in the VM's memory `m`, with the violations it meets collected in `found` instead
/// of counted (the fast path gives up on any).
fn walk_in(
    m: &GuestMem,
    vm: BarVm,
    va: u64,
    write: bool,
    found: &mut Vec<(Violation, String)>,
) -> Result<Tr, u32> {
    let (pd, limit) = match vm {
        BarVm::Direct => {
            return Ok(Tr {
                target: Target::Vram,
                page: va & !(gf100::PAGE_SIZE - 1),
                read_only: false,
            })
        }
        BarVm::NoInstance => return Err(fault::REASON_NO_CHANNEL),
        BarVm::Vm { pd, limit } => (pd, limit),
    };
    if va > limit {
        return Err(fault::REASON_VM_LIMIT_EXCEEDED);
    }
    let (pd, pd_target) = pd.ok_or(fault::REASON_PT_NOT_PRESENT)?;
    let pde = match m.read_u64(pd_target, pd + mmu::pde_index(va) * mmu::ENTRY_SIZE) {
        Ok(raw) => Pde::decode(raw),
        Err(v) => {
            found.push((v, format!("BAR page directory {pd:#x}: {v}")));
            return Err(fault::REASON_PT_NOT_PRESENT);
        }
    };
    if pde.small.is_none() && pde.large.is_none() {
        return Err(fault::REASON_PT_NOT_PRESENT);
    }
    if va % mmu::PDE_COVERAGE >= pde.size.coverage() {
        return Err(fault::REASON_PT_TOO_SHORT);
    }
    let tables = [
        pde.small.map(|t| (t, mmu::spt_index(va), false)),
        pde.large.map(|t| (t, mmu::lpt_index(va), true)),
    ];
    for (t, index, large) in tables.into_iter().flatten() {
        let raw = match m.read_u64(t.target, t.addr + index * mmu::ENTRY_SIZE) {
            Ok(raw) => raw,
            Err(v) => {
                found.push((v, format!("BAR page table {:#x}: {v}", t.addr)));
                continue;
            }
        };
        let pte = match Pte::decode(raw) {
            Ok(Some(pte)) => pte,
            Ok(None) => continue,
            Err(_) => return Err(fault::REASON_INVALID_STORAGE_TYPE),
        };
        if write && pte.read_only {
            return Err(fault::REASON_PAGE_READ_ONLY);
        }
        let page = if large {
            pte.addr + (va & (mmu::LARGE_PAGE_SIZE - 1) & !(gf100::PAGE_SIZE - 1))
        } else {
            pte.addr
        };
        return Ok(Tr {
            target: pte.target,
            page,
            read_only: pte.read_only,
        });
    }
    Err(fault::REASON_PAGE_NOT_PRESENT)
}

/// Translates BAR offset `va` of `bar` (software TLB, then walk); pages outside the VM's memory
/// are not present.
fn translate(cx: &mut VmCx, bar: Bar, va: u64, write: bool) -> Result<Tr, u32> {
    if let Some(r) = cx.vm.bars.cached(bar, va, write) {
        return r;
    }
    let vm = cx.vm.bars.vm(bar);
    let tr = walk(cx, vm, va, write)?;
    if let Err(v) = cx.gmem().to_phys(tr.target, tr.page, gf100::PAGE_SIZE) {
        cx.violation(v.into(), || {
            format!(
                "{bar:?} offset {va:#x} maps {:#x} ({:?}): {v}",
                tr.page, tr.target
            )
        });
        return Err(fault::REASON_PAGE_NOT_PRESENT);
    }
    cx.vm.bars.keep(bar, va, tr);
    Ok(tr)
}

/// [`translate`] with only the VM's state (the fast path): the software TLB, else a walk that
/// meets no fault and no violation and leads inside the VM's memory, whose result the TLB then
/// keeps. `None`, nothing counted or raised, for anything else (the usual path walks again,
/// faults and counts).
fn translate_local(
    phys: &dyn PhysicalGpu,
    vm: &mut VmState,
    bar: Bar,
    va: u64,
    write: bool,
) -> Option<Tr> {
    if let Some(r) = vm.bars.cached(bar, va, write) {
        return r.ok();
    }
    let m = vm.mem.view(phys);
    let mut found = Vec::new();
    let tr = walk_in(&m, vm.bars.vm(bar), va, write, &mut found).ok()?;
    if !found.is_empty() || m.to_phys(tr.target, tr.page, gf100::PAGE_SIZE).is_err() {
        return None;
    }
    vm.bars.keep(bar, va, tr);
    Some(tr)
}

/// Raises a virtual MMU fault for the VM's own BAR access.
fn bar_fault(cx: &mut VmCx, bar: Bar, va: u64, reason: u32, write: bool) {
    let (unit, reg) = if bar == Bar::Bar3 {
        (fault::UNIT_BAR3, cx.vm.regs.bar3_inst)
    } else {
        (fault::UNIT_BAR1, cx.vm.regs.bar1_inst)
    };
    let client = if write {
        fault::HUB_CLIENT_BAR_WRITE
    } else {
        fault::HUB_CLIENT_BAR_READ
    };
    let f = VFault {
        unit,
        inst: reg & !(pbus::BAR_INST_VM_MODE | pbus::BAR_INST_UNK30),
        va,
        flags: FaultFlags {
            reason,
            hub: true,
            write,
            client,
            gpc: 0,
        },
    };
    cx.vm.stats.bar_faults += 1;
    cx.vm.regs.report_fault(f);
}

/// True for the access widths a BAR supports.
pub(crate) fn valid_width(len: usize) -> bool {
    matches!(len, 1 | 2 | 4 | 8)
}

/// A guest read of BAR1 or BAR3.
pub(crate) fn bar_read(cx: &mut VmCx, bar: Bar, offset: u64, data: &mut [u8]) {
    let exits = if bar == Bar::Bar3 {
        &mut cx.vm.stats.exits.bar3
    } else {
        &mut cx.vm.stats.exits.bar1
    };
    exits.count(false);
    if !valid_width(data.len()) {
        data.fill(0xff);
        let n = data.len();
        cx.violation(ViolationKind::BadAccess, || {
            format!("{bar:?} read of {n} bytes")
        });
        return;
    }
    if bar == Bar::Bar1 && crate::channels::userd::read(&mut cx.chan(), offset, data) {
        return;
    }
    cx.vm.stats.by_class.aperture.count(false);
    let len = data.len() as u64;
    if !matches!(offset.checked_add(len), Some(e) if e <= bar.size()) {
        data.fill(0xff);
        return;
    }
    let mut done = 0usize;
    while done < data.len() {
        let va = offset + done as u64;
        let in_page = (gf100::PAGE_SIZE - (va & (gf100::PAGE_SIZE - 1))) as usize;
        let n = in_page.min(data.len() - done);
        let piece = &mut data[done..done + n];
        match translate(cx, bar, va, false) {
            Ok(tr) => {
                let addr = tr.page + (va & (gf100::PAGE_SIZE - 1));
                if cx.gmem().read(tr.target, addr, piece).is_err() {
                    piece.fill(0xff);
                }
            }
            Err(reason) => {
                data[done..].fill(0xff);
                bar_fault(cx, bar, va, reason, false);
                return;
            }
        }
        done += n;
    }
}

/// A guest write of BAR1 or BAR3.
pub(crate) fn bar_write(cx: &mut VmCx, bar: Bar, offset: u64, data: &[u8]) {
    let exits = if bar == Bar::Bar3 {
        &mut cx.vm.stats.exits.bar3
    } else {
        &mut cx.vm.stats.exits.bar1
    };
    exits.count(true);
    if !valid_width(data.len()) {
        let n = data.len();
        cx.violation(ViolationKind::BadAccess, || {
            format!("{bar:?} write of {n} bytes")
        });
        return;
    }
    if bar == Bar::Bar1 && crate::channels::userd::write(&mut cx.chan(), offset, data) {
        return;
    }
    cx.vm.stats.by_class.aperture.count(true);
    let len = data.len() as u64;
    if !matches!(offset.checked_add(len), Some(e) if e <= bar.size()) {
        return;
    }
    let mut done = 0usize;
    while done < data.len() {
        let va = offset + done as u64;
        let in_page = (gf100::PAGE_SIZE - (va & (gf100::PAGE_SIZE - 1))) as usize;
        let n = in_page.min(data.len() - done);
        match translate(cx, bar, va, true) {
            Ok(tr) => {
                let addr = tr.page + (va & (gf100::PAGE_SIZE - 1));
                if let Err(v) = cx.guest_write(tr.target, addr, &data[done..done + n]) {
                    cx.violation(v.into(), || format!("{bar:?} write at {va:#x}: {v}"));
                }
            }
            Err(reason) => {
                bar_fault(cx, bar, va, reason, true);
                return;
            }
        }
        done += n;
    }
}

/// A guest read of the PRAMIN window at window offset `off`.
pub(crate) fn pramin_read(cx: &mut VmCx, off: u64, data: &mut [u8]) {
    let pmem = cx.vm.regs.pmem;
    let Some((base, target)) = pbus::pmem_decode(pmem) else {
        data.fill(0xff);
        cx.violation(ViolationKind::InvalidTarget, || {
            format!("PRAMIN window with the invalid target (PMEM {pmem:#010x})")
        });
        return;
    };
    let addr = base + off;
    if let Err(v) = cx.gmem().read(target, addr, data) {
        data.fill(0xff);
        cx.violation(v.into(), || format!("PRAMIN read at {addr:#x}: {v}"));
    }
}

/// A guest write of the PRAMIN window at window offset `off`.
pub(crate) fn pramin_write(cx: &mut VmCx, off: u64, data: &[u8]) {
    let pmem = cx.vm.regs.pmem;
    let Some((base, target)) = pbus::pmem_decode(pmem) else {
        cx.violation(ViolationKind::InvalidTarget, || {
            format!("PRAMIN window with the invalid target (PMEM {pmem:#010x})")
        });
        return;
    };
    let addr = base + off;
    if let Err(v) = cx.guest_write(target, addr, data) {
        cx.violation(v.into(), || format!("PRAMIN write at {addr:#x}: {v}"));
    }
}

/// `channels::userd::read` with only the VM's state (the fast path, `host::local`): a read of one of the VM's
/// own channels' USERD inside its page. False, nothing done, for anything else (the usual path
/// then does it, with the same result, or the violation it is).
pub(crate) fn userd_read_fast(
    phys: &dyn PhysicalGpu,
    layout: &HostLayout,
    vm: &mut VmState,
    offset: u64,
    data: &mut [u8],
) -> bool {
    let Some((g, reg)) = userd::locate_in(vm.regs.poll_area(), offset) else {
        return false;
    };
    if reg + data.len() as u64 > gf100::userd::SIZE || g >= vm.nchan() {
        return false;
    }
    vm.stats.by_class.userd.count(false);
    phys.read_vram(layout.userd_page(vm.phys_chid(g)).offset(reg), data);
    userd::overlay_gp_put(reg, data, vm.chans[g as usize].gp_put);
    true
}

/// True if an access of `len` bytes at `offset` of `bar` may take the fast path as a memory
/// access: BAR1 or BAR3, not empty, inside the BAR and within one page, and not the VM's USERD
/// area of BAR1 (its own rules, `channels::userd`).
fn fast_memory_access(vm: &VmState, bar: Bar, offset: u64, len: usize) -> bool {
    let last = (len as u64)
        .checked_sub(1)
        .and_then(|n| offset.checked_add(n));
    bar != Bar::Bar0
        && matches!(last, Some(l) if l < bar.size()
            && l >> gf100::PAGE_SHIFT == offset >> gf100::PAGE_SHIFT)
        && !(bar == Bar::Bar1 && userd::locate_in(vm.regs.poll_area(), offset).is_some())
}

/// A BAR1 read of memory (not USERD) with only the VM's state (the fast path): a guest polling
/// a fence or reading results through BAR1. Only within one page whose translation the VM's
/// software TLB holds or a walk finds without a fault or violation ([`translate_local`];
/// validated against its slice and RAM; dropped when the guest flushes its BAR TLB), and read
/// through the VM's memory view, which checks the range again. False, nothing done, for
/// anything else (the usual path walks, faults, counts).
pub(crate) fn aperture_read_fast(
    phys: &dyn PhysicalGpu,
    vm: &mut VmState,
    offset: u64,
    data: &mut [u8],
) -> bool {
    if !fast_memory_access(vm, Bar::Bar1, offset, data.len()) {
        return false;
    }
    let Some(tr) = translate_local(phys, vm, Bar::Bar1, offset, false) else {
        return false;
    };
    let addr = tr.page + (offset & (gf100::PAGE_SIZE - 1));
    if vm.mem.view(phys).read(tr.target, addr, data).is_err() {
        return false;
    }
    vm.stats.by_class.aperture.count(false);
    true
}

/// A BAR1 or BAR3 memory write with only the VM's state (the fast path, `host::local`): the
/// guest driver writing its page tables, or data, through its BAR mapping. Only within one
/// page that translates as for a read ([`translate_local`]) and is writable, not USERD, not a
/// page holding a bound channel's instance block, and reaching none of the VM's shadowed page
/// directories; the write goes through the VM's memory view (which checks the range again) and
/// the shadow entries of the page tables it covers are rewritten in place
/// ([`crate::shadow_pt::ShadowPt::local_write`], `guest_wrote_tables`). False, nothing done, for anything else
/// (the usual path translates, faults, counts, and lets the shadows and channels see it).
pub(crate) fn aperture_write_fast(
    phys: &dyn PhysicalGpu,
    vm: &mut VmState,
    bar: Bar,
    offset: u64,
    data: &[u8],
) -> bool {
    if !valid_width(data.len()) || !fast_memory_access(vm, bar, offset, data.len()) {
        return false;
    }
    let Some(tr) = translate_local(phys, vm, bar, offset, true) else {
        return false;
    };
    let addr = tr.page + (offset & (gf100::PAGE_SIZE - 1));
    if !local_guest_write(phys, vm, tr.target, addr, data) {
        return false;
    }
    let exits = if bar == Bar::Bar3 {
        &mut vm.stats.exits.bar3
    } else {
        &mut vm.stats.exits.bar1
    };
    exits.count(true);
    vm.stats.by_class.aperture.count(true);
    vm.stats.local_writes += 1;
    true
}

/// A guest write of the PRAMIN window at window offset `off` with only the VM's state (the fast
/// path; [`pramin_write`] otherwise): under the conditions of [`local_guest_write`]. Drivers
/// clear and fill instance memory, page tables and buffers through the window by the tens of
/// thousands of writes when they create a channel.
pub(crate) fn pramin_write_fast(
    phys: &dyn PhysicalGpu,
    vm: &mut VmState,
    off: u64,
    data: &[u8],
) -> bool {
    let Some((base, target)) = pbus::pmem_decode(vm.regs.pmem) else {
        return false;
    };
    local_guest_write(phys, vm, target, base + off, data)
}

/// [`VmCx::guest_write`] with only the VM's state: the write of `data` at `addr` in `target`
/// if it reaches no page of a bound channel's instance block and none of the VM's shadowed page
/// directories (their shadows need the host) and the VM's memory check lets all of it through;
/// the shadow entries of the page tables it covers are then rewritten in place. False, nothing
/// written, otherwise.
fn local_guest_write(
    phys: &dyn PhysicalGpu,
    vm: &mut VmState,
    target: Target,
    addr: u64,
    data: &[u8],
) -> bool {
    let len = data.len() as u64;
    if crate::channels::write_reaches_instance(&vm.inst_pages, target, addr, len) {
        return false;
    }
    // `None`: it reaches a page directory.
    let Some(hit) = vm.shadow.local_write(target, addr, len) else {
        return false;
    };
    let mem = vm.mem.view(phys);
    if mem.write(target, addr, data).is_err() {
        return false;
    }
    vm.shadow.guest_wrote_tables(&mem, hit, addr, data);
    true
}

/// A doorbell that announces nothing, with only the VM's state (the fast path): GP_PUT written
/// with the value it holds, on a bound channel whose every entry the GPU has already been given
/// (`phys_put`) and run (the host saw that submission complete: `done_put`), not parked, held
/// or killed. The host's doorbell handler would find nothing to run (`host::dispatch::doorbell`);
/// it is counted as a doorbell and done.
/// False, nothing done, for any other write (the usual path does it).
pub(crate) fn userd_doorbell_fast(vm: &mut VmState, offset: u64, data: &[u8]) -> bool {
    let Ok(word) = <[u8; 4]>::try_from(data) else {
        return false;
    };
    let Some((g, reg)) = userd::locate_in(vm.regs.poll_area(), offset) else {
        return false;
    };
    if reg != gf100::userd::GP_PUT || g >= vm.nchan() {
        return false;
    }
    let ch = &vm.chans[g as usize];
    let put = u32::from_le_bytes(word);
    if ch.bound.is_none()
        || ch.killed
        || ch.parked
        || ch.held
        || put != ch.gp_put
        || ch.gp_put != ch.phys_put
        || ch.done_put != Some(ch.phys_put)
    {
        return false;
    }
    vm.stats.by_class.userd.count(true);
    vm.stats.doorbells += 1;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(page: u64) -> Tr {
        Tr {
            target: Target::Vram,
            page,
            read_only: false,
        }
    }

    #[test]
    fn the_soft_tlb_keeps_bars_apart_evicts_by_slot_and_forgets_on_flush() {
        let mut bars = GuestBars::default();
        let va = 0x1234_5000;
        bars.keep(Bar::Bar1, va, tr(0x10_0000));
        assert_eq!(
            bars.cached(Bar::Bar1, va + 0xffc, false),
            Some(Ok(tr(0x10_0000)))
        );
        // The same offset through BAR3 is another page.
        assert_eq!(bars.cached(Bar::Bar3, va, false), None);
        bars.keep(
            Bar::Bar3,
            va,
            Tr {
                read_only: true,
                ..tr(0x20_0000)
            },
        );
        assert_eq!(
            bars.cached(Bar::Bar3, va, true),
            Some(Err(fault::REASON_PAGE_READ_ONLY))
        );
        assert_eq!(bars.cached(Bar::Bar1, va, false), Some(Ok(tr(0x10_0000))));
        // A page whose number shares the slot evicts it; neither is confused for the other.
        let alias = va + ((TLB_SLOTS as u64) << (gf100::PAGE_SHIFT - 1));
        assert_eq!(
            SoftTlb::key(Bar::Bar1, alias) as usize % TLB_SLOTS,
            SoftTlb::key(Bar::Bar1, va) as usize % TLB_SLOTS
        );
        assert_eq!(bars.cached(Bar::Bar1, alias, false), None);
        bars.keep(Bar::Bar1, alias, tr(0x30_0000));
        assert_eq!(bars.cached(Bar::Bar1, va, false), None);
        assert_eq!(
            bars.cached(Bar::Bar1, alias, false),
            Some(Ok(tr(0x30_0000)))
        );
        bars.flush();
        assert_eq!(bars.cached(Bar::Bar1, alias, false), None);
        assert_eq!(bars.cached(Bar::Bar3, va, false), None);
    }

    #[test]
    fn a_wrapped_generation_forgets_every_slot() {
        let mut tlb = SoftTlb::default();
        tlb.insert(SoftTlb::key(Bar::Bar1, 0), tr(1));
        tlb.generation = u32::MAX;
        tlb.insert(SoftTlb::key(Bar::Bar1, 0x1000), tr(2));
        tlb.clear();
        assert_eq!(tlb.generation, 1);
        // Slot 0 was filled in generation 1 before the wrap: it must not come back.
        assert_eq!(tlb.get(SoftTlb::key(Bar::Bar1, 0)), None);
        assert_eq!(tlb.get(SoftTlb::key(Bar::Bar1, 0x1000)), None);
    }
}
