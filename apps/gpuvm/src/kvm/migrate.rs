//! Live migration of a running guest between two VMM processes over a Unix socket
//! (`gpuvm run --kvm --migrate-listen SOCK` on the destination, `--migrate-to SOCK
//! --migrate-after-exits N` on the source).
//!
//! Pre-copy: the source turns on KVM's dirty-page log for the RAM slot
//! (`KVM_MEM_LOG_DIRTY_PAGES`), sends every non-zero page while the guest keeps running (round
//! 0), then in each further round the pages `KVM_GET_DIRTY_LOG` reports written since the last
//! one, until a round finds at most [`STOP_PAGES`] dirty pages or [`MAX_ROUNDS`] rounds have
//! run. Each RAM round is followed by a VRAM round of the vGPU (a [`LiveSession`], whose dirty
//! log starts with the migration: `gpuvm::migrate::Outgoing` in this process, or the `gpuvm
//! serve` daemon that holds the vGPU, over its control socket), written as a
//! `gpuvm::migrate` stream and sent in VGPU messages; pre-copy also waits for a VRAM round of at most [`STOP_VRAM_PAGES`]. Then
//! stop-and-copy: the migration thread asks the vCPU thread to pause (a flag and the kick
//! signal of [`super::kick`], so a guest spinning without exits is reached too); at its next
//! exit boundary the vCPU thread completes the pending exit, captures the vCPU, VM and VMM
//! state ([`super::snapshot`]) and hands it over; the migration thread quiesces the vGPU,
//! sends the last dirty RAM pages **plus every guest-RAM page the GPU could write by DMA since
//! the vGPU's log began** (`DirtyLog::dma_reachable`: KVM's dirty log does not see the GPU's
//! writes), the last VRAM pages and the device state (ending the vGPU's stream), a hash of all
//! of RAM and the state (which carries the vGPU stream's length and hash), and waits for the
//! destination to say it has loaded everything. The destination keeps the vGPU's stream
//! (at most [`MAX_VGPU_STREAM`] bytes) until RAM is complete, then restores the vGPU into its
//! own host (or, with `--vfio-user`, into its daemon) with that RAM attached, then the vCPU
//! runs. Downtime is the time the vCPU is paused. If anything fails before
//! that acknowledgment (the destination refuses, the vGPU cannot be captured, the socket
//! breaks), the source resumes the guest and the run goes on there.
//!
//! The stream (all integers little-endian): messages of `tag: u8, len: u32, payload[len]`.
//! Source to destination: HELLO (`"GPUVMMIG"`, version u32, JSON [`Hello`]), PAGES (round u32,
//! count u32, then per page `u64` index, bit 63 set for an all-zero page which carries no
//! data, else 4096 bytes), ROUND_END (round u32, pages u64), VGPU (the next bytes of the
//! vGPU's `gpuvm::migrate` stream), STATE (JSON [`StateMsg`]), ABORT (reason). Destination to source: OK (text) or ERR (reason), after HELLO and after STATE.
//! The destination treats everything as untrusted: unknown tags, lengths over [`MAX_MSG`], a
//! page index outside RAM, a count that does not match the payload or the round's total, a
//! version or RAM size it does not take, a RAM hash that differs, are all refused with an
//! error naming them.

use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use kvm_ioctls::{Kvm, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};

use super::device_seam::{self, LiveSession, MAX_VGPU_STREAM};
use super::snapshot::{self, DeviceInfo, GuestSpec, Hasher, MachineState, PAGE};
use super::vm::GuestVm;

/// The first bytes of HELLO.
pub const MAGIC: &[u8; 8] = b"GPUVMMIG";
/// Stream version; another is refused.
pub const VERSION: u32 = 1;
/// Largest message payload.
pub const MAX_MSG: usize = 64 << 20;
/// Pages per PAGES message.
const BATCH: usize = 256;
/// Pre-copy stops when a round finds at most this many dirty pages (1 MiB).
pub const STOP_PAGES: usize = 256;
/// ... or after this many rounds (round 0 included).
pub const MAX_ROUNDS: u32 = 8;
/// Bit 63 of a page entry: the page is all zeros (no data follows).
const ZERO_PAGE: u64 = 1 << 63;

const HELLO: u8 = 1;
const OK: u8 = 2;
const ERR: u8 = 3;
const PAGES: u8 = 4;
const ROUND_END: u8 = 5;
const STATE: u8 = 6;
const ABORT: u8 = 7;
const VGPU: u8 = 8;
/// Bytes of vGPU stream per VGPU message.
const VGPU_CHUNK: usize = 16 << 20;
/// Pre-copy also waits for a VRAM round of at most this many pages (1 MiB) before stopping.
pub const STOP_VRAM_PAGES: u64 = 256;

fn tag_name(t: u8) -> &'static str {
    match t {
        HELLO => "HELLO",
        OK => "OK",
        ERR => "ERR",
        PAGES => "PAGES",
        ROUND_END => "ROUND_END",
        STATE => "STATE",
        ABORT => "ABORT",
        VGPU => "VGPU",
        _ => "unknown",
    }
}

/// HELLO's JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The guest's parameters (the destination runs with them).
    pub guest: GuestSpec,
    /// RAM size, bytes.
    pub ram_bytes: u64,
    /// Page size.
    pub page_size: u64,
}

/// STATE's JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateMsg {
    /// Everything but RAM.
    pub machine: MachineState,
    /// Hash of all of RAM at the stop.
    pub ram_hash: String,
    /// The vGPU's bytes, hex.
    pub vgpu_hex: String,
}

fn write_msg(w: &mut impl Write, tag: u8, payload: &[u8]) -> std::io::Result<()> {
    w.write_all(&[tag])?;
    w.write_all(&(payload.len() as u32).to_le_bytes())?;
    w.write_all(payload)?;
    w.flush()
}

fn read_msg(r: &mut impl Read, peer: &str) -> anyhow::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => anyhow::anyhow!("the {peer} closed the stream"),
        _ => anyhow::anyhow!("reading from the {peer}: {e}"),
    })?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    ensure!(
        len <= MAX_MSG,
        "the {peer} sent a {} message of {len} bytes (at most {MAX_MSG})",
        tag_name(head[0])
    );
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(|e| {
        anyhow::anyhow!(
            "the {peer}'s {} message ended early ({len} bytes announced): {e}",
            tag_name(head[0])
        )
    })?;
    Ok((head[0], payload))
}

/// Reads the destination's OK or ERR.
fn expect_ok(r: &mut impl Read, after: &str) -> anyhow::Result<String> {
    match read_msg(r, "destination")? {
        (OK, p) => Ok(String::from_utf8_lossy(&p).into_owned()),
        (ERR, p) => bail!(
            "the destination refused {after}: {}",
            String::from_utf8_lossy(&p)
        ),
        (t, _) => bail!(
            "the destination answered {after} with {} ({t})",
            tag_name(t)
        ),
    }
}

/// One pre-copy round, as measured by whoever sent or received it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Round {
    /// 0 = all non-zero pages; the last = stop-and-copy (the guest paused).
    pub round: u32,
    /// Pages sent (zero pages included).
    pub pages: u64,
    /// Of which all-zero (no data sent).
    pub zero_pages: u64,
    /// Bytes on the stream.
    pub bytes: u64,
    /// Time the round took, ns.
    pub ns: u64,
    /// The guest was paused (stop-and-copy).
    pub stop_and_copy: bool,
}

/// What the source measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SourceStats {
    /// The socket.
    pub socket: PathBuf,
    /// Every round, stop-and-copy last.
    pub rounds: Vec<Round>,
    /// Bytes on the stream in all.
    pub bytes: u64,
    /// From the connection to the destination's last OK, ns.
    pub total_ns: u64,
    /// The vCPU was paused this long (capture, last pages, state, the destination loading it), ns.
    pub downtime_ns: u64,
    /// Of the downtime: hashing all of RAM at the stop, ns.
    pub hash_ns: u64,
    /// Length of the STATE message.
    pub state_bytes: u64,
    /// RAM size.
    pub ram_bytes: u64,
    /// What the destination said at the end.
    pub destination: String,
    /// The vGPU's VRAM rounds (`gpuvm::migrate::VramCopy`), stop-and-copy last.
    pub vram_rounds: Vec<gpuvm::migrate::RoundStats>,
    /// Bytes of the vGPU's stream (VRAM pages and device state), VGPU message headers excluded.
    pub vgpu_stream_bytes: u64,
    /// Guest-RAM pages the GPU could reach by DMA, sent again in the stop-and-copy round
    /// (KVM's dirty log does not see the GPU's writes).
    pub dma_pages: u64,
    /// Submissions withdrawn while quiescing the vGPU.
    pub withdrawn: u64,
}

/// What the destination measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DestStats {
    /// The socket.
    pub socket: PathBuf,
    /// Rounds received.
    pub rounds: Vec<Round>,
    /// Bytes received.
    pub bytes: u64,
    /// From HELLO to the state loaded, ns.
    pub total_ns: u64,
    /// From STATE received to the guest ready to run, ns.
    pub load_ns: u64,
    /// Bytes of the vGPU's stream received.
    pub vgpu_stream_bytes: u64,
}

// ---------------------------------------------------------------------------------------------
// Destination

/// A connection accepted on the destination, HELLO read and checked.
pub struct Incoming {
    reader: BufReader<UnixStream>,
    writer: BufWriter<UnixStream>,
    /// The source's HELLO.
    pub hello: Hello,
    socket: PathBuf,
    started: Instant,
    state_at: Option<Instant>,
    stats: DestStats,
    vgpu_stream: Vec<u8>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("socket", &self.socket)
            .finish()
    }
}

/// Listens on `socket` (a stale socket file there is replaced; any other file is refused),
/// accepts one source and reads its HELLO. `wait` bounds every read from the source.
pub fn listen(socket: &Path, wait: Duration) -> anyhow::Result<Incoming> {
    accept(bind(socket)?, socket, wait)
}

/// Binds `socket` for [`accept`] (a stale socket file there is replaced; any other file is
/// refused): from then on a source can connect.
fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if let Ok(m) = std::fs::symlink_metadata(socket) {
        use std::os::unix::fs::FileTypeExt;
        ensure!(
            m.file_type().is_socket(),
            "{} exists and is not a socket",
            socket.display()
        );
        std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale socket {}", socket.display()))?;
    }
    UnixListener::bind(socket).with_context(|| format!("listening on {}", socket.display()))
}

/// Accepts one source on `l` (bound at `socket`) and reads its HELLO.
fn accept(l: UnixListener, socket: &Path, wait: Duration) -> anyhow::Result<Incoming> {
    eprintln!("gpuvm: waiting for a migration on {}", socket.display());
    let (s, _) = l.accept().context("accepting the migration")?;
    drop(l);
    let _ = std::fs::remove_file(socket);
    s.set_read_timeout(Some(wait))?;
    let started = Instant::now();
    let mut reader = BufReader::with_capacity(1 << 20, s.try_clone()?);
    let mut writer = BufWriter::new(s);
    let hello = (|| -> anyhow::Result<Hello> {
        let (t, p) = read_msg(&mut reader, "source")?;
        ensure!(
            t == HELLO,
            "the source began with {} ({t}), not HELLO",
            tag_name(t)
        );
        ensure!(
            p.len() >= 12 && &p[..8] == MAGIC,
            "the source's HELLO does not start with {MAGIC:?}: not a gpuvm migration stream"
        );
        let v = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
        ensure!(
            v == VERSION,
            "the source speaks stream version {v}; this gpuvm speaks {VERSION}"
        );
        let h: Hello = serde_json::from_slice(&p[12..]).context("the source's HELLO")?;
        ensure!(
            h.page_size == PAGE,
            "page size {} (expected {PAGE})",
            h.page_size
        );
        ensure!(
            h.ram_bytes == h.guest.ram_bytes && h.ram_bytes > 0 && h.ram_bytes.is_multiple_of(PAGE),
            "RAM of {:#x} bytes does not match the guest's {:#x}",
            h.ram_bytes,
            h.guest.ram_bytes
        );
        Ok(h)
    })();
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            let _ = write_msg(&mut writer, ERR, format!("{e:#}").as_bytes());
            return Err(e);
        }
    };
    Ok(Incoming {
        reader,
        writer,
        hello,
        socket: socket.to_path_buf(),
        started,
        state_at: None,
        vgpu_stream: Vec::new(),
        stats: DestStats {
            socket: socket.to_path_buf(),
            ..DestStats::default()
        },
    })
}

impl Incoming {
    /// Tells the source why the destination gives up (best effort: it may be gone).
    pub fn refuse(&mut self, e: &anyhow::Error) {
        let _ = write_msg(&mut self.writer, ERR, format!("{e:#}").as_bytes());
    }

    /// Accepts the source (OK to HELLO), then receives pages into `mem` until the STATE
    /// message; checks RAM against the source's hash. Returns the state and the vGPU's bytes.
    pub fn receive(&mut self, mem: &GuestMemoryMmap) -> anyhow::Result<(MachineState, Vec<u8>)> {
        let ram = self.hello.ram_bytes;
        ensure!(
            mem.last_addr().0 + 1 == ram,
            "RAM here is {:#x} bytes, the source's {ram:#x}",
            mem.last_addr().0 + 1
        );
        write_msg(&mut self.writer, OK, b"ready").context("answering HELLO")?;
        let pages_total = ram / PAGE;
        let mut round = Round::default();
        let mut round_t = Instant::now();
        loop {
            let (t, p) = read_msg(&mut self.reader, "source")?;
            self.stats.bytes += 5 + p.len() as u64;
            round.bytes += 5 + p.len() as u64;
            match t {
                PAGES => {
                    let (r, n) = apply_pages(&p, mem, pages_total)?;
                    ensure!(
                        r == round.round,
                        "PAGES of round {r} inside round {}",
                        round.round
                    );
                    round.pages += n.0;
                    round.zero_pages += n.1;
                }
                VGPU => {
                    ensure!(
                        self.vgpu_stream.len() as u64 + p.len() as u64 <= MAX_VGPU_STREAM,
                        "the vGPU's stream is longer than {MAX_VGPU_STREAM} bytes"
                    );
                    self.vgpu_stream.extend_from_slice(&p);
                    self.stats.vgpu_stream_bytes += p.len() as u64;
                }
                ROUND_END => {
                    ensure!(p.len() == 12, "ROUND_END of {} bytes", p.len());
                    let r = u32::from_le_bytes(p[0..4].try_into()?);
                    let n = u64::from_le_bytes(p[4..12].try_into()?);
                    ensure!(
                        r == round.round && n == round.pages,
                        "round {r} ended with {n} pages announced; {} pages of round {} arrived",
                        round.pages,
                        round.round
                    );
                    ensure!(r < 1024, "more than 1024 rounds");
                    round.ns = round_t.elapsed().as_nanos() as u64;
                    let next = round.round + 1;
                    self.stats.rounds.push(std::mem::take(&mut round));
                    round.round = next;
                    round_t = Instant::now();
                }
                STATE => {
                    let t0 = Instant::now();
                    if let Some(last) = self.stats.rounds.last_mut() {
                        last.stop_and_copy = true;
                    }
                    let s: StateMsg = serde_json::from_slice(&p).context("the source's STATE")?;
                    let vgpu = if self.vgpu_stream.is_empty() {
                        unhex(&s.vgpu_hex).context("the vGPU's bytes")?
                    } else {
                        ensure!(
                            s.vgpu_hex.is_empty(),
                            "the source sent the vGPU both as a stream and in its STATE"
                        );
                        std::mem::take(&mut self.vgpu_stream)
                    };
                    let here = snapshot::ram_hash(mem, ram)?;
                    ensure!(
                        here == s.ram_hash,
                        "RAM here hashes to {here}, the source's to {}: pages were lost",
                        s.ram_hash
                    );
                    ensure!(
                        s.machine.vcpus.len() == 1,
                        "{} vCPUs (this VMM runs one)",
                        s.machine.vcpus.len()
                    );
                    self.state_at = Some(t0);
                    return Ok((s.machine, vgpu));
                }
                ABORT => bail!(
                    "the source aborted the migration: {}",
                    String::from_utf8_lossy(&p)
                ),
                t => bail!("the source sent {} ({t}) during pre-copy", tag_name(t)),
            }
        }
    }

    /// The socket it came in on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Says OK to STATE: the guest is loaded and runs here now. Returns the statistics.
    pub fn loaded(&mut self) -> anyhow::Result<DestStats> {
        self.stats.load_ns = self.state_at.map_or(0, |t| t.elapsed().as_nanos() as u64);
        self.stats.total_ns = self.started.elapsed().as_nanos() as u64;
        write_msg(&mut self.writer, OK, b"loaded; the guest runs here")
            .context("acknowledging the state")?;
        Ok(self.stats.clone())
    }
}

/// Checks and applies one PAGES payload; returns its round and (pages, zero pages).
fn apply_pages(
    p: &[u8],
    mem: &GuestMemoryMmap,
    pages_total: u64,
) -> anyhow::Result<(u32, (u64, u64))> {
    ensure!(p.len() >= 8, "PAGES of {} bytes", p.len());
    let round = u32::from_le_bytes(p[0..4].try_into()?);
    let count = u32::from_le_bytes(p[4..8].try_into()?) as usize;
    ensure!(count <= BATCH * 4, "PAGES with {count} pages");
    let mut at = 8;
    let zero = [0u8; PAGE as usize];
    let mut zeros = 0;
    for i in 0..count {
        let word = p
            .get(at..at + 8)
            .with_context(|| format!("PAGES: entry {i} of {count} is cut off"))?;
        let word = u64::from_le_bytes(word.try_into()?);
        at += 8;
        let index = word & !ZERO_PAGE;
        ensure!(
            index < pages_total,
            "PAGES: page {index:#x} is outside RAM ({pages_total:#x} pages)"
        );
        let data: &[u8] = if word & ZERO_PAGE != 0 {
            zeros += 1;
            &zero
        } else {
            let d = p
                .get(at..at + PAGE as usize)
                .with_context(|| format!("PAGES: the data of page {index:#x} is cut off"))?;
            at += PAGE as usize;
            d
        };
        mem.write_slice(data, GuestAddress(index * PAGE))
            .context("writing guest RAM")?;
    }
    ensure!(
        at == p.len(),
        "PAGES: {} bytes after {count} pages",
        p.len() - at
    );
    Ok((round, (count as u64, zeros)))
}

fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
    ensure!(s.len().is_multiple_of(2), "odd length");
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(s.get(i..i + 2).context("not ASCII")?, 16)
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Source

/// What the vCPU thread hands the migration thread at the stop: the state (the vGPU's part
/// is left to the migration thread), or why there is none (the migration is then aborted).
pub type Handover = Result<(MachineState, Vec<u8>), String>;

/// The migration thread of a source, as the vCPU thread sees it.
pub struct Source {
    stop: Arc<AtomicBool>,
    tx: Option<mpsc::SyncSender<Handover>>,
    handle: Option<std::thread::JoinHandle<anyhow::Result<SourceStats>>>,
}

impl Source {
    /// Starts pre-copy of `gvm`'s RAM to `socket` in a new thread; dirty logging must be on.
    /// The thread kicks the calling (vCPU) thread when it wants the stop.
    pub fn start(
        kvm: &Kvm,
        gvm: &GuestVm,
        socket: &Path,
        guest: GuestSpec,
        live: Box<dyn LiveSession>,
    ) -> anyhow::Result<Source> {
        // The thread reads the dirty log through its own descriptor of the VM.
        // SAFETY: dup of the VM fd this GuestVm owns; the copy is owned by the new VmFd.
        let fd = unsafe { libc::dup(gvm.fd.as_raw_fd()) };
        ensure!(
            fd >= 0,
            "dup of the VM fd: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is a valid, open KVM VM descriptor that nothing else owns.
        let vm = match unsafe { kvm.create_vmfd_from_rawfd(fd) } {
            Ok(vm) => vm,
            Err(e) => {
                // SAFETY: `fd` is ours (the dup above) and nothing took it.
                unsafe { libc::close(fd) };
                bail!("VM fd for the dirty log: {e}");
            }
        };
        let mem = gvm.mem.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::sync_channel::<Handover>(1);
        // SAFETY: pthread_self has no preconditions.
        let vcpu_thread = unsafe { libc::pthread_self() };
        let socket = socket.to_path_buf();
        let st = stop.clone();
        let handle = std::thread::Builder::new()
            .name("migrate".into())
            .spawn(move || run_source(vm, mem, socket, guest, st, rx, vcpu_thread, live))?;
        Ok(Source {
            stop,
            tx: Some(tx),
            handle: Some(handle),
        })
    }

    /// True when the migration thread wants the guest paused.
    pub fn wants_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// True if the migration thread has ended (failed, before asking for the stop).
    pub fn finished(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Hands the state over and waits for the end of the migration.
    pub fn hand_over(&mut self, h: Handover) -> anyhow::Result<SourceStats> {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(h);
        }
        self.join()
    }

    /// Waits for the thread (dropping the channel first, so a thread waiting for the state
    /// aborts).
    pub fn join(&mut self) -> anyhow::Result<SourceStats> {
        self.tx = None;
        match self.handle.take() {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the migration thread panicked"))),
            None => bail!("the migration already ended"),
        }
    }
}

impl Drop for Source {
    /// The thread signals this (vCPU) thread: it must end before this thread does, even if
    /// the run loop was left early.
    fn drop(&mut self) {
        if self.handle.is_some() {
            let _ = self.join();
        }
    }
}

/// Sends `pages` (indices) of `mem` as PAGES messages of `round`; returns (zero pages, bytes).
fn send_pages(
    w: &mut impl Write,
    mem: &GuestMemoryMmap,
    round: u32,
    pages: &[u64],
) -> anyhow::Result<(u64, u64)> {
    let mut zeros = 0;
    let mut bytes = 0;
    let mut page = vec![0u8; PAGE as usize];
    for chunk in pages.chunks(BATCH) {
        let mut p = Vec::with_capacity(8 + chunk.len() * (8 + PAGE as usize));
        p.extend_from_slice(&round.to_le_bytes());
        p.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        for &i in chunk {
            mem.read_slice(&mut page, GuestAddress(i * PAGE))
                .context("reading guest RAM")?;
            if page.iter().all(|&b| b == 0) {
                p.extend_from_slice(&(i | ZERO_PAGE).to_le_bytes());
                zeros += 1;
            } else {
                p.extend_from_slice(&i.to_le_bytes());
                p.extend_from_slice(&page);
            }
        }
        write_msg(w, PAGES, &p).context("sending pages")?;
        bytes += 5 + p.len() as u64;
    }
    Ok((zeros, bytes))
}

fn end_round(w: &mut impl Write, round: u32, pages: u64) -> anyhow::Result<u64> {
    let mut p = round.to_le_bytes().to_vec();
    p.extend_from_slice(&pages.to_le_bytes());
    write_msg(w, ROUND_END, &p).context("ending a round")?;
    Ok(5 + p.len() as u64)
}

/// The vGPU's side of the source: its session, and what has been sent of its stream.
struct VramSide {
    /// Dropped uncommitted (the migration failed), it resumes the vGPU.
    sess: Option<Box<dyn LiveSession>>,
    hash: Hasher,
    /// Bytes not hashed yet: the hash takes 32-byte words, so it is fed whole words until the
    /// end, as the destination hashing the whole stream at once does.
    unhashed: Vec<u8>,
    len: u64,
}

impl VramSide {
    fn sess(&mut self) -> anyhow::Result<&mut Box<dyn LiveSession>> {
        self.sess
            .as_mut()
            .context("the vGPU's stream is already finished")
    }

    /// Sends what the session produced since the last call as VGPU messages.
    fn drain(&mut self, w: &mut impl Write) -> anyhow::Result<u64> {
        let bytes = self.sess()?.take();
        self.unhashed.extend_from_slice(&bytes);
        let whole = self.unhashed.len() / 32 * 32;
        self.hash.update(&self.unhashed[..whole]);
        self.unhashed.drain(..whole);
        self.len += bytes.len() as u64;
        let mut sent = 0;
        for c in bytes.chunks(VGPU_CHUNK) {
            write_msg(w, VGPU, c).context("sending the vGPU's stream")?;
            sent += 5 + c.len() as u64;
        }
        Ok(sent)
    }

    /// One VRAM round into the stream, sent.
    fn round(&mut self, w: &mut impl Write) -> anyhow::Result<(gpuvm::migrate::RoundStats, u64)> {
        let rs = self.sess()?.round()?;
        let bytes = self.drain(w)?;
        Ok((rs, bytes))
    }
}

#[allow(clippy::too_many_arguments)]
fn run_source(
    vm: VmFd,
    mem: GuestMemoryMmap,
    socket: PathBuf,
    guest: GuestSpec,
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Handover>,
    vcpu_thread: libc::pthread_t,
    live: Box<dyn LiveSession>,
) -> anyhow::Result<SourceStats> {
    let ram = guest.ram_bytes;
    let t0 = Instant::now();
    let s = UnixStream::connect(&socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut w = BufWriter::with_capacity(1 << 20, s);
    let mut stats = SourceStats {
        socket: socket.clone(),
        ram_bytes: ram,
        ..SourceStats::default()
    };
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&serde_json::to_vec(&Hello {
        guest,
        ram_bytes: ram,
        page_size: PAGE,
    })?);
    write_msg(&mut w, HELLO, &hello).context("sending HELLO")?;
    stats.bytes += 5 + hello.len() as u64;
    expect_ok(&mut r, "the migration")?;
    // The vGPU's session (its dirty log began when it was opened: every VRAM and guest-RAM
    // page the GPU can reach from then on is recorded); dropped uncommitted, it resumes the
    // vGPU.
    let mut vs = VramSide {
        sess: Some(live),
        hash: Hasher::default(),
        unhashed: Vec::new(),
        len: 0,
    };
    stats.bytes += vs.drain(&mut w)?;
    // Round 0: every non-zero page (the destination's RAM starts zeroed). The dirty log was
    // turned on before this thread started, so what the guest writes from now on is in the
    // next round. Each RAM round is followed by a VRAM round.
    let mut round = 0u32;
    loop {
        let rt = Instant::now();
        let pages: Vec<u64> = if round == 0 {
            let mut page = vec![0u8; PAGE as usize];
            let mut v = Vec::new();
            for i in 0..ram / PAGE {
                mem.read_slice(&mut page, GuestAddress(i * PAGE))
                    .context("reading guest RAM")?;
                if page.iter().any(|&b| b != 0) {
                    v.push(i);
                }
            }
            v
        } else {
            super::vm::dirty_pages(&vm, ram)?
        };
        let (zeros, mut bytes) = send_pages(&mut w, &mem, round, &pages)?;
        bytes += end_round(&mut w, round, pages.len() as u64)?;
        let (rs, vbytes) = vs.round(&mut w)?;
        bytes += vbytes;
        stats.vram_rounds.push(rs);
        stats.bytes += bytes;
        stats.rounds.push(Round {
            round,
            pages: pages.len() as u64,
            zero_pages: zeros,
            bytes,
            ns: rt.elapsed().as_nanos() as u64,
            stop_and_copy: false,
        });
        round += 1;
        let converged = pages.len() <= STOP_PAGES && rs.sent <= STOP_VRAM_PAGES;
        if (round > 1 && converged) || round >= MAX_ROUNDS {
            break;
        }
    }
    // Stop-and-copy: ask the vCPU thread to pause at its next exit boundary; the kick makes
    // KVM_RUN return even if the guest does not exit by itself.
    stop.store(true, Ordering::SeqCst);
    // SAFETY: `vcpu_thread` is the vCPU thread, which joins this thread before it ends
    // (`Source::join`, also from `Drop`), so it is alive; the kick signal's handler is
    // installed (the thread's Kicker) or, once that is dropped, does nothing.
    unsafe { libc::pthread_kill(vcpu_thread, super::kick::kick_signal()) };
    let handed = rx
        .recv()
        .unwrap_or_else(|_| Err("the guest ended before it could be paused".to_string()));
    let (mut machine, _) = match handed {
        Ok(x) => x,
        Err(reason) => {
            let _ = write_msg(&mut w, ABORT, reason.as_bytes());
            bail!("{reason}");
        }
    };
    let rt = Instant::now();
    // The vCPU is paused: quiesce the vGPU (no vCPU access, none of its work on the GPU), so
    // neither RAM nor VRAM changes any more; its last pages and device state end its stream.
    let st = match vs.sess()?.stop(device_seam::QUIESCE_WAIT_NS) {
        Ok(st) => st,
        Err(e) => {
            let reason = format!("{e:#}");
            let _ = write_msg(&mut w, ABORT, reason.as_bytes());
            bail!("{reason}");
        }
    };
    stats.withdrawn = st.withdrawn;
    // The last RAM pages: what KVM saw written, and every page the GPU could write by DMA
    // since the vGPU's log began (KVM does not see those writes).
    let mut pages = super::vm::dirty_pages(&vm, ram)?;
    let dma: Vec<u64> = st
        .dma_pages
        .iter()
        .copied()
        .filter(|&p| p < ram / PAGE)
        .collect();
    stats.dma_pages = dma.len() as u64;
    pages.extend(dma);
    pages.sort_unstable();
    pages.dedup();
    let (zeros, mut bytes) = send_pages(&mut w, &mem, round, &pages)?;
    bytes += end_round(&mut w, round, pages.len() as u64)?;
    bytes += vs.drain(&mut w)?;
    stats.vram_rounds.push(st.round);
    stats.vgpu_stream_bytes = vs.len;
    let rest = std::mem::take(&mut vs.unhashed);
    vs.hash.update(&rest);
    machine.vgpu = DeviceInfo {
        kind: device_seam::VGPU_KIND.to_string(),
        len: vs.len,
        hash: vs.hash.finish(),
    };
    let ht = Instant::now();
    let ram_hash = snapshot::ram_hash(&mem, ram)?;
    stats.hash_ns = ht.elapsed().as_nanos() as u64;
    let state = serde_json::to_vec(&StateMsg {
        machine,
        ram_hash,
        vgpu_hex: String::new(),
    })?;
    write_msg(&mut w, STATE, &state).context("sending the state")?;
    stats.state_bytes = state.len() as u64;
    bytes += 5 + state.len() as u64;
    stats.bytes += bytes;
    stats.rounds.push(Round {
        round,
        pages: pages.len() as u64,
        zero_pages: zeros,
        bytes,
        ns: rt.elapsed().as_nanos() as u64,
        stop_and_copy: true,
    });
    stats.destination = expect_ok(&mut r, "the guest's state")?;
    // The destination has the guest from here on: whatever happens to the commit, the guest
    // must not go on here too (a failed commit leaves the vGPU to be scrubbed when this VMM
    // goes).
    if let Some(sess) = vs.sess.take() {
        if let Err(e) = sess.commit() {
            eprintln!("gpuvm: the guest moved, but its vGPU's migration was not committed: {e:#}");
        }
    }
    stats.total_ns = t0.elapsed().as_nanos() as u64;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm::snapshot::{DeviceInfo, SerialRegs, VmmState};
    use crate::kvm::vcpu_state::{Blob, Summary, VcpuState, VmState};
    use crate::kvm::ExitCounts;

    const RAM_PAGES: u64 = 4;

    fn spec() -> GuestSpec {
        GuestSpec {
            size: 16,
            workloads: vec!["madd".into()],
            fence_irq: false,
            ecam: false,
            calibrate: 0,
            mode: 0,
            shadow: gpuvm::profile::ShadowMode::Lazy,
            scheme: None,
            vram_mib: 0,
            guest_ram: 0,
            ram_bytes: RAM_PAGES * PAGE,
            pvh: false,
            guest_elf_hash: String::new(),
        }
    }

    /// A state that decodes (its blobs are only checked when restored into KVM).
    fn machine() -> MachineState {
        let b = Blob::of(&0u64);
        MachineState {
            vm: VmState {
                irqchip: vec![],
                clock: b.clone(),
            },
            vcpus: vec![VcpuState {
                id: 0,
                summary: Summary {
                    rip: String::new(),
                    rsp: String::new(),
                    rflags: String::new(),
                    cr3: String::new(),
                    cs: String::new(),
                },
                regs: b.clone(),
                sregs: b.clone(),
                xsave: b.clone(),
                xcrs: b.clone(),
                debugregs: b.clone(),
                lapic: b.clone(),
                mp_state: b.clone(),
                events: b.clone(),
                cpuid: vec![],
                msrs: vec![],
                tsc_khz: 0,
            }],
            vmm: VmmState {
                serial: SerialRegs {
                    regs: [0; 9],
                    in_buffer: vec![],
                },
                console_partial: vec![],
                console: vec![],
                pci_address: 0,
                exits: ExitCounts::default(),
                marks: vec![],
                elapsed_ns: 0,
            },
            vgpu: DeviceInfo {
                kind: "test".into(),
                len: 0,
                hash: String::new(),
            },
        }
    }

    fn state_msg(ram_hash: String) -> (u8, Vec<u8>) {
        let s = StateMsg {
            machine: machine(),
            ram_hash,
            vgpu_hex: "00ff".into(),
        };
        (STATE, serde_json::to_vec(&s).unwrap())
    }

    fn round_end(round: u32, pages: u64) -> (u8, Vec<u8>) {
        let mut p = round.to_le_bytes().to_vec();
        p.extend_from_slice(&pages.to_le_bytes());
        (ROUND_END, p)
    }

    /// A destination (`listen` + `receive`, here) fed by a fake source that sends a HELLO of
    /// `version`, then `msgs`. Returns the destination's result and RAM.
    fn session(
        name: &str,
        version: u32,
        msgs: Vec<(u8, Vec<u8>)>,
    ) -> (anyhow::Result<(MachineState, Vec<u8>)>, GuestMemoryMmap) {
        let dir = std::env::temp_dir().join(format!("gpuvm-migtest-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let path = sock.clone();
        // Bound before the source starts, so its connect finds the listener.
        let listener = bind(&sock).unwrap();
        let src = std::thread::spawn(move || {
            let mut s = UnixStream::connect(&path).unwrap();
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&version.to_le_bytes());
            hello.extend_from_slice(
                &serde_json::to_vec(&Hello {
                    guest: spec(),
                    ram_bytes: RAM_PAGES * PAGE,
                    page_size: PAGE,
                })
                .unwrap(),
            );
            let _ = write_msg(&mut s, HELLO, &hello);
            let _ = read_msg(&mut s, "destination");
            for (t, p) in msgs {
                if write_msg(&mut s, t, &p).is_err() {
                    break;
                }
            }
        });
        let m = mem(RAM_PAGES);
        let r =
            accept(listener, &sock, Duration::from_secs(30)).and_then(|mut inc| inc.receive(&m));
        src.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (r, m)
    }

    fn refused(name: &str, version: u32, msgs: Vec<(u8, Vec<u8>)>, expect: &str) {
        let (r, _) = session(name, version, msgs);
        let e = format!("{:#}", r.expect_err("accepted"));
        assert!(e.contains(expect), "expected '{expect}' in: {e}");
    }

    #[test]
    fn a_destination_receives_rounds_and_checks_the_ram_hash() {
        let want = mem(RAM_PAGES);
        want.write_slice(&[7; PAGE as usize], GuestAddress(2 * PAGE))
            .unwrap();
        let hash = snapshot::ram_hash(&want, RAM_PAGES * PAGE).unwrap();
        let msgs = vec![
            (PAGES, pages_msg(0, &[(2, Some(7)), (3, Some(1))])),
            round_end(0, 2),
            (PAGES, pages_msg(1, &[(3, None)])),
            round_end(1, 1),
            state_msg(hash.clone()),
        ];
        let (r, got) = session("ok", VERSION, msgs);
        let (m, vgpu) = r.unwrap();
        assert_eq!(m, machine());
        assert_eq!(vgpu, vec![0x00, 0xff]);
        assert_eq!(snapshot::ram_hash(&got, RAM_PAGES * PAGE).unwrap(), hash);
        // Page 3 was sent with data in round 0, then as a zero page in round 1.
        assert_eq!(got.read_obj::<u8>(GuestAddress(3 * PAGE)).unwrap(), 0);
        assert_eq!(got.read_obj::<u8>(GuestAddress(2 * PAGE + 9)).unwrap(), 7);
    }

    #[test]
    fn the_vgpu_stream_arrives_in_pieces_and_not_twice() {
        let hash = snapshot::ram_hash(&mem(RAM_PAGES), RAM_PAGES * PAGE).unwrap();
        let mut state = serde_json::to_vec(&StateMsg {
            machine: machine(),
            ram_hash: hash.clone(),
            vgpu_hex: String::new(),
        })
        .unwrap();
        let msgs = vec![
            (VGPU, b"GPUVM".to_vec()),
            round_end(0, 0),
            (VGPU, b"SNP".to_vec()),
            (STATE, state.clone()),
        ];
        let (r, _) = session("vgpu", VERSION, msgs);
        assert_eq!(r.unwrap().1, b"GPUVMSNP");
        state = serde_json::to_vec(&StateMsg {
            machine: machine(),
            ram_hash: hash,
            vgpu_hex: "00".into(),
        })
        .unwrap();
        refused(
            "vgpu-twice",
            VERSION,
            vec![(VGPU, b"x".to_vec()), (STATE, state)],
            "both as a stream and in its STATE",
        );
    }

    #[test]
    fn a_destination_refuses_what_a_gpuvm_source_would_not_send() {
        refused("version", 2, vec![], "speaks stream version 2");
        refused(
            "round",
            VERSION,
            vec![(PAGES, pages_msg(1, &[(0, None)]))],
            "PAGES of round 1 inside round 0",
        );
        refused(
            "count",
            VERSION,
            vec![(PAGES, pages_msg(0, &[(0, None)])), round_end(0, 5)],
            "5 pages announced; 1 pages of round 0 arrived",
        );
        refused(
            "outside",
            VERSION,
            vec![(PAGES, pages_msg(0, &[(RAM_PAGES, Some(1))]))],
            "outside RAM",
        );
        refused(
            "abort",
            VERSION,
            vec![(ABORT, b"because".to_vec())],
            "the source aborted the migration: because",
        );
        refused("tag", VERSION, vec![(99, vec![])], "unknown (99)");
        refused(
            "hash",
            VERSION,
            vec![
                (PAGES, pages_msg(0, &[(1, Some(3))])),
                round_end(0, 1),
                state_msg("0".repeat(16)),
            ],
            "pages were lost",
        );
        refused("eof", VERSION, vec![], "the source closed the stream");
    }

    fn mem(pages: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), (pages * PAGE) as usize)]).unwrap()
    }

    fn pages_msg(round: u32, entries: &[(u64, Option<u8>)]) -> Vec<u8> {
        let mut p = round.to_le_bytes().to_vec();
        p.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for &(i, fill) in entries {
            match fill {
                None => p.extend_from_slice(&(i | ZERO_PAGE).to_le_bytes()),
                Some(b) => {
                    p.extend_from_slice(&i.to_le_bytes());
                    p.extend_from_slice(&[b; PAGE as usize]);
                }
            }
        }
        p
    }

    #[test]
    fn pages_are_applied_and_bad_ones_refused() {
        let m = mem(4);
        let (r, (n, z)) = apply_pages(&pages_msg(2, &[(1, Some(7)), (3, None)]), &m, 4).unwrap();
        assert_eq!((r, n, z), (2, 2, 1));
        assert_eq!(m.read_obj::<u8>(GuestAddress(PAGE + 5)).unwrap(), 7);
        let e = apply_pages(&pages_msg(0, &[(4, Some(1))]), &m, 4).unwrap_err();
        assert!(e.to_string().contains("outside RAM"), "{e}");
        let mut cut = pages_msg(0, &[(0, Some(1))]);
        cut.truncate(cut.len() - 1);
        let e = apply_pages(&cut, &m, 4).unwrap_err();
        assert!(e.to_string().contains("cut off"), "{e}");
        let mut extra = pages_msg(0, &[(0, None)]);
        extra.push(0);
        let e = apply_pages(&extra, &m, 4).unwrap_err();
        assert!(e.to_string().contains("bytes after"), "{e}");
        assert!(apply_pages(&[0; 3], &m, 4).is_err());
    }

    #[test]
    fn oversized_and_cut_messages_are_refused() {
        let mut big = vec![PAGES];
        big.extend_from_slice(&(MAX_MSG as u32 + 1).to_le_bytes());
        let e = read_msg(&mut &big[..], "source").unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        let mut cut = vec![STATE];
        cut.extend_from_slice(&10u32.to_le_bytes());
        cut.extend_from_slice(b"abc");
        let e = read_msg(&mut &cut[..], "source").unwrap_err();
        assert!(e.to_string().contains("ended early"), "{e}");
        let e = read_msg(&mut &[][..], "source").unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
    }
}
