//! The snapshot / migration stream: versioned, self-describing, and read as untrusted input.
//!
//! ```text
//! magic "GPUVMSNP" (8 bytes), format version u32 LE
//! records, each: tag u8, payload length u32 LE, payload
//!   1 INFO    JSON StreamInfo: what follows (profile, slice size, page size, producer)
//!   2 PAGES   n x (page index u64 LE, 4096 bytes): VRAM pages of the slice
//!   3 DEVICE  JSON DeviceState (crate::vgpu::DeviceState)
//!   4 END     pages sent u64 LE, records sent u64 LE
//! ```
//!
//! INFO comes first and once, PAGES any number of times (a live migration sends one batch per
//! round; a later copy of a page replaces an earlier one), DEVICE once, END last. A reader
//! checks the magic, the version, every length against a limit before allocating, every page
//! index against the slice, the JSON against its schema (unknown fields refused), the order of
//! records and END's counts; a stream that ends before END is truncated. Errors name what was
//! wrong and where.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::profile::VgpuProfile;
use crate::vgpu::DeviceState;

/// The first bytes of a stream.
pub const MAGIC: &[u8; 8] = b"GPUVMSNP";
/// The stream format this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of a VRAM page in a stream.
pub const PAGE: usize = 4096;
/// Pages in one PAGES record at most.
pub const MAX_PAGES_PER_RECORD: usize = 256;
/// Bytes of a JSON record at most.
pub const MAX_JSON: usize = 16 << 20;

const TAG_INFO: u8 = 1;
const TAG_PAGES: u8 = 2;
const TAG_DEVICE: u8 = 3;
const TAG_END: u8 = 4;
const PAGE_ENTRY: usize = 8 + PAGE;

/// What a stream carries (its first record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamInfo {
    /// Always "gpuvm-vgpu-snapshot".
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The vGPU's profile (the destination creates its vGPU from it).
    pub profile: VgpuProfile,
    /// Bytes of the VRAM slice the pages belong to.
    pub slice_bytes: u64,
    /// [`PAGE`].
    pub page_size: u64,
    /// The producing build.
    pub producer: String,
}

impl StreamInfo {
    /// The info of a stream of a vGPU with `profile` and a slice of `slice_bytes`.
    pub fn new(profile: &VgpuProfile, slice_bytes: u64) -> StreamInfo {
        StreamInfo {
            format: "gpuvm-vgpu-snapshot".into(),
            version: VERSION,
            profile: profile.clone(),
            slice_bytes,
            page_size: PAGE as u64,
            producer: concat!("gpuvm ", env!("CARGO_PKG_VERSION")).into(),
        }
    }
}

/// Why a stream was refused.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// Reading or writing failed.
    #[error("stream I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Not a gpuvm snapshot.
    #[error("not a gpuvm snapshot (bad magic)")]
    BadMagic,
    /// Another format version.
    #[error("snapshot format version {found}, this build reads {VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// The stream ended early.
    #[error("snapshot truncated: {0}")]
    Truncated(&'static str),
    /// A record is malformed.
    #[error("record {index} ({what}): {why}")]
    Record {
        /// Its number, from 0.
        index: u64,
        /// Its kind.
        what: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// One record as read.
#[derive(Debug)]
pub enum Record {
    /// What the stream carries.
    Info(StreamInfo),
    /// VRAM pages: (page index, contents).
    Pages(Vec<(u64, Box<[u8]>)>),
    /// The device state.
    Device(Box<DeviceState>),
    /// The end.
    End {
        /// Page entries the producer sent.
        pages: u64,
        /// Records before END the producer sent.
        records: u64,
    },
}

/// Writes a stream.
pub struct StreamWriter<W: Write> {
    w: W,
    records: u64,
    pages: u64,
    bytes: u64,
}

impl<W: Write> StreamWriter<W> {
    /// Starts a stream on `w` with its INFO record.
    pub fn new(mut w: W, info: &StreamInfo) -> Result<StreamWriter<W>, StreamError> {
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        let mut s = StreamWriter {
            w,
            records: 0,
            pages: 0,
            bytes: 12,
        };
        let json = serde_json::to_vec(info).map_err(std::io::Error::other)?;
        s.record(TAG_INFO, &json)?;
        Ok(s)
    }

    fn record(&mut self, tag: u8, payload: &[u8]) -> Result<(), StreamError> {
        self.w.write_all(&[tag])?;
        self.w.write_all(&(payload.len() as u32).to_le_bytes())?;
        self.w.write_all(payload)?;
        self.records += 1;
        self.bytes += 5 + payload.len() as u64;
        Ok(())
    }

    /// Writes VRAM pages (batched into records of at most [`MAX_PAGES_PER_RECORD`]).
    pub fn pages(&mut self, pages: &[(u64, &[u8])]) -> Result<(), StreamError> {
        for chunk in pages.chunks(MAX_PAGES_PER_RECORD) {
            let mut buf = Vec::with_capacity(chunk.len() * PAGE_ENTRY);
            for (idx, data) in chunk {
                assert_eq!(data.len(), PAGE, "a stream page is {PAGE} bytes");
                buf.extend_from_slice(&idx.to_le_bytes());
                buf.extend_from_slice(data);
            }
            self.record(TAG_PAGES, &buf)?;
            self.pages += chunk.len() as u64;
        }
        Ok(())
    }

    /// Writes the device state.
    pub fn device(&mut self, st: &DeviceState) -> Result<(), StreamError> {
        let json = serde_json::to_vec(st).map_err(std::io::Error::other)?;
        self.record(TAG_DEVICE, &json)
    }

    /// Writes END, flushes, and returns the writer and the stream's length in bytes.
    pub fn finish(mut self) -> Result<(W, u64), StreamError> {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&self.pages.to_le_bytes());
        p[8..].copy_from_slice(&self.records.to_le_bytes());
        self.w.write_all(&[TAG_END])?;
        self.w.write_all(&16u32.to_le_bytes())?;
        self.w.write_all(&p)?;
        self.bytes += 21;
        self.w.flush()?;
        Ok((self.w, self.bytes))
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Page entries written so far.
    pub fn pages_written(&self) -> u64 {
        self.pages
    }

    /// The writer the stream goes to (an [`super::Outgoing`] takes the bytes from it).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.w
    }

    /// Flushes what was written.
    pub fn flush(&mut self) -> Result<(), StreamError> {
        self.w.flush()?;
        Ok(())
    }
}

/// Reads a stream, checking every record.
pub struct StreamReader<R: Read> {
    r: R,
    index: u64,
    info: Option<StreamInfo>,
    device: bool,
    ended: bool,
    pages: u64,
}

impl<R: Read> StreamReader<R> {
    /// Checks the magic and version of `r`.
    pub fn new(mut r: R) -> Result<StreamReader<R>, StreamError> {
        let mut head = [0u8; 12];
        read_exact(&mut r, &mut head, "header")?;
        if &head[..8] != MAGIC {
            return Err(StreamError::BadMagic);
        }
        let found = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if found != VERSION {
            return Err(StreamError::Version { found });
        }
        Ok(StreamReader {
            r,
            index: 0,
            info: None,
            device: false,
            ended: false,
            pages: 0,
        })
    }

    /// The INFO record, once read.
    pub fn info(&self) -> Option<&StreamInfo> {
        self.info.as_ref()
    }

    fn bad(&self, what: &'static str, why: impl Into<String>) -> StreamError {
        StreamError::Record {
            index: self.index,
            what,
            why: why.into(),
        }
    }

    /// The next record; `None` after END.
    pub fn next_record(&mut self) -> Result<Option<Record>, StreamError> {
        if self.ended {
            return Ok(None);
        }
        let mut head = [0u8; 5];
        read_exact(&mut self.r, &mut head, "no END record")?;
        let tag = head[0];
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let what = match tag {
            TAG_INFO => "INFO",
            TAG_PAGES => "PAGES",
            TAG_DEVICE => "DEVICE",
            TAG_END => "END",
            _ => return Err(self.bad("unknown", format!("tag {tag}"))),
        };
        let limit = match tag {
            TAG_PAGES => MAX_PAGES_PER_RECORD * PAGE_ENTRY,
            TAG_END => 16,
            _ => MAX_JSON,
        };
        if len > limit {
            return Err(self.bad(what, format!("{len} bytes, at most {limit}")));
        }
        if tag != TAG_INFO && self.info.is_none() {
            return Err(self.bad(what, "the first record must be INFO"));
        }
        let mut payload = vec![0u8; len];
        read_exact(&mut self.r, &mut payload, "a record is cut short")?;
        let rec = match tag {
            TAG_INFO => {
                if self.info.is_some() {
                    return Err(self.bad(what, "a second INFO"));
                }
                let info: StreamInfo =
                    serde_json::from_slice(&payload).map_err(|e| self.bad(what, e.to_string()))?;
                if info.format != "gpuvm-vgpu-snapshot"
                    || info.version != VERSION
                    || info.page_size != PAGE as u64
                {
                    return Err(self.bad(
                        what,
                        format!(
                            "format {:?} version {} page size {}",
                            info.format, info.version, info.page_size
                        ),
                    ));
                }
                if let Err(e) = info.profile.validate() {
                    return Err(self.bad(what, format!("profile: {e}")));
                }
                if info.slice_bytes != info.profile.vram_bytes() {
                    return Err(self.bad(
                        what,
                        format!(
                            "slice of {} bytes, the profile has {}",
                            info.slice_bytes,
                            info.profile.vram_bytes()
                        ),
                    ));
                }
                self.info = Some(info.clone());
                Record::Info(info)
            }
            TAG_PAGES => {
                if self.device {
                    return Err(self.bad(what, "pages after DEVICE"));
                }
                if !len.is_multiple_of(PAGE_ENTRY) {
                    return Err(self.bad(what, format!("{len} bytes is not whole pages")));
                }
                let slice_pages = self.info.as_ref().map_or(0, |i| i.slice_bytes) / PAGE as u64;
                let mut out = Vec::with_capacity(len / PAGE_ENTRY);
                for e in payload.chunks_exact(PAGE_ENTRY) {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&e[..8]);
                    let idx = u64::from_le_bytes(b);
                    if idx >= slice_pages {
                        return Err(self.bad(
                            what,
                            format!("page {idx} is outside the {slice_pages}-page slice"),
                        ));
                    }
                    out.push((idx, e[8..].to_vec().into_boxed_slice()));
                }
                self.pages += out.len() as u64;
                Record::Pages(out)
            }
            TAG_DEVICE => {
                if self.device {
                    return Err(self.bad(what, "a second DEVICE"));
                }
                let st: DeviceState =
                    serde_json::from_slice(&payload).map_err(|e| self.bad(what, e.to_string()))?;
                if Some(&st.profile) != self.info.as_ref().map(|i| &i.profile) {
                    return Err(self.bad(what, "its profile differs from INFO's"));
                }
                self.device = true;
                Record::Device(Box::new(st))
            }
            _ => {
                let mut a = [0u8; 8];
                let mut b = [0u8; 8];
                if len != 16 {
                    return Err(self.bad(what, format!("{len} bytes, expected 16")));
                }
                a.copy_from_slice(&payload[..8]);
                b.copy_from_slice(&payload[8..]);
                let (pages, records) = (u64::from_le_bytes(a), u64::from_le_bytes(b));
                if !self.device {
                    return Err(self.bad(what, "no DEVICE record before END"));
                }
                if pages != self.pages || records != self.index {
                    return Err(self.bad(
                        what,
                        format!(
                            "the producer sent {pages} pages in {records} records, {} pages in {} \
                             records arrived",
                            self.pages, self.index
                        ),
                    ));
                }
                self.ended = true;
                Record::End { pages, records }
            }
        };
        self.index += 1;
        Ok(Some(rec))
    }
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &'static str) -> Result<(), StreamError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => StreamError::Truncated(what),
        _ => StreamError::Io(e),
    })
}
