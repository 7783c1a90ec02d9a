//! One VM's vGPU behind `vfio_user::ServerBackend`.
//!
//! [`VmDevice`] is what outlives connections: the VM's name and profile, its current vGPU on
//! the shared `GpuHost` and its interrupt line. [`VgpuBackend`] is one connection's view: the
//! client's DMA maps and the checks on every request. Region accesses go to
//! `Vgpu::config_read/write` and `Vgpu::bar_read/write` after [`crate::regions::check`]; DMA maps
//! become the vGPU's guest memory ([`crate::dma`]), its DMA window grown to hold them when
//! windows are sized from the RAM ([`crate::dma::DmaWindows`]); SET_IRQS connects the INTx eventfd
//! ([`crate::irq`]: INTx or MSI); DEVICE_RESET destroys the vGPU (its VRAM slice scrubbed) and
//! creates a fresh one from the same profile (with the window the maps need), keeping the DMA maps and the eventfd as a function-level
//! reset keeps the IOMMU and the VMM's interrupt routing. When the connection ends, however it
//! ends, the daemon tears the vGPU down the same way and the next client gets a fresh one.
//!
//! Refusals are counted and logged (rate-limited) with the VM's name. A refused region access is
//! answered by content — all-ones for a read, a write dropped — never with an error reply:
//! Cloud Hypervisor's client ignores the error flag and waits for the full reply, so an error
//! would block the guest's vCPU for good. The one exception is a read larger than 4 KiB (no
//! client's guest access is that large): filling it would commit memory the crate only
//! reserved. Other refused requests (DMA maps, SET_IRQS) get an error reply (`io::Error`).
//!
//! **Restores.** Cloud Hypervisor v53 does not support snapshot/restore or migration of a VM
//! with a vfio-user device, and does not refuse it either: the restored VM connects again and
//! carries on as if its GPU had kept its state. Every connection gets a freshly reset vGPU
//! anyway (the previous one is scrubbed when its client goes); on top of that a restore is
//! recognised by the order of the client's first configuration access: a booting client first
//! *reads* configuration space (it walks the capability list), a restoring Cloud Hypervisor
//! first *writes* PCI_COMMAND (it pushes its saved command word, `VfioCommon::set_state`). Such
//! a connection is refused by content: every region access reads all-ones and drops writes (a
//! guest driver sees a device that fell off the bus rather than a GPU silently missing its
//! state), counted and logged.

use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use gpuvm::host::{GpuHost, HostError};
use gpuvm::profile::VgpuProfile;
use gpuvm::vgpu::Vgpu;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_TYPE_MASK,
    VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_IRQ_SET_DATA_TYPE_MASK,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, ServerBackend};
use vm_memory::{GuestMemory, GuestMemoryMmap};

use crate::dma::{DmaMaps, DmaWindows};
use crate::irq::{adopt_eventfd, VgpuIrq};
use crate::peer::{self, Peer};
use crate::regions::{self, Target};
use crate::traffic::Traffic;

/// What a VM's vGPUs did, summed over its life or over one vGPU: the VM's counters that
/// survive its clients (each client gets a fresh vGPU whose own counters start at 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmTotals {
    /// GPU time charged to it, ns.
    pub gpu_busy_ns: u64,
    /// Doorbells (GP_PUT writes).
    pub doorbells: u64,
    /// Submissions dispatched.
    pub submissions: u64,
    /// Submissions completed.
    pub completions: u64,
    /// Trapped BAR accesses.
    pub exits: u64,
    /// MMU faults and BAR faults delivered to the guest.
    pub faults: u64,
    /// Isolation violations refused.
    pub violations: u64,
    /// Channels killed by the hang watchdog.
    pub watchdog_kills: u64,
}

impl VmTotals {
    /// The counters of one vGPU now (its GPU time as the host's scheduler charged it).
    pub fn of(host: &GpuHost, v: &Vgpu) -> VmTotals {
        let vs = v.stats();
        let busy = host
            .sched_stats()
            .vms
            .iter()
            .find(|s| s.vm == v.id())
            .map_or(0, |s| s.busy_ns);
        VmTotals {
            gpu_busy_ns: busy,
            doorbells: vs.doorbells,
            submissions: vs.submissions,
            completions: vs.completions,
            exits: vs.exits.total(),
            faults: vs.faults_delivered + vs.bar_faults,
            violations: vs.violations.total,
            watchdog_kills: vs.watchdog_kills,
        }
    }
}

impl std::ops::Add for VmTotals {
    type Output = VmTotals;
    fn add(self, o: VmTotals) -> VmTotals {
        VmTotals {
            gpu_busy_ns: self.gpu_busy_ns + o.gpu_busy_ns,
            doorbells: self.doorbells + o.doorbells,
            submissions: self.submissions + o.submissions,
            completions: self.completions + o.completions,
            exits: self.exits + o.exits,
            faults: self.faults + o.faults,
            violations: self.violations + o.violations,
            watchdog_kills: self.watchdog_kills + o.watchdog_kills,
        }
    }
}

/// The client a VM is served to now: who it is (`SO_PEERCRED`), since when, and the server
/// end of its connection (to close it when the device fails).
#[derive(Debug, Clone)]
pub struct Holder {
    /// The peer, if its descriptor was found.
    pub peer: Option<Peer>,
    /// When it connected (the log lines' time format).
    pub since: String,
    /// The server end of its connection, owned by the `vfio_user` crate; valid only while the
    /// connection lasts (the holder is cleared before the crate closes it).
    pub(crate) fd: Option<RawFd>,
}

/// One VM served over its socket: survives its clients.
#[derive(Debug)]
pub struct VmDevice {
    name: String,
    profile: Mutex<VgpuProfile>,
    cap_ppm: Mutex<Option<u32>>,
    waker: std::sync::OnceLock<Arc<crate::waker::Waker>>,
    host: Arc<GpuHost>,
    /// How its vGPUs' DMA windows are sized.
    windows: DmaWindows,
    vgpu: Mutex<Option<Arc<Vgpu>>>,
    line: Arc<VgpuIrq>,
    stopping: AtomicBool,
    teardowns: AtomicU64,
    rejected: AtomicU64,
    connections: AtomicU64,
    client: AtomicBool,
    /// The guest RAM the connected client mapped (what a restore attaches).
    ram: Mutex<Option<GuestMemoryMmap>>,
    /// Bumped when a restore replaces the vGPU under a connection (the backend adopts it).
    generation: AtomicU64,
    /// A migration of the vGPU out is in progress.
    pub(crate) migrating: AtomicBool,
    /// Counters of its vGPUs already destroyed (the current one's are added when read).
    retired: Mutex<VmTotals>,
    /// vGPUs created for it so far: the current one's generation (1 for the first).
    vgpus: AtomicU64,
    /// Bytes the clients moved through its BARs and configuration space, all connections.
    bytes_total: AtomicU64,
    /// The same, the current connection.
    bytes_session: AtomicU64,
    /// Its socket path (to find a connection's descriptor), once served.
    socket: Mutex<Option<PathBuf>>,
    /// The client served now, and a condition variable signalled when that changes.
    pub(crate) holder: Mutex<Option<Holder>>,
    pub(crate) holder_changed: Condvar,
    /// Signalled when the holder goes (wakes the busy-socket watcher out of `poll`).
    pub(crate) holder_gone: vmm_sys_util::eventfd::EventFd,
}

impl VmDevice {
    /// Creates the VM's first vGPU, with a DMA window as `windows` says (the smallest one when
    /// sized from the RAM: no client has mapped any yet).
    pub fn new(
        name: &str,
        profile: VgpuProfile,
        host: Arc<GpuHost>,
        windows: DmaWindows,
    ) -> Result<Arc<VmDevice>, HostError> {
        let dev = VmDevice {
            name: name.to_string(),
            profile: Mutex::new(profile),
            cap_ppm: Mutex::new(None),
            waker: std::sync::OnceLock::new(),
            host,
            windows,
            vgpu: Mutex::new(None),
            line: Arc::new(VgpuIrq::new()),
            stopping: AtomicBool::new(false),
            teardowns: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            client: AtomicBool::new(false),
            ram: Mutex::new(None),
            generation: AtomicU64::new(0),
            migrating: AtomicBool::new(false),
            retired: Mutex::new(VmTotals::default()),
            vgpus: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            bytes_session: AtomicU64::new(0),
            socket: Mutex::new(None),
            holder: Mutex::new(None),
            holder_changed: Condvar::new(),
            holder_gone: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)
                .map_err(|e| HostError::Config(format!("eventfd: {e}")))?,
        };
        let v = dev.create()?;
        *dev.slot() = Some(v);
        Ok(Arc::new(dev))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Vgpu>>> {
        self.vgpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn create(&self) -> Result<Arc<Vgpu>, HostError> {
        let p = self.profile();
        let v = match self.windows {
            DmaWindows::Fixed => self.host.create_vgpu(&p)?,
            // The window the client's maps need (kept across a device reset), else the
            // smallest: a DMA_MAP grows it.
            DmaWindows::FromRam { .. } => {
                let end = self.ram().map_or(0, |m| m.last_addr().0 + 1);
                self.host.create_vgpu_for_ram(&p, end)?
            }
        };
        self.line.reset();
        self.configure(&v);
        self.vgpus.fetch_add(1, Ordering::SeqCst);
        Ok(v)
    }

    /// Destroys `old` (the slot's vGPU, taken out under the slot lock by the caller) after
    /// adding its counters to the VM's lifetime totals.
    fn retire(&self, old: &Vgpu) {
        let t = VmTotals::of(&self.host, old);
        {
            let mut r = Self::lock(&self.retired);
            *r = *r + t;
        }
        if let Err(e) = self.host.destroy_vgpu(old) {
            self.event(&format!("destroying the vGPU: {e}"));
        }
        self.teardowns.fetch_add(1, Ordering::SeqCst);
    }

    /// The VM's counters over its whole life (every vGPU it had, the current one included),
    /// and the current vGPU's alone (zero without one).
    pub fn totals(&self) -> (VmTotals, VmTotals) {
        let slot = self.slot();
        let current = slot
            .as_ref()
            .map(|v| VmTotals::of(&self.host, v))
            .unwrap_or_default();
        let retired = *Self::lock(&self.retired);
        (retired + current, current)
    }

    /// The current vGPU's generation: how many vGPUs the VM has had (1 for the first; each
    /// client, device reset and restore gets a fresh one).
    pub fn vgpu_generation(&self) -> u64 {
        self.vgpus.load(Ordering::SeqCst)
    }

    /// Bytes the clients moved through the device's regions (BARs and configuration space):
    /// over the VM's life, and in the current connection.
    pub fn bytes_moved(&self) -> (u64, u64) {
        (
            self.bytes_total.load(Ordering::Relaxed),
            self.bytes_session.load(Ordering::Relaxed),
        )
    }

    fn moved(&self, n: usize) {
        self.bytes_total.fetch_add(n as u64, Ordering::Relaxed);
        self.bytes_session.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The client served now, if any (who, since when).
    pub fn holder(&self) -> Option<Holder> {
        Self::lock(&self.holder).clone()
    }

    pub(crate) fn set_socket(&self, path: PathBuf) {
        *Self::lock(&self.socket) = Some(path);
    }

    /// Records the client now served (called from inside the connection, where the crate's
    /// stream is open) and logs who it is.
    fn set_holder(&self) -> Option<RawFd> {
        let path = Self::lock(&self.socket).clone();
        let fd = path.as_deref().and_then(peer::connection_fd);
        let peer = fd.and_then(|fd| {
            // SAFETY: `fd` is the crate's open connection (we are inside its request loop).
            peer::peer_of(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        });
        self.event(&match peer {
            Some(p) => format!("client is {p}"),
            None => "client's credentials unknown (its connection descriptor was not found)".into(),
        });
        *Self::lock(&self.holder) = Some(Holder {
            peer,
            since: crate::say::now(),
            fd,
        });
        self.holder_changed.notify_all();
        fd
    }

    /// Forgets the client (its connection ended or is about to): the busy-socket watcher stops
    /// refusing newcomers.
    pub(crate) fn clear_holder(&self) {
        *Self::lock(&self.holder) = None;
        let _ = self.holder_gone.write(1);
        self.holder_changed.notify_all();
    }

    /// What the VM's settings give every vGPU of it: the cap and weight set at run time (a
    /// reconnect or a restore keeps them) and the interrupt line.
    fn configure(&self, v: &Vgpu) {
        let cap = *Self::lock(&self.cap_ppm);
        if cap.is_some() {
            if let Err(e) = self.host.set_vm_cap(v.id(), cap) {
                self.event(&format!("cap not applied to the vGPU: {e}"));
            }
        }
        let weight = self.profile().weight;
        if v.profile().weight != weight {
            if let Err(e) = self.host.set_vm_weight(v.id(), weight) {
                self.event(&format!("weight not applied to the vGPU: {e}"));
            }
        }
        v.set_irq_line(self.line.clone());
    }

    /// Replaces the VM's vGPU by what `build` makes (the old one destroyed first); if `build`
    /// fails, by a fresh one. The interrupt line keeps the client's eventfds. Connections adopt
    /// the new vGPU at their next request ([`VmDevice::generation`]).
    pub(crate) fn replace_vgpu(
        &self,
        build: impl FnOnce(&GpuHost) -> Result<Arc<Vgpu>, String>,
    ) -> Result<Arc<Vgpu>, String> {
        let mut slot = self.slot();
        if self.stopping.load(Ordering::SeqCst) {
            return Err("the daemon is stopping".into());
        }
        if let Some(old) = slot.take() {
            self.retire(&old);
        }
        let r = build(&self.host);
        match &r {
            Ok(v) => {
                self.configure(v);
                self.vgpus.fetch_add(1, Ordering::SeqCst);
                *slot = Some(v.clone());
            }
            Err(_) => match self.create() {
                Ok(v) => {
                    *slot = Some(v);
                }
                Err(e) => self.event(&format!("a fresh vGPU failed too: {e}")),
            },
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// Counts vGPU replacements under a connection (see [`VmDevice::replace_vgpu`]).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The guest RAM the connected client mapped, if any.
    pub fn ram(&self) -> Option<GuestMemoryMmap> {
        Self::lock(&self.ram).clone()
    }

    pub(crate) fn set_ram(&self, ram: Option<GuestMemoryMmap>) {
        *Self::lock(&self.ram) = ram;
    }

    /// How the VM's DMA windows are sized.
    pub fn windows(&self) -> DmaWindows {
        self.windows
    }

    /// Makes `v`'s DMA window hold guest RAM that ends at `end` (its RAM detached): a window
    /// too small is grown to the next power of two of `end` if the host allows it (nothing
    /// can use the window yet: no channel bound); otherwise the refusal names both sizes and
    /// the window stays as it was.
    fn fit_window(&self, v: &Vgpu, end: u64) -> io::Result<()> {
        let (_, size) = self
            .host
            .dma_window(v)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if end <= size {
            return Ok(());
        }
        match self.host.resize_dma_window(v, end) {
            Ok((base, grown)) => {
                self.event(&format!(
                    "DMA window grown from {size:#x} to {grown:#x} bytes (IOVA {base:#x}) for guest RAM ending at {end:#x}"
                ));
                Ok(())
            }
            Err(e) => Err(einval(format!(
                "guest RAM ending at {end:#x} does not fit the vGPU's {size:#x}-byte DMA window, which cannot grow: {e}"
            ))),
        }
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The VM's profile (with a weight changed at run time).
    pub fn profile(&self) -> VgpuProfile {
        Self::lock(&self.profile).clone()
    }

    /// The cap set for the VM (ppm), if any.
    pub fn cap_ppm(&self) -> Option<u32> {
        *Self::lock(&self.cap_ppm)
    }

    /// The host it runs on.
    pub fn host(&self) -> &Arc<GpuHost> {
        &self.host
    }

    pub(crate) fn set_waker(&self, w: Arc<crate::waker::Waker>) {
        let _ = self.waker.set(w);
    }

    /// Wakes the daemon's poller if this VM's last access made something due sooner.
    pub(crate) fn nudge(&self) {
        if let Some(w) = self.waker.get() {
            w.nudge(&self.host);
        }
    }

    /// Changes the VM's weight (1-100) now and for every later vGPU of it. Refused (nothing
    /// changed) by the host for a weight out of range or a policy without weights.
    pub fn set_weight(&self, weight: u32) -> Result<(), HostError> {
        let mut p = Self::lock(&self.profile);
        if let Some(v) = self.vgpu() {
            self.host.set_vm_weight(v.id(), weight)?;
        } else {
            return Err(HostError::Config("the VM has no vGPU".into()));
        }
        p.weight = weight;
        drop(p);
        if let Some(w) = self.waker.get() {
            w.kick();
        }
        Ok(())
    }

    /// Sets or clears the VM's cap (ppm) now and for every later vGPU of it. Refused (nothing
    /// changed) for a cap out of range or a policy without caps.
    pub fn set_cap(&self, cap_ppm: Option<u32>) -> Result<(), HostError> {
        let mut c = Self::lock(&self.cap_ppm);
        if let Some(v) = self.vgpu() {
            self.host.set_vm_cap(v.id(), cap_ppm)?;
        } else {
            return Err(HostError::Config("the VM has no vGPU".into()));
        }
        *c = cap_ppm;
        drop(c);
        if let Some(w) = self.waker.get() {
            w.kick();
        }
        Ok(())
    }

    /// The current vGPU (`None` once the daemon shut down).
    pub fn vgpu(&self) -> Option<Arc<Vgpu>> {
        self.slot().clone()
    }

    /// The interrupt line.
    pub fn line(&self) -> &Arc<VgpuIrq> {
        &self.line
    }

    /// vGPUs torn down (disconnects, crashes, resets).
    pub fn teardowns(&self) -> u64 {
        self.teardowns.load(Ordering::SeqCst)
    }

    /// Requests refused since the daemon started.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    pub(crate) fn connected(&self) {
        self.connections.fetch_add(1, Ordering::SeqCst);
        self.bytes_session.store(0, Ordering::Relaxed);
        self.client.store(true, Ordering::SeqCst);
    }

    pub(crate) fn disconnected(&self) {
        self.client.store(false, Ordering::SeqCst);
    }

    /// True while a client is connected.
    pub fn has_client(&self) -> bool {
        self.client.load(Ordering::SeqCst)
    }

    /// Prints a per-VM event on standard error, timestamped (and logs it).
    pub fn event(&self, msg: &str) {
        crate::say::say(format_args!("[{}] {msg}", self.name));
    }

    /// Destroys the current vGPU (channels stopped, work dropped, VRAM slice scrubbed, DMA
    /// windows unmapped) and, unless the daemon is stopping, creates a fresh one from the same
    /// profile.
    pub fn recycle(&self, why: &str) -> Result<Option<Arc<Vgpu>>, HostError> {
        let mut slot = self.slot();
        if let Some(old) = slot.take() {
            self.retire(&old);
        }
        self.line.reset();
        if self.stopping.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let v = self.create()?;
        self.event(&format!(
            "{why}: vGPU destroyed and scrubbed, fresh vGPU generation {} (host id {}, profile '{}')",
            self.vgpu_generation(),
            v.id(),
            self.profile().name
        ));
        *slot = Some(v.clone());
        Ok(Some(v))
    }

    /// Destroys the vGPU for good (daemon shutdown).
    pub fn shut_down(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.recycle("shutdown");
    }

    /// Counts one refused request; returns the count so far.
    pub(crate) fn count_refusal(&self) -> u64 {
        self.rejected.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn reject(&self, e: io::Error) -> io::Error {
        let n = self.rejected.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= 16 || n.is_power_of_two() {
            self.event(&format!("request refused ({n} so far): {e}"));
        }
        e
    }
}

/// Phase markers logged per connection; later ones are counted, not logged.
const MARKS_LOGGED: u64 = 256;

/// The largest refused read answered by content (all-ones): the whole configuration space, the
/// largest access the device takes.
const MAX_READ_ANSWERED: usize = 4096;

/// One connection's backend.
pub struct VgpuBackend {
    dev: Arc<VmDevice>,
    vgpu: Arc<Vgpu>,
    dma: DmaMaps,
    accesses: u64,
    /// The "work on the GPU" event was logged for this client.
    submitting: bool,
    /// Submissions finished at the last look, if work was outstanding then.
    outstanding_at: Option<u64>,
    traffic: Traffic,
    /// A configuration access was seen (the restore check looks at the first one only).
    config_seen: bool,
    /// The client was recognised as a restored VM: every region access is refused.
    restored: bool,
    /// Traffic at the last phase marker, and the markers seen.
    last_mark: Traffic,
    marks: u64,
    /// The device's [`VmDevice::generation`] this connection's vGPU is from.
    generation: u64,
    /// The client was identified (first request seen): the server end of its connection.
    conn: Option<Option<RawFd>>,
    /// The device failed for this client (why): every later request is refused.
    failed: Option<String>,
}

/// What the daemon tells an operator whose VMM maps guest RAM that is not sealed.
pub const UNSEALED_DMA_FIX: &str = "Cloud Hypervisor's guest memory is such a file: start the daemon with `gpuvm serve --allow-unsealed-dma` to accept it (docs/cloud-hypervisor.md), or have the VMM share its RAM as a memfd sealed with F_SEAL_SHRINK";

fn einval(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.into())
}

impl VgpuBackend {
    /// A backend for a new client of `dev` (`None` once the daemon shut down). With
    /// `require_sealed_dma`, DMA map files must be sealed against shrinking.
    pub fn new(dev: Arc<VmDevice>, require_sealed_dma: bool) -> Option<VgpuBackend> {
        let vgpu = dev.vgpu()?;
        let dma = match dev.windows {
            DmaWindows::Fixed => DmaMaps::with_fix(
                dev.host.config().iova_window,
                require_sealed_dma,
                ": start gpuvm serve with a larger --dma-window-mib, or without it to size each VM's window from its RAM",
            ),
            DmaWindows::FromRam { max } => DmaMaps::with_fix(
                max,
                require_sealed_dma,
                ": start gpuvm serve with a larger --dma-window-max-mib",
            ),
        };
        let generation = dev.generation();
        Some(VgpuBackend {
            dev,
            vgpu,
            dma,
            accesses: 0,
            submitting: false,
            outstanding_at: None,
            traffic: Traffic::default(),
            config_seen: false,
            restored: false,
            last_mark: Traffic::default(),
            marks: 0,
            generation,
            conn: None,
            failed: None,
        })
    }

    /// At the connection's first request: who the client is (logged; the busy-socket watcher
    /// names it to a second client).
    fn identify(&mut self) {
        if self.conn.is_none() {
            self.conn = Some(self.dev.set_holder());
        }
    }

    /// Fails the device for this client: logs `why` with the fix, refuses every later request
    /// and shuts the connection down, so that the VMM's pending request fails at once (a
    /// vfio-user client such as Cloud Hypervisor's ignores an error reply to DMA_MAP, but not a
    /// closed connection) instead of its guest failing later on memory the GPU cannot reach.
    fn fail(&mut self, why: String) -> io::Error {
        self.dev.event(&format!(
            "device failed for this client: {why}; closing the connection"
        ));
        if let Some(Some(fd)) = self.conn {
            // SAFETY: `fd` is the crate's connection, open while this backend serves it;
            // shutdown(2) does not close it, it only ends both directions.
            let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
        }
        self.failed = Some(why.clone());
        self.dev.rejected.fetch_add(1, Ordering::SeqCst);
        io::Error::new(io::ErrorKind::PermissionDenied, why)
    }

    /// The refusal of a request after the device failed.
    fn refuse_failed(&mut self) -> Option<io::Error> {
        let why = self.failed.clone()?;
        self.traffic.refused += 1;
        self.dev.rejected.fetch_add(1, Ordering::SeqCst);
        Some(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the device failed for this client: {why}"),
        ))
    }

    /// A phase marker: a 4-byte write at offset 0 of BAR5 (the I/O window the device model does
    /// not emulate). The test guest writes one at each phase boundary (driver init, each
    /// workload, the end); the daemon logs the messages since the previous marker, which is
    /// how messages per workload are measured under Cloud Hypervisor. Counted like any access.
    fn mark(&mut self, value: u32) {
        self.marks += 1;
        if self.marks <= MARKS_LOGGED {
            let since = self.traffic - self.last_mark;
            self.dev.event(&format!(
                "phase mark {value:#x}: since the previous mark {since}"
            ));
        }
        self.last_mark = self.traffic;
    }

    /// This connection's messages so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }

    /// True if the client was recognised as a restored VM (see the module doc).
    pub fn restored(&self) -> bool {
        self.restored
    }

    /// Adopts a vGPU a restore put in place since the last request: the guest goes on with
    /// it (a migrated VM is not a booting one, so the restore check does not apply). Its RAM
    /// is what this connection had mapped when the restore read [`VmDevice::ram`]; it is not
    /// attached again here, because detaching and attaching unmaps the DMA windows for a
    /// moment while the restored guest's work may be running. A client that maps or unmaps
    /// while its own restore runs can leave the vGPU with its previous maps (still its own
    /// memory, kept mapped) until its next DMA request.
    fn sync(&mut self) {
        let g = self.dev.generation();
        if g != self.generation {
            self.generation = g;
            if let Some(v) = self.dev.vgpu() {
                self.vgpu = v;
            }
            self.config_seen = true;
            self.restored = false;
            self.submitting = false;
            self.outstanding_at = None;
        }
    }

    /// Checks a region access; on refusal counts and logs it (`None`: answer by content).
    fn admit(&mut self, region: u32, offset: u64, len: usize, write: bool) -> Option<Target> {
        self.sync();
        self.identify();
        if self.refuse_failed().is_some() {
            return None;
        }
        let target = match regions::check(region, offset, len) {
            Ok(t) => t,
            Err(e) => {
                self.traffic.refused += 1;
                let _ = self.dev.reject(e);
                return None;
            }
        };
        if let Target::Config(off) = target {
            if !self.config_seen {
                self.config_seen = true;
                if write && off == 4 {
                    self.restored = true;
                    self.dev.event(
                        "restored VM recognised (its first configuration access writes PCI_COMMAND, as Cloud Hypervisor's restore does; a boot reads first): its GPU state is gone, the connection is refused by content (all-ones reads, dropped writes)",
                    );
                }
            }
        }
        if self.restored {
            self.traffic.refused += 1;
            self.dev.rejected.fetch_add(1, Ordering::SeqCst);
            return None;
        }
        self.dev.moved(len);
        Some(target)
    }

    /// Gives the vGPU the current set of DMA maps (its window grown first if they end beyond
    /// it and it may grow).
    fn reattach(&mut self) -> io::Result<()> {
        self.sync();
        self.vgpu
            .detach_guest_memory()
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.dev.set_ram(None);
        if let Some(mem) = self.dma.guest_memory() {
            self.dev.fit_window(&self.vgpu, self.dma.end())?;
            self.vgpu
                .attach_guest_memory(mem.clone())
                .map_err(|e| einval(format!("attaching guest RAM: {e}")))?;
            self.dev.set_ram(Some(mem));
        }
        Ok(())
    }

    fn config_read(&self, offset: u16, data: &mut [u8]) {
        if data.len() <= 4 {
            return self.vgpu.config_read(offset, data);
        }
        for (i, chunk) in data.chunks_mut(4).enumerate() {
            self.vgpu.config_read(offset + 4 * i as u16, chunk);
        }
    }

    fn config_write(&self, offset: u16, data: &[u8]) {
        if data.len() <= 4 {
            return self.vgpu.config_write(offset, data);
        }
        for (i, chunk) in data.chunks(4).enumerate() {
            self.vgpu.config_write(offset + 4 * i as u16, chunk);
        }
    }

    /// Reports, once per client, when the guest first has lasting work on the GPU: a
    /// submission dispatched and still unfinished at two looks 64 BAR accesses apart (a guest
    /// with work in flight goes on polling; a driver's short set-up submissions finish within
    /// a few polls). The looks read the VM's own counters (`Vgpu::stats_local`: its lock
    /// alone), not the host's: a client that never has lasting work is looked at for as long
    /// as it runs, and a host-lock hold every 64 of its exits would make other VMs wait.
    fn note_access(&mut self) {
        self.accesses += 1;
        if self.submitting || !self.accesses.is_multiple_of(64) {
            return;
        }
        let s = self.vgpu.stats_local();
        let finished = s.completions.saturating_add(s.aborted);
        let outstanding = s.submissions > finished;
        if outstanding && self.outstanding_at == Some(finished) {
            self.submitting = true;
            self.dev.event(&format!(
                "work on the GPU ({} doorbells, {} submissions dispatched, {finished} finished)",
                s.doorbells, s.submissions
            ));
        }
        self.outstanding_at = outstanding.then_some(finished);
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> io::Result<()> {
        if (index != regions::INTX && index != regions::MSI) || start != 0 || count > 1 {
            return Err(einval(format!(
                "SET_IRQS index {index} start {start} count {count}: only INTx (index 0) and MSI (index 1), one vector"
            )));
        }
        let action = flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
        let data = flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
        let line = &self.dev.line;
        let want_fds = usize::from(data == VFIO_IRQ_SET_DATA_EVENTFD && count == 1);
        if fds.len() != want_fds
            || flags & !(VFIO_IRQ_SET_ACTION_TYPE_MASK | VFIO_IRQ_SET_DATA_TYPE_MASK) != 0
        {
            return Err(einval(format!(
                "SET_IRQS flags {flags:#x} count {count} with {} file descriptors",
                fds.len()
            )));
        }
        let msi = index == regions::MSI;
        match (action, data, count) {
            (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, 1) => {
                let evt = fds.into_iter().next().ok_or_else(|| einval("no eventfd"))?;
                let evt = Some(adopt_eventfd(evt)?);
                if msi {
                    line.set_msi_eventfd(evt);
                } else {
                    line.set_eventfd(evt);
                }
            }
            (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_NONE, 0) if msi => {
                line.set_msi_eventfd(None)
            }
            (VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_NONE, 0) => line.set_eventfd(None),
            // The MSI capability has no per-vector mask: nothing to do.
            (VFIO_IRQ_SET_ACTION_MASK | VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_NONE, 1)
                if msi => {}
            (VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_DATA_NONE, 1) => line.set_masked(true),
            (VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_NONE, 1) => line.set_masked(false),
            _ => {
                return Err(einval(format!(
                    "SET_IRQS flags {flags:#x} count {count}: supported are TRIGGER with one eventfd, TRIGGER with none and count 0, MASK and UNMASK"
                )))
            }
        }
        Ok(())
    }
}

impl ServerBackend for VgpuBackend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        match self.admit(region, offset, data.len(), false) {
            // Filling a huge buffer would commit the memory the crate only reserved (its
            // zeroed allocation is lazy): a read larger than any the device takes gets an error
            // reply instead (Cloud Hypervisor's accesses are 8 bytes at most).
            None if data.len() > MAX_READ_ANSWERED => {
                return Err(einval(format!(
                    "refused read of {} bytes: answered with an error, not {} bytes of all-ones",
                    data.len(),
                    data.len()
                )))
            }
            None => data.fill(0xff),
            Some(Target::Config(off)) => {
                self.traffic.config_reads += 1;
                self.config_read(off, data)
            }
            Some(Target::Bar(bar, off)) => {
                self.traffic.bar_reads += 1;
                self.vgpu.bar_read(bar, off, data);
                self.note_access();
                self.dev.nudge();
            }
            Some(Target::IoBar) => {
                self.traffic.bar_reads += 1;
                data.fill(0xff)
            }
        }
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.admit(region, offset, data.len(), true) {
            None => {}
            Some(Target::IoBar) => {
                self.traffic.bar_writes += 1;
                if let (0, Ok(v)) = (offset, <[u8; 4]>::try_from(data)) {
                    self.mark(u32::from_le_bytes(v));
                }
            }
            Some(Target::Config(off)) => {
                self.traffic.config_writes += 1;
                self.config_write(off, data)
            }
            Some(Target::Bar(bar, off)) => {
                self.traffic.bar_writes += 1;
                self.vgpu.bar_write(bar, off, data);
                self.note_access();
                self.dev.nudge();
            }
        }
        Ok(())
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> io::Result<()> {
        self.traffic.dma += 1;
        self.identify();
        if let Some(e) = self.refuse_failed() {
            return Err(e);
        }
        if !flags.contains(DmaMapFlags::READ_WRITE) {
            return Err(self.dev.reject(einval(format!(
                "DMA map {address:#x}+{size:#x} with flags {:#x}: the GPU reads and writes guest RAM",
                flags.bits()
            ))));
        }
        match self.dma.map(offset, address, size, fd) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(self.fail(format!(
                    "DMA map {address:#x}+{size:#x} refused: {e}. {UNSEALED_DMA_FIX}"
                )));
            }
            Err(e) => return Err(self.dev.reject(e)),
        }
        if let Err(e) = self.reattach() {
            let _ = self.dma.unmap(address, size, false);
            let _ = self.reattach();
            return Err(self.dev.reject(e));
        }
        Ok(())
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> io::Result<()> {
        self.traffic.dma += 1;
        self.identify();
        if let Some(e) = self.refuse_failed() {
            return Err(e);
        }
        if flags.contains(DmaUnmapFlags::GET_DIRTY_PAGE_INFO) {
            return Err(self
                .dev
                .reject(einval("dirty page tracking is not supported")));
        }
        self.dma
            .unmap(address, size, flags.contains(DmaUnmapFlags::UNMAP_ALL))
            .map_err(|e| self.dev.reject(e))?;
        self.reattach().map_err(|e| self.dev.reject(e))
    }

    fn reset(&mut self) -> io::Result<()> {
        self.sync();
        self.identify();
        if let Some(e) = self.refuse_failed() {
            return Err(e);
        }
        let eventfds = self.dev.line.take_eventfds();
        let fresh = self
            .dev
            .recycle("device reset")
            .map_err(|e| io::Error::other(format!("re-creating the vGPU: {e}")))?
            .ok_or_else(|| io::Error::other("the daemon is shutting down"))?;
        self.vgpu = fresh;
        self.generation = self.dev.generation();
        self.dev.line.restore_eventfds(eventfds);
        self.submitting = false;
        self.outstanding_at = None;
        self.reattach()
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> io::Result<()> {
        self.identify();
        if let Some(e) = self.refuse_failed() {
            return Err(e);
        }
        let unmask = index == regions::INTX
            && flags & VFIO_IRQ_SET_ACTION_TYPE_MASK == VFIO_IRQ_SET_ACTION_UNMASK;
        if unmask {
            self.traffic.unmasks += 1;
        } else {
            self.traffic.set_irqs += 1;
        }
        VgpuBackend::set_irqs(self, index, flags, start, count, fds).map_err(|e| self.dev.reject(e))
    }
}
