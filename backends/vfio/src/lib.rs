//! A real GF100 bound to vfio-pci: the [`PhysicalGpu`] the host runs on when a card is passed
//! through (GPUvm's hypervisor owns the physical GPU; here through VFIO in user space).
//!
//! - BAR0 registers and the BAR1/BAR3 apertures: `bars` (mmap()ed, or pread/pwrite).
//! - VRAM: through the PRAMIN window (`pramin`).
//! - System memory: one IOMMU window per VM (`dma`).
//! - Interrupts: an eventfd turned into the host's [`IrqLine`] (`irq`).
//! - The kernel side: the [`DeviceAccess`] trait, implemented with `vfio-ioctls` in `sys`;
//!   device lookup and its error messages in `open`.
//!
//! Everything except `sys` runs in the unit tests over a simulated GF100 served as VFIO
//! regions (`docs/vfio.md` says what was and was not exercised). The real GPU keeps its own
//! time: [`PhysicalGpu::next_event_ns`] is `None` (nothing to jump a simulated clock to) and
//! [`PhysicalGpu::poll`] only collects interrupts (register and aperture accesses too). Counters a real GPU does not expose (MMU
//! faults, busy time, ...) stay 0 in [`GpuStats`]; [`VfioGpu::vfio_stats`] has the backend's.

mod bars;
mod device;
mod dma;
mod irq;
mod mapped;
mod open;
mod pramin;
mod sys;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gf100::{pbus, pfb, pmc};
use vm_memory::GuestMemoryMmap;

use gpuvm_phys::addr::{Gpa, HostVram, Iova};
use gpuvm_phys::irq::IrqLine;
use gpuvm_phys::{Bar, DmaError, GpuStats, PhysicalGpu};

pub use device::{DeviceAccess, DeviceError, IrqKind, RegionInfo};
pub use irq::IrqCounts;
pub use mapped::MappedBar;
pub use open::{OpenError, PciAddress, VfioPaths};
pub use sys::VfioPci;

use bars::BarIo;
use dma::DmaWindows;
use irq::{Check, Irq};
use pramin::Pramin;

/// What the backend did, beyond [`GpuStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct VfioStats {
    /// Interrupt kind in use (`None`: polling the interrupt registers).
    pub irq_kind: Option<IrqKind>,
    /// Interrupt path counters.
    pub irq: IrqCounts,
    /// PMEM writes that moved the PRAMIN window.
    pub pramin_moves: u64,
    /// DMA windows mapped now.
    pub dma_windows: usize,
    /// Whether BAR0, BAR1 and BAR3 are mmap()ed (else pread/pwrite).
    pub mapped: [bool; 3],
    /// Aperture accesses outside their BAR (read as all-ones, writes dropped).
    pub out_of_bar: u64,
}

#[derive(Debug, Default)]
struct Counters {
    mmio_reads: AtomicU64,
    mmio_writes: AtomicU64,
    aperture_reads: AtomicU64,
    aperture_writes: AtomicU64,
    bad_register_reads: AtomicU64,
    out_of_bar: AtomicU64,
}

/// A GF100 reached through a [`DeviceAccess`] (VFIO in production, a simulator in tests).
pub struct VfioGpu<D: DeviceAccess> {
    dev: D,
    bar0: BarIo,
    bar1: BarIo,
    bar3: BarIo,
    vram_size: u64,
    /// The PRAMIN window. Held for every access inside the window and every PMEM write.
    pramin: Mutex<Pramin>,
    dma: Mutex<DmaWindows>,
    irq: Irq,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<D: DeviceAccess> VfioGpu<D> {
    /// Takes over the GPU behind `dev`: sets up BAR access, checks that it is a Fermi, sizes
    /// its VRAM from the memory controller, enables its interrupt.
    pub fn new(dev: D) -> Result<VfioGpu<D>, OpenError> {
        let info = |bar: Bar| {
            let r = dev.region(bar);
            if r.size < bar.size() {
                return Err(OpenError::Bar {
                    index: bar.index(),
                    size: r.size,
                    want: bar.size(),
                });
            }
            Ok(r)
        };
        let (r0, r1, r3) = (info(Bar::Bar0)?, info(Bar::Bar1)?, info(Bar::Bar3)?);
        let bar0 = BarIo::new(&dev, Bar::Bar0, r0);
        let bar1 = BarIo::new(&dev, Bar::Bar1, r1);
        let bar3 = BarIo::new(&dev, Bar::Bar3, r3);
        let boot0 = bar0.read32(&dev, pmc::BOOT_0);
        if !pmc::boot0_is_fermi(boot0) {
            return Err(OpenError::NotFermi(boot0));
        }
        let vram_size = probe_vram(&bar0, &dev);
        if vram_size == 0 {
            return Err(OpenError::NoVram);
        }
        let irq = Irq::setup(&dev).map_err(OpenError::EventFd)?;
        log::info!(
            "GF100 BOOT_0 {boot0:#010x}, {} MiB VRAM, interrupts {:?}, BARs mapped {:?}",
            vram_size >> 20,
            irq.kind(),
            [bar0.is_mapped(), bar1.is_mapped(), bar3.is_mapped()]
        );
        Ok(VfioGpu {
            dev,
            bar0,
            bar1,
            bar3,
            vram_size,
            pramin: Mutex::new(Pramin::default()),
            dma: Mutex::new(DmaWindows::default()),
            irq,
            counters: Counters::default(),
        })
    }

    /// The device underneath.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The eventfd the kernel signals on an interrupt, for an event loop to wait on before
    /// calling [`PhysicalGpu::poll`].
    pub fn irq_fd(&self) -> RawFd {
        self.irq.fd().as_raw_fd()
    }

    /// The backend's own counters.
    pub fn vfio_stats(&self) -> VfioStats {
        VfioStats {
            irq_kind: self.irq.kind(),
            irq: self.irq.counts(),
            pramin_moves: lock(&self.pramin).moves,
            dma_windows: lock(&self.dma).len(),
            mapped: [
                self.bar0.is_mapped(),
                self.bar1.is_mapped(),
                self.bar3.is_mapped(),
            ],
            out_of_bar: self.counters.out_of_bar.load(Ordering::Relaxed),
        }
    }

    /// Resets the device. A reset GF100 needs its VBIOS init scripts run again (nouveau's
    /// devinit) before it works: this backend does not do that.
    pub fn reset(&self) {
        self.dev.reset();
        lock(&self.pramin).pmem_written(0xffff_ffff);
    }

    fn aperture(&self, bar: Bar) -> &BarIo {
        match bar {
            Bar::Bar0 => &self.bar0,
            Bar::Bar1 => &self.bar1,
            Bar::Bar3 => &self.bar3,
        }
    }

    fn in_pramin(offset: u32) -> bool {
        (pbus::PRAMIN_BASE..pbus::PRAMIN_BASE + pbus::PRAMIN_SIZE).contains(&offset)
    }

    /// Recomputes the interrupt line (see `irq`).
    fn refresh_irq(&self, check: Check) {
        let level = || {
            let intr = self.bar0.read32(&self.dev, pmc::INTR_HOST);
            let en = self.bar0.read32(&self.dev, pmc::INTR_EN_HOST);
            pmc::line_asserted(intr, en)
        };
        let rearm = || self.bar0.write32(&self.dev, pmc::MSI_REARM, 0);
        self.irq.refresh(&self.dev, check, level, rearm);
    }

    /// The part of `[addr, addr + len)` inside VRAM, as (start, length).
    fn clip(&self, addr: HostVram, len: usize) -> (u64, usize) {
        let start = addr.raw().min(self.vram_size);
        let n = (self.vram_size - start).min(len as u64) as usize;
        (start, n)
    }
}

/// VRAM size from the memory controller: the sum over enabled partitions of their MiB, as
/// nouveau's `gf100_fb_vidmem_size` computes it.
fn probe_vram(bar0: &BarIo, dev: &dyn DeviceAccess) -> u64 {
    let count = bar0.read32(dev, pfb::FBP_COUNT).min(pfb::MAX_FBP);
    let disabled = bar0.read32(dev, pfb::FBP_DISABLE_MASK);
    (0..count)
        .filter(|i| disabled & (1 << i) == 0)
        .map(|i| u64::from(bar0.read32(dev, pfb::fbpa_amount(i))) << 20)
        .sum()
}

impl<D: DeviceAccess> PhysicalGpu for VfioGpu<D> {
    fn read_reg(&self, offset: u32) -> u32 {
        self.counters.mmio_reads.fetch_add(1, Ordering::Relaxed);
        let v = if offset & 3 != 0 {
            gf100::BAD_REGISTER
        } else if Self::in_pramin(offset) {
            let _window = lock(&self.pramin);
            self.bar0.read32(&self.dev, offset)
        } else {
            self.bar0.read32(&self.dev, offset)
        };
        if v == gf100::BAD_REGISTER {
            self.counters
                .bad_register_reads
                .fetch_add(1, Ordering::Relaxed);
        }
        self.refresh_irq(Check::Access);
        v
    }

    fn write_reg(&self, offset: u32, value: u32) {
        self.counters.mmio_writes.fetch_add(1, Ordering::Relaxed);
        if offset & 3 != 0 {
            return;
        }
        if offset == pbus::PMEM || Self::in_pramin(offset) {
            let mut window = lock(&self.pramin);
            self.bar0.write32(&self.dev, offset, value);
            if offset == pbus::PMEM {
                window.pmem_written(value);
            }
        } else {
            self.bar0.write32(&self.dev, offset, value);
        }
        self.refresh_irq(Check::Access);
    }

    fn read_aperture(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.counters.aperture_reads.fetch_add(1, Ordering::Relaxed);
        if !self.aperture(bar).read(&self.dev, offset, data) {
            self.counters.out_of_bar.fetch_add(1, Ordering::Relaxed);
        }
        self.refresh_irq(Check::Access);
    }

    fn write_aperture(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.counters
            .aperture_writes
            .fetch_add(1, Ordering::Relaxed);
        if !self.aperture(bar).write(&self.dev, offset, data) {
            self.counters.out_of_bar.fetch_add(1, Ordering::Relaxed);
        }
        self.refresh_irq(Check::Access);
    }

    fn vram_size(&self) -> u64 {
        self.vram_size
    }

    fn read_vram(&self, addr: HostVram, data: &mut [u8]) {
        let (start, n) = self.clip(addr, data.len());
        data[n..].fill(0);
        lock(&self.pramin).read(&self.bar0, &self.dev, start, &mut data[..n]);
    }

    fn write_vram(&self, addr: HostVram, data: &[u8]) {
        let (start, n) = self.clip(addr, data.len());
        lock(&self.pramin).write(&self.bar0, &self.dev, start, &data[..n]);
    }

    fn fill_vram(&self, addr: HostVram, len: u64, byte: u8) {
        let start = addr.raw().min(self.vram_size);
        let n = (self.vram_size - start).min(len);
        lock(&self.pramin).fill(&self.bar0, &self.dev, start, n, byte);
    }

    fn map_dma(
        &self,
        iova: Iova,
        len: u64,
        mem: GuestMemoryMmap,
        gpa: Gpa,
    ) -> Result<(), DmaError> {
        lock(&self.dma).map(&self.dev, iova, len, mem, gpa)
    }

    fn unmap_dma(&self, iova: Iova) -> Result<(), DmaError> {
        lock(&self.dma).unmap(&self.dev, iova)
    }

    fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        let level = || {
            let intr = self.bar0.read32(&self.dev, pmc::INTR_HOST);
            let en = self.bar0.read32(&self.dev, pmc::INTR_EN_HOST);
            pmc::line_asserted(intr, en)
        };
        let rearm = || self.bar0.write32(&self.dev, pmc::MSI_REARM, 0);
        self.irq.connect(&self.dev, line, level, rearm);
    }

    fn poll(&self) {
        self.refresh_irq(Check::Poll);
    }

    fn next_event_ns(&self) -> Option<u64> {
        None
    }

    fn stats(&self) -> GpuStats {
        let c = &self.counters;
        GpuStats {
            mmio_reads: c.mmio_reads.load(Ordering::Relaxed),
            mmio_writes: c.mmio_writes.load(Ordering::Relaxed),
            aperture_reads: c.aperture_reads.load(Ordering::Relaxed),
            aperture_writes: c.aperture_writes.load(Ordering::Relaxed),
            bad_register_reads: c.bad_register_reads.load(Ordering::Relaxed),
            ..GpuStats::default()
        }
    }
}

impl<D: DeviceAccess> Drop for VfioGpu<D> {
    fn drop(&mut self) {
        self.irq.disable(&self.dev);
        lock(&self.dma).unmap_all(&self.dev);
    }
}

impl<D: DeviceAccess> std::fmt::Debug for VfioGpu<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioGpu")
            .field("vram_size", &self.vram_size)
            .field("stats", &self.vfio_stats())
            .finish_non_exhaustive()
    }
}
