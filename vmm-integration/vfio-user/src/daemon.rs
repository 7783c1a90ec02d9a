//! The daemon: one `GpuHost`, one vfio-user socket and one thread per VM, and a poller thread.
//!
//! Each VM's thread waits for a client on its socket, then runs `vfio_user::Server::run` (which
//! accepts the connection and serves it until it closes) with a fresh [`VgpuBackend`]. However
//! the connection ends — the client disconnects or crashes, or the crate panics on a malformed
//! message (it does on some, see `docs/vfio-user.md`; `catch_unwind` contains that) — the VM's
//! vGPU is destroyed and scrubbed and a fresh one waits for the next client. The other VMs'
//! threads never notice. The poller calls `GpuHost::poll` when `GpuHost::next_event_ns` says
//! something is due, so completions, scheduler timers and the hang watchdog advance on the real
//! clock even while every guest waits for an interrupt.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use gpuvm::clock::Clock;
use gpuvm::host::GpuHost;
use gpuvm::profile::VgpuProfile;
use vfio_user::Server;
use vmm_sys_util::eventfd::EventFd;

use crate::backend::{VgpuBackend, VmDevice};
use crate::regions;

/// One VM the daemon serves.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Its name: the socket is `NAME.sock`, logs are prefixed `[NAME]`.
    pub name: String,
    /// Its vGPU.
    pub profile: VgpuProfile,
}

/// What the daemon serves.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where the sockets go (created if missing).
    pub socket_dir: PathBuf,
    /// The VMs.
    pub vms: Vec<VmSpec>,
    /// Refuse DMA map files that are not sealed against shrinking (see [`crate::dma`]).
    pub require_sealed_dma: bool,
}

/// A running daemon.
pub struct Daemon {
    host: Arc<GpuHost>,
    devices: Vec<Arc<VmDevice>>,
    sockets: Vec<PathBuf>,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    poller: Option<JoinHandle<()>>,
    vm_threads: Vec<JoinHandle<()>>,
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// Removes a socket left behind by a daemon that died (nobody accepts on it); refuses to touch
/// anything else.
fn clear_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(bad(format!(
            "{} exists and is not a socket",
            path.display()
        )));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is served by another process", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

/// Waits until a client connects on `listener` (true) or the daemon stops (false).
fn wait_for_client(listener: &UnixListener, wake: &EventFd, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if n > 0 && fds[0].revents & libc::POLLIN != 0 {
            return true;
        }
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Makes sure the VM has a vGPU (creating one can fail, for example while resources are
/// short): retries every second until it has one or the daemon stops.
fn ensure_vgpu(dev: &VmDevice, stop: &AtomicBool) -> bool {
    while dev.vgpu().is_none() {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if let Err(e) = dev.recycle("re-creating the vGPU") {
            dev.event(&format!("cannot create a vGPU ({e}); retrying in 1 s"));
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    true
}

/// One VM's thread: serve a client, tear the vGPU down, serve the next.
fn serve_vm(
    dev: Arc<VmDevice>,
    listener: UnixListener,
    server: Server,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    require_sealed_dma: bool,
) {
    while ensure_vgpu(&dev, &stop) && wait_for_client(&listener, &wake, &stop) {
        let Some(mut backend) = VgpuBackend::new(dev.clone(), require_sealed_dma) else {
            continue;
        };
        dev.connected();
        dev.event("client connected");
        let why = match catch_unwind(AssertUnwindSafe(|| server.run(&mut backend))) {
            Ok(Ok(())) => "client disconnected".to_string(),
            Ok(Err(e)) => format!("connection lost ({e})"),
            Err(p) => format!(
                "vfio_user server panicked on a malformed message ({}); connection dropped",
                panic_message(&*p)
            ),
        };
        if stop.load(Ordering::SeqCst) {
            break;
        }
        // Destroy the vGPU (it stops using the client's RAM) before the maps go; a failure to
        // create the fresh one is retried by `ensure_vgpu`.
        if let Err(e) = dev.recycle(&why) {
            dev.event(&format!("{why}: vGPU destroyed; a fresh one failed: {e}"));
        }
        drop(backend);
    }
}

/// Calls `host.poll()` whenever something is due.
fn poll_host(host: Arc<GpuHost>, clock: Arc<dyn Clock>, stop: Arc<AtomicBool>) {
    const MAX_SLEEP_NS: u64 = 200_000;
    while !stop.load(Ordering::SeqCst) {
        let now = clock.now_ns();
        match host.next_event_ns() {
            Some(t) if t <= now => host.poll(),
            Some(t) => std::thread::sleep(Duration::from_nanos((t - now).min(MAX_SLEEP_NS))),
            None => std::thread::sleep(Duration::from_nanos(MAX_SLEEP_NS)),
        }
    }
}

impl Daemon {
    /// Creates every VM's vGPU on `host`, binds the sockets and starts serving. `clock` is the
    /// clock of the physical GPU (what `next_event_ns` is measured in).
    pub fn start(
        host: Arc<GpuHost>,
        clock: Arc<dyn Clock>,
        cfg: DaemonConfig,
    ) -> io::Result<Daemon> {
        if cfg.vms.is_empty() {
            return Err(bad("no VMs to serve".into()));
        }
        for (i, vm) in cfg.vms.iter().enumerate() {
            let ok = !vm.name.is_empty()
                && vm.name.len() <= 64
                && vm
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err(bad(format!(
                    "VM name '{}': 1-64 letters, digits, '-' or '_'",
                    vm.name
                )));
            }
            if cfg.vms[..i].iter().any(|o| o.name == vm.name) {
                return Err(bad(format!("VM name '{}' given twice", vm.name)));
            }
        }
        std::fs::create_dir_all(&cfg.socket_dir)?;
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let mut daemon = Daemon {
            host: host.clone(),
            devices: Vec::new(),
            sockets: Vec::new(),
            stop: stop.clone(),
            wake: wake.clone(),
            poller: None,
            vm_threads: Vec::new(),
        };
        let mut pending = Vec::new();
        for vm in &cfg.vms {
            let path = cfg.socket_dir.join(format!("{}.sock", vm.name));
            clear_stale_socket(&path)?;
            let dev = VmDevice::new(&vm.name, vm.profile.clone(), host.clone())
                .map_err(|e| bad(format!("VM '{}': {e}", vm.name)))?;
            daemon.devices.push(dev.clone());
            let listener = UnixListener::bind(&path)?;
            daemon.sockets.push(path.clone());
            let watch = listener.try_clone()?;
            let server = Server::from_owned_fd(
                OwnedFd::from(listener),
                true,
                regions::irqs(),
                regions::server_regions(),
            );
            pending.push((dev, watch, server, path));
        }
        for (dev, watch, server, path) in pending {
            let (wake, stop) = (wake.clone(), stop.clone());
            let sealed = cfg.require_sealed_dma;
            dev.event(&format!(
                "serving {} on {} (profile '{}': {} MiB VRAM, {} channels, weight {}, shadow {})",
                dev.vgpu().map(|v| v.id().to_string()).unwrap_or_default(),
                path.display(),
                dev.profile().name,
                dev.profile().vram_mib,
                dev.profile().channels,
                dev.profile().weight,
                dev.profile().shadow
            ));
            let t = std::thread::Builder::new()
                .name(dev.name().to_string())
                .spawn(move || serve_vm(dev, watch, server, wake, stop, sealed))?;
            daemon.vm_threads.push(t);
        }
        let (h, s) = (host.clone(), stop.clone());
        daemon.poller = Some(
            std::thread::Builder::new()
                .name("poller".into())
                .spawn(move || poll_host(h, clock, s))?,
        );
        Ok(daemon)
    }

    /// The VMs.
    pub fn devices(&self) -> &[Arc<VmDevice>] {
        &self.devices
    }

    /// The socket paths, in VM order.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// The host.
    pub fn host(&self) -> &Arc<GpuHost> {
        &self.host
    }

    /// Stops serving: every vGPU destroyed and scrubbed, every socket removed, the poller and
    /// the idle VM threads joined. A thread still inside a client's connection is left blocked
    /// in the crate's read (it cannot be woken from outside); its vGPU is already gone, so it
    /// only answers all-ones until the client closes or the process exits.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.write(1);
        for dev in &self.devices {
            dev.shut_down();
        }
        for path in &self.sockets {
            let _ = std::fs::remove_file(path);
        }
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
        for t in self.vm_threads.drain(..) {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.wake.write(1);
        for dev in &self.devices {
            dev.shut_down();
        }
        for path in &self.sockets {
            let _ = std::fs::remove_file(path);
        }
    }
}
