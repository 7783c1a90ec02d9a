//! The vGPU's interrupt line as a vfio-user INTx eventfd.
//!
//! The device model's [`IrqLine`] is level-triggered; a client hands the server an eventfd with
//! SET_IRQS (INTx, `DATA_EVENTFD | ACTION_TRIGGER`) and registers the same eventfd with KVM as
//! an irqfd, so each rising edge of the line is signalled on it once (as `IrqfdLine` does in the
//! in-process VMM). `ACTION_MASK`/`ACTION_UNMASK` suppress and re-allow signalling.
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

/// INTx towards the client.
#[derive(Debug, Default)]
pub struct IntxLine {
    evt: Mutex<Option<File>>,
    level: AtomicBool,
    masked: AtomicBool,
    raised: AtomicU64,
    dropped: AtomicU64,
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

impl IntxLine {
    /// A line with no eventfd.
    pub fn new() -> IntxLine {
        IntxLine::default()
    }

    /// Connects the client's eventfd (already checked by [`adopt_eventfd`]), or disconnects.
    pub fn set_eventfd(&self, evt: Option<File>) {
        *self.evt.lock().unwrap_or_else(|e| e.into_inner()) = evt;
    }

    /// Takes the eventfd out (to keep it across a device reset).
    pub fn take_eventfd(&self) -> Option<File> {
        self.evt.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Masks or unmasks signalling.
    pub fn set_masked(&self, masked: bool) {
        self.masked.store(masked, Ordering::SeqCst);
    }

    /// Forgets the eventfd, the level and the mask (a new client, or a fresh vGPU).
    pub fn reset(&self) {
        self.set_eventfd(None);
        self.level.store(false, Ordering::SeqCst);
        self.masked.store(false, Ordering::SeqCst);
    }

    /// Rising edges signalled on the eventfd.
    pub fn raised(&self) -> u64 {
        self.raised.load(Ordering::SeqCst)
    }

    /// Rising edges not signalled (masked, no eventfd, or the write failed).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }
}

impl IrqLine for IntxLine {
    fn set_level(&self, asserted: bool) {
        let was = self.level.swap(asserted, Ordering::SeqCst);
        if !asserted || was {
            return;
        }
        let guard = self.evt.lock().unwrap_or_else(|e| e.into_inner());
        let sent = match (&*guard, self.masked.load(Ordering::SeqCst)) {
            (Some(f), false) => {
                let mut f: &File = f;
                f.write_all(&1u64.to_ne_bytes()).is_ok()
            }
            _ => false,
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
        let line = IntxLine::new();
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
    fn only_eventfds_are_taken_and_a_full_one_does_not_block() {
        let (r, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(adopt_eventfd(File::from(std::os::fd::OwnedFd::from(r))).is_err());
        let evt = adopt_eventfd(eventfd()).unwrap();
        // The client fills the counter; the next edge must fail, not block.
        (&evt).write_all(&(u64::MAX - 1).to_ne_bytes()).unwrap();
        let line = IntxLine::new();
        line.set_eventfd(Some(evt));
        line.set_level(true);
        assert_eq!((line.raised(), line.dropped()), (0, 1));
    }
}
