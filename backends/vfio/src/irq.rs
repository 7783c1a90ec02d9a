//! Interrupt plumbing of a real GF100 under VFIO: the kernel signals an eventfd when the device
//! interrupts; the backend turns that into the level of the [`IrqLine`] the host waits on.
//!
//! A waiter thread blocks on the eventfd and turns each signal into a counter, so that every
//! `PhysicalGpu` method can notice a delivered interrupt with one atomic load instead of a
//! syscall (the trait's contract: every method does what `poll` does). `poll` also drains the
//! eventfd itself, so a caller that polls never depends on the thread's timing.
//!
//! The level is not taken from the eventfd (an edge, and with INTx a masked one) but recomputed
//! from the GPU's own aggregation, PMC INTR_HOST and INTR_EN_HOST
//! ([`gf100::pmc::line_asserted`]), when an interrupt was delivered and, after each access, while
//! the line is asserted (the host's servicing clears the sources with register writes). When
//! the level falls after an interrupt the device is acknowledged: INTx is unmasked at VFIO
//! (vfio-pci masked it when it fired), MSI is re-armed at the GPU (`gf100::pmc::MSI_REARM`, as
//! nouveau does after each interrupt). Without any usable interrupt the level is recomputed on
//! every poll.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::EventFd;

use gpuvm_phys::irq::IrqLine;

use super::device::{DeviceAccess, IrqKind};

/// Counters of the interrupt path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IrqCounts {
    /// Eventfd signals received (interrupts the kernel delivered).
    pub events: u64,
    /// INTx unmasks done.
    pub unmasks: u64,
    /// MSI re-arms done.
    pub rearms: u64,
    /// Changes of the line's level.
    pub level_changes: u64,
}

#[derive(Default)]
struct Inner {
    line: Option<Arc<dyn IrqLine>>,
    level: bool,
    /// An interrupt was delivered and not yet acknowledged (INTx masked / MSI not re-armed).
    unacked: bool,
    counts: IrqCounts,
}

/// Why the level is being looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// `poll`: drain the eventfd too; with no interrupt enabled, read the registers.
    Poll,
    /// Any other access: only if an interrupt arrived or the line is asserted.
    Access,
    /// Always recompute (a line was just connected).
    Force,
}

/// What the waiter thread shares.
#[derive(Default)]
struct Shared {
    /// Signals read from the eventfd and not yet accounted.
    arrived: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    /// Reads the (non-blocking) eventfd into `arrived`.
    fn drain(&self, fd: &EventFd) {
        match fd.read() {
            Ok(n) => {
                self.arrived.fetch_add(n, Ordering::AcqRel);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => log::warn!("reading the interrupt eventfd: {e}"),
        }
    }
}

/// The interrupt state of one device.
pub(super) struct Irq {
    kind: Option<IrqKind>,
    fd: Arc<EventFd>,
    shared: Arc<Shared>,
    /// Wakes the waiter for shutdown.
    wake: Arc<EventFd>,
    waiter: Option<JoinHandle<()>>,
    inner: Mutex<Inner>,
    /// Fast check for "line asserted" without the lock.
    asserted_hint: AtomicBool,
}

/// Blocks on `fd` (and `wake`) until `shared.stop`.
fn wait_loop(fd: Arc<EventFd>, wake: Arc<EventFd>, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [
            libc::pollfd {
                fd: fd.as_raw_fd(),
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
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                log::error!("interrupt waiter: poll: {e}");
                return;
            }
            continue;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            shared.drain(&fd);
        }
    }
}

impl Irq {
    /// Enables MSI if the device offers it, else INTx, signalling a fresh non-blocking eventfd
    /// watched by a waiter thread. With neither (or if enabling fails) the backend polls the
    /// interrupt registers.
    pub(super) fn setup(dev: &dyn DeviceAccess) -> io::Result<Irq> {
        let fd = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let shared = Arc::new(Shared::default());
        let mut kind = None;
        for k in [IrqKind::Msi, IrqKind::Intx] {
            if dev.irq_count(k) == 0 {
                continue;
            }
            match dev.enable_irq(k, &fd) {
                Ok(()) => {
                    kind = Some(k);
                    break;
                }
                Err(e) => log::warn!("cannot enable {k:?}: {e}"),
            }
        }
        let waiter = match kind {
            Some(_) => {
                let (f, w, s) = (fd.clone(), wake.clone(), shared.clone());
                Some(
                    std::thread::Builder::new()
                        .name("gpuvm-vfio-irq".into())
                        .spawn(move || wait_loop(f, w, s))?,
                )
            }
            None => {
                log::warn!("no interrupt could be enabled: polling the interrupt registers");
                None
            }
        };
        Ok(Irq {
            kind,
            fd,
            shared,
            wake,
            waiter,
            inner: Mutex::new(Inner::default()),
            asserted_hint: AtomicBool::new(false),
        })
    }

    /// The interrupt kind in use, `None` when polling.
    pub(super) fn kind(&self) -> Option<IrqKind> {
        self.kind
    }

    /// The eventfd the kernel signals.
    pub(super) fn fd(&self) -> &EventFd {
        &self.fd
    }

    /// The counters.
    pub(super) fn counts(&self) -> IrqCounts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Connects the line and sends it the level `level()` computes now.
    pub(super) fn connect(
        &self,
        dev: &dyn DeviceAccess,
        line: Arc<dyn IrqLine>,
        level: impl FnOnce() -> bool,
        rearm: impl FnOnce(),
    ) {
        let mut inner = self.lock();
        line.set_level(inner.level);
        inner.line = Some(line);
        drop(inner);
        self.refresh(dev, Check::Force, level, rearm);
    }

    /// Takes the interrupts delivered so far (with `Check::Poll` draining the eventfd first)
    /// and, if any arrived, the line is asserted, `Check::Force`, or (polling) no interrupt is
    /// enabled, recomputes the level with `level()` (reads of the GPU's interrupt registers),
    /// drives the line and acknowledges a handled interrupt (`rearm()` writes the GPU's MSI
    /// re-arm register). `Check::Access` costs two atomic loads while nothing is pending.
    pub(super) fn refresh(
        &self,
        dev: &dyn DeviceAccess,
        check: Check,
        level: impl FnOnce() -> bool,
        rearm: impl FnOnce(),
    ) {
        if check == Check::Poll && self.kind.is_some() {
            self.shared.drain(&self.fd);
        }
        let pending = self.shared.arrived.load(Ordering::Acquire) > 0;
        let asserted = self.asserted_hint.load(Ordering::Acquire);
        let polling = self.kind.is_none() && check == Check::Poll;
        if !pending && check != Check::Force && !polling && !asserted {
            return;
        }
        let mut inner = self.lock();
        let events = self.shared.arrived.swap(0, Ordering::AcqRel);
        if events > 0 {
            inner.counts.events += events;
            inner.unacked = true;
        }
        let now = level();
        if now != inner.level {
            inner.level = now;
            inner.counts.level_changes += 1;
            self.asserted_hint.store(now, Ordering::Release);
            if let Some(line) = &inner.line {
                line.set_level(now);
            }
        }
        if !now && inner.unacked {
            inner.unacked = false;
            match self.kind {
                Some(IrqKind::Intx) => match dev.unmask_intx() {
                    Ok(()) => inner.counts.unmasks += 1,
                    Err(e) => log::error!("INTx unmask: {e}"),
                },
                Some(IrqKind::Msi) => {
                    rearm();
                    inner.counts.rearms += 1;
                }
                None => {}
            }
        }
    }

    /// Stops the kernel signalling and the waiter thread (device teardown).
    pub(super) fn disable(&mut self, dev: &dyn DeviceAccess) {
        if let Some(k) = self.kind {
            if let Err(e) = dev.disable_irq(k) {
                log::warn!("disabling {k:?}: {e}");
            }
        }
        self.shared.stop.store(true, Ordering::Release);
        if let Err(e) = self.wake.write(1) {
            log::warn!("waking the interrupt waiter: {e}");
        }
        if let Some(t) = self.waiter.take() {
            let _ = t.join();
        }
    }
}
