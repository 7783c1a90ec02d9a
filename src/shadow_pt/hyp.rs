//! Hypervisor-owned mappings in every shadow address space of a VM: the last page-directory
//! entry of each shadow directory ([`HYP_PDE`], the top 128 MiB of the 40-bit VA space) is the
//! host's, whatever the guest wrote there. It names one large-page table per VM in which the
//! device model maps host-owned pages (today: each bound channel's GR context,
//! `crate::channels::grctx`) — the "VA the hypervisor reserves" of
//! `shared/research/gf100-pgraph-ctxsw.md` §5.2. A guest PDE at that index is never shadowed
//! (counted as a violation each time it would be). The pages are mapped supervisor-only
//! (PTE bit 1, the "priv" bit nouveau itself uses for the buffers only FECS may touch).
//!
//! The table is allocated on first use from the VM's shadow budget and freed (through the
//! quarantine) with the VM's shadows.

use gf100::mmu::{self, PtSize, Pte};
use gf100::Target;

use crate::addr::HostVram;

use super::{translate, ShadowCtx, ShadowPt};

/// The page-directory index the host keeps in every shadow directory.
pub const HYP_PDE: u16 = (mmu::PD_ENTRIES - 1) as u16;
/// First VA of the hypervisor's range (slot `i` of [`ShadowPt::map_hyp_page`] is at
/// `HYP_VA_BASE + i * 128 KiB`).
pub const HYP_VA_BASE: u64 = HYP_PDE as u64 * mmu::PDE_COVERAGE;
/// Large pages in the hypervisor's range.
pub const HYP_SLOTS: u32 = mmu::LPT_ENTRIES as u32;

/// The VM's hypervisor table.
#[derive(Debug, Default)]
pub(crate) struct HypTable {
    /// The large-page table in hypervisor VRAM, once allocated.
    pub lpt: Option<u64>,
}

impl HypTable {
    /// The shadow PDE every shadow directory carries at [`HYP_PDE`] (0 while no table exists).
    pub(crate) fn pde(&self) -> u64 {
        translate::shadow_pde(PtSize::Full, None, self.lpt)
    }
}

impl ShadowPt {
    /// Maps the 128 KiB of hypervisor VRAM at `page` (128 KiB aligned) at slot `slot` of the
    /// hypervisor range of every shadow address space of the VM, supervisor-only; `None` unmaps
    /// the slot. Returns the VA, or `None` if the slot is out of range or no table could be
    /// allocated. The caller flushes the physical TLB of [`ShadowPt::shadow_pds`] after an unmap.
    pub fn map_hyp_page(
        &mut self,
        cx: &mut ShadowCtx,
        slot: u32,
        page: Option<HostVram>,
    ) -> Option<u64> {
        if slot >= HYP_SLOTS {
            return None;
        }
        let lpt = match self.books.hyp.lpt {
            Some(t) => t,
            None => {
                let t = self.books.alloc(cx, mmu::LPT_SIZE)?;
                cx.mem.phys.fill_vram(HostVram(t), mmu::LPT_SIZE, 0);
                self.books.hyp.lpt = Some(t);
                let pde = self.books.hyp.pde().to_le_bytes();
                for space in self.spaces.values() {
                    let at = space.pd + u64::from(HYP_PDE) * mmu::ENTRY_SIZE;
                    cx.mem.phys.write_vram(HostVram(at), &pde);
                }
                t
            }
        };
        let pte = page.map_or(0, |p| {
            Pte {
                supervisor: true,
                vol: false,
                ..Pte::new(p.raw(), Target::Vram)
            }
            .encode()
        });
        let at = lpt + u64::from(slot) * mmu::ENTRY_SIZE;
        cx.mem.phys.write_vram(HostVram(at), &pte.to_le_bytes());
        Some(HYP_VA_BASE + u64::from(slot) * mmu::LARGE_PAGE_SIZE)
    }

    /// Allocates one 128 KiB, 128 KiB-aligned page of hypervisor VRAM charged to the VM's
    /// shadow budget (like its shadow tables); `None` when the budget or the VRAM is exhausted.
    pub fn alloc_hyp_page(&mut self, cx: &mut ShadowCtx) -> Option<HostVram> {
        let r = self
            .books
            .alloc_aligned(cx, mmu::LARGE_PAGE_SIZE, mmu::LARGE_PAGE_SIZE);
        if r.is_none() {
            self.books.stats.alloc_failures += 1;
        }
        r.map(HostVram)
    }

    /// Returns a page of [`ShadowPt::alloc_hyp_page`] (through the quarantine).
    pub fn free_hyp_page(&mut self, cx: &mut ShadowCtx, page: HostVram) {
        self.books.free(cx, page.raw(), mmu::LARGE_PAGE_SIZE);
    }

    /// Every shadow page directory of the VM (for TLB flushes after a hypervisor mapping
    /// changed).
    pub fn shadow_pds(&self) -> Vec<HostVram> {
        self.spaces.values().map(|s| HostVram(s.pd)).collect()
    }
}
