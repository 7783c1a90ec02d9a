//! GPU address spaces for channels. Mirrors nouveau `mmu/vmmgf100.c` and `mmu/vmm.c`: a 64 KiB
//! page directory, small-page (4 KiB) and large-page (128 KiB) tables created on demand and freed
//! when their last entry goes, PTEs in nouveau's format (`gf100_vmm_valid`: VRAM pages plain,
//! system-memory pages SYSRAM-coherent with VOL), and the TLB invalidate of
//! `gf100_vmm_invalidate`:
//!
//! ```text
//! wait (rd 0x100c80 & 0x00ff0000) != 0        free flush slots
//! wr 0x100cb8 = (pd >> 12) << 4 | target      page directory
//! wr 0x100cbc = 0x80000000 | type             type: PAGE_ALL (1) [| HUB_ONLY (4) for BAR VMs]
//! wait (rd 0x100c80 & 0x00008000) != 0        flush queued
//! ```
//!
//! Page tables live in instance memory (written through BAR3, or PRAMIN), like nouveau's
//! `nvkm_mmu_ptc_get` objects. Every batch of PTE writes ends with a PFLUSH and a TLB invalidate.
//!
//! When the para-virtual interface is active ([`crate::pv`]) and the address space is bound to a
//! channel (so the device model knows its page directory), PDE and PTE writes are queued as
//! `OP_WRITE_PDE`/`OP_WRITE_PTE` ops instead, and the TLB invalidate becomes an `OP_FLUSH` op
//! followed by the batch submission; the tables themselves are allocated (and zeroed) the same
//! way. An address space no bound channel uses is written as without the interface (the device
//! model reads those entries from guest memory when a channel binding names the directory).
//!
//! VA layout of a channel VM (a driver choice, so that no PDE ever holds both table kinds):
//! small-page mappings in `[SMALL_VA_BASE, LARGE_VA_BASE)`, large-page mappings in
//! `[LARGE_VA_BASE, VA_LIMIT)`; the first 256 MiB stay unmapped to catch null pointers.

use alloc::collections::BTreeMap;

use gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gf100::{inst, pffb, Target};

use crate::device::Gpu;
use crate::error::DriverError;
use crate::instmem::InstObj;
use crate::range::{align_up, RangeAllocator};
use crate::Hal;

/// First VA handed out for small-page mappings.
pub const SMALL_VA_BASE: u64 = 0x0000_1000_0000;
/// First VA handed out for large-page mappings (512 GiB).
pub const LARGE_VA_BASE: u64 = 0x0080_0000_0000;

/// Page size of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSize {
    /// 4 KiB pages through a small-page table.
    Small,
    /// 128 KiB pages through a large-page table.
    Large,
}

impl PageSize {
    /// Bytes per page.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Small => mmu::SMALL_PAGE_SIZE,
            PageSize::Large => mmu::LARGE_PAGE_SIZE,
        }
    }
}

/// What a page of a mapping points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// VRAM at this address.
    Vram(u64),
    /// Guest RAM (bus address) at this address.
    Sysram(u64),
}

#[derive(Debug)]
struct PageTable {
    obj: InstObj,
    /// Present entries.
    used: u64,
}

#[derive(Debug, Default)]
struct PdeTables {
    small: Option<PageTable>,
    large: Option<PageTable>,
}

/// A channel address space (nouveau `nvkm_vmm`).
#[derive(Debug)]
pub struct AddressSpace {
    pub(crate) pd: InstObj,
    tables: BTreeMap<u64, PdeTables>,
    small_va: RangeAllocator,
    large_va: RangeAllocator,
    /// A bound channel uses this address space, so the device model knows its page directory
    /// (para-virtual ops may name it).
    pub(crate) pv_bound: bool,
}

impl AddressSpace {
    /// VRAM address of the page directory.
    pub fn pd_addr(&self) -> u64 {
        self.pd.addr()
    }

    /// The highest valid VA (what goes into the instance block's limit).
    pub fn limit(&self) -> u64 {
        mmu::VA_LIMIT - 1
    }

    /// True while a bound channel uses this address space; with the para-virtual interface
    /// active, its entries then go through para-virtual batches.
    pub fn is_bound(&self) -> bool {
        self.pv_bound
    }
}

impl<H: Hal> Gpu<H> {
    /// Creates an empty address space.
    pub fn vm_new(&mut self) -> Result<AddressSpace, DriverError> {
        let pd = self.inst_new(mmu::PD_SIZE, gf100::PAGE_SIZE)?;
        Ok(AddressSpace {
            pd,
            tables: BTreeMap::new(),
            small_va: RangeAllocator::new(SMALL_VA_BASE, LARGE_VA_BASE),
            large_va: RangeAllocator::new(LARGE_VA_BASE, mmu::VA_LIMIT),
            pv_bound: false,
        })
    }

    /// Frees an address space and all its page tables. Mappings still present are dropped
    /// (their backing memory belongs to the caller).
    pub fn vm_free(&mut self, vm: AddressSpace) -> Result<(), DriverError> {
        let AddressSpace { pd, tables, .. } = vm;
        let mut first_err = None;
        for (_, t) in tables {
            for pt in [t.small, t.large].into_iter().flatten() {
                if let Err(e) = self.inst_free(pt.obj) {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Err(e) = self.inst_free(pd) {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Writes the PDB and limit of `vm` into an instance block (nouveau `gf100_vmm_join_`).
    pub(crate) fn vm_join(&mut self, vm: &AddressSpace, inst_blk: &InstObj) {
        self.inst_wr64(
            inst_blk,
            inst::PDB_LO,
            inst::pdb_encode(vm.pd.addr(), Target::Vram),
        );
        self.inst_wr64(inst_blk, inst::LIMIT_LO, vm.limit());
    }

    /// Reserves `size` bytes of VA for `page`-sized mappings.
    pub fn vm_alloc_va(
        &mut self,
        vm: &mut AddressSpace,
        size: u64,
        page: PageSize,
    ) -> Result<u64, DriverError> {
        let size =
            align_up(size, page.bytes()).ok_or(DriverError::InvalidArgument { what: "VA size" })?;
        let r = match page {
            PageSize::Small => &mut vm.small_va,
            PageSize::Large => &mut vm.large_va,
        };
        r.alloc(size, page.bytes()).ok_or(DriverError::OutOfVa {
            space: "channel VM",
            size,
        })
    }

    /// Returns VA space reserved with [`Gpu::vm_alloc_va`].
    pub fn vm_free_va(
        &mut self,
        vm: &mut AddressSpace,
        va: u64,
        size: u64,
        page: PageSize,
    ) -> Result<(), DriverError> {
        let size =
            align_up(size, page.bytes()).ok_or(DriverError::InvalidArgument { what: "VA size" })?;
        let r = match page {
            PageSize::Small => &mut vm.small_va,
            PageSize::Large => &mut vm.large_va,
        };
        r.free(va, size).map_err(|_| DriverError::Internal {
            what: "VA double free",
        })
    }

    /// Maps `size` bytes at `va` (page aligned, inside reserved VA) to `backing`, creating page
    /// tables as needed, then flushes (PFLUSH + TLB invalidate).
    pub fn vm_map(
        &mut self,
        vm: &mut AddressSpace,
        va: u64,
        backing: Backing,
        size: u64,
        page: PageSize,
    ) -> Result<(), DriverError> {
        let pg = page.bytes();
        let (base, target) = match backing {
            Backing::Vram(a) => (a, Target::Vram),
            Backing::Sysram(a) => (a, Target::SysCoherent),
        };
        if !va.is_multiple_of(pg) || base % pg != 0 || size == 0 {
            return Err(DriverError::InvalidArgument {
                what: "unaligned GPU mapping",
            });
        }
        let end = va.checked_add(size).filter(|&e| e <= mmu::VA_LIMIT);
        let Some(end) = end else {
            return Err(DriverError::InvalidArgument {
                what: "GPU mapping beyond the VA space",
            });
        };
        let mut cur = va;
        while cur < end {
            let pte = Pte::new(base + (cur - va), target).encode();
            let r = self.vm_pte_write(vm, cur, page, Some(pte));
            self.pv_settle(r)?;
            cur += pg;
        }
        self.vm_flush(vm)
    }

    /// Unmaps `[va, va + size)`, freeing page tables that become empty, then flushes.
    pub fn vm_unmap(
        &mut self,
        vm: &mut AddressSpace,
        va: u64,
        size: u64,
        page: PageSize,
    ) -> Result<(), DriverError> {
        let pg = page.bytes();
        if !va.is_multiple_of(pg) {
            return Err(DriverError::InvalidArgument {
                what: "unaligned GPU unmapping",
            });
        }
        let end = va.saturating_add(size).min(mmu::VA_LIMIT);
        let mut cur = va;
        let mut emptied = alloc::vec::Vec::new();
        while cur < end {
            let r = self.vm_pte_write(vm, cur, page, None);
            if let Some(pde) = self.pv_settle(r)? {
                emptied.push(pde);
            }
            cur += pg;
        }
        // Detach empty tables from their PDEs, flush, and only then free their memory.
        let mut dead = alloc::vec::Vec::new();
        for pde in emptied {
            if let Some(t) = vm.tables.get_mut(&pde) {
                let slot = match page {
                    PageSize::Small => &mut t.small,
                    PageSize::Large => &mut t.large,
                };
                if slot.as_ref().is_some_and(|pt| pt.used == 0) {
                    if let Some(pt) = slot.take() {
                        dead.push(pt.obj);
                    }
                }
                let empty = t.small.is_none() && t.large.is_none();
                let r = self.vm_pde_write(vm, pde);
                self.pv_settle(r)?;
                if empty {
                    vm.tables.remove(&pde);
                }
            }
        }
        self.vm_flush(vm)?;
        for obj in dead {
            self.inst_free(obj)?;
        }
        Ok(())
    }

    /// Writes (or clears, with `None`) the PTE for `va`. Returns the PDE index if clearing left
    /// its table empty.
    fn vm_pte_write(
        &mut self,
        vm: &mut AddressSpace,
        va: u64,
        page: PageSize,
        pte: Option<u64>,
    ) -> Result<Option<u64>, DriverError> {
        let pde = mmu::pde_index(va);
        let (index, table_size) = match page {
            PageSize::Small => (mmu::spt_index(va), mmu::SPT_SIZE),
            PageSize::Large => (mmu::lpt_index(va), mmu::LPT_SIZE),
        };
        let exists = vm.tables.get(&pde).is_some_and(|t| match page {
            PageSize::Small => t.small.is_some(),
            PageSize::Large => t.large.is_some(),
        });
        if !exists {
            if pte.is_none() {
                return Ok(None);
            }
            let obj = self.inst_new(table_size, gf100::PAGE_SIZE)?;
            let t = vm.tables.entry(pde).or_default();
            let slot = match page {
                PageSize::Small => &mut t.small,
                PageSize::Large => &mut t.large,
            };
            *slot = Some(PageTable { obj, used: 0 });
            self.vm_pde_write(vm, pde)?;
        }
        let pv = self.vm_pv(vm);
        let Some(t) = vm.tables.get_mut(&pde) else {
            return Err(DriverError::Internal {
                what: "page table vanished",
            });
        };
        let Some(pt) = (match page {
            PageSize::Small => t.small.as_mut(),
            PageSize::Large => t.large.as_mut(),
        }) else {
            return Err(DriverError::Internal {
                what: "page table vanished",
            });
        };
        match pte {
            Some(v) => {
                pt.used += 1;
                self.vm_entry_write(pv, false, &pt.obj, index, v)?;
                Ok(None)
            }
            None => {
                pt.used = pt.used.saturating_sub(1);
                self.vm_entry_write(pv, false, &pt.obj, index, 0)?;
                Ok((pt.used == 0).then_some(pde))
            }
        }
    }

    /// True if `vm`'s entries go through the para-virtual interface: it is active and a bound
    /// channel uses `vm`.
    fn vm_pv(&self, vm: &AddressSpace) -> bool {
        self.pv.is_some() && vm.pv_bound
    }

    /// Writes entry `index` of a page directory (`pde`) or page table: straight into instance
    /// memory, or queued as a para-virtual op (`pv`).
    fn vm_entry_write(
        &mut self,
        pv: bool,
        pde: bool,
        table: &InstObj,
        index: u64,
        value: u64,
    ) -> Result<(), DriverError> {
        if pv {
            return self.pv_entry(pde, table, index, value);
        }
        self.inst_wr64(table, index * mmu::ENTRY_SIZE, value);
        Ok(())
    }

    /// Rewrites PDE `pde` from the tables attached to it.
    fn vm_pde_write(&mut self, vm: &AddressSpace, pde: u64) -> Result<(), DriverError> {
        let entry = match vm.tables.get(&pde) {
            Some(t) => Pde {
                large: t.large.as_ref().map(|pt| PtRef {
                    addr: pt.obj.addr(),
                    target: Target::Vram,
                    vol: false,
                }),
                small: t.small.as_ref().map(|pt| PtRef {
                    addr: pt.obj.addr(),
                    target: Target::Vram,
                    vol: false,
                }),
                size: PtSize::Full,
            },
            None => Pde::EMPTY,
        };
        let pv = self.vm_pv(vm);
        self.vm_entry_write(pv, true, &vm.pd, pde, entry.encode())
    }

    /// PFLUSH of the PTE writes, then a TLB invalidate of the VM (nouveau `gf100_vmm_flush`).
    /// Para-virtual: PFLUSH of any other BAR3 writes (normally none), then `OP_FLUSH` and the
    /// batch submission instead of the invalidate registers.
    fn vm_flush(&mut self, vm: &AddressSpace) -> Result<(), DriverError> {
        if self.vm_pv(vm) {
            let r = self.inst_done();
            self.pv_settle(r)?;
            return self.pv_flush(&vm.pd);
        }
        self.inst_done()?;
        self.tlb_flush(vm.pd.addr(), false)
    }

    /// `gf100_vmm_invalidate` for the page directory at `pd` (VRAM), all pages, hub only for BAR
    /// VMs.
    pub(crate) fn tlb_flush(&mut self, pd: u64, hub_only: bool) -> Result<(), DriverError> {
        self.wait_reg(pffb::VM_CFG, "MMU flush slot (0x100c80)", |v| {
            v & pffb::VM_CFG_FLUSH_SLOTS_MASK != 0
        })?;
        self.wr32(
            pffb::TLB_FLUSH_VSPACE,
            pffb::vspace_encode(pd, Target::Vram),
        );
        let kind = pffb::FLUSH_PAGE_ALL | if hub_only { pffb::FLUSH_HUB_ONLY } else { 0 };
        self.wr32(pffb::TLB_FLUSH_TRIGGER, pffb::FLUSH_TRIGGER | kind);
        self.wait_reg(pffb::VM_CFG, "MMU flush (0x100c80)", |v| {
            v & pffb::VM_CFG_FLUSH_QUEUED != 0
        })?;
        Ok(())
    }
}
