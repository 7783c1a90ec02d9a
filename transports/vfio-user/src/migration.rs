//! Moving a VM's vGPU between daemons: the device half of a migration whose guest (RAM, vCPUs)
//! its VMM moves. The VMM carries the vGPU's `gpuvm::migrate` stream from one daemon to the
//! other, as VFIO's migration interface has the VMM carry a device's data; the daemons' control
//! sockets are the transport (`docs/migration.md`, "gpuvm serve and other VMMs").
//!
//! - Source: [`VmDevice::migrate_out`] opens a [`MigrationOut`] on a VM whose client is
//!   connected: the vGPU's dirty log runs, rounds of VRAM go out while the guest runs, then
//!   the stop (quiesce, last pages, device state) once the VMM has paused the vCPUs. Committed,
//!   the vGPU stays quiesced until its client goes (then it is scrubbed as always); dropped
//!   uncommitted, it is resumed and the guest goes on here.
//! - Destination: [`VmDevice::restore_from`] replaces the fresh vGPU of a VM whose (new)
//!   client has connected and mapped its RAM with one rebuilt from the stream, with that RAM
//!   attached; the client's connection adopts it (its next request sees it), so the guest
//!   continues where it stopped.
//!
//! A stream is untrusted input: the library validates it and destroys a half-built vGPU; the
//! VM then gets a fresh one, and nothing of another VM is touched.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use gpuvm::clock::Clock;
use gpuvm::migrate::{Outgoing, RoundStats, StopStats};
use gpuvm::vgpu::Vgpu;

use crate::backend::VmDevice;

/// An outgoing migration of one VM's vGPU (see the module doc).
pub struct MigrationOut {
    dev: Arc<VmDevice>,
    out: Option<Outgoing>,
}

impl MigrationOut {
    /// The stream bytes produced since the last call (the header, first).
    pub fn take(&mut self) -> Vec<u8> {
        self.out.as_mut().map(|o| o.take()).unwrap_or_default()
    }

    fn out(&mut self) -> Result<&mut Outgoing, String> {
        self.out
            .as_mut()
            .ok_or_else(|| "the migration is already committed".to_string())
    }

    /// One round of VRAM pages while the guest runs.
    pub fn round(&mut self) -> Result<RoundStats, String> {
        self.out()?.round().map_err(|e| e.to_string())
    }

    /// Quiesces the vGPU (the VMM has paused the vCPUs), the last pages and the device state.
    pub fn stop(&mut self, clock: &dyn Clock, max_wait_ns: u64) -> Result<StopStats, String> {
        let st = self
            .out()?
            .stop(clock, max_wait_ns)
            .map_err(|e| e.to_string())?;
        self.dev.event(&format!(
            "migration: quiesced ({} submissions withdrawn), stream ended",
            st.withdrawn
        ));
        Ok(st)
    }

    /// The destination has the VM: this vGPU stays quiesced until its client goes.
    pub fn commit(mut self) {
        if let Some(o) = self.out.take() {
            o.commit();
            self.dev.event(
                "migration committed: the vGPU stays quiesced until its client disconnects, then it is scrubbed",
            );
        }
    }
}

impl Drop for MigrationOut {
    fn drop(&mut self) {
        // Outgoing's own drop ends the dirty log and resumes a vGPU it quiesced.
        let abandoned = self.out.take().is_some();
        self.dev.migrating.store(false, Ordering::SeqCst);
        if abandoned {
            self.dev.event(
                "migration abandoned before its commit: the vGPU resumed, the guest goes on here",
            );
        }
    }
}

impl VmDevice {
    /// True while a migration of the vGPU out is in progress.
    pub fn migrating(&self) -> bool {
        self.migrating.load(Ordering::SeqCst)
    }

    /// Starts moving this VM's vGPU out (see the module doc). Refused while no client is
    /// connected (its vGPU would be a fresh one: nothing to move) or while another migration
    /// of it runs.
    pub fn migrate_out(self: &Arc<Self>) -> Result<MigrationOut, String> {
        if !self.has_client() {
            return Err(format!(
                "VM '{}' has no client: only a running VM's vGPU can be moved",
                self.name()
            ));
        }
        if self.migrating.swap(true, Ordering::SeqCst) {
            return Err(format!("VM '{}' is already being migrated", self.name()));
        }
        let r = self
            .vgpu()
            .ok_or_else(|| "the daemon is stopping".to_string())
            .and_then(|v| Outgoing::start(self.host().clone(), v).map_err(|e| e.to_string()));
        match r {
            Ok(out) => {
                self.event("migration out started: dirty log on");
                Ok(MigrationOut {
                    dev: self.clone(),
                    out: Some(out),
                })
            }
            Err(e) => {
                self.migrating.store(false, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Rebuilds this VM's vGPU from a `gpuvm::migrate` stream, with the RAM its connected
    /// client mapped; the client's connection adopts it. The stream's vGPU must have this VM's
    /// VRAM size and channel count. On any error the VM gets a fresh vGPU (its previous one, a
    /// fresh one too since nothing ran on it, is destroyed first: the GPU need not have room
    /// for two).
    pub fn restore_from(&self, stream: &[u8]) -> Result<Arc<Vgpu>, String> {
        if !self.has_client() {
            return Err(format!(
                "VM '{}' has no client: connect its VMM (and map its RAM) before restoring its vGPU",
                self.name()
            ));
        }
        let ram = self
            .ram()
            .ok_or_else(|| format!("VM '{}': its client has not mapped guest RAM", self.name()))?;
        if self.migrating.load(Ordering::SeqCst) {
            return Err(format!("VM '{}' is being migrated out", self.name()));
        }
        let p = self.profile();
        let t0 = std::time::Instant::now();
        let r = self.replace_vgpu(|host| {
            let v = gpuvm::migrate::restore(host, stream, Some(ram))
                .map_err(|e| format!("the stream: {e}"))?;
            let got = v.profile();
            if got.vram_mib != p.vram_mib || got.channels != p.channels {
                let _ = host.destroy_vgpu(&v);
                return Err(format!(
                    "the stream's vGPU has {} MiB of VRAM and {} channels, VM '{}' has {} MiB and {}",
                    got.vram_mib,
                    got.channels,
                    self.name(),
                    p.vram_mib,
                    p.channels
                ));
            }
            Ok(v)
        });
        match &r {
            Ok(v) => self.event(&format!(
                "vGPU restored from a migration stream ({} bytes) as {} in {:.1} ms: the client's connection adopts it",
                stream.len(),
                v.id(),
                t0.elapsed().as_secs_f64() * 1e3
            )),
            Err(e) => self.event(&format!("restore refused, the VM has a fresh vGPU: {e}")),
        }
        r
    }
}
