//! The vGPU's interrupt line as vfio-user interrupts: INTx (index 0) or MSI (index 1), each an
//! eventfd the client hands over.
//!
//! The device model's [`IrqLine`] is level-triggered; a client hands the server an eventfd with
//! SET_IRQS (`DATA_EVENTFD | ACTION_TRIGGER`) and registers the same eventfd with KVM as an
//! irqfd, so each rising edge of the line is signalled on it once (as `IrqfdLine` does in the
//! in-process VMM). While an MSI eventfd is connected (the guest enabled MSI: Cloud Hypervisor
//! then disconnects INTx and connects vector 0), edges go there; otherwise to INTx.
//! `ACTION_MASK`/`ACTION_UNMASK` of INTx suppress and re-allow signalling; they cost one atomic
//! store, because Cloud Hypervisor sends an UNMASK after every trapped BAR access (its stand-in
//! for an EOI). An UNMASK does not re-signal a line that is still high: delivery is by edge,
//! and a guest that has not cleared the interrupt yet must not get a second one for it.
//!
//! The eventfd is the client's, so it is checked and made harmless first: it must be an
//! eventfd (not a pipe the client never drains) and it is set non-blocking, because a client
//! can push the counter to its maximum, after which a blocking write would stall the host's
//! poller and with it every VM.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use gpuvm::irq::IrqLine;

/// The vGPU's interrupt towards the client: INTx or MSI.
#[derive(Debug, Default)]
pub struct VgpuIrq {
    intx: Mutex<Option<File>>,
    msi: Mutex<Option<File>>,
    level: AtomicBool,
    masked: AtomicBool,
    raised: AtomicU64,
    raised_msi: AtomicU64,
    dropped: AtomicU64,
    unmasks: AtomicU64,
}

/// Checks that `file` is an eventfd and makes it non-blocking.
pub fn adopt_eventfd(file: File) -> io::Result<File> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the interrupt descriptor is {link:?}, not an eventfd"),
        ));
    }
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own only change its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

fn lock(m: &Mutex<Option<File>>) -> std::sync::MutexGuard<'_, Option<File>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn signal(evt: &File) -> bool {
    let mut f: &File = evt;
    f.write_all(&1u64.to_ne_bytes()).is_ok()
}

impl VgpuIrq {
    /// A line with no eventfd.
    pub fn new() -> VgpuIrq {
        VgpuIrq::default()
    }

    /// Connects the client's INTx eventfd (already checked by [`adopt_eventfd`]), or
    /// disconnects it.
    pub fn set_eventfd(&self, evt: Option<File>) {
        *lock(&self.intx) = evt;
    }

    /// Connects the client's MSI eventfd (vector 0), or disconnects it (MSI disabled).
    pub fn set_msi_eventfd(&self, evt: Option<File>) {
        *lock(&self.msi) = evt;
    }

    /// Takes both eventfds out (to keep them across a device reset).
    pub fn take_eventfds(&self) -> (Option<File>, Option<File>) {
        (lock(&self.intx).take(), lock(&self.msi).take())
    }

    /// Puts eventfds taken by [`VgpuIrq::take_eventfds`] back.
    pub fn restore_eventfds(&self, (intx, msi): (Option<File>, Option<File>)) {
        self.set_eventfd(intx);
        self.set_msi_eventfd(msi);
    }

    /// Masks or unmasks INTx signalling.
    pub fn set_masked(&self, masked: bool) {
        if !masked {
            self.unmasks.fetch_add(1, Ordering::Relaxed);
        }
        self.masked.store(masked, Ordering::SeqCst);
    }

    /// Forgets the eventfds, the level and the mask (a new client, or a fresh vGPU).
    pub fn reset(&self) {
        self.set_eventfd(None);
        self.set_msi_eventfd(None);
        self.level.store(false, Ordering::SeqCst);
        self.masked.store(false, Ordering::SeqCst);
    }

    /// Rising edges signalled on an eventfd (INTx or MSI).
    pub fn raised(&self) -> u64 {
        self.raised.load(Ordering::SeqCst)
    }

    /// Of [`VgpuIrq::raised`], those signalled as MSI.
    pub fn raised_msi(&self) -> u64 {
        self.raised_msi.load(Ordering::SeqCst)
    }

    /// Rising edges not signalled (masked, no eventfd, or the write failed).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// INTx UNMASK requests received.
    pub fn unmasks(&self) -> u64 {
        self.unmasks.load(Ordering::Relaxed)
    }
}

impl IrqLine for VgpuIrq {
    fn set_level(&self, asserted: bool) {
        let was = self.level.swap(asserted, Ordering::SeqCst);
        if !asserted || was {
            return;
        }
        let msi = lock(&self.msi);
        let sent = if let Some(f) = &*msi {
            let ok = signal(f);
            if ok {
                self.raised_msi.fetch_add(1, Ordering::SeqCst);
            }
            ok
        } else {
            drop(msi);
            let intx = lock(&self.intx);
            match (&*intx, self.masked.load(Ordering::SeqCst)) {
                (Some(f), false) => signal(f),
                _ => false,
            }
        };
        if sent {
            self.raised.fetch_add(1, Ordering::SeqCst);
        } else {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::FromRawFd;

    fn eventfd() -> File {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, 0) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        unsafe { File::from_raw_fd(fd) }
    }

    #[test]
    fn rising_edges_signal_the_eventfd() {
        let evt = eventfd();
        let mut reader = evt.try_clone().unwrap();
        let line = VgpuIrq::new();
        line.set_eventfd(Some(adopt_eventfd(evt).unwrap()));
        line.set_level(true);
        line.set_level(true);
        line.set_level(false);
        line.set_level(true);
        let mut b = [0u8; 8];
        reader.read_exact(&mut b).unwrap();
        assert_eq!(u64::from_ne_bytes(b), 2, "two rising edges");
        line.set_level(false);
        line.set_masked(true);
        line.set_level(true);
        assert_eq!((line.raised(), line.dropped()), (2, 1));
    }

    #[test]
    fn with_msi_connected_edges_go_to_msi_and_ignore_the_intx_mask() {
        let (intx, msi) = (eventfd(), eventfd());
        let (mut intx_r, mut msi_r) = (intx.try_clone().unwrap(), msi.try_clone().unwrap());
        let line = VgpuIrq::new();
        line.set_eventfd(Some(adopt_eventfd(intx).unwrap()));
        line.set_msi_eventfd(Some(adopt_eventfd(msi).unwrap()));
        line.set_masked(true);
        line.set_level(true);
        line.set_level(false);
        line.set_level(true);
        let mut b = [0u8; 8];
        msi_r.read_exact(&mut b).unwrap();
        assert_eq!(u64::from_ne_bytes(b), 2, "two MSIs");
        assert_eq!((line.raised(), line.raised_msi()), (2, 2));
        // MSI disabled again: back to INTx (unmasked).
        line.set_msi_eventfd(None);
        line.set_masked(false);
        line.set_level(false);
        line.set_level(true);
        intx_r.read_exact(&mut b).unwrap();
        assert_eq!(u64::from_ne_bytes(b), 1, "one INTx edge");
        assert_eq!(
            (line.raised(), line.raised_msi(), line.unmasks()),
            (3, 2, 1)
        );
    }

    #[test]
    fn only_eventfds_are_taken_and_a_full_one_does_not_block() {
        let (r, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(adopt_eventfd(File::from(std::os::fd::OwnedFd::from(r))).is_err());
        let evt = adopt_eventfd(eventfd()).unwrap();
        // The client fills the counter; the next edge must fail, not block.
        (&evt).write_all(&(u64::MAX - 1).to_ne_bytes()).unwrap();
        let line = VgpuIrq::new();
        line.set_eventfd(Some(evt));
        line.set_level(true);
        assert_eq!((line.raised(), line.dropped()), (0, 1));
    }
}
