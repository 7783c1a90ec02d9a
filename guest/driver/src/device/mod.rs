//! Device bring-up: identify the chip, enable the engines, size VRAM, set up the MMU defaults,
//! BAR3 and BAR1, and PFIFO. Mirrors nouveau's `nvkm_device_ctor` (BOOT_0 check),
//! `nv50_mc_init` (PMC ENABLE), `gf100_fb_vidmem_probe` / `gf100_fb_init_page` /
//! `gf100_fb_sysmem_flush_page_init` (FB), `gf100_bar_oneinit`/`_init` (BARs, see [`crate::bar`])
//! and `gf100_fifo_init` (PFIFO, see [`crate::channel`]).
//!
//! The driver is one type, [`Gpu`], whose methods are split by mechanism into this module's
//! parts: `instmem` (instance memory) at the bottom; `bar` (BAR1/BAR3 page tables), `vm`
//! (address spaces), `pv` (the para-virtual batch queue) and `fifo` (PFIFO) on it; `buffer`
//! (VRAM and sysmem buffers) on `vm`; `channel` on all of them. A part names the device it
//! belongs to (`Gpu`, its ancestor) and the parts below it, never one above
//! (`tests/architecture.rs`). Their methods still call each other through `Gpu` (instance
//! memory is written through BAR3, BAR3's page tables live in instance memory), as nouveau's
//! subdevices do: the seam is the type, not the files.

pub mod bar;
pub mod buffer;
pub mod channel;
pub mod fifo;
pub mod instmem;
pub mod pv;
pub mod vm;

use gf100::{pfb, pffb, pmc};

use crate::bar::BarVm;
use crate::channel::{Channel, Fifo};
use crate::config::{DriverConfig, FenceMode};
use crate::error::DriverError;
use crate::hal::{Bar, Dma, Mmio, Platform};
use crate::sysmem::{DmaAlloc, DmaAllocator};
use crate::vram::VramAllocator;
use crate::wait::Backoff;
use crate::Hal;
use pv::{PvQueue, PvStats};

/// Smallest VRAM the driver accepts (room for the BAR page tables, USERD and channels).
pub const MIN_VRAM: u64 = 16 << 20;
/// Largest VRAM the driver accepts (the 40-bit physical address space).
pub const MAX_VRAM: u64 = 1 << 40;
/// Largest per-partition amount the driver believes, in MiB (a GF100 partition holds 256-1024 MiB;
/// anything near the register's range is garbage).
pub const MAX_FBPA_MIB: u64 = 64 << 10;

/// A GF100 driven by this driver.
pub struct Gpu<H> {
    pub(crate) hal: H,
    pub(crate) cfg: DriverConfig,
    /// The fence mode in effect (Interrupt falls back to Poll without platform interrupts).
    pub(crate) fence_mode: FenceMode,
    pub(crate) boot0: u32,
    pub(crate) vram_size: u64,
    pub(crate) vram: VramAllocator,
    pub(crate) dma: DmaAllocator,
    /// VRAM address the PRAMIN window currently shows (nouveau caches it the same way).
    pub(crate) pramin_base: Option<u64>,
    /// BAR3 writes since the last PFLUSH.
    pub(crate) bar3_dirty: bool,
    pub(crate) bar3: Option<BarVm>,
    pub(crate) bar1: Option<BarVm>,
    pub(crate) fifo: Option<Fifo>,
    /// PBDMAs found (popcount of SUBFIFO_ENABLE, bounded by `gf100::pfifo::PBDMAS`).
    pub(crate) pbdmas: u32,
    /// The sysmem flush page (nouveau `gf100_fb_sysmem_flush_page_init`).
    pub(crate) flush_page: Option<DmaAlloc>,
    /// The channel the workloads reuse.
    pub(crate) chan: Option<Channel>,
    /// The para-virtual page-table batch queue, when that path is active.
    pub(crate) pv: Option<PvQueue>,
    /// Counters of the para-virtual path.
    pub(crate) pv_stats: PvStats,
}

impl<H> core::fmt::Debug for Gpu<H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Gpu")
            .field("boot0", &format_args!("{:#010x}", self.boot0))
            .field("vram_size", &self.vram_size)
            .field("fence_mode", &self.fence_mode)
            .field("pbdmas", &self.pbdmas)
            .field("paravirt", &self.pv.is_some())
            .finish_non_exhaustive()
    }
}

impl<H: Mmio + Dma + Platform> Gpu<H> {
    /// Brings the GPU up: BOOT_0 check, PMC, VRAM sizing, the para-virtual interface check
    /// (unless [`crate::Paravirt::Off`]), FB defaults, BAR3, BAR1, PFIFO, and the para-virtual
    /// batch buffer when that path is used.
    pub fn init(hal: H, cfg: DriverConfig) -> Result<Gpu<H>, DriverError> {
        let mut hal = hal;
        if cfg.gpfifo_entries < 2
            || !cfg.gpfifo_entries.is_power_of_two()
            || cfg.gpfifo_entries > 1 << 15
        {
            return Err(DriverError::InvalidArgument {
                what: "gpfifo_entries must be a power of two in 2..=32768",
            });
        }
        if cfg.pushbuf_bytes == 0
            || !cfg.pushbuf_bytes.is_multiple_of(gf100::PAGE_SIZE)
            || cfg.pushbuf_bytes > 1 << 24
        {
            return Err(DriverError::InvalidArgument {
                what: "pushbuf_bytes must be whole pages, at most 16 MiB",
            });
        }

        // nvkm_device_ctor: identify the chip.
        let boot0 = hal.read32(Bar::Bar0, pmc::BOOT_0 as u64);
        if !pmc::boot0_is_fermi(boot0) {
            return Err(DriverError::NotFermi { boot0 });
        }

        // nv50_mc_init: everything on; interrupts stay unarmed until PFIFO is ready.
        hal.write32(Bar::Bar0, pmc::ENABLE as u64, pmc::ENABLE_ALL);
        hal.write32(Bar::Bar0, pmc::INTR_EN_HOST as u64, 0);

        let vram_size = probe_vram(&mut hal)?;
        let paravirt = pv::probe(&mut hal, cfg.paravirt)?;
        let fence_mode = match cfg.fence_mode {
            FenceMode::Interrupt if hal.has_interrupts() => FenceMode::Interrupt,
            _ => FenceMode::Poll,
        };
        let dma = DmaAllocator::new(hal.base(), hal.size());
        let mut gpu = Gpu {
            hal,
            cfg,
            fence_mode,
            boot0,
            vram_size,
            vram: VramAllocator::new(vram_size),
            dma,
            pramin_base: None,
            bar3_dirty: false,
            bar3: None,
            bar1: None,
            fifo: None,
            pbdmas: 0,
            flush_page: None,
            chan: None,
            pv: None,
            pv_stats: PvStats::default(),
        };
        gpu.fb_init()?;
        gpu.bar3_init()?;
        gpu.bar1_init()?;
        gpu.fifo_init()?;
        if paravirt {
            gpu.pv_init()?;
        }
        Ok(gpu)
    }

    /// FB defaults nouveau programs: 128 KiB large pages (`gf100_fb_init_page`, big page 17) and
    /// the sysmem flush page (`gf100_fb_sysmem_flush_page_init`).
    fn fb_init(&mut self) -> Result<(), DriverError> {
        let cfg = self.rd32(pffb::VM_CFG);
        self.wr32(pffb::VM_CFG, cfg & !pffb::VM_CFG_LARGE_PAGE_64K);
        let page = self.dma.alloc(gf100::PAGE_SIZE, gf100::PAGE_SIZE)?;
        self.dma_zero(page.addr(), page.size());
        self.wr32(pffb::SYSMEM_FLUSH_PAGE, (page.addr() >> 8) as u32);
        self.flush_page = Some(page);
        Ok(())
    }
}

impl<H> Gpu<H> {
    /// The platform the driver runs on.
    pub fn hal(&self) -> &H {
        &self.hal
    }

    /// The platform, mutably.
    pub fn hal_mut(&mut self) -> &mut H {
        &mut self.hal
    }

    /// Gives the platform back. The GPU is left as it is (channels keep their state).
    pub fn into_hal(self) -> H {
        self.hal
    }

    /// VRAM size in bytes as read from the memory controller.
    pub fn vram_size(&self) -> u64 {
        self.vram_size
    }

    /// BOOT_0 as read at init.
    pub fn boot0(&self) -> u32 {
        self.boot0
    }

    /// The configuration in use.
    pub fn config(&self) -> &DriverConfig {
        &self.cfg
    }

    /// The fence mode in effect (Interrupt falls back to Poll without platform interrupts).
    pub fn fence_mode(&self) -> FenceMode {
        self.fence_mode
    }

    /// VRAM bytes not allocated.
    pub fn vram_free(&self) -> u64 {
        self.vram.free_bytes()
    }

    /// Guest-RAM (DMA) bytes not allocated.
    pub fn dma_free(&self) -> u64 {
        self.dma.free_bytes()
    }
}

impl<H: Hal> Gpu<H> {
    /// Reads a BAR0 register.
    pub(crate) fn rd32(&mut self, reg: u32) -> u32 {
        self.hal.read32(Bar::Bar0, reg as u64)
    }

    /// Writes a BAR0 register.
    pub(crate) fn wr32(&mut self, reg: u32, v: u32) {
        self.hal.write32(Bar::Bar0, reg as u64, v)
    }

    /// Read-modify-write of a BAR0 register (nouveau `nvkm_mask`); returns the old value.
    pub(crate) fn mask32(&mut self, reg: u32, mask: u32, value: u32) -> u32 {
        let old = self.rd32(reg);
        self.wr32(reg, (old & !mask) | value);
        old
    }

    /// Polls `cond(rd32(reg))` until it holds, with back-off delays, bounded by the configured
    /// timeout (nouveau `nvkm_msec` loops).
    pub(crate) fn wait_reg(
        &mut self,
        reg: u32,
        what: &'static str,
        cond: impl Fn(u32) -> bool,
    ) -> Result<u32, DriverError> {
        let mut b = Backoff::new(self.cfg.timeout_ns);
        loop {
            let v = self.rd32(reg);
            if cond(v) {
                return Ok(v);
            }
            if !b.delay(&mut self.hal) {
                return Err(DriverError::Timeout { what });
            }
        }
    }

    /// Zeroes guest RAM.
    pub(crate) fn dma_zero(&mut self, addr: u64, len: u64) {
        let zeros = [0u8; 256];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(zeros.len() as u64);
            self.hal.write(addr + off, &zeros[..n as usize]);
            off += n;
        }
    }
}

/// Sizes VRAM as `gf100_fb_vidmem_probe` does: the sum over the enabled frame-buffer partitions
/// of their amount registers (MiB). Every value is bounds-checked.
fn probe_vram<H: Mmio>(hal: &mut H) -> Result<u64, DriverError> {
    let fbps = hal.read32(Bar::Bar0, pfb::FBP_COUNT as u64);
    if fbps == 0 || fbps > pfb::MAX_FBP {
        return Err(DriverError::BadHardwareValue {
            what: "FBP count (0x022438)",
            value: fbps as u64,
        });
    }
    let disabled = hal.read32(Bar::Bar0, pfb::FBP_DISABLE_MASK as u64);
    let mut bytes = 0u64;
    for fbp in 0..fbps {
        if disabled & (1 << fbp) != 0 {
            continue;
        }
        let mib = hal.read32(Bar::Bar0, pfb::fbpa_amount(fbp) as u64) as u64;
        if mib > MAX_FBPA_MIB {
            return Err(DriverError::BadHardwareValue {
                what: "FBP memory amount (0x11020c)",
                value: mib,
            });
        }
        bytes += mib << 20;
    }
    if !(MIN_VRAM..=MAX_VRAM).contains(&bytes) {
        return Err(DriverError::BadVramSize { bytes });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Regs([(u32, u32); 8]);
    impl Mmio for Regs {
        fn read32(&mut self, _bar: Bar, offset: u64) -> u32 {
            self.0
                .iter()
                .find(|(r, _)| *r as u64 == offset)
                .map(|(_, v)| *v)
                .unwrap_or(gf100::BAD_REGISTER)
        }
        fn write32(&mut self, _bar: Bar, _offset: u64, _value: u32) {}
    }

    fn regs(count: u32, mask: u32, amounts: [u32; 6]) -> Regs {
        let mut r = [
            (pfb::FBP_COUNT, count),
            (pfb::FBP_DISABLE_MASK, mask),
            (0, 0),
            (0, 0),
            (0, 0),
            (0, 0),
            (0, 0),
            (0, 0),
        ];
        for (i, a) in amounts.iter().enumerate() {
            r[2 + i] = (pfb::fbpa_amount(i as u32), *a);
        }
        Regs(r)
    }

    #[test]
    fn vram_is_the_sum_of_enabled_partitions() {
        assert_eq!(probe_vram(&mut regs(6, 0, [1024; 6])).unwrap(), 6 << 30);
        assert_eq!(
            probe_vram(&mut regs(6, 0b100001, [1024; 6])).unwrap(),
            4 << 30
        );
        assert_eq!(
            probe_vram(&mut regs(2, 0, [256, 256, 0, 0, 0, 0])).unwrap(),
            512 << 20
        );
    }

    #[test]
    fn garbage_vram_registers_are_errors() {
        assert!(probe_vram(&mut regs(gf100::BAD_REGISTER, 0, [1024; 6])).is_err());
        assert!(probe_vram(&mut regs(0, 0, [1024; 6])).is_err());
        assert!(probe_vram(&mut regs(6, 0x3f, [1024; 6])).is_err());
        assert!(probe_vram(&mut regs(6, 0, [gf100::BAD_REGISTER; 6])).is_err());
        assert!(probe_vram(&mut regs(1, 0, [1, 0, 0, 0, 0, 0])).is_err());
    }
}
