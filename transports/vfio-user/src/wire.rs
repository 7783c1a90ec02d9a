//! Raw vfio-user framing, for tests: the `vfio_user` client only sends well-formed messages and
//! does not look at the error flag of most replies, so robustness tests build messages byte by
//! byte here and read replies header first. Layouts follow the vfio-user specification (a
//! 16-byte header: message id u16, command u16, message size u32, flags u32, error u32; all
//! little-endian on the hosts this runs on).

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Command numbers.
pub mod cmd {
    /// VERSION.
    pub const VERSION: u16 = 1;
    /// DMA_MAP.
    pub const DMA_MAP: u16 = 2;
    /// DMA_UNMAP.
    pub const DMA_UNMAP: u16 = 3;
    /// DEVICE_GET_INFO.
    pub const DEVICE_GET_INFO: u16 = 4;
    /// SET_IRQS.
    pub const SET_IRQS: u16 = 8;
    /// REGION_READ.
    pub const REGION_READ: u16 = 9;
    /// REGION_WRITE.
    pub const REGION_WRITE: u16 = 10;
    /// DEVICE_RESET.
    pub const DEVICE_RESET: u16 = 13;
}

/// Header flag of a reply.
pub const FLAG_REPLY: u32 = 1;
/// Header flag of an error reply.
pub const FLAG_ERROR: u32 = 1 << 5;
/// Size of the header.
pub const HEADER: usize = 16;

/// A message: header plus body; `message_size` is set from the length unless overridden.
pub fn message(id: u16, command: u16, body: &[u8], size_override: Option<u32>) -> Vec<u8> {
    let size = size_override.unwrap_or((HEADER + body.len()) as u32);
    let mut m = Vec::with_capacity(HEADER + body.len());
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(&command.to_le_bytes());
    m.extend_from_slice(&size.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// A reply's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Message id (the request's).
    pub id: u16,
    /// Command.
    pub command: u16,
    /// Total size.
    pub size: u32,
    /// Flags.
    pub flags: u32,
    /// Error number.
    pub error: u32,
}

impl Reply {
    /// True if the error flag is set.
    pub fn is_error(&self) -> bool {
        self.flags & FLAG_ERROR != 0
    }
}

/// A raw client connection.
pub struct RawClient {
    /// The socket.
    pub stream: UnixStream,
    next_id: u16,
}

impl RawClient {
    /// Connects (no version negotiation yet); reads time out after 10 s.
    pub fn connect(path: &Path) -> io::Result<RawClient> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(RawClient { stream, next_id: 1 })
    }

    /// Connects and negotiates the version.
    pub fn connect_negotiated(path: &Path) -> io::Result<RawClient> {
        let mut c = RawClient::connect(path)?;
        let (r, _) = c.request(cmd::VERSION, &version_body(), None, &[])?;
        if r.is_error() {
            return Err(io::Error::other("VERSION refused"));
        }
        Ok(c)
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Sends a request (with file descriptors if any) and reads its reply.
    pub fn request(
        &mut self,
        command: u16,
        body: &[u8],
        size_override: Option<u32>,
        fds: &[RawFd],
    ) -> io::Result<(Reply, Vec<u8>)> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let m = message(id, command, body, size_override);
        if fds.is_empty() {
            self.stream.write_all(&m)?;
        } else {
            self.stream
                .send_with_fds(&[&m[..]], fds)
                .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        }
        self.reply()
    }

    /// Reads one reply (its body up to 1 MiB).
    pub fn reply(&mut self) -> io::Result<(Reply, Vec<u8>)> {
        let mut h = [0u8; HEADER];
        self.stream.read_exact(&mut h)?;
        let r = Reply {
            id: u16::from_le_bytes([h[0], h[1]]),
            command: u16::from_le_bytes([h[2], h[3]]),
            size: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            flags: u32::from_le_bytes([h[8], h[9], h[10], h[11]]),
            error: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
        };
        let body_len = (r.size as usize).saturating_sub(HEADER);
        if body_len > 1 << 20 {
            return Err(io::Error::other(format!("reply of {} bytes", r.size)));
        }
        let mut body = vec![0u8; body_len];
        self.stream.read_exact(&mut body)?;
        Ok((r, body))
    }

    /// Reads `count` bytes of `region` at `offset`.
    pub fn region_read(
        &mut self,
        region: u32,
        offset: u64,
        count: u32,
    ) -> io::Result<(Reply, Vec<u8>)> {
        self.request(
            cmd::REGION_READ,
            &region_access(region, offset, count, &[]),
            None,
            &[],
        )
    }

    /// Writes `data` to `region` at `offset`.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<Reply> {
        let body = region_access(region, offset, data.len() as u32, data);
        Ok(self.request(cmd::REGION_WRITE, &body, None, &[])?.0)
    }

    /// Maps `size` bytes of `fd` (if any) at `address`.
    pub fn dma_map(
        &mut self,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<RawFd>,
    ) -> io::Result<Reply> {
        let fds: Vec<RawFd> = fd.into_iter().collect();
        Ok(self
            .request(
                cmd::DMA_MAP,
                &dma_map_body(3, offset, address, size),
                None,
                &fds,
            )?
            .0)
    }
}

/// The body of a VERSION message: major 0, minor 1, default capabilities.
pub fn version_body() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(b"{\"capabilities\":{}}\0");
    b
}

/// The body of REGION_READ/REGION_WRITE: offset u64, region u32, count u32, then data.
pub fn region_access(region: u32, offset: u64, count: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&region.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(data);
    b
}

/// The body of DMA_MAP: argsz, flags, offset, address, size.
pub fn dma_map_body(flags: u32, offset: u64, address: u64, size: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&32u32.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&address.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b
}

/// The body of DMA_UNMAP: argsz, flags, address, size.
pub fn dma_unmap_body(flags: u32, address: u64, size: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&24u32.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&address.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b
}

/// The body of SET_IRQS: argsz, flags, index, start, count.
pub fn set_irqs_body(flags: u32, index: u32, start: u32, count: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&20u32.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(&start.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b
}
