//! The daemon: one `GpuHost`, one vfio-user socket and one thread per VM, and an event-driven
//! poller.
//!
//! Each VM's thread waits for a client on its socket, then runs `vfio_user::Server::run` (which
//! accepts the connection and serves it until it closes) with a fresh [`VgpuBackend`]. However
//! the connection ends — the client disconnects or crashes, or the crate panics on a malformed
//! message (it does on some, see `docs/vfio-user.md`; `catch_unwind` contains that) — the VM's
//! vGPU is destroyed and scrubbed and a fresh one waits for the next client. The other VMs'
//! threads never notice. VMs can be added and removed while the daemon runs
//! ([`Daemon::add_vm`], [`Daemon::remove_vm`]).
//!
//! **The poller** ([`Poller`]) is a rust-vmm `event-manager` loop over two file descriptors: a
//! `TimerFd` armed for `GpuHost::next_event_ns` (the GPU's next completion, the scheduler's
//! timer, the watchdog) and an `EventFd` the VM threads signal when an access made something
//! due earlier than the armed time ([`Waker::nudge`]). With nothing pending the timer is
//! disarmed and the daemon's threads all block in the kernel: an idle daemon uses no CPU.
//! (The VM threads cannot join the loop: `vfio_user::Server::run` blocks on its socket for a
//! whole connection; they block in `poll(2)` between connections.)

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

pub use crate::waker::Waker;
use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use gpuvm::clock::Clock;
use gpuvm::host::{GpuHost, MAX_DMA_WINDOW, MIN_DMA_WINDOW};
use gpuvm::profile::VgpuProfile;
use vfio_user::Server;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::backend::{VgpuBackend, VmDevice};
use crate::dma::DmaWindows;
use crate::regions;

/// One VM the daemon serves.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Its name: the socket is `NAME.sock`, logs are prefixed `[NAME]`.
    pub name: String,
    /// Its vGPU.
    pub profile: VgpuProfile,
    /// Its cap (parts per million of GPU time), for a capping scheduler (`fixed-share`).
    pub cap_ppm: Option<u32>,
}

/// What the daemon serves.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where the sockets go (created if missing).
    pub socket_dir: PathBuf,
    /// The VMs at start (more can be added later).
    pub vms: Vec<VmSpec>,
    /// Refuse DMA map files that are not sealed against shrinking (see [`crate::dma`]).
    pub require_sealed_dma: bool,
}

/// Who may connect to the VM sockets: a socket is created with the process's umask (only its
/// owner can connect with the usual 022: connecting needs write permission), then given
/// `mode` and `gid` if set (`gpuvm serve --socket-mode 0660 --socket-group kvm`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SocketAccess {
    /// Permission bits of each VM socket (e.g. 0o660).
    pub mode: Option<u32>,
    /// Group of each VM socket.
    pub gid: Option<u32>,
}

impl SocketAccess {
    fn apply(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(gid) = self.gid {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("giving {} to group {gid}: {e}", path.display()),
                )
            })?;
        }
        if let Some(mode) = self.mode {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("setting mode {mode:o} on {}: {e}", path.display()),
                )
            })?;
        }
        Ok(())
    }
}

/// The poller: an `event-manager` subscriber over the timer and the wake-up eventfd.
pub struct Poller {
    host: Arc<GpuHost>,
    clock: Arc<dyn Clock>,
    timer: TimerFd,
    waker: Arc<Waker>,
}

impl Poller {
    fn new(host: Arc<GpuHost>, clock: Arc<dyn Clock>, waker: Arc<Waker>) -> io::Result<Poller> {
        let timer = TimerFd::new()?;
        // Non-blocking: the timer may be re-armed between epoll's report and our read.
        // SAFETY: fcntl on a descriptor we own; no memory is passed.
        unsafe {
            let fl = libc::fcntl(timer.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(timer.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(Poller {
            host,
            clock,
            timer,
            waker,
        })
    }

    /// Polls the host while something is due, then arms the timer for the next event (or
    /// disarms it).
    fn service(&mut self) {
        for _ in 0..10_000 {
            let next = self.host.next_event_ns();
            let now = self.clock.now_ns();
            if let Some(t) = next {
                if t <= now {
                    self.host.poll();
                    self.waker.polls.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            self.waker
                .armed
                .store(next.unwrap_or(u64::MAX), Ordering::SeqCst);
            // An access between our look and the store saw the old armed time and may not
            // have kicked: look again.
            if self.host.next_event_ns() != next {
                continue;
            }
            let r = match next {
                Some(t) => self.timer.reset(Duration::from_nanos(t - now), None),
                None => self.timer.clear(),
            };
            if let Err(e) = r {
                log::error!("gpuvm serve: arming the poller's timer: {e}");
            }
            return;
        }
        // Still due after that many polls: let the loop come round again soon.
        let _ = self.timer.reset(Duration::from_micros(50), None);
    }
}

impl MutEventSubscriber for Poller {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        self.waker.wakeups.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 8];
        // Drain whichever descriptor fired (both non-blocking; nothing to read is fine).
        // SAFETY: reading at most 8 bytes into a local buffer from a descriptor we own.
        unsafe { libc::read(events.fd(), buf.as_mut_ptr().cast(), 8) };
        if !self.waker.stop.load(Ordering::SeqCst) {
            self.service();
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in [self.timer.as_raw_fd(), self.waker.kick.as_raw_fd()] {
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                log::error!("gpuvm serve: poller cannot watch fd {fd}: {e:?}");
            }
        }
    }
}

/// One VM being served.
struct VmEntry {
    dev: Arc<VmDevice>,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    watcher: Option<JoinHandle<()>>,
}

/// A running daemon.
pub struct Daemon {
    host: Arc<GpuHost>,
    socket_dir: PathBuf,
    require_sealed_dma: bool,
    access: SocketAccess,
    windows: DmaWindows,
    vms: Mutex<Vec<VmEntry>>,
    waker: Arc<Waker>,
    poller: Mutex<Option<JoinHandle<()>>>,
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
        let n = dev.connections();
        let g = dev.vgpu_generation();
        dev.event(&if n == 1 {
            format!("client connected: vGPU generation {g}")
        } else {
            // A reconnecting client (a rebooted, reconnected or restored VMM) never sees the
            // previous client's GPU state: that vGPU was destroyed when its client went.
            format!(
                "client connected (connection {n}): freshly reset vGPU generation {g}, nothing kept from the previous client"
            )
        });
        let why = match catch_unwind(AssertUnwindSafe(|| server.run(&mut backend))) {
            Ok(Ok(())) => "client disconnected".to_string(),
            Ok(Err(e)) => format!("connection lost ({e})"),
            Err(p) => format!(
                "vfio_user server panicked on a malformed message ({}); connection dropped",
                panic_message(&*p)
            ),
        };
        dev.clear_holder();
        dev.disconnected();
        dev.set_ram(None);
        let line = dev.line();
        dev.event(&format!(
            "connection ended: {}; interrupt edges so far: {} signalled ({} as MSI), {} not (masked, no eventfd or a failed write)",
            backend.traffic(),
            line.raised(),
            line.raised_msi(),
            line.dropped()
        ));
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

/// How long a VM's holder has to show it hung up before a newcomer is refused as a second
/// client (see [`watch_busy`]).
const BUSY_GRACE_MS: i32 = 500;

fn holder_lock(dev: &VmDevice) -> MutexGuard<'_, Option<crate::backend::Holder>> {
    dev.holder.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `fds` (each for `POLLIN`, or `POLLRDHUP` when `hup`); `None` if the call failed.
fn poll_in(fds: &[(std::os::fd::RawFd, bool)], timeout_ms: i32) -> Option<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, hup)| libc::pollfd {
            fd,
            events: if hup { libc::POLLRDHUP } else { libc::POLLIN },
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a valid array of pollfd for the duration of the call.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    (n >= 0).then(|| p.iter().map(|x| x.revents != 0).collect())
}

/// The busy-socket watcher of one VM: while a client is served, a second client that connects
/// (a second VMM started on the same VM by mistake) would wait in the socket's backlog with no
/// word until the first leaves. Instead it is accepted here, logged with who holds the VM and
/// since when, counted as a refused request, and closed, so the second VMM fails at once.
/// A newcomer whose predecessor hangs up within [`BUSY_GRACE_MS`] is left alone: it is the VM's
/// next client (a rebooting VMM), and the VM's thread accepts it once the old connection is torn
/// down.
fn watch_busy(
    dev: Arc<VmDevice>,
    listener: UnixListener,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) {
    loop {
        {
            let mut h = holder_lock(&dev);
            while h.is_none() && !stop.load(Ordering::SeqCst) {
                h = dev
                    .holder_changed
                    .wait(h)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let fds = [
            (listener.as_raw_fd(), false),
            (dev.holder_gone.as_raw_fd(), false),
            (wake.as_raw_fd(), false),
        ];
        let Some(ready) = poll_in(&fds, -1) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if ready[1] {
            let _ = dev.holder_gone.read();
            continue;
        }
        if !ready[0] {
            continue;
        }
        let Some(holder) = holder_lock(&dev).clone() else {
            continue;
        };
        let gone_or_stop = [
            (dev.holder_gone.as_raw_fd(), false),
            (wake.as_raw_fd(), false),
        ];
        let Some(fd) = holder.fd else {
            // Unknown connection: it cannot be told whether it hung up, so never refuse; wait
            // for the VM's thread to end it.
            let _ = poll_in(&gone_or_stop, -1);
            continue;
        };
        // A client that has just closed its connection may keep it open a moment longer (a
        // copy of the descriptor in a child between fork and exec), and its successor must not
        // be refused for that: the holder has a grace period to show it hung up.
        match poll_in(
            &[(fd, true), gone_or_stop[0], gone_or_stop[1]],
            BUSY_GRACE_MS,
        ) {
            // Still connected after the grace period: the newcomer is a second client.
            Some(r) if r.iter().all(|&x| !x) => {}
            // Hung up: the newcomer is the next client; wait for the VM's thread to end the
            // old connection (holder_gone).
            Some(r) if r[0] => {
                let _ = poll_in(&gone_or_stop, -1);
                continue;
            }
            // The holder went, or the daemon stops, or poll failed: look again.
            _ => continue,
        }
        let h = holder_lock(&dev);
        let same = h
            .as_ref()
            .is_some_and(|x| x.fd == holder.fd && x.since == holder.since);
        if !same || !poll_in(&[(listener.as_raw_fd(), false)], 0).is_some_and(|r| r[0]) {
            continue;
        }
        // The VM's thread only accepts between connections (holder None), and the backlog
        // holds a connection until it is accepted: this accept does not block.
        let newcomer = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                drop(h);
                dev.event(&format!("busy-socket watcher: accept: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let who = crate::peer::peer_of(std::os::fd::AsFd::as_fd(&newcomer))
            .map_or_else(|| "unknown peer".to_string(), |p| p.to_string());
        let holder_who = holder
            .peer
            .map_or_else(|| "an unidentified client".to_string(), |p| p.to_string());
        let n = dev.count_refusal();
        if n <= 16 || n.is_power_of_two() {
            dev.event(&format!(
                "refused a second client ({who}): the VM's socket is busy, served since {} to {holder_who}; one client per VM, stop that VMM first ({n} refusals so far)",
                holder.since
            ));
        }
        drop(h);
        drop(newcomer);
    }
}

fn valid_name(name: &str) -> io::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok && name != "control" {
        Ok(())
    } else {
        Err(bad(format!(
            "VM name '{name}': 1-64 letters, digits, '-' or '_' (and not 'control')"
        )))
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
        Self::start_with_access(host, clock, cfg, SocketAccess::default())
    }

    /// [`Daemon::start`], with the VM sockets' mode and group set as `access` says.
    pub fn start_with_access(
        host: Arc<GpuHost>,
        clock: Arc<dyn Clock>,
        cfg: DaemonConfig,
        access: SocketAccess,
    ) -> io::Result<Daemon> {
        Self::start_with(host, clock, cfg, access, DmaWindows::default())
    }

    /// [`Daemon::start_with_access`], with each VM's DMA window sized as `windows` says
    /// (the other constructors size them from the RAM, up to
    /// [`crate::dma::DEFAULT_MAX_WINDOW`]).
    pub fn start_with(
        host: Arc<GpuHost>,
        clock: Arc<dyn Clock>,
        cfg: DaemonConfig,
        access: SocketAccess,
        windows: DmaWindows,
    ) -> io::Result<Daemon> {
        if let DmaWindows::FromRam { max } = windows {
            if !max.is_power_of_two() || !(MIN_DMA_WINDOW..=MAX_DMA_WINDOW).contains(&max) {
                return Err(bad(format!(
                    "the largest DMA window, {max:#x} bytes, must be a power of two from {MIN_DMA_WINDOW:#x} to {MAX_DMA_WINDOW:#x}"
                )));
            }
        }
        if cfg.vms.is_empty() {
            return Err(bad("no VMs to serve".into()));
        }
        for (i, vm) in cfg.vms.iter().enumerate() {
            valid_name(&vm.name)?;
            if cfg.vms[..i].iter().any(|o| o.name == vm.name) {
                return Err(bad(format!("VM name '{}' given twice", vm.name)));
            }
        }
        std::fs::create_dir_all(&cfg.socket_dir)?;
        let waker = Arc::new(Waker::new()?);
        let daemon = Daemon {
            host: host.clone(),
            socket_dir: cfg.socket_dir.clone(),
            require_sealed_dma: cfg.require_sealed_dma,
            access,
            windows,
            vms: Mutex::new(Vec::new()),
            waker: waker.clone(),
            poller: Mutex::new(None),
        };
        let mut poller = Poller::new(host, clock, waker.clone())?;
        poller.service();
        let mut em = EventManager::<Arc<Mutex<dyn MutEventSubscriber + Send>>>::new()
            .map_err(|e| io::Error::other(format!("event manager: {e:?}")))?;
        em.add_subscriber(Arc::new(Mutex::new(poller)));
        let w = waker.clone();
        *daemon.poller_slot() = Some(std::thread::Builder::new().name("poller".into()).spawn(
            move || {
                while !w.stop.load(Ordering::SeqCst) {
                    if let Err(e) = em.run() {
                        log::error!("gpuvm serve: poller: {e:?}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            },
        )?);
        for vm in cfg.vms {
            daemon.add_vm(vm)?;
        }
        Ok(daemon)
    }

    fn poller_slot(&self) -> MutexGuard<'_, Option<JoinHandle<()>>> {
        self.poller.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entries(&self) -> MutexGuard<'_, Vec<VmEntry>> {
        self.vms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts serving one more VM: its vGPU created, its socket bound, its thread started.
    /// Refused, with nothing changed, for a bad or duplicate name, a socket another process
    /// serves, or a profile the GPU has no room for.
    pub fn add_vm(&self, vm: VmSpec) -> io::Result<Arc<VmDevice>> {
        valid_name(&vm.name)?;
        let mut vms = self.entries();
        if self.waker.stop.load(Ordering::SeqCst) {
            return Err(bad("the daemon is stopping".into()));
        }
        if vms.iter().any(|e| e.dev.name() == vm.name) {
            return Err(bad(format!("a VM named '{}' exists", vm.name)));
        }
        let path = self.socket_dir.join(format!("{}.sock", vm.name));
        clear_stale_socket(&path)?;
        let dev = VmDevice::new(
            &vm.name,
            vm.profile.clone(),
            self.host.clone(),
            self.windows,
        )
        .map_err(|e| bad(format!("VM '{}': {e}", vm.name)))?;
        dev.set_waker(self.waker.clone());
        if vm.cap_ppm.is_some() {
            if let Err(e) = dev.set_cap(vm.cap_ppm) {
                dev.shut_down();
                return Err(bad(format!("VM '{}': {e}", vm.name)));
            }
        }
        let bound = (|| {
            let listener = UnixListener::bind(&path)?;
            self.access.apply(&path)?;
            let watch = listener.try_clone()?;
            let busy = listener.try_clone()?;
            Ok::<_, io::Error>((listener, watch, busy))
        })();
        let (listener, watch, busy) = match bound {
            Ok(l) => l,
            Err(e) => {
                dev.shut_down();
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        dev.set_socket(path.clone());
        let server = Server::from_owned_fd(
            OwnedFd::from(listener),
            true,
            regions::irqs(),
            regions::server_regions(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let p = dev.profile();
        dev.event(&format!(
            "serving vGPU generation {} on {} (profile '{}': {} MiB VRAM, {} channels, weight {}, shadow {})",
            dev.vgpu_generation(),
            path.display(),
            p.name,
            p.vram_mib,
            p.channels,
            p.weight,
            p.shadow
        ));
        let (d, w, st, sealed) = (
            dev.clone(),
            wake.clone(),
            stop.clone(),
            self.require_sealed_dma,
        );
        let thread = std::thread::Builder::new()
            .name(dev.name().to_string())
            .spawn(move || serve_vm(d, watch, server, w, st, sealed));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                dev.shut_down();
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let (d, w, st) = (dev.clone(), wake.clone(), stop.clone());
        let watcher = std::thread::Builder::new()
            .name(format!("{}-busy", dev.name()))
            .spawn(move || watch_busy(d, busy, w, st));
        let watcher = match watcher {
            Ok(t) => Some(t),
            Err(e) => {
                dev.event(&format!(
                    "no busy-socket watcher ({e}): a second client will wait unannounced"
                ));
                None
            }
        };
        vms.push(VmEntry {
            dev: dev.clone(),
            socket: path,
            stop,
            wake,
            thread: Some(thread),
            watcher,
        });
        Ok(dev)
    }

    /// Stops serving one VM: its vGPU destroyed and scrubbed, its socket removed, its thread
    /// stopped (a thread inside a client's connection ends when the client goes; its vGPU is
    /// already gone). Returns the VM's device (for its counters); refused for an unknown name.
    pub fn remove_vm(&self, name: &str) -> io::Result<Arc<VmDevice>> {
        let mut vms = self.entries();
        let Some(i) = vms.iter().position(|e| e.dev.name() == name) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no VM named '{name}'"),
            ));
        };
        let mut e = vms.remove(i);
        drop(vms);
        Self::stop_entry(&mut e);
        e.dev
            .event("removed: vGPU destroyed and scrubbed, socket removed");
        Ok(e.dev)
    }

    fn stop_entry(e: &mut VmEntry) {
        e.stop.store(true, Ordering::SeqCst);
        let _ = e.wake.write(1);
        {
            // Under the holder's lock, so the watcher cannot miss the notification between
            // its look at `stop` and its wait.
            let _h = e.dev.holder.lock().unwrap_or_else(|x| x.into_inner());
            e.dev.holder_changed.notify_all();
        }
        e.dev.shut_down();
        let _ = std::fs::remove_file(&e.socket);
        if let Some(t) = e.watcher.take() {
            for _ in 0..50 {
                if t.is_finished() {
                    let _ = t.join();
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        if let Some(t) = e.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            } else {
                // Between connections the thread sees the wake-up at once; give it a moment.
                for _ in 0..50 {
                    if t.is_finished() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                if t.is_finished() {
                    let _ = t.join();
                }
            }
        }
    }

    /// The VMs, in the order they were added.
    pub fn devices(&self) -> Vec<Arc<VmDevice>> {
        self.entries().iter().map(|e| e.dev.clone()).collect()
    }

    /// One VM by name.
    pub fn device(&self, name: &str) -> Option<Arc<VmDevice>> {
        self.entries()
            .iter()
            .find(|e| e.dev.name() == name)
            .map(|e| e.dev.clone())
    }

    /// The socket paths, in VM order.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.entries().iter().map(|e| e.socket.clone()).collect()
    }

    /// The socket directory.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The host.
    pub fn host(&self) -> &Arc<GpuHost> {
        &self.host
    }

    /// The poller's wake-up handle and counters.
    pub fn waker(&self) -> &Arc<Waker> {
        &self.waker
    }

    /// Stops serving: every vGPU destroyed and scrubbed, every socket removed, the poller and
    /// the idle VM threads joined. A thread still inside a client's connection is left blocked
    /// in the crate's read (it cannot be woken from outside); its vGPU is already gone, so it
    /// only answers all-ones until the client closes or the process exits.
    pub fn shutdown(&self) {
        self.waker.stop.store(true, Ordering::SeqCst);
        self.waker.kick();
        let mut vms = std::mem::take(&mut *self.entries());
        for e in &mut vms {
            Self::stop_entry(e);
        }
        if let Some(p) = self.poller_slot().take() {
            let _ = p.join();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}
