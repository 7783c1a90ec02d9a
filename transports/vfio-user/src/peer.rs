//! Who is on the other end of a VM's socket: the peer's pid, uid and gid from `SO_PEERCRED`
//! (through `nix`), and its command name from `/proc`.
//!
//! `vfio_user::Server::run` (crate 0.1.7) accepts the connection itself and never shows the
//! stream, so the daemon finds the connection's descriptor among its own: the one socket whose
//! local address is the VM's socket path and which is not listening ([`connection_fd`]). It is
//! looked up from inside a backend callback, where the crate's stream is certainly open, and
//! used only while that connection lasts.

use std::os::fd::{BorrowedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{getsockname, getsockopt, sockopt, UnixAddr};

/// The process on the other end of a Unix socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its process id (as the kernel saw it when it connected).
    pub pid: i32,
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.pid))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        write!(
            f,
            "pid {} ({comm}), uid {}, gid {}",
            self.pid, self.uid, self.gid
        )
    }
}

/// The peer of the connected socket `fd`.
pub fn peer_of(fd: BorrowedFd<'_>) -> Option<Peer> {
    let c = getsockopt(&fd, sockopt::PeerCredentials).ok()?;
    Some(Peer {
        pid: c.pid(),
        uid: c.uid(),
        gid: c.gid(),
    })
}

/// The descriptor of this process's one connected (not listening) socket whose local address
/// is `socket`: the server end of a client's connection to it. `None` if there is none or more
/// than one.
pub fn connection_fd(socket: &Path) -> Option<RawFd> {
    let mut found = None;
    for e in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<RawFd>().ok()) else {
            continue;
        };
        // Only sockets: the link reads `socket:[inode]`.
        match std::fs::read_link(e.path()) {
            Ok(l) if l.to_string_lossy().starts_with("socket:") => {}
            _ => continue,
        }
        // SAFETY: getsockname/getsockopt only read the state of the descriptor; if it was
        // closed and reused meanwhile they answer for whatever it is now, and a wrong answer is
        // filtered out below (only a non-listening socket bound to `socket` is taken).
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(addr) = getsockname::<UnixAddr>(fd) else {
            continue;
        };
        if addr.path() != Some(socket) {
            continue;
        }
        if getsockopt(&b, sockopt::AcceptConn).unwrap_or(true) {
            continue;
        }
        if found.replace(fd).is_some() {
            return None;
        }
    }
    found
}
