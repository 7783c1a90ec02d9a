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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use gpuvm::clock::Clock;
use gpuvm::host::GpuHost;
use gpuvm::profile::VgpuProfile;
use vfio_user::Server;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::backend::{VgpuBackend, VmDevice};
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

/// Wakes the poller when an access made something due earlier than it will wake by itself.
#[derive(Debug)]
pub struct Waker {
    kick: EventFd,
    /// The time the poller's timer is armed for (`u64::MAX`: disarmed).
    armed: AtomicU64,
    stop: AtomicBool,
    wakeups: AtomicU64,
    polls: AtomicU64,
    nudges: AtomicU64,
}

impl Waker {
    fn new() -> io::Result<Waker> {
        Ok(Waker {
            kick: EventFd::new(libc::EFD_NONBLOCK)?,
            armed: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            nudges: AtomicU64::new(0),
        })
    }

    /// After an access: wakes the poller if the host's next event is now earlier than the time
    /// its timer is armed for. Costs one lookup of `next_event_ns` (the host lock).
    pub fn nudge(&self, host: &GpuHost) {
        if let Some(t) = host.next_event_ns() {
            if t < self.armed.load(Ordering::SeqCst) {
                self.kick();
            }
        }
    }

    /// Wakes the poller unconditionally (after a control change: a new weight or cap may let
    /// queued work run).
    pub fn kick(&self) {
        self.nudges.fetch_add(1, Ordering::Relaxed);
        let _ = self.kick.write(1);
    }

    /// Times the poller woke up.
    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Times the poller called `GpuHost::poll`.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    /// Times a VM thread or the control socket woke the poller.
    pub fn nudges(&self) -> u64 {
        self.nudges.load(Ordering::Relaxed)
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
}

/// A running daemon.
pub struct Daemon {
    host: Arc<GpuHost>,
    socket_dir: PathBuf,
    require_sealed_dma: bool,
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
        let fresh = dev.vgpu().map(|v| v.id().to_string()).unwrap_or_default();
        dev.event(&if n == 1 {
            format!("client connected: vGPU {fresh}")
        } else {
            // A reconnecting client (a rebooted, reconnected or restored VMM) never sees the
            // previous client's GPU state: that vGPU was destroyed when its client went.
            format!(
                "client connected (connection {n}): freshly reset vGPU {fresh}, nothing kept from the previous client"
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
        dev.disconnected();
        dev.set_ram(None);
        dev.event(&format!("connection ended: {}", backend.traffic()));
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
        let dev = VmDevice::new(&vm.name, vm.profile.clone(), self.host.clone())
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
            let watch = listener.try_clone()?;
            Ok::<_, io::Error>((listener, watch))
        })();
        let (listener, watch) = match bound {
            Ok(l) => l,
            Err(e) => {
                dev.shut_down();
                return Err(e);
            }
        };
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
            "serving {} on {} (profile '{}': {} MiB VRAM, {} channels, weight {}, shadow {})",
            dev.vgpu().map(|v| v.id().to_string()).unwrap_or_default(),
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
        vms.push(VmEntry {
            dev: dev.clone(),
            socket: path,
            stop,
            wake,
            thread: Some(thread),
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
        e.dev.shut_down();
        let _ = std::fs::remove_file(&e.socket);
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
