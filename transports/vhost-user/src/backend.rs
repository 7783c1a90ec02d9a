//! One VM's vGPU behind rust-vmm's `VhostUserBackendMut`.
//!
//! [`VmDevice`] outlives connections: the VM's name and profile, its current vGPU on the
//! shared `GpuHost`, its interrupt line and its counters. [`PciBackend`] is one connection's
//! back end: queue 0 carries UML's commands (config space, BAR reads, writes and memsets), each
//! checked by [`crate::wire`] and then performed with `Vgpu::config_read/write` and
//! `Vgpu::bar_read/write`; queue 1 carries interrupts back ([`crate::irq`]). The vhost-user
//! memory table becomes the vGPU's guest memory (`attach_guest_memory`): DMA is plain guest
//! memory. The back-end request channel UML opens (BACKEND_REQ) is kept for the connection's
//! life: dropping it makes UML read EOF on it and unregister the device at the next interrupt.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpuvm::host::{GpuHost, HostError};
use gpuvm::phys::Bar;
use gpuvm::profile::VgpuProfile;
use gpuvm::vgpu::Vgpu;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackendMut, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddressSpace, GuestMemory};
use vmm_sys_util::epoll::EventSet;

use crate::irq::{Mem, UmlIrq};
use crate::wire::{self, Command};

/// Queue 0: commands. Queue 1: interrupts.
pub const NUM_QUEUES: usize = 2;
/// Queue size offered.
pub const QUEUE_SIZE: usize = 256;

/// One VM served over its socket: survives its clients.
#[derive(Debug)]
pub struct VmDevice {
    name: String,
    profile: VgpuProfile,
    host: Arc<GpuHost>,
    vgpu: Mutex<Option<Arc<Vgpu>>>,
    line: Arc<UmlIrq>,
    rejected: AtomicU64,
    commands: AtomicU64,
    teardowns: AtomicU64,
    connections: AtomicU64,
    unknown: Mutex<std::collections::BTreeMap<u32, RegisterUse>>,
}

/// Accesses of one BAR0 register the device model does not implement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegisterUse {
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
}

/// Distinct unimplemented registers recorded at most (a guest can touch millions).
pub const MAX_UNKNOWN: usize = 4096;

/// Whether the device model implements the BAR0 register at `off` (a region with a handler
/// covers it). The transport only observes; the model itself answers and counts.
fn implemented(off: u32) -> bool {
    gpuvm::mmio::regions::lookup(off).is_some_and(|r| r.handler.is_some())
        || (gpuvm::gf100::pbus::PRAMIN_BASE
            ..gpuvm::gf100::pbus::PRAMIN_BASE + gpuvm::gf100::pbus::PRAMIN_SIZE)
            .contains(&off)
}

impl VmDevice {
    /// Creates the VM's first vGPU.
    pub fn new(
        name: &str,
        profile: VgpuProfile,
        host: Arc<GpuHost>,
    ) -> Result<Arc<VmDevice>, HostError> {
        let dev = VmDevice {
            name: name.to_string(),
            profile,
            host,
            vgpu: Mutex::new(None),
            line: Arc::new(UmlIrq::default()),
            rejected: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            teardowns: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            unknown: Mutex::new(Default::default()),
        };
        let v = dev.create()?;
        *dev.slot() = Some(v);
        Ok(Arc::new(dev))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Vgpu>>> {
        self.vgpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn create(&self) -> Result<Arc<Vgpu>, HostError> {
        let v = self.host.create_vgpu(&self.profile)?;
        self.line.reset();
        v.set_irq_line(self.line.clone());
        Ok(v)
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current vGPU (`None` after shutdown).
    pub fn vgpu(&self) -> Option<Arc<Vgpu>> {
        self.slot().clone()
    }

    /// The interrupt line.
    pub fn line(&self) -> &Arc<UmlIrq> {
        &self.line
    }

    /// Commands refused (malformed or out of range) since the daemon started.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::SeqCst)
    }

    /// Commands performed.
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::SeqCst)
    }

    /// vGPUs torn down (disconnects, resets).
    pub fn teardowns(&self) -> u64 {
        self.teardowns.load(Ordering::SeqCst)
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    /// The BAR0 registers outside the device model's implementation the guests touched:
    /// the map of what the model lacks (since the daemon started).
    pub fn unknown_registers(&self) -> Vec<(u32, RegisterUse)> {
        let m = self.unknown.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn note_bar0(&self, offset: u64, len: usize, write: bool) {
        let first = (offset & !3) as u32;
        let last = ((offset + len as u64 - 1) & !3) as u32;
        let mut m = self.unknown.lock().unwrap_or_else(|e| e.into_inner());
        let mut reg = first;
        while reg <= last {
            if !implemented(reg) && (m.len() < MAX_UNKNOWN || m.contains_key(&reg)) {
                let u = m.entry(reg).or_default();
                if write {
                    u.writes += 1;
                } else {
                    u.reads += 1;
                }
            }
            reg += 4;
        }
    }

    pub(crate) fn connected(&self) {
        self.connections.fetch_add(1, Ordering::SeqCst);
    }

    /// One line on standard error (and the log) about this VM.
    pub fn event(&self, msg: &str) {
        log::info!("[{}] {msg}", self.name);
        eprintln!("gpuvm vhost-user: [{}] {msg}", self.name);
    }

    /// Destroys the vGPU (channels stopped, VRAM slice scrubbed, DMA windows unmapped) and,
    /// unless `last`, creates a fresh one from the same profile: what a disconnect, a crash or
    /// a reset of the guest gets.
    pub fn recycle(&self, why: &str, last: bool) -> Result<(), HostError> {
        let mut slot = self.slot();
        if let Some(old) = slot.take() {
            if let Err(e) = self.host.destroy_vgpu(&old) {
                self.event(&format!("destroying the vGPU: {e}"));
            }
            self.teardowns.fetch_add(1, Ordering::SeqCst);
        }
        self.line.reset();
        if last {
            return Ok(());
        }
        let v = self.create()?;
        self.event(&format!(
            "{why}: vGPU destroyed and scrubbed, fresh {}",
            v.id()
        ));
        *slot = Some(v);
        Ok(())
    }

    fn reject(&self, e: &str) {
        let n = self.rejected.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= 16 || n.is_power_of_two() {
            self.event(&format!("command refused ({n} so far): {e}"));
        }
    }
}

/// One connection's back end.
pub struct PciBackend {
    dev: Arc<VmDevice>,
    vgpu: Arc<Vgpu>,
    mem: Option<Mem>,
    backend_req: Option<Backend>,
    event_idx: bool,
}

impl PciBackend {
    /// A back end for a new client of `dev` (`None` after shutdown).
    pub fn new(dev: Arc<VmDevice>) -> Option<PciBackend> {
        let vgpu = dev.vgpu()?;
        Some(PciBackend {
            dev,
            vgpu,
            mem: None,
            backend_req: None,
            event_idx: false,
        })
    }

    /// Whether UML's back-end request channel is held.
    pub fn has_backend_req(&self) -> bool {
        self.backend_req.is_some()
    }

    /// Performs one checked command; returns the bytes to give back (reads) or an error.
    pub fn perform(&self, cmd: &Command) -> Result<Vec<u8>, String> {
        let v = &self.vgpu;
        match cmd {
            Command::CfgRead { offset, size } => {
                let mut out = vec![0u8; *size];
                for (off, len) in cfg_pieces(*offset, *size) {
                    let a = usize::from(off - offset);
                    v.config_read(off, &mut out[a..a + len]);
                }
                Ok(out)
            }
            Command::CfgWrite { offset, data } => {
                for (off, len) in cfg_pieces(*offset, data.len()) {
                    let a = usize::from(off - offset);
                    v.config_write(off, &data[a..a + len]);
                }
                // MSI routing may have changed.
                self.dev
                    .line
                    .set_msi(v.msi().filter(|m| m.enabled).map(|m| m.data));
                Ok(Vec::new())
            }
            Command::MmioRead { bar, offset, size } => {
                let target = bar_of(*bar, *offset, *size)?;
                if target == Some(Bar::Bar0) {
                    self.dev.note_bar0(*offset, *size, false);
                }
                let mut out = vec![0xffu8; *size];
                if let Some(b) = target {
                    for (off, len) in wire::split(*offset, *size) {
                        let a = (off - offset) as usize;
                        v.bar_read(b, off, &mut out[a..a + len]);
                    }
                }
                Ok(out)
            }
            Command::MmioWrite { bar, offset, data } => {
                if let Some(b) = bar_of(*bar, *offset, data.len())? {
                    if b == Bar::Bar0 {
                        self.dev.note_bar0(*offset, data.len(), true);
                    }
                    for (off, len) in wire::split(*offset, data.len()) {
                        let a = (off - offset) as usize;
                        v.bar_write(b, off, &data[a..a + len]);
                    }
                }
                Ok(Vec::new())
            }
            Command::MmioMemset {
                bar,
                offset,
                size,
                value,
            } => {
                if let Some(b) = bar_of(*bar, *offset, *size)? {
                    if b == Bar::Bar0 {
                        self.dev.note_bar0(*offset, *size, true);
                    }
                    v.bar_fill(b, *offset, *size as u64, *value);
                }
                Ok(Vec::new())
            }
        }
    }

    /// Serves every command UML queued; returns whether any was.
    fn serve_commands(&self, vring: &VringRwLock<Mem>) -> io::Result<bool> {
        let Some(atomic) = self.mem.clone() else {
            return Ok(false);
        };
        let mem = atomic.memory();
        let mut any = false;
        loop {
            let chain = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone());
            let Some(chain) = chain else { break };
            any = true;
            let head = chain.head_index();
            let mut input = Vec::new();
            let mut outs = Vec::new();
            let mut bad = None;
            for d in chain.clone() {
                if d.is_write_only() {
                    outs.push((d.addr(), d.len() as usize));
                    continue;
                }
                let len = d.len() as usize;
                if input.len() + len > wire::HDR_LEN + wire::MAX_ACCESS as usize {
                    bad = Some("command larger than any access".to_string());
                    break;
                }
                let at = input.len();
                input.resize(at + len, 0);
                if let Err(e) = mem.read_slice(&mut input[at..], d.addr()) {
                    bad = Some(format!("command buffer outside guest memory: {e}"));
                    break;
                }
            }
            let result = match bad {
                Some(e) => Err(e),
                None => wire::parse(&input)
                    .map_err(|e| e.to_string())
                    .and_then(|c| self.perform(&c)),
            };
            let mut written = 0usize;
            match result {
                Ok(out) => {
                    self.dev.commands.fetch_add(1, Ordering::SeqCst);
                    let room: usize = outs.iter().map(|o| o.1).sum();
                    if room < out.len() {
                        self.dev.reject(&format!(
                            "answer of {} bytes, {room} bytes of room",
                            out.len()
                        ));
                    } else {
                        for (addr, len) in outs {
                            if written == out.len() {
                                break;
                            }
                            let n = len.min(out.len() - written);
                            if mem.write_slice(&out[written..written + n], addr).is_err() {
                                self.dev.reject("answer buffer outside guest memory");
                                break;
                            }
                            written += n;
                        }
                    }
                }
                Err(e) => self.dev.reject(&e),
            }
            vring
                .add_used(head, written as u32)
                .map_err(|e| io::Error::other(format!("{e:?}")))?;
        }
        Ok(any)
    }
}

/// Config-space pieces of at most 4 bytes, naturally aligned (the device model takes 1, 2, 4).
fn cfg_pieces(offset: u16, len: usize) -> impl Iterator<Item = (u16, usize)> {
    wire::split(u64::from(offset), len).flat_map(|(off, l)| {
        let n = if l == 8 { 2 } else { 1 };
        let l = l.min(4);
        (0..n).map(move |i| (off as u16 + (i * l) as u16, l))
    })
}

/// The device-model BAR of a virt-pci BAR number, after a bounds check. `Ok(None)`: BAR5, the
/// I/O window the model does not emulate (reads all-ones, writes dropped).
fn bar_of(bar: u8, offset: u64, len: usize) -> Result<Option<Bar>, String> {
    let (b, size) = match bar {
        0 => (Some(Bar::Bar0), Bar::Bar0.size()),
        1 => (Some(Bar::Bar1), Bar::Bar1.size()),
        3 => (Some(Bar::Bar3), Bar::Bar3.size()),
        5 => (None, gpuvm::gf100::pci::BAR5_SIZE),
        _ => return Err(format!("BAR {bar} does not exist")),
    };
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(b),
        _ => Err(format!(
            "{len} bytes at {offset:#x} of BAR {bar} ({size:#x} bytes)"
        )),
    }
}

impl VhostUserBackendMut for PciBackend {
    type Bitmap = ();
    type Vring = VringRwLock<Mem>;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // BACKEND_REQ: without it UML's IRQ setup fails ("genirq: Flags mismatch irq 0").
        VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::BACKEND_REQ
    }

    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    fn update_memory(&mut self, mem: Mem) -> io::Result<()> {
        let snapshot = (*mem.memory()).clone();
        let regions = snapshot.num_regions();
        self.vgpu
            .detach_guest_memory()
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.vgpu
            .attach_guest_memory(snapshot)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.dev
            .event(&format!("guest memory attached ({regions} region(s))"));
        self.mem = Some(mem);
        Ok(())
    }

    fn set_backend_req_fd(&mut self, backend: Backend) {
        // Kept: UML reads EOF on a dropped channel and unregisters the device.
        self.backend_req = Some(backend);
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock<Mem>],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        let Some(mem) = self.mem.clone() else {
            return Ok(());
        };
        if let Some(irq) = vrings.get(1) {
            self.dev.line.attach(irq.clone(), mem);
        }
        match device_event {
            0 => {
                if let Some(cmd) = vrings.first() {
                    if self.serve_commands(cmd)? {
                        cmd.signal_used_queue()?;
                    }
                }
            }
            1 => self.dev.line.kick(),
            _ => {}
        }
        Ok(())
    }
}
