//! BAR1 and BAR3 bring-up and mappings. Mirrors nouveau `bar/gf100.c` (`gf100_bar_oneinit`,
//! `gf100_bar_bar1_init`, `gf100_bar_bar2_init`) and `bar/g84.c` (`g84_bar_flush`):
//!
//! each BAR gets its own instance block and VM (page directory + small-page tables covering the
//! BAR, sized to the PCI resource), joined by writing the PDB and the limit (BAR size - 1) at
//! instance +0x200/+0x208; then `0x1714 = 0x80000000 | inst >> 12` (BAR3) or
//! `0x1704 = 0x80000000 | inst >> 12` (BAR1). BAR3's own structures are "boot" objects written
//! through PRAMIN (nouveau `nvkm_vmm_boot`); BAR1's live in instance memory, reached through
//! BAR3. Every BAR VM update ends with a PFLUSH of BAR writes and a TLB invalidate with
//! HUB_ONLY.

use alloc::vec::Vec;

use gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gf100::{inst, pbus, Target};

use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::Bar;
use crate::instmem::InstObj;
use crate::range::{align_up, RangeAllocator};
use crate::Hal;

/// The VM behind one BAR.
#[derive(Debug)]
pub(crate) struct BarVm {
    pub(crate) inst: InstObj,
    pub(crate) pd: InstObj,
    /// One full small-page table per 128 MiB of the BAR.
    pub(crate) spts: Vec<InstObj>,
    pub(crate) va: RangeAllocator,
}

impl<H: Hal> Gpu<H> {
    /// Brings up BAR3 (nouveau "bar2"): boot objects through PRAMIN, then the binding.
    pub(crate) fn bar3_init(&mut self) -> Result<(), DriverError> {
        let vm = self.bar_vm_new(Bar::Bar3, true)?;
        let inst = vm.inst.addr();
        let pd = vm.pd.addr();
        self.bar3 = Some(vm);
        self.wr32(pbus::BAR3_INST, pbus::bar_inst_encode(inst, Target::Vram));
        self.tlb_flush(pd, true)
    }

    /// Brings up BAR1: objects in instance memory (through BAR3), then the binding.
    pub(crate) fn bar1_init(&mut self) -> Result<(), DriverError> {
        let vm = self.bar_vm_new(Bar::Bar1, false)?;
        let inst = vm.inst.addr();
        let pd = vm.pd.addr();
        self.bar1 = Some(vm);
        self.inst_done()?;
        self.wr32(pbus::BAR1_INST, pbus::bar_inst_encode(inst, Target::Vram));
        self.tlb_flush(pd, true)
    }

    fn bar_vm_new(&mut self, bar: Bar, boot: bool) -> Result<BarVm, DriverError> {
        let size = bar.size();
        let new = |gpu: &mut Self, size: u64| {
            if boot {
                gpu.inst_new_boot(size, gf100::PAGE_SIZE)
            } else {
                gpu.inst_new(size, gf100::PAGE_SIZE)
            }
        };
        let inst = new(self, inst::SIZE)?;
        let pd = new(self, mmu::PD_SIZE)?;
        let npde = size.div_ceil(mmu::PDE_COVERAGE);
        let mut spts = Vec::new();
        for i in 0..npde {
            let spt = new(self, mmu::SPT_SIZE)?;
            let pde = Pde {
                large: None,
                small: Some(PtRef {
                    addr: spt.addr(),
                    target: Target::Vram,
                    vol: false,
                }),
                size: PtSize::Full,
            };
            self.inst_wr64(&pd, i * mmu::ENTRY_SIZE, pde.encode());
            spts.push(spt);
        }
        // nvkm_vmm_join: PDB and limit.
        self.inst_wr64(
            &inst,
            inst::PDB_LO,
            inst::pdb_encode(pd.addr(), Target::Vram),
        );
        self.inst_wr64(&inst, inst::LIMIT_LO, size - 1);
        Ok(BarVm {
            inst,
            pd,
            spts,
            va: RangeAllocator::new(0, size),
        })
    }

    fn bar_vm_mut(&mut self, bar: Bar) -> Result<&mut Option<BarVm>, DriverError> {
        match bar {
            Bar::Bar1 => Ok(&mut self.bar1),
            Bar::Bar3 => Ok(&mut self.bar3),
            Bar::Bar0 => Err(DriverError::Internal {
                what: "BAR0 has no VM",
            }),
        }
    }

    /// Maps `size` bytes of VRAM at `addr` (page aligned) into `bar`; returns the BAR offset.
    pub(crate) fn bar_map_vram(
        &mut self,
        bar: Bar,
        addr: u64,
        size: u64,
    ) -> Result<u64, DriverError> {
        let size = align_up(size, gf100::PAGE_SIZE).ok_or(DriverError::InvalidArgument {
            what: "BAR mapping size",
        })?;
        let mut vm = self.bar_vm_mut(bar)?.take().ok_or(DriverError::Internal {
            what: "BAR not initialised",
        })?;
        let r = self.bar_map_inner(&mut vm, bar, addr, size);
        *self.bar_vm_mut(bar)? = Some(vm);
        r
    }

    fn bar_map_inner(
        &mut self,
        vm: &mut BarVm,
        bar: Bar,
        addr: u64,
        size: u64,
    ) -> Result<u64, DriverError> {
        let name = if bar == Bar::Bar1 { "BAR1" } else { "BAR3" };
        let va = vm
            .va
            .alloc(size, gf100::PAGE_SIZE)
            .ok_or(DriverError::OutOfVa { space: name, size })?;
        let mut off = 0;
        while off < size {
            self.bar_pte_write(vm, va + off, Pte::new(addr + off, Target::Vram).encode());
            off += gf100::PAGE_SIZE;
        }
        self.inst_done()?;
        self.tlb_flush(vm.pd.addr(), true)?;
        Ok(va)
    }

    /// Unmaps `[va, va + size)` of `bar` and returns the space.
    pub(crate) fn bar_unmap(&mut self, bar: Bar, va: u64, size: u64) -> Result<(), DriverError> {
        let size = align_up(size, gf100::PAGE_SIZE).ok_or(DriverError::InvalidArgument {
            what: "BAR mapping size",
        })?;
        let mut vm = self.bar_vm_mut(bar)?.take().ok_or(DriverError::Internal {
            what: "BAR not initialised",
        })?;
        let r = self.bar_unmap_inner(&mut vm, va, size);
        *self.bar_vm_mut(bar)? = Some(vm);
        r
    }

    fn bar_unmap_inner(&mut self, vm: &mut BarVm, va: u64, size: u64) -> Result<(), DriverError> {
        vm.va.free(va, size).map_err(|_| DriverError::Internal {
            what: "BAR unmap of unmapped range",
        })?;
        let mut off = 0;
        while off < size {
            self.bar_pte_write(vm, va + off, 0);
            off += gf100::PAGE_SIZE;
        }
        self.inst_done()?;
        self.tlb_flush(vm.pd.addr(), true)
    }

    fn bar_pte_write(&mut self, vm: &BarVm, va: u64, pte: u64) {
        let Some(spt) = vm.spts.get((va / mmu::PDE_COVERAGE) as usize) else {
            return;
        };
        self.inst_wr64(spt, mmu::spt_index(va) * mmu::ENTRY_SIZE, pte);
    }

    /// Flushes BAR writes (nouveau `g84_bar_flush`): write PFLUSH = 1, wait for the busy bit to
    /// clear.
    pub(crate) fn bar_flush(&mut self) -> Result<(), DriverError> {
        self.wr32(pbus::PFLUSH, pbus::PFLUSH_TRIGGER);
        self.wait_reg(pbus::PFLUSH, "PFLUSH (BAR write flush)", |v| {
            v & pbus::PFLUSH_BUSY == 0
        })?;
        Ok(())
    }
}
