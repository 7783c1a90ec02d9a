//! The vGPU as a VM's VMM sees it: configuration space and BAR accesses, guest RAM and the
//! interrupt, behind one trait so that the same vCPU loop ([`super::run_vm`]), PCI decoder
//! ([`super::pci::PciBus`]) and BAR windows ([`super::mmio::BarWindows`]) drive either the
//! in-process device model ([`LocalVgpu`], `gpuvm run --kvm`) or a vGPU served by `gpuvm serve`
//! over vfio-user ([`super::remote::RemoteVgpu`], `gpuvm run --kvm --vfio-user SOCKET`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpuvm::vgpu::{Vgpu, VgpuStats};
use gpuvm_guest::hal::Bar;
use gpuvm_sim::SimGpu;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::IrqfdLine;

/// A VM's vGPU, wherever it lives.
pub trait VgpuDevice: Send + Sync {
    /// Reads configuration space (1, 2 or 4 bytes within a dword).
    fn config_read(&self, offset: u16, data: &mut [u8]);
    /// Writes configuration space.
    fn config_write(&self, offset: u16, data: &[u8]);
    /// Reads a BAR (1, 2, 4 or 8 bytes).
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]);
    /// Writes a BAR.
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]);
    /// True if guest RAM must be shareable with another process (file-backed, `MAP_SHARED`).
    fn needs_shared_ram(&self) -> bool;
    /// Gives the device the VM's RAM.
    fn attach_ram(&self, mem: &GuestMemoryMmap) -> anyhow::Result<()>;
    /// Connects the interrupt to `evt`, already registered as the VM's irqfd.
    fn connect_irq(&self, evt: EventFd) -> anyhow::Result<()>;
    /// Rising edges sent to the irqfd, if this side knows (0 otherwise).
    fn irqs_raised(&self) -> u64;
    /// GPU busy time of the VM's channels so far, if this side knows (0 otherwise).
    fn busy_ns(&self) -> u64;
    /// The device model's counters, if this side knows (zeros otherwise).
    fn stats(&self) -> VgpuStats;
    /// The VM's id on its host, if this side knows.
    fn vm_id(&self) -> Option<u32>;
    /// Why the device stopped answering, if it did (the VM is then stopped).
    fn failure(&self) -> Option<String>;
    /// The in-process vGPU behind this device, if there is one (BAR remap reads its
    /// direct-map plan; a stopped VM's vGPU is destroyed through it).
    fn vgpu(&self) -> Option<&Arc<Vgpu>> {
        None
    }
    /// The device's snapshot seam, if it has one (see [`super::device_seam::DeviceSnapshot`]):
    /// without it a snapshot or migration of the VM is refused.
    fn snapshot(&self) -> Option<&dyn super::device_seam::DeviceSnapshot> {
        None
    }
}

/// The irqfd line of an in-process device, once connected, and how many edges it sent.
#[derive(Default)]
pub(super) struct IrqfdSlot(Mutex<Option<Arc<IrqfdLine>>>);

impl IrqfdSlot {
    /// Wraps `evt` (already the VM's irqfd) as a level-triggered line, remembers it and
    /// returns it for the device to drive.
    pub(super) fn connect(&self, evt: EventFd) -> Arc<IrqfdLine> {
        let line = Arc::new(IrqfdLine {
            evt,
            level: AtomicBool::new(false),
            raised: AtomicU64::new(0),
        });
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(line.clone());
        line
    }

    /// Rising edges sent so far (0 if never connected).
    pub(super) fn raised(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |l| l.raised.load(Ordering::SeqCst))
    }
}

/// The in-process device model on the simulated GPU.
pub struct LocalVgpu {
    pub(super) vgpu: Arc<Vgpu>,
    sim: Arc<SimGpu>,
    line: IrqfdSlot,
}

impl LocalVgpu {
    /// Wraps `vgpu`, which lives on `sim`.
    pub fn new(vgpu: Arc<Vgpu>, sim: Arc<SimGpu>) -> LocalVgpu {
        LocalVgpu {
            vgpu,
            sim,
            line: IrqfdSlot::default(),
        }
    }
}

impl VgpuDevice for LocalVgpu {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.vgpu.config_read(offset, data)
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        self.vgpu.config_write(offset, data)
    }
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.vgpu.bar_read(bar, offset, data)
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.vgpu.bar_write(bar, offset, data)
    }
    fn needs_shared_ram(&self) -> bool {
        false
    }
    fn attach_ram(&self, mem: &GuestMemoryMmap) -> anyhow::Result<()> {
        Ok(self.vgpu.attach_guest_memory(mem.clone())?)
    }
    fn connect_irq(&self, evt: EventFd) -> anyhow::Result<()> {
        self.vgpu.set_irq_line(self.line.connect(evt));
        Ok(())
    }
    fn irqs_raised(&self) -> u64 {
        self.line.raised()
    }
    fn busy_ns(&self) -> u64 {
        self.vgpu
            .phys_channels()
            .filter_map(|c| self.sim.channel_busy_ns(c))
            .sum()
    }
    fn stats(&self) -> VgpuStats {
        self.vgpu.stats()
    }
    fn vm_id(&self) -> Option<u32> {
        Some(self.vgpu.id().0)
    }
    fn failure(&self) -> Option<String> {
        None
    }
    fn vgpu(&self) -> Option<&Arc<Vgpu>> {
        Some(&self.vgpu)
    }
}
