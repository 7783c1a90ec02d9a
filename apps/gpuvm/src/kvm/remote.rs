//! `gpuvm run --kvm --vfio-user SOCKET`: one KVM VM whose vGPU lives in `gpuvm serve`.
//!
//! The VMM is a vfio-user client (the `vfio_user` crate's `Client`): configuration-space and
//! BAR exits become REGION_READ/REGION_WRITE messages (VFIO PCI region indices: BARn = n,
//! configuration space = 7), guest RAM is a sealed memfd shared with DMA_MAP, and the
//! interrupt is an eventfd registered as the VM's irqfd and handed over with SET_IRQS (INTx,
//! `DATA_EVENTFD | ACTION_TRIGGER`), so the daemon's rising edges reach the guest's IOAPIC
//! without passing through this process. Only the daemon knows the vGPU's counters and the GPU
//! time, so the report carries zeros there (see docs/vfio-user.md).
//!
//! **Snapshot, restore and live migration** go through the daemon's control socket
//! (`DIR/control.sock` next to the VM's socket `DIR/NAME.sock`; [`crate::serve_migrate`]): the
//! daemon quiesces the vGPU and streams its state to this VMM, which stores it or carries it
//! to the destination VMM like its own devices' state; the destination VMM connects to its own
//! daemon, maps the restored RAM and hands the stream to that daemon, whose connection adopts
//! the rebuilt vGPU. The vGPU thus moves between two daemons with the guest.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use gpuvm::clock::ClockKind;
use gpuvm::host::HostStats;
use gpuvm::vgpu::VgpuStats;
use gpuvm_guest::hal::Bar;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_INTX_IRQ_INDEX,
};
use vfio_user::Client;
use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::device::VgpuDevice;
use super::device_seam::{self, DeviceSnapshot};
use super::snapshot;
use super::{is_pvm, open_kvm, run_vm, Incoming, KvmOptions, KvmReport, RunCtx};

/// A vGPU served over a vfio-user socket.
pub struct RemoteVgpu {
    client: Mutex<Client>,
    socket: PathBuf,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// The eventfd handed to the daemon (kept open for the VM's lifetime).
    irq: Mutex<Option<EventFd>>,
    /// The daemon's directory and the VM's name there (from `DIR/NAME.sock`).
    daemon_dir: PathBuf,
    name: String,
    /// Guest RAM was mapped (a restore maps it before handing the stream over).
    ram_mapped: AtomicBool,
    /// The session a snapshot left open (the vGPU quiesced in the daemon); dropping it resumes.
    saved: Mutex<Option<crate::serve_migrate::Session>>,
}

impl RemoteVgpu {
    /// Connects to `socket` and checks that the device is the vGPU (its regions' sizes).
    pub fn connect(socket: &Path) -> anyhow::Result<RemoteVgpu> {
        let client = Client::new(socket).map_err(|e| {
            anyhow::anyhow!(
                "connecting to the vfio-user socket {}: {e}",
                socket.display()
            )
        })?;
        for (index, size) in [
            (0, Bar::Bar0.size()),
            (1, Bar::Bar1.size()),
            (3, Bar::Bar3.size()),
            (VFIO_PCI_CONFIG_REGION_INDEX, 4096),
        ] {
            let got = client.region(index).map(|r| r.size);
            anyhow::ensure!(
                got == Some(size),
                "{}: region {index} is {got:?} bytes, expected {size:#x}: not a gpuvm vGPU",
                socket.display()
            );
        }
        let name = socket
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let daemon_dir = socket
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(RemoteVgpu {
            client: Mutex::new(client),
            socket: socket.to_path_buf(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            irq: Mutex::new(None),
            daemon_dir,
            name,
            ram_mapped: AtomicBool::new(false),
            saved: Mutex::new(None),
        })
    }

    fn client(&self) -> std::sync::MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the first failure of the connection.
    fn fail(&self, what: &str, e: vfio_user::Error) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            let msg = format!(
                "the vfio-user server at {} stopped answering ({what}: {e}): VM stopped",
                self.socket.display()
            );
            eprintln!("gpuvm: {msg}");
            *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
        }
    }

    fn read(&self, region: u32, offset: u64, data: &mut [u8]) {
        if self.failed.load(Ordering::SeqCst) {
            data.fill(0xff);
            return;
        }
        if let Err(e) = self.client().region_read(region, offset, data) {
            data.fill(0xff);
            self.fail("region read", e);
        }
    }

    fn write(&self, region: u32, offset: u64, data: &[u8]) {
        if self.failed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.client().region_write(region, offset, data) {
            self.fail("region write", e);
        }
    }

    /// Mean round trip of a configuration-space dword read over the socket, ns.
    pub fn round_trip_ns(&self, n: u32) -> u64 {
        let t = Instant::now();
        let mut b = [0u8; 4];
        for _ in 0..n {
            self.read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut b);
        }
        t.elapsed().as_nanos() as u64 / u64::from(n.max(1))
    }
}

impl VgpuDevice for RemoteVgpu {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        self.read(VFIO_PCI_CONFIG_REGION_INDEX, u64::from(offset), data)
    }
    fn config_write(&self, offset: u16, data: &[u8]) {
        self.write(VFIO_PCI_CONFIG_REGION_INDEX, u64::from(offset), data)
    }
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.read(u32::from(bar.index()), offset, data)
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.write(u32::from(bar.index()), offset, data)
    }
    fn needs_shared_ram(&self) -> bool {
        true
    }
    fn attach_ram(&self, mem: &GuestMemoryMmap) -> anyhow::Result<()> {
        // Under the client's lock, so the flag and the maps change together.
        let mut client = self.client();
        if self.ram_mapped.load(Ordering::SeqCst) {
            return Ok(());
        }
        for region in mem.iter() {
            let fo = region
                .file_offset()
                .context("guest RAM is not file-backed: it cannot be shared with the server")?;
            client
                .dma_map(
                    fo.start(),
                    region.start_addr().0,
                    region.len(),
                    fo.file().as_raw_fd(),
                )
                .map_err(|e| anyhow::anyhow!("DMA_MAP of guest RAM: {e}"))?;
        }
        self.ram_mapped.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn connect_irq(&self, evt: EventFd) -> anyhow::Result<()> {
        self.client()
            .set_irqs(
                VFIO_PCI_INTX_IRQ_INDEX,
                VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                0,
                1,
                &[evt.as_raw_fd()],
            )
            .map_err(|e| anyhow::anyhow!("SET_IRQS (INTx eventfd): {e}"))?;
        *self.irq.lock().unwrap_or_else(|e| e.into_inner()) = Some(evt);
        Ok(())
    }
    fn irqs_raised(&self) -> u64 {
        0
    }
    fn busy_ns(&self) -> u64 {
        0
    }
    fn stats(&self) -> VgpuStats {
        VgpuStats::default()
    }
    fn vm_id(&self) -> Option<u32> {
        None
    }
    fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::SeqCst) {
            return None;
        }
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    fn snapshot(&self) -> Option<&dyn DeviceSnapshot> {
        Some(self)
    }
}

impl RemoteVgpu {
    fn saved(&self) -> std::sync::MutexGuard<'_, Option<crate::serve_migrate::Session>> {
        self.saved.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The daemon's vGPU through its control socket: the same `gpuvm::migrate` stream as the
/// in-process vGPU's ([`device_seam::VGPU_KIND`]), so a snapshot taken through one daemon restores
/// through another.
impl DeviceSnapshot for RemoteVgpu {
    fn kind(&self) -> String {
        device_seam::VGPU_KIND.to_string()
    }

    fn save(&self) -> anyhow::Result<Vec<u8>> {
        let mut s = crate::serve_migrate::Session::open(&self.daemon_dir, &self.name)?;
        let st = s.stop(device_seam::QUIESCE_WAIT_NS / 1_000_000)?;
        // The header (from `open`) and everything the stop produced.
        let bytes = s.take();
        log::info!(
            "vGPU {} saved by its daemon ({} submissions withdrawn)",
            self.name,
            st.withdrawn
        );
        *self.saved() = Some(s);
        Ok(bytes)
    }

    fn resume(&self) {
        // Dropping the session tells the daemon to resume the vGPU.
        self.saved().take();
    }

    fn restore(&self, bytes: &[u8], ram: &GuestMemoryMmap) -> anyhow::Result<()> {
        // The daemon rebuilds the vGPU with the RAM this connection mapped: map it first.
        self.attach_ram(ram)?;
        let id = crate::serve_migrate::restore(&self.daemon_dir, &self.name, bytes)?;
        log::info!("vGPU {} restored by its daemon as {id}", self.name);
        Ok(())
    }

    fn live(&self) -> anyhow::Result<Box<dyn super::device_seam::LiveSession>> {
        Ok(Box::new(crate::serve_migrate::Session::open(
            &self.daemon_dir,
            &self.name,
        )?))
    }
}

/// Runs one KVM VM whose vGPU is served at `socket`, booting it or starting it from
/// `incoming` (a snapshot or a migration).
pub fn run_remote(
    opts: &KvmOptions,
    socket: &Path,
    incoming: Option<Incoming>,
) -> anyhow::Result<KvmReport> {
    let kvm = open_kvm()?;
    if incoming.is_some() || opts.outgoing.is_some() {
        snapshot::check_supported(opts)?;
    }
    anyhow::ensure!(
        opts.vms == 1,
        "--vfio-user runs one VM per process (--vms 1)"
    );
    anyhow::ensure!(
        opts.workloads.len() <= super::abi::MAX_WORKLOADS,
        "at most {} workloads per run",
        super::abi::MAX_WORKLOADS
    );
    let remote = RemoteVgpu::connect(socket)?;
    if opts.calibrate > 0 {
        let n = opts.calibrate.min(100_000);
        eprintln!(
            "gpuvm: vfio-user region read round trip (config dword, {n} reads): {} ns",
            remote.round_trip_ns(n)
        );
    }
    let dev: Arc<dyn VgpuDevice> = Arc::new(remote);
    let ctx = RunCtx::detached();
    *ctx.incoming.lock().unwrap_or_else(|e| e.into_inner()) = incoming;
    let report = run_vm(&kvm, 0, dev.clone(), &ctx, opts);
    // Closing the connection tells the daemon to tear this VM's vGPU down.
    drop(dev);
    Ok(KvmReport {
        backend: "kvm-vfio-user",
        pvm: is_pvm(),
        guest_ring: 3,
        clock: ClockKind::Real,
        size: opts.size,
        shadow: opts.shadow,
        scheme: None,
        vms: vec![report],
        host: HostStats::default(),
        gate_open_ns: None,
        samples: Vec::new(),
        recorded: Vec::new(),
    })
}
