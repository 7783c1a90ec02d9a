//! The PRAMIN window: 1 MiB of VRAM visible at BAR0 0x700000, its base selected by PMEM
//! (0x001700 = address >> 16). Mirrors nouveau `nv50_instobj_rd32`/`_wr32` (the "slow path" of
//! `instmem/nv50.c`): the window is kept 1 MiB-aligned and the base is cached, so PMEM is only
//! written when an access leaves the current window.

use gf100::{pbus, Target};

use crate::device::Gpu;
use crate::hal::Bar;
use crate::Hal;

/// Size of the window (and alignment of its base).
const WINDOW: u64 = pbus::PRAMIN_SIZE as u64;

impl<H: Hal> Gpu<H> {
    /// Points the window at the 1 MiB block containing `addr`; returns the BAR0 offset of `addr`.
    fn pramin_select(&mut self, addr: u64) -> u64 {
        let base = addr & !(WINDOW - 1);
        if self.pramin_base != Some(base) {
            self.wr32(pbus::PMEM, pbus::pmem_encode(base, Target::Vram));
            self.pramin_base = Some(base);
        }
        pbus::PRAMIN_BASE as u64 + (addr - base)
    }

    /// Reads a VRAM word through PRAMIN (also useful to inspect GPU structures in tests).
    pub fn pramin_rd32(&mut self, addr: u64) -> u32 {
        let off = self.pramin_select(addr);
        self.hal.read32(Bar::Bar0, off)
    }

    /// Writes a VRAM word through PRAMIN.
    pub fn pramin_wr32(&mut self, addr: u64, v: u32) {
        let off = self.pramin_select(addr);
        self.hal.write32(Bar::Bar0, off, v)
    }

    /// Writes a 64-bit VRAM value through PRAMIN (low word first, as nouveau's `nvkm_wo64`).
    pub(crate) fn pramin_wr64(&mut self, addr: u64, v: u64) {
        self.pramin_wr32(addr, v as u32);
        self.pramin_wr32(addr + 4, (v >> 32) as u32);
    }
}
