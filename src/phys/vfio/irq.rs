//! Interrupt plumbing of a real GF100 under VFIO: the kernel signals an eventfd when the device
//! interrupts; the backend turns that into the level of the [`IrqLine`] the host waits on.
//!
//! The level is not taken from the eventfd (an edge, and with INTx a masked one) but recomputed
//! from the GPU's own aggregation, PMC INTR_HOST and INTR_EN_HOST
//! ([`gf100::pmc::line_asserted`]), each time an event arrived and while the line is asserted
//! (the host's servicing clears the sources with register writes). When the level falls after
//! an interrupt, the device is acknowledged: INTx is unmasked at VFIO (vfio-pci masked it when it
//! fired), MSI is re-armed at the GPU (`gf100::pmc::MSI_REARM`, as nouveau does after each
//! interrupt). Without any usable interrupt the level is recomputed on every poll.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

use crate::irq::IrqLine;

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

/// The interrupt state of one device.
pub(super) struct Irq {
    kind: Option<IrqKind>,
    fd: EventFd,
    inner: Mutex<Inner>,
    /// Fast check for "line asserted" without the lock.
    asserted_hint: AtomicBool,
}

impl Irq {
    /// Enables MSI if the device offers it, else INTx, signalling a fresh non-blocking eventfd.
    /// With neither (or if enabling fails) the backend polls the interrupt registers.
    pub(super) fn setup(dev: &dyn DeviceAccess) -> io::Result<Irq> {
        let fd = EventFd::new(libc::EFD_NONBLOCK)?;
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
        if kind.is_none() {
            log::warn!("no interrupt could be enabled: polling the interrupt registers");
        }
        Ok(Irq {
            kind,
            fd,
            inner: Mutex::new(Inner::default()),
            asserted_hint: AtomicBool::new(false),
        })
    }

    /// The interrupt kind in use, `None` when polling.
    pub(super) fn kind(&self) -> Option<IrqKind> {
        self.kind
    }

    /// The eventfd the kernel signals (for an event loop that waits on it).
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
        self.refresh(dev, true, level, rearm);
    }

    /// Takes pending eventfd signals and, if any arrived, the line is asserted, or `force`, or
    /// no interrupt is enabled, recomputes the level with `level()` (reads of the GPU's
    /// interrupt registers), drives the line and acknowledges a handled interrupt (`rearm()`
    /// writes the GPU's MSI re-arm register).
    pub(super) fn refresh(
        &self,
        dev: &dyn DeviceAccess,
        force: bool,
        level: impl FnOnce() -> bool,
        rearm: impl FnOnce(),
    ) {
        let events = match self.fd.read() {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                log::warn!("reading the interrupt eventfd: {e}");
                0
            }
        };
        let polling = self.kind.is_none();
        if events == 0 && !force && !polling && !self.asserted_hint.load(Ordering::Acquire) {
            return;
        }
        let mut inner = self.lock();
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

    /// Stops the kernel signalling (device teardown).
    pub(super) fn disable(&self, dev: &dyn DeviceAccess) {
        if let Some(k) = self.kind {
            if let Err(e) = dev.disable_irq(k) {
                log::warn!("disabling {k:?}: {e}");
            }
        }
    }
}
