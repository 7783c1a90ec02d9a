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

use std::ops::Range;
use std::sync::{Arc, Mutex};

use gpuvm::addr::{Gpa, Iova};
use gpuvm::harness::{BareGpu, InProcessDevice};
use gpuvm::irq::IrqLine;
use gpuvm::mmio::pci::PciConfig;
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::vgpu::{Vgpu, VgpuStats};
use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

/// What the VMM needs from the device behind the vGPU's PCI function and BARs.
pub trait BarDevice: Send + Sync {
    /// Reads configuration space.
    fn config_read(&self, offset: u16, data: &mut [u8]);
    /// Writes configuration space.
    fn config_write(&self, offset: u16, data: &[u8]);
    /// Reads 1-8 bytes of `bar` at `offset`.
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]);
    /// Writes 1-8 bytes of `bar` at `offset`.
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]);
}

impl BarDevice for Vgpu {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        Vgpu::config_read(self, offset, data)
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        Vgpu::config_write(self, offset, data)
    }
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        Vgpu::bar_read(self, bar, offset, data)
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        Vgpu::bar_write(self, bar, offset, data)
    }
}

/// The physical GPU given to one guest as it is.
pub struct Passthrough {
    gpu: BareGpu,
    pci: Mutex<PciConfig>,
}

impl Passthrough {
    /// The GPU `gpu` with a fresh configuration space.
    pub fn new(gpu: Arc<dyn PhysicalGpu>) -> Passthrough {
        Passthrough {
            gpu: BareGpu(gpu),
            pci: Mutex::new(PciConfig::quadro6000()),
        }
    }

    fn pci(&self) -> std::sync::MutexGuard<'_, PciConfig> {
        self.pci.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl BarDevice for Passthrough {
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
}

/// The device of one KVM VM.
#[derive(Clone)]
pub enum Device {
    /// A vGPU of the shared host.
    Virt(Arc<Vgpu>),
    /// The physical GPU (the `native` scheme).
    Native(Arc<Passthrough>),
}

impl Device {
    /// The device as the PCI bus and the BAR windows use it.
    pub fn bars(&self) -> Arc<dyn BarDevice> {
        match self {
            Device::Virt(v) => v.clone(),
            Device::Native(p) => p.clone(),
        }
    }

    /// The vGPU, if this is one.
    pub fn vgpu(&self) -> Option<&Arc<Vgpu>> {
        match self {
            Device::Virt(v) => Some(v),
            Device::Native(_) => None,
        }
    }

    /// The VM's id (0 for native).
    pub fn id(&self) -> u32 {
        match self {
            Device::Virt(v) => v.id().0,
            Device::Native(_) => 0,
        }
    }

    /// The device model's counters (empty for native: there is none).
    pub fn stats(&self) -> VgpuStats {
        self.vgpu().map(|v| v.stats()).unwrap_or_default()
    }

    /// The physical channels the VM's work runs on (all of them natively).
    pub fn channels(&self) -> Range<u32> {
        match self {
            Device::Virt(v) => v.phys_channels(),
            Device::Native(_) => 0..gf100::pfifo::CHANNELS,
        }
    }

    /// Makes guest RAM reachable by DMA: through the vGPU's DMA window, or natively at
    /// IOVA = GPA.
    pub fn attach_memory(&self, mem: GuestMemoryMmap) -> anyhow::Result<()> {
        match self {
            Device::Virt(v) => Ok(v.attach_guest_memory(mem)?),
            Device::Native(p) => {
                let regions: Vec<(u64, u64)> =
                    mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
                for (gpa, len) in regions {
                    p.gpu
                        .0
                        .map_dma(Iova(gpa), len, mem.clone(), Gpa(gpa))
                        .map_err(|e| anyhow::anyhow!("mapping guest RAM for DMA: {e}"))?;
                }
                Ok(())
            }
        }
    }

    /// Connects the interrupt line.
    pub fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        match self {
            Device::Virt(v) => v.set_irq_line(line),
            Device::Native(p) => p.gpu.set_irq_line(line),
        }
    }
}
