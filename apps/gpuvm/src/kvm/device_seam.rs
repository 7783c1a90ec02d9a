//! The seam through which the VMM saves, restores and live-migrates a device's own state
//! without looking inside it: [`DeviceSnapshot`] (opaque bytes out and back in) and
//! [`LiveSession`] (the device's side of a live migration, in this process or in the
//! `gpuvm serve` daemon). The devices (`device`, `migratable`, `remote`) implement it; the
//! snapshot (`snapshot`) and the migration (`migrate`) drive it.

use anyhow::Context;
use vm_memory::GuestMemoryMmap;

/// Most bytes of vGPU stream a destination accepts (it keeps them until RAM is complete).
pub const MAX_VGPU_STREAM: u64 = 8 << 30;

/// [`DeviceSnapshot::kind`] of the in-process vGPU (`migratable`) and the daemon's (`remote`): its bytes are a `gpuvm::migrate` stream.
pub const VGPU_KIND: &str = "gpuvm-migrate-stream/1";
/// How long quiescing the vGPU may wait for its work on the GPU to finish.
pub const QUIESCE_WAIT_NS: u64 = 5_000_000_000;

/// The seam through which the VMM saves and restores a device's own state: opaque bytes the
/// device produces and takes back. The VMM stores them (`vgpu.bin`, or the migration stream's
/// VGPU messages) with a length and a hash and never looks inside.
pub trait DeviceSnapshot: Send + Sync {
    /// What produced the bytes, with a version (checked on restore).
    fn kind(&self) -> String;
    /// Quiesces the device (the vCPUs are paused) and returns its whole state, or why it
    /// cannot be captured (the snapshot is then refused and the device runs on). After a
    /// successful save the device stays quiesced: [`DeviceSnapshot::resume`] it if the
    /// snapshot is not used after all.
    fn save(&self) -> anyhow::Result<Vec<u8>>;
    /// Lets a device that [`DeviceSnapshot::save`] (or a live migration) quiesced run again:
    /// the snapshot or migration failed and the guest goes on here. A no-op otherwise.
    fn resume(&self);
    /// Rebuilds the device from `bytes` in this (new) process, with the guest's RAM `ram`
    /// already restored. The seam must not have a device yet.
    fn restore(&self, bytes: &[u8], ram: &GuestMemoryMmap) -> anyhow::Result<()>;
    /// Starts the device's side of a live migration: its dirty log, then VRAM rounds on
    /// request (an error: it cannot be migrated live now).
    fn live(&self) -> anyhow::Result<Box<dyn LiveSession>>;
}

/// The vGPU's side of a live migration as the VMM drives it: the next bytes of the vGPU's
/// `gpuvm::migrate` stream, produced in this process (`gpuvm::migrate::Outgoing`) or by the
/// `gpuvm serve` daemon that holds the vGPU (`crate::serve_migrate::Session`). Dropped before
/// [`LiveSession::commit`], a session resumes the vGPU.
pub trait LiveSession: Send {
    /// Stream bytes produced since the last call (the header, first).
    fn take(&mut self) -> Vec<u8>;
    /// One round of VRAM pages while the guest runs.
    fn round(&mut self) -> anyhow::Result<gpuvm::migrate::RoundStats>;
    /// The vCPUs are paused: quiesce the vGPU, the last pages, the device state.
    fn stop(&mut self, max_wait_ns: u64) -> anyhow::Result<gpuvm::migrate::StopStats>;
    /// The destination has the guest: the vGPU stays quiesced.
    fn commit(self: Box<Self>) -> anyhow::Result<()>;
}

impl LiveSession for gpuvm::migrate::Outgoing {
    fn take(&mut self) -> Vec<u8> {
        gpuvm::migrate::Outgoing::take(self)
    }
    fn round(&mut self) -> anyhow::Result<gpuvm::migrate::RoundStats> {
        gpuvm::migrate::Outgoing::round(self).context("a VRAM round")
    }
    fn stop(&mut self, max_wait_ns: u64) -> anyhow::Result<gpuvm::migrate::StopStats> {
        let clock = gpuvm::clock::ClockKind::Real.create();
        gpuvm::migrate::Outgoing::stop(self, &*clock, max_wait_ns).context("stopping the vGPU")
    }
    fn commit(self: Box<Self>) -> anyhow::Result<()> {
        gpuvm::migrate::Outgoing::commit(*self);
        Ok(())
    }
}

impl LiveSession for crate::serve_migrate::Session {
    fn take(&mut self) -> Vec<u8> {
        crate::serve_migrate::Session::take(self)
    }
    fn round(&mut self) -> anyhow::Result<gpuvm::migrate::RoundStats> {
        crate::serve_migrate::Session::round(self)
    }
    fn stop(&mut self, max_wait_ns: u64) -> anyhow::Result<gpuvm::migrate::StopStats> {
        crate::serve_migrate::Session::stop(self, max_wait_ns.div_ceil(1_000_000))
    }
    fn commit(self: Box<Self>) -> anyhow::Result<()> {
        crate::serve_migrate::Session::commit(*self)
    }
}
