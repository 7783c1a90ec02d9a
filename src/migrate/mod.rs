//! Snapshot, restore and live migration of a vGPU (`docs/migration.md`).
//!
//! - [`snapshot`]: quiesce the VM, write its VRAM pages and device state as a stream
//!   ([`stream`]); the VM stays quiesced (resume it, or destroy it after a migration).
//! - [`restore`]: read a stream into a new vGPU on a host (another GPU, another slice, other
//!   physical channels); on any error the new vGPU is destroyed, so the host is as before.
//! - [`VramCopy`] and [`migrate_live`]: copy VRAM in rounds while the VM runs, then a short
//!   stop-and-copy.
//!
//! **Which pages a round sends** ([`VramCopy::round`]). The destination's slice starts zeroed, so
//! the copy remembers, per page, a 128-bit hash (xxh3) of what the destination holds (at first,
//! a zero page's). A round reads each candidate page, and sends it if its hash differs. The
//! first round's candidates are all pages the GPU holds as written (all pages if the backend
//! cannot tell); later rounds' are the pages the host wrote for the guest since the last round
//! plus every page the GPU can reach (the two sets of [`crate::guest_mem::DirtyLog`]).
//!
//! **Why no write is missed.** A page of the slice changes only (a) by a guest access the
//! device model performs (PRAMIN, BAR1, BAR3 — all of them while the log runs, because nothing
//! is mapped straight into the guest), which marks it written; or (b) by the GPU, through a
//! shadow page-table entry (the host's own mappings name only hypervisor VRAM). The log starts
//! by rebuilding every shadow table and flushing the physical TLB, so from then on each
//! translation the GPU can use was made by the device model after the log began and recorded
//! its page; those pages are compared in every round, never dropped. The last round runs with
//! the VM quiesced — no vCPU access, nothing in flight — so what it reads is final, and every
//! page whose content differs from what the destination holds is sent. A hash collision (2^-128
//! per changed page) is the only way to miss one.

pub mod outgoing;
pub mod stream;

pub use outgoing::{Outgoing, StopStats};

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

use vm_memory::GuestMemoryMmap;
use xxhash_rust::xxh3::xxh3_128;

use crate::clock::Clock;
use crate::guest_mem::DirtyLog;
use crate::host::migrate::MigrateError;
use crate::host::{GpuHost, HostError};
use crate::vgpu::{Vgpu, VgpuError};

use stream::{Record, StreamError, StreamInfo, StreamReader, StreamWriter, PAGE};

/// Why a snapshot, restore or migration failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host-side step.
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    /// The stream.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// Creating the destination vGPU.
    #[error("destination: {0}")]
    Host(#[from] HostError),
    /// Attaching guest memory at the destination.
    #[error("destination: {0}")]
    Vgpu(#[from] VgpuError),
}

/// Where a round's pages go: a batch of (page index, contents).
pub type PageSink<'a> = dyn FnMut(&[(u64, &[u8])]) -> Result<(), StreamError> + 'a;

/// The copy of one VM's VRAM, round by round.
pub struct VramCopy {
    log: Arc<DirtyLog>,
    /// Hash of what the destination holds, per page.
    sent: Vec<u128>,
    first: bool,
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoundStats {
    /// Pages read and hashed.
    pub examined: u64,
    /// Pages sent.
    pub sent: u64,
    /// Bytes sent (page data).
    pub bytes: u64,
    /// Wall time of the round.
    pub micros: u64,
}

fn zero_hash() -> u128 {
    xxh3_128(&[0u8; PAGE])
}

impl VramCopy {
    /// Starts the dirty log of `v` (see [`Vgpu::start_dirty_log`]).
    pub fn start(v: &Vgpu) -> Result<VramCopy, Error> {
        let log = v
            .start_dirty_log()
            .ok_or(Error::Migrate(MigrateError::NoSuchVm))?;
        let pages = log.pages() as usize;
        Ok(VramCopy {
            log,
            sent: vec![zero_hash(); pages],
            first: true,
        })
    }

    fn candidates(&mut self, v: &Vgpu) -> Vec<u64> {
        let pages = self.sent.len() as u64;
        let mut c: Vec<u64> = if self.first {
            self.first = false;
            // Everything written so far; the log's own sets start now.
            let _ = self.log.take_written();
            match v.vram_resident() {
                Some(ranges) => ranges
                    .into_iter()
                    .flat_map(|(a, l)| (a / PAGE as u64)..(a + l).div_ceil(PAGE as u64))
                    .collect(),
                None => (0..pages).collect(),
            }
        } else {
            let mut c = self.log.take_written();
            c.extend(self.log.gpu_reachable());
            c
        };
        c.retain(|&p| p < pages);
        c.sort_unstable();
        c.dedup();
        c
    }

    /// Reads every candidate page of `v` and passes those that differ from what the
    /// destination holds to `send` (page index, contents), in batches.
    pub fn round(&mut self, v: &Vgpu, send: &mut PageSink) -> Result<RoundStats, Error> {
        let t = Instant::now();
        let cand = self.candidates(v);
        let mut st = RoundStats {
            examined: cand.len() as u64,
            ..RoundStats::default()
        };
        const BATCH: usize = stream::MAX_PAGES_PER_RECORD;
        let mut buf = vec![0u8; BATCH * PAGE];
        let mut idx = Vec::with_capacity(BATCH);
        for chunk in cand.chunks(BATCH) {
            idx.clear();
            for (i, &p) in chunk.iter().enumerate() {
                let page = &mut buf[i * PAGE..(i + 1) * PAGE];
                v.vram_read(p * PAGE as u64, page)?;
                let h = xxh3_128(page);
                if h != self.sent[p as usize] {
                    self.sent[p as usize] = h;
                    idx.push((p, i));
                }
            }
            if !idx.is_empty() {
                let batch: Vec<(u64, &[u8])> = idx
                    .iter()
                    .map(|&(p, i)| (p, &buf[i * PAGE..(i + 1) * PAGE]))
                    .collect();
                send(&batch)?;
                st.sent += batch.len() as u64;
                st.bytes += (batch.len() * PAGE) as u64;
            }
        }
        st.micros = t.elapsed().as_micros() as u64;
        Ok(st)
    }

    /// The dirty log: a VMM migrating the guest's RAM sends every page of
    /// [`DirtyLog::dma_reachable`] again in its stop-and-copy round (the GPU writes those by
    /// DMA, which the VMM's own dirty log does not see).
    pub fn log(&self) -> &DirtyLog {
        &self.log
    }

    /// Ends the dirty log.
    pub fn stop(self, v: &Vgpu) {
        v.stop_dirty_log();
    }
}

/// What a snapshot wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotStats {
    /// Pages written.
    pub pages: u64,
    /// Bytes of the stream.
    pub bytes: u64,
    /// Submissions withdrawn while quiescing.
    pub withdrawn: u64,
}

/// Quiesces `v` (waiting at most `max_wait_ns` on `clock`) and writes its snapshot to `w`. The
/// VM is left quiesced: [`GpuHost::resume`] it to go on, or destroy it once the snapshot is
/// restored elsewhere. On error it is resumed (it goes on as if nothing happened).
pub fn snapshot<W: Write>(
    host: &GpuHost,
    v: &Vgpu,
    clock: &dyn Clock,
    max_wait_ns: u64,
    w: W,
) -> Result<SnapshotStats, Error> {
    let q = match host.quiesce(v, clock, max_wait_ns) {
        Ok(q) => q,
        Err(e) => {
            let _ = host.resume(v);
            return Err(e.into());
        }
    };
    let r = (|| {
        let mut copy = VramCopy::start(v)?;
        let info = StreamInfo::new(v.profile(), v.vram_slice().size);
        let mut sw = StreamWriter::new(w, &info)?;
        copy.round(v, &mut |b| sw.pages(b))?;
        copy.stop(v);
        let st = host.device_state(v)?;
        sw.device(&st)?;
        let pages = sw.pages_written();
        let (_, bytes) = sw.finish()?;
        Ok(SnapshotStats {
            pages,
            bytes,
            withdrawn: q.withdrawn as u64,
        })
    })();
    if r.is_err() {
        v.stop_dirty_log();
        let _ = host.resume(v);
    }
    r
}

/// Reads a snapshot stream from `r` into a new vGPU of `host`, with `ram` (the guest's RAM,
/// which the VMM moved) attached. The vGPU runs when this returns. On any error the new vGPU
/// is destroyed and the host is as before.
pub fn restore<R: Read>(
    host: &GpuHost,
    r: R,
    ram: Option<GuestMemoryMmap>,
) -> Result<Arc<Vgpu>, Error> {
    let mut sr = StreamReader::new(r)?;
    let info = match sr.next_record()? {
        Some(Record::Info(i)) => i,
        _ => return Err(StreamError::Truncated("no INFO record").into()),
    };
    let ram_end = ram.as_ref().map(|m| {
        use vm_memory::GuestMemory;
        m.last_addr().0 + 1
    });
    let v = match ram_end {
        Some(end) => host.create_vgpu_for_ram(&info.profile, end)?,
        None => host.create_vgpu(&info.profile)?,
    };
    let r = (|| {
        if let Some(ram) = ram {
            v.attach_guest_memory(ram)?;
        }
        while let Some(rec) = sr.next_record()? {
            match rec {
                Record::Pages(pages) => {
                    for (p, data) in pages {
                        v.restore_vram(p * PAGE as u64, &data)?;
                    }
                }
                Record::Device(st) => host.apply_device_state(&v, &st)?,
                Record::Info(_) | Record::End { .. } => {}
            }
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(v),
        Err(e) => {
            log::warn!("restore refused: {e}");
            let _ = host.destroy_vgpu(&v);
            Err(e)
        }
    }
}

/// How a live migration went.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LiveStats {
    /// Each round while the VM ran, then the stop-and-copy round last.
    pub rounds: Vec<RoundStats>,
    /// From the start to the end of the stream.
    pub total_micros: u64,
    /// From quiescing the VM to the end of the stream (the VM does not run meanwhile).
    pub downtime_micros: u64,
    /// Submissions withdrawn while quiescing.
    pub withdrawn: u64,
    /// Bytes of the stream.
    pub bytes: u64,
}

/// When to stop the rounds that run alongside the VM.
#[derive(Debug, Clone, Copy)]
pub struct LiveOptions {
    /// At most this many rounds while the VM runs.
    pub max_rounds: u32,
    /// Stop early once a round sends at most this many pages.
    pub converged_pages: u64,
    /// Quiescing may wait this long (on the clock given).
    pub max_wait_ns: u64,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            max_rounds: 8,
            converged_pages: 64,
            max_wait_ns: 1_000_000_000,
        }
    }
}

/// Migrates `v` live: rounds of VRAM pages to `w` while the VM runs, then `pause` (the VMM
/// stops the guest's vCPUs), quiesce, the last pages and the device state. On success the VM
/// is left quiesced and paused (destroy it: the destination has it); on error the dirty log is
/// stopped, the VM resumed and `unpause` called, so the source goes on.
pub fn migrate_live<W: Write>(
    host: &GpuHost,
    v: &Vgpu,
    clock: &dyn Clock,
    opts: LiveOptions,
    w: W,
    pause: &mut dyn FnMut(),
    unpause: &mut dyn FnMut(),
) -> Result<LiveStats, Error> {
    let t0 = Instant::now();
    let mut stats = LiveStats::default();
    let mut copy = VramCopy::start(v)?;
    let mut paused = false;
    let r = (|| {
        let info = StreamInfo::new(v.profile(), v.vram_slice().size);
        let mut sw = StreamWriter::new(w, &info)?;
        for _ in 0..opts.max_rounds {
            let rs = copy.round(v, &mut |b| sw.pages(b))?;
            sw.flush()?;
            stats.rounds.push(rs);
            if rs.sent <= opts.converged_pages {
                break;
            }
        }
        pause();
        paused = true;
        let down = Instant::now();
        let q = host.quiesce(v, clock, opts.max_wait_ns)?;
        stats.withdrawn = q.withdrawn as u64;
        let rs = copy.round(v, &mut |b| sw.pages(b))?;
        stats.rounds.push(rs);
        let st = host.device_state(v)?;
        sw.device(&st)?;
        stats.bytes = sw.finish()?.1;
        stats.downtime_micros = down.elapsed().as_micros() as u64;
        Ok::<(), Error>(())
    })();
    stats.total_micros = t0.elapsed().as_micros() as u64;
    copy.stop(v);
    match r {
        Ok(()) => Ok(stats),
        Err(e) => {
            let _ = host.resume(v);
            if paused {
                unpause();
            }
            Err(e)
        }
    }
}
