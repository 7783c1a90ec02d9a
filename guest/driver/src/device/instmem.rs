//! Instance memory: VRAM objects the GPU reads as structures (instance blocks, page directories
//! and tables, runlists), reached by the CPU through BAR3 once it is up, or through PRAMIN.
//! Mirrors nouveau `instmem/nv50.c`: `nv50_instobj_new` (VRAM), the fast path that maps the
//! object into the BAR3 ("bar2") VM, the PRAMIN slow path for "boot" objects (BAR3's own tables)
//! or when BAR3 space runs out, and `nv50_instobj_release` flushing BAR writes with PFLUSH.

use crate::config::InstAccess;
use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::Bar;
use crate::vram::VramAlloc;
use crate::Hal;

/// An instance-memory object.
#[derive(Debug)]
pub struct InstObj {
    pub(crate) mem: VramAlloc,
    /// Where the object is mapped in BAR3, if it is.
    pub(crate) bar3_va: Option<u64>,
}

impl InstObj {
    /// VRAM address.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.mem.size()
    }
}

impl<H: Hal> Gpu<H> {
    /// Allocates a zeroed object, mapped into BAR3 when configured and possible.
    pub(crate) fn inst_new(&mut self, size: u64, align: u64) -> Result<InstObj, DriverError> {
        self.inst_new_with(size, align, true)
    }

    /// Allocates an object like [`Gpu::inst_new`], zeroing it only if `zero` (nouveau's `zero`
    /// argument of `nvkm_memory_new`; the USERD area is cleared page by page per channel).
    pub(crate) fn inst_new_with(
        &mut self,
        size: u64,
        align: u64,
        zero: bool,
    ) -> Result<InstObj, DriverError> {
        let mem = self.vram.alloc(size, align)?;
        let bar3_va = if self.cfg.inst_access == InstAccess::Bar3 && self.bar3.is_some() {
            match self.bar_map_vram(Bar::Bar3, mem.addr(), mem.size()) {
                Ok(va) => Some(va),
                // Out of BAR3 space: use PRAMIN for this object, as nouveau does.
                Err(DriverError::OutOfVa { .. }) => None,
                Err(e) => {
                    let _ = self.vram.free(mem);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let obj = InstObj { mem, bar3_va };
        if zero {
            self.inst_fill(&obj, 0, obj.size(), 0);
            self.inst_done()?;
        }
        Ok(obj)
    }

    /// Allocates a zeroed object reached through PRAMIN only (a "boot" object).
    pub(crate) fn inst_new_boot(&mut self, size: u64, align: u64) -> Result<InstObj, DriverError> {
        let mem = self.vram.alloc(size, align)?;
        let obj = InstObj { mem, bar3_va: None };
        self.inst_fill(&obj, 0, obj.size(), 0);
        Ok(obj)
    }

    /// Frees an object (unmapping it from BAR3 first).
    pub(crate) fn inst_free(&mut self, obj: InstObj) -> Result<(), DriverError> {
        let InstObj { mem, bar3_va } = obj;
        let unmapped = match bar3_va {
            Some(va) => self.bar_unmap(Bar::Bar3, va, mem.size()),
            None => Ok(()),
        };
        self.vram.free(mem)?;
        unmapped
    }

    /// Writes a word of an object.
    pub(crate) fn inst_wr32(&mut self, obj: &InstObj, off: u64, v: u32) {
        debug_assert!(off + 4 <= obj.size(), "instobj write out of bounds");
        if off + 4 > obj.size() {
            return;
        }
        match obj.bar3_va {
            Some(va) => {
                self.hal.write32(Bar::Bar3, va + off, v);
                self.bar3_dirty = true;
            }
            None => self.pramin_wr32(obj.addr() + off, v),
        }
    }

    /// Writes a 64-bit value (low word first).
    pub(crate) fn inst_wr64(&mut self, obj: &InstObj, off: u64, v: u64) {
        debug_assert!(off + 8 <= obj.size(), "instobj write out of bounds");
        if off + 8 > obj.size() {
            return;
        }
        match obj.bar3_va {
            Some(va) => {
                self.hal.write64(Bar::Bar3, va + off, v);
                self.bar3_dirty = true;
            }
            None => self.pramin_wr64(obj.addr() + off, v),
        }
    }

    /// Fills `[off, off + len)` of an object with a repeated 32-bit value.
    pub(crate) fn inst_fill(&mut self, obj: &InstObj, off: u64, len: u64, v: u32) {
        let end = (off + len).min(obj.size());
        let mut o = off;
        let v64 = (v as u64) << 32 | v as u64;
        while o + 8 <= end {
            self.inst_wr64(obj, o, v64);
            o += 8;
        }
        while o + 4 <= end {
            self.inst_wr32(obj, o, v);
            o += 4;
        }
    }

    /// Ends a batch of object writes: flushes BAR writes with PFLUSH if any went through BAR3
    /// (nouveau `nv50_instobj_release` -> `g84_bar_flush`).
    pub(crate) fn inst_done(&mut self) -> Result<(), DriverError> {
        if !self.bar3_dirty {
            return Ok(());
        }
        self.bar3_dirty = false;
        self.bar_flush()
    }
}
