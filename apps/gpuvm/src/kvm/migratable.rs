//! The in-process vGPU behind the [`DeviceSnapshot`] seam ([`MigratableVgpu`]): save and
//! restore as a `gpuvm::migrate` stream, and live migration through `gpuvm::migrate::Outgoing`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{bail, ensure, Context};
use gpuvm::host::GpuHost;
use gpuvm::vgpu::{Vgpu, VgpuStats};
use gpuvm_guest::hal::Bar;
use gpuvm_sim::SimGpu;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::device::{LocalVgpu, VgpuDevice};
use super::device_seam::{DeviceSnapshot, QUIESCE_WAIT_NS, VGPU_KIND};

/// The in-process vGPU with the library's snapshot, restore and live migration
/// (`gpuvm::migrate`): [`DeviceSnapshot::save`] quiesces it and writes its VRAM pages and
/// device state (registers, PCI configuration space, channels, page-table roots) as a
/// `gpuvm::migrate` stream; [`DeviceSnapshot::restore`] reads such a stream into a new vGPU
/// of this process's host, with the restored guest RAM attached (`gpuvm::migrate::restore`,
/// which validates every record and destroys the new vGPU on any error).
///
/// A VM that is restored starts with no vGPU at all ([`MigratableVgpu::to_restore`]): until
/// the restore it reads as an absent device.
pub struct MigratableVgpu {
    host: Arc<GpuHost>,
    sim: Arc<SimGpu>,
    inner: OnceLock<LocalVgpu>,
    /// The restore attached guest RAM (the VMM's own attach is then skipped).
    ram_attached: AtomicBool,
    /// A save or a live migration left the vGPU quiesced.
    quiesced: AtomicBool,
}

impl MigratableVgpu {
    /// Wraps `vgpu`, a vGPU of `host` on `sim`.
    pub fn new(host: Arc<GpuHost>, sim: Arc<SimGpu>, vgpu: Arc<Vgpu>) -> MigratableVgpu {
        let m = MigratableVgpu::to_restore(host, sim);
        let _ = m.inner.set(LocalVgpu::new(vgpu, m.sim.clone()));
        m
    }

    /// A device that [`DeviceSnapshot::restore`] fills in.
    pub fn to_restore(host: Arc<GpuHost>, sim: Arc<SimGpu>) -> MigratableVgpu {
        MigratableVgpu {
            host,
            sim,
            inner: OnceLock::new(),
            ram_attached: AtomicBool::new(false),
            quiesced: AtomicBool::new(false),
        }
    }
}

impl DeviceSnapshot for MigratableVgpu {
    fn kind(&self) -> String {
        VGPU_KIND.to_string()
    }

    fn save(&self) -> anyhow::Result<Vec<u8>> {
        let Some(d) = self.inner.get() else {
            bail!("there is no vGPU to save");
        };
        let clock = gpuvm::clock::ClockKind::Real.create();
        let mut out = Vec::new();
        gpuvm::migrate::snapshot(&self.host, &d.vgpu, &*clock, QUIESCE_WAIT_NS, &mut out)
            .context("snapshotting the vGPU")?;
        self.quiesced.store(true, Ordering::SeqCst);
        Ok(out)
    }

    fn resume(&self) {
        if self.quiesced.swap(false, Ordering::SeqCst) {
            if let Some(d) = self.inner.get() {
                d.vgpu.stop_dirty_log();
                if let Err(e) = self.host.resume(&d.vgpu) {
                    eprintln!("gpuvm: resuming the vGPU: {e}");
                }
            }
        }
    }

    fn restore(&self, bytes: &[u8], ram: &GuestMemoryMmap) -> anyhow::Result<()> {
        ensure!(
            self.inner.get().is_none(),
            "restoring into a vGPU that is not fresh"
        );
        let v = gpuvm::migrate::restore(&self.host, bytes, Some(ram.clone()))
            .context("the vGPU's snapshot stream")?;
        self.ram_attached.store(true, Ordering::SeqCst);
        if self
            .inner
            .set(LocalVgpu::new(v.clone(), self.sim.clone()))
            .is_err()
        {
            let _ = self.host.destroy_vgpu(&v);
            bail!("restoring into a vGPU that is not fresh");
        }
        Ok(())
    }

    fn live(&self) -> anyhow::Result<Box<dyn super::device_seam::LiveSession>> {
        let d = self.inner.get().context("there is no vGPU to migrate")?;
        let out = gpuvm::migrate::Outgoing::start(self.host.clone(), d.vgpu.clone())
            .context("starting the vGPU's dirty log")?;
        Ok(Box::new(out))
    }
}

impl VgpuDevice for MigratableVgpu {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        match self.inner.get() {
            Some(d) => d.config_read(offset, data),
            None => data.fill(0xff),
        }
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        if let Some(d) = self.inner.get() {
            d.config_write(offset, data)
        }
    }
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        match self.inner.get() {
            Some(d) => d.bar_read(bar, offset, data),
            None => data.fill(0xff),
        }
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        if let Some(d) = self.inner.get() {
            d.bar_write(bar, offset, data)
        }
    }
    fn needs_shared_ram(&self) -> bool {
        false
    }
    fn attach_ram(&self, mem: &GuestMemoryMmap) -> anyhow::Result<()> {
        match self.inner.get() {
            Some(_) if self.ram_attached.load(Ordering::SeqCst) => Ok(()),
            Some(d) => d.attach_ram(mem),
            None => bail!("the vGPU was not restored"),
        }
    }
    fn connect_irq(&self, evt: EventFd) -> anyhow::Result<()> {
        match self.inner.get() {
            Some(d) => d.connect_irq(evt),
            None => bail!("the vGPU was not restored"),
        }
    }
    fn irqs_raised(&self) -> u64 {
        self.inner.get().map_or(0, |d| d.irqs_raised())
    }
    fn busy_ns(&self) -> u64 {
        self.inner.get().map_or(0, |d| d.busy_ns())
    }
    fn stats(&self) -> VgpuStats {
        self.inner.get().map(|d| d.stats()).unwrap_or_default()
    }
    fn vm_id(&self) -> Option<u32> {
        self.inner.get().and_then(|d| d.vm_id())
    }
    fn failure(&self) -> Option<String> {
        None
    }
    fn vgpu(&self) -> Option<&Arc<Vgpu>> {
        self.inner.get().map(|d| &d.vgpu)
    }
    fn snapshot(&self) -> Option<&dyn DeviceSnapshot> {
        Some(self)
    }
}

// ---------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------
// Everything but RAM, and the directory
