//! The direct-map plan of BAR1 and BAR3: GPUvm's **BAR remap** optimization ("the BAR1/BAR3
//! aperture pages are mapped straight to the GPU's aperture so data accesses do not trap; only
//! pages holding sensitive structures are intercepted").
//!
//! Our apertures are walked in software through the guest's BAR1/BAR3 page tables into the VM's
//! VRAM slice (`aperture`). The equivalent of remapping is this plan: the runs of aperture pages a
//! VMM may map straight onto physical VRAM (KVM memory slots over the simulator's VRAM mapping)
//! so that guest loads and stores there never exit. A page is in the plan only if
//!
//! - the guest's BAR binding translates it (direct mode, or a present PTE within the limit);
//! - it targets VRAM **inside the VM's own slice** (never system memory, never another VM's VRAM
//!   or hypervisor VRAM);
//! - it is not a page the model must see every access to: the USERD poll area of BAR1
//!   (doorbells, emulated GP_PUT) never appears.
//!
//! Pages the model must see *writes* to appear as **read-only** runs (a VMM maps them with
//! `KVM_MEM_READONLY`: reads do not exit, writes do and go to [`super::Vgpu::bar_write`] as
//! before): the guest instance blocks of bound channels (their shadows are refreshed on write),
//! the page-table pages the shadow manager write-tracks (incremental and PV modes), and pages the
//! guest's own PTE marks read-only (a write must raise the guest's MMU fault).
//!
//! The plan carries a **generation** that changes whenever the plan may have changed: a BAR
//! binding write or guest TLB flush (the aperture reloads), a PV batch, the poll area moving, a
//! channel bound or unbound, the tracked set changing. Guest PTE writes without a flush do not
//! change it, as on hardware (a stale mapping still only reaches the VM's own slice). A VMM
//! checks [`super::Vgpu::direct_map_generation`] after each exit (cheap) and re-reads the plan
//! when it moved.

use gf100::mmu::{self, Pde, Pte};
use gf100::pci::Bar;
use gf100::{pfifo, userd, Target};

use crate::addr::{GuestVram, HostVram};
use crate::vgpu::aperture::BarVm;
use crate::vgpu::VmCx;

const PAGE: u64 = gf100::PAGE_SIZE;

/// A run of aperture pages mapped straight onto physical VRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectRun {
    /// First BAR offset (page aligned).
    pub offset: u64,
    /// Length in bytes (whole pages).
    pub len: u64,
    /// Physical VRAM address of `offset` (inside the VM's slice).
    pub host: HostVram,
    /// Writes must still trap (map read-only).
    pub read_only: bool,
}

/// The direct-map plan of one aperture BAR.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirectMap {
    /// See the module documentation; equal generations mean an equal plan.
    pub generation: u64,
    /// The runs, by increasing offset, never overlapping.
    pub runs: Vec<DirectRun>,
}

impl DirectMap {
    /// Pages in the plan (read-only ones included).
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.len / PAGE).sum()
    }

    /// Pages mapped read-only.
    pub fn read_only_pages(&self) -> u64 {
        self.runs
            .iter()
            .filter(|r| r.read_only)
            .map(|r| r.len / PAGE)
            .sum()
    }

    /// The run holding BAR offset `offset`, if any.
    pub fn run_at(&self, offset: u64) -> Option<&DirectRun> {
        self.runs
            .iter()
            .find(|r| offset >= r.offset && offset - r.offset < r.len)
    }
}

/// The generation of the plans of both BARs.
pub(crate) fn generation(vm: &crate::vgpu::VmState) -> u64 {
    // Both counters only grow, so their sum changes whenever either does.
    vm.map_gen.wrapping_add(vm.shadow.tracking_version())
}

/// Builds the plan of `bar` (BAR1 or BAR3; BAR0 has none).
pub(crate) fn plan(cx: &mut VmCx, bar: Bar) -> DirectMap {
    let mut out = DirectMap {
        generation: generation(cx.vm),
        runs: Vec::new(),
    };
    // BAR0 has no plan; with memory decoding off no page may be mapped (every access must
    // reach the device model, which answers all-ones).
    // While a migration's dirty log runs, every write must be seen: nothing is mapped.
    if bar == Bar::Bar0 || !cx.vm.pci.memory_enabled() || cx.vm.mem.log.is_some() {
        return out;
    }
    let userd = if bar == Bar::Bar1 {
        cx.vm.regs.poll_area().map(|b| {
            (
                b,
                b.saturating_add(u64::from(pfifo::CHANNELS) * userd::SIZE),
            )
        })
    } else {
        None
    };
    let slice = cx.vm.mem.slice;
    let add = |out: &mut DirectMap, cx: &VmCx, va: u64, page: u64, pte_ro: bool| {
        if userd.is_some_and(|(lo, hi)| va < hi && va + PAGE > lo) {
            return;
        }
        let Ok(host) = slice.translate(GuestVram(page), PAGE) else {
            return;
        };
        let read_only = pte_ro
            || cx.vm.inst_pages.contains_key(&(false, page))
            || cx.vm.shadow.is_tracked(Target::Vram, page);
        if let Some(last) = out.runs.last_mut() {
            if last.offset + last.len == va
                && last.host.raw() + last.len == host.raw()
                && last.read_only == read_only
            {
                last.len += PAGE;
                return;
            }
        }
        out.runs.push(DirectRun {
            offset: va,
            len: PAGE,
            host,
            read_only,
        });
    };
    match cx.vm.bars.vm(bar) {
        BarVm::NoInstance | BarVm::Vm { pd: None, .. } => {}
        BarVm::Direct => {
            let end = bar.size().min(slice.size) & !(PAGE - 1);
            for va in (0..end).step_by(PAGE as usize) {
                add(&mut out, cx, va, va, false);
            }
        }
        BarVm::Vm {
            pd: Some((pd, pd_target)),
            limit,
        } => {
            let end = bar.size().min(limit.saturating_add(1)) & !(PAGE - 1);
            let mut base = 0u64;
            while base < end {
                let span_end = end.min(base + mmu::PDE_COVERAGE);
                let raw = cx
                    .gmem()
                    .read_u64(pd_target, pd + mmu::pde_index(base) * mmu::ENTRY_SIZE);
                if let Ok(raw) = raw {
                    let pde = Pde::decode(raw);
                    let cover_end = span_end.min(base + pde.size.coverage());
                    let small = pde
                        .small
                        .and_then(|t| read_table(cx, t, mmu::SPT_ENTRIES, cover_end - base));
                    let large = pde.large.and_then(|t| {
                        read_table(
                            cx,
                            t,
                            mmu::LPT_ENTRIES,
                            (cover_end - base).div_ceil(mmu::LARGE_PAGE_SIZE)
                                * mmu::LARGE_PAGE_SIZE,
                        )
                    });
                    let mut va = base;
                    while va < cover_end {
                        if let Some((page, ro)) = lookup(small.as_deref(), large.as_deref(), va) {
                            add(&mut out, cx, va, page, ro);
                        }
                        va += PAGE;
                    }
                }
                base += mmu::PDE_COVERAGE;
            }
        }
    }
    out
}

/// Reads the entries of a page table covering `span` bytes of its PDE (at most `entries`); `None`
/// if the table is not inside the VM's memory (the walk treats it as absent too).
fn read_table(cx: &VmCx, t: mmu::PtRef, entries: u64, span: u64) -> Option<Vec<u64>> {
    let page_size = mmu::PDE_COVERAGE / entries;
    let n = span.div_ceil(page_size).min(entries);
    let mut buf = vec![0u8; (n * mmu::ENTRY_SIZE) as usize];
    cx.gmem().read(t.target, t.addr, &mut buf).ok()?;
    Some(
        buf.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
    )
}

/// The guest VRAM page and read-only bit of `va` (small table first, then large, as the walk
/// does); `None` if not mapped or not in VRAM.
fn lookup(small: Option<&[u64]>, large: Option<&[u64]>, va: u64) -> Option<(u64, bool)> {
    let small_raw = small.and_then(|t| t.get(mmu::spt_index(va) as usize).copied());
    let large_raw = large.and_then(|t| t.get(mmu::lpt_index(va) as usize).copied());
    for (raw, is_large) in [(small_raw, false), (large_raw, true)] {
        let Some(raw) = raw else { continue };
        match Pte::decode(raw) {
            Ok(Some(pte)) => {
                if pte.target != Target::Vram {
                    return None;
                }
                let page = if is_large {
                    pte.addr + (va & (mmu::LARGE_PAGE_SIZE - 1) & !(PAGE - 1))
                } else {
                    pte.addr
                };
                return Some((page, pte.read_only));
            }
            Ok(None) => continue,
            Err(_) => return None,
        }
    }
    None
}
