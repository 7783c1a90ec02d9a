//! The device a KVM guest sees on PCI 00:01.0: a VM's vGPU (the device model), or — for the
//! `native` scheme, GPUvm's pass-through baseline — the physical (simulated) GPU itself.
//!
//! In pass-through mode there is no device model, no shadowing and no scheduler: the guest's
//! BAR0 accesses are the GPU's registers, BAR1/BAR3 its apertures (walked by the GPU's own MMU
//! through the page tables the guest driver built), the guest's RAM is mapped for DMA at
//! IOVA = GPA (as the in-process native harness does) and the GPU's interrupt line is the
//! guest's. Configuration space is a plain Quadro 6000 header (the same `PciConfig` the vGPU
//! uses), so the guest finds and places the device the same way. With one VM only: a second
//! guest would own the same GPU.

use std::sync::{Arc, Mutex};

use gpuvm::addr::{Gpa, Iova};
use gpuvm::mmio::pci::PciConfig;
use gpuvm::phys::Bar;
use gpuvm::vgpu::VgpuStats;
use gpuvm_harness::{BareGpu, InProcessDevice};
use gpuvm_sim::SimGpu;
use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::device::{IrqfdSlot, VgpuDevice};

/// The physical GPU given to one guest as it is.
pub struct Passthrough {
    gpu: BareGpu,
    sim: Arc<SimGpu>,
    pci: Mutex<PciConfig>,
    line: IrqfdSlot,
}

impl Passthrough {
    /// The simulated GPU `sim` with a fresh configuration space.
    pub fn new(sim: Arc<SimGpu>) -> Passthrough {
        Passthrough {
            gpu: BareGpu(sim.clone()),
            sim,
            pci: Mutex::new(PciConfig::quadro6000()),
            line: IrqfdSlot::default(),
        }
    }

    fn pci(&self) -> std::sync::MutexGuard<'_, PciConfig> {
        self.pci.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl VgpuDevice for Passthrough {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.pci().read(offset, data)
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        self.pci().write(offset, data)
    }
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        // The GPU's BAR0 is 32-bit registers: other widths read all-ones, as the bus would.
        if bar == Bar::Bar0 && data.len() != 4 {
            data.fill(0xff);
            return;
        }
        self.gpu.bar_read(bar, offset, data)
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        if bar == Bar::Bar0 && data.len() != 4 {
            return;
        }
        self.gpu.bar_write(bar, offset, data)
    }
    fn needs_shared_ram(&self) -> bool {
        false
    }
    /// Guest RAM is mapped for DMA at IOVA = GPA (the in-process native harness does the same).
    fn attach_ram(&self, mem: &GuestMemoryMmap) -> anyhow::Result<()> {
        let regions: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
        for (gpa, len) in regions {
            self.gpu
                .0
                .map_dma(Iova(gpa), len, mem.clone(), Gpa(gpa))
                .map_err(|e| anyhow::anyhow!("mapping guest RAM for DMA: {e}"))?;
        }
        Ok(())
    }
    fn connect_irq(&self, evt: EventFd) -> anyhow::Result<()> {
        self.gpu.set_irq_line(self.line.connect(evt));
        Ok(())
    }
    fn irqs_raised(&self) -> u64 {
        self.line.raised()
    }
    /// The whole GPU is the guest's: every channel's busy time.
    fn busy_ns(&self) -> u64 {
        (0..gf100::pfifo::CHANNELS)
            .filter_map(|c| self.sim.channel_busy_ns(c))
            .sum()
    }
    /// There is no device model: no counters.
    fn stats(&self) -> VgpuStats {
        VgpuStats::default()
    }
    fn vm_id(&self) -> Option<u32> {
        Some(0)
    }
    fn failure(&self) -> Option<String> {
        None
    }
}
