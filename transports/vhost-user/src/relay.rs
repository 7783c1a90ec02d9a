//! The front door: a relay between the vhost-user front end (UML) and rust-vmm's back-end
//! crate that checks every front-end message's framing and normalizes the one UML gets
//! "wrong" for the crate.
//!
//! UML's `virtio_uml` sends SET_MEM_TABLE with its whole fixed array of 8 region slots and
//! `num_regions` = 1; the vhost 0.14 crate refuses any size other than header + `num_regions`
//! regions (`InvalidMessage`) and the device never comes up. The protocol only defines the
//! first `num_regions` entries, so the relay cuts the message to them (and fixes the header's
//! size) before the crate sees it: no patched crate. Everything else passes through as it is,
//! with its file descriptors; replies and back-end messages flow back untouched.
//!
//! A front end is hostile: a header announcing more than [`MAX_PAYLOAD`] bytes, more than
//! [`MAX_FDS`] descriptors, or a message cut short ends the connection (only this VM's), and
//! is reported; nothing here panics on input.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// vhost-user header: request, flags, size (u32 each).
pub const HDR_LEN: usize = 12;
/// The largest payload accepted (the vhost crate's own limit, `MAX_MSG_SIZE`).
pub const MAX_PAYLOAD: usize = 0x1000;
/// The most descriptors one message may carry (the vhost crate's `MAX_ATTACHED_FD_ENTRIES`).
pub const MAX_FDS: usize = 32;
/// VHOST_USER_SET_MEM_TABLE.
pub const SET_MEM_TABLE: u32 = 5;
/// One memory region in SET_MEM_TABLE: guest address, size, user address, mmap offset.
pub const REGION_LEN: usize = 32;
/// VHOST_MEMORY_MAX_NREGIONS.
pub const MAX_REGIONS: usize = 8;

/// What the relay saw, shared with the daemon for its report.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Front-end messages passed on.
    pub messages: AtomicU64,
    /// SET_MEM_TABLE messages cut to their `num_regions` regions.
    pub normalized: AtomicU64,
    /// Connections ended for a malformed message.
    pub refused: AtomicU64,
}

/// One message: header, payload and the descriptors that came with it.
#[derive(Debug)]
pub struct Message {
    /// The 12-byte header.
    pub hdr: [u8; HDR_LEN],
    /// The payload (`size` bytes).
    pub payload: Vec<u8>,
    /// Descriptors received with it.
    pub fds: Vec<OwnedFd>,
}

impl Message {
    /// The request code.
    pub fn request(&self) -> u32 {
        u32::from_le_bytes(self.hdr[0..4].try_into().expect("4 bytes"))
    }

    fn set_size(&mut self, size: usize) {
        self.hdr[8..12].copy_from_slice(&(size as u32).to_le_bytes());
    }
}

/// Receives up to `buf.len()` bytes and any descriptors; returns (bytes, descriptors).
fn recv_some(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    const CMSG_SPACE: usize = 256; // CMSG_SPACE(32 * 4) = 144 on x86_64, with room to spare.
    let mut cmsg = [0u64; CMSG_SPACE / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_SPACE;
    let n = loop {
        // SAFETY: `msg` points at `iov` (which points into `buf`) and at `cmsg`, all alive and
        // of the lengths given; MSG_CMSG_CLOEXEC keeps received descriptors out of children.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Take ownership of every descriptor that arrived, even if we then refuse the message.
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, within
    // msg_controllen; SCM_RIGHTS data is an array of descriptors now owned by this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors than a vhost-user message may carry",
        ));
    }
    Ok(n)
}

/// Receives exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before any byte.
fn recv_exact(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let n = recv_some(sock, &mut buf[got..], fds)?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("message cut short after {got} of {} bytes", buf.len()),
            ));
        }
        got += n;
    }
    Ok(true)
}

/// Reads one message; `Ok(None)` when the peer closed the connection between messages.
pub fn read_message(sock: &UnixStream) -> io::Result<Option<Message>> {
    let mut hdr = [0u8; HDR_LEN];
    let mut fds = Vec::new();
    if !recv_exact(sock, &mut hdr, &mut fds)? {
        return Ok(None);
    }
    let size = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes")) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("payload of {size} bytes announced (at most {MAX_PAYLOAD})"),
        ));
    }
    let mut payload = vec![0u8; size];
    if !recv_exact(sock, &mut payload, &mut fds)? && size > 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed between a header and its payload",
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} descriptors with one message", fds.len()),
        ));
    }
    Ok(Some(Message { hdr, payload, fds }))
}

/// Sends one message with its descriptors.
pub fn write_message(sock: &UnixStream, m: &Message) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(HDR_LEN + m.payload.len());
    bytes.extend_from_slice(&m.hdr);
    bytes.extend_from_slice(&m.payload);
    let mut sent = 0;
    let mut first = true;
    while sent < bytes.len() {
        let mut iov = libc::iovec {
            iov_base: bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: bytes.len() - sent,
        };
        let raw: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
        let mut cmsg = [0u64; 32];
        // SAFETY: msghdr is plain data; zeroed is a valid empty value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if first && !raw.is_empty() {
            let data_len = (raw.len() * std::mem::size_of::<RawFd>()) as u32;
            // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic; `cmsg` (256 bytes) holds
            // CMSG_SPACE(32 descriptors) = 144 bytes, and read_message caps descriptors at 32.
            unsafe {
                msg.msg_control = cmsg.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(data_len) as usize;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(data_len) as usize;
                std::ptr::copy_nonoverlapping(
                    raw.as_ptr(),
                    libc::CMSG_DATA(c) as *mut RawFd,
                    raw.len(),
                );
            }
        }
        // SAFETY: `msg` points at `iov` (into `bytes`) and `cmsg`, alive for the call;
        // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        first = false;
        sent += n as usize;
    }
    Ok(())
}

/// Cuts a SET_MEM_TABLE payload to its `num_regions` regions (UML sends all 8 slots).
/// Returns whether the message was changed. Other messages, and SET_MEM_TABLE messages whose
/// `num_regions` is 0, above 8 or larger than the payload, are left for the crate to judge.
pub fn normalize(m: &mut Message) -> bool {
    if m.request() != SET_MEM_TABLE || m.payload.len() < 8 {
        return false;
    }
    let n = u32::from_le_bytes(m.payload[0..4].try_into().expect("4 bytes")) as usize;
    let want = 8 + n * REGION_LEN;
    if n == 0 || n > MAX_REGIONS || m.payload.len() <= want {
        return false;
    }
    m.payload.truncate(want);
    m.set_size(want);
    true
}

/// Copies messages from the front end to the crate (normalized) until either side closes.
pub fn front_to_back(front: &UnixStream, back: &UnixStream, stats: &RelayStats) -> io::Result<()> {
    loop {
        let Some(mut m) = read_message(front).inspect_err(|_| {
            stats.refused.fetch_add(1, Ordering::SeqCst);
        })?
        else {
            return Ok(());
        };
        if normalize(&mut m) {
            stats.normalized.fetch_add(1, Ordering::SeqCst);
        }
        stats.messages.fetch_add(1, Ordering::SeqCst);
        write_message(back, &m)?;
    }
}

/// Copies the crate's replies back to the front end until either side closes.
pub fn back_to_front(back: &UnixStream, front: &UnixStream) -> io::Result<()> {
    while let Some(m) = read_message(back)? {
        write_message(front, &m)?;
    }
    Ok(())
}

/// Runs both directions; returns when the connection ends (either side), with the reason.
pub fn run(front: UnixStream, back: UnixStream, stats: Arc<RelayStats>) -> io::Result<()> {
    let (f2, b2) = (front.try_clone()?, back.try_clone()?);
    let replies = std::thread::Builder::new()
        .name("vhost-user replies".into())
        .spawn(move || {
            let r = back_to_front(&b2, &f2);
            let _ = f2.shutdown(std::net::Shutdown::Both);
            r
        })?;
    let r = front_to_back(&front, &back, &stats);
    let _ = back.shutdown(std::net::Shutdown::Both);
    let _ = front.shutdown(std::net::Shutdown::Both);
    let _ = replies.join();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn msg(request: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = request.to_le_bytes().to_vec();
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn mem_table(n: u32, slots: usize) -> Vec<u8> {
        let mut p = n.to_le_bytes().to_vec();
        p.extend_from_slice(&0u32.to_le_bytes());
        for i in 0..slots {
            p.extend_from_slice(&[i as u8 + 1; REGION_LEN]);
        }
        p
    }

    #[test]
    fn uml_mem_table_is_cut_to_its_regions() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&msg(SET_MEM_TABLE, &mem_table(1, 8))).unwrap();
        let mut m = read_message(&b).unwrap().unwrap();
        assert_eq!(m.payload.len(), 8 + 8 * REGION_LEN);
        assert!(normalize(&mut m));
        assert_eq!(m.payload.len(), 8 + REGION_LEN);
        assert_eq!(
            u32::from_le_bytes(m.hdr[8..12].try_into().unwrap()) as usize,
            8 + REGION_LEN
        );
        assert_eq!(&m.payload[8..], &[1u8; REGION_LEN]);
        // An exact table, or one the crate must judge, is left alone.
        for p in [
            mem_table(2, 2),
            mem_table(0, 8),
            mem_table(9, 8),
            mem_table(4, 2),
        ] {
            let mut m = Message {
                hdr: msg(SET_MEM_TABLE, &p)[..12].try_into().unwrap(),
                payload: p.clone(),
                fds: Vec::new(),
            };
            assert!(!normalize(&mut m));
            assert_eq!(m.payload, p);
        }
    }

    #[test]
    fn malformed_framing_ends_only_the_connection() {
        // A header announcing a huge payload.
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut h = 1u32.to_le_bytes().to_vec();
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        a.write_all(&h).unwrap();
        assert!(read_message(&b).is_err());
        // A header cut short, then EOF.
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[1, 0, 0]).unwrap();
        drop(a);
        assert!(read_message(&b).is_err());
        // A payload cut short.
        let (mut a, b) = UnixStream::pair().unwrap();
        let full = msg(3, &[0u8; 64]);
        a.write_all(&full[..40]).unwrap();
        drop(a);
        assert!(read_message(&b).is_err());
        // A clean close between messages is not an error.
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(read_message(&b).unwrap().is_none());
    }

    #[test]
    fn descriptors_travel_with_their_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let m = Message {
            hdr: msg(SET_MEM_TABLE, &mem_table(1, 8))[..12]
                .try_into()
                .unwrap(),
            payload: mem_table(1, 8),
            fds: vec![OwnedFd::from(file)],
        };
        write_message(&a, &m).unwrap();
        let got = read_message(&b).unwrap().unwrap();
        assert_eq!(got.fds.len(), 1);
        assert_eq!(got.payload, m.payload);
        // Relayed: the crate's side gets the normalized message with the descriptor.
        let (front_client, front) = UnixStream::pair().unwrap();
        let (back, back_crate) = UnixStream::pair().unwrap();
        let stats = Arc::new(RelayStats::default());
        let s2 = stats.clone();
        let t = std::thread::spawn(move || run(front, back, s2));
        write_message(&front_client, &m).unwrap();
        let got = read_message(&back_crate).unwrap().unwrap();
        assert_eq!(got.payload.len(), 8 + REGION_LEN);
        assert_eq!(got.fds.len(), 1);
        // A reply flows back.
        let reply = Message {
            hdr: msg(1, &[7; 8])[..12].try_into().unwrap(),
            payload: vec![7; 8],
            fds: Vec::new(),
        };
        write_message(&back_crate, &reply).unwrap();
        assert_eq!(
            read_message(&front_client).unwrap().unwrap().payload,
            vec![7; 8]
        );
        drop(front_client);
        t.join().unwrap().unwrap();
        assert_eq!(stats.normalized.load(Ordering::SeqCst), 1);
        assert_eq!(stats.messages.load(Ordering::SeqCst), 1);
    }
}
