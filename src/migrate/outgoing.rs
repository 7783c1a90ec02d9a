//! One vGPU's side of a live migration driven from outside: [`Outgoing`] holds the VRAM copy
//! and the stream writer between calls, so that a caller can interleave its own work (a VMM
//! sending guest RAM) with the vGPU's rounds, and so that the stream can be carried by
//! whoever moves the guest — a VMM in this process, or a daemon's control socket answering a
//! VMM in another process, as VFIO's migration interface has the VMM carry a device's data.
//!
//! The bytes each call produces are the next piece of one `gpuvm::migrate` stream
//! ([`super::stream`]); concatenated they are what [`super::restore`] reads. Dropped before
//! [`Outgoing::commit`], the session ends the dirty log and resumes a VM it quiesced, so a
//! failed or abandoned migration leaves the source running.

use std::sync::Arc;

use crate::clock::Clock;
use crate::host::GpuHost;
use crate::vgpu::Vgpu;

use super::stream::{StreamInfo, StreamWriter};
use super::{Error, RoundStats, VramCopy};

/// What [`Outgoing::stop`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StopStats {
    /// The stop-and-copy round.
    pub round: RoundStats,
    /// Submissions withdrawn while quiescing (they stay in the guest's rings and run on the
    /// destination).
    pub withdrawn: u64,
    /// Guest-RAM pages (GPA / 4096) the GPU could write by DMA since the session began: a
    /// VMM whose own dirty log cannot see those writes resends them.
    pub dma_pages: Vec<u64>,
}

/// An outgoing migration of one vGPU (see the module doc).
pub struct Outgoing {
    host: Arc<GpuHost>,
    vgpu: Arc<Vgpu>,
    copy: Option<VramCopy>,
    sw: Option<StreamWriter<Vec<u8>>>,
    /// The stream's last bytes, once it is finished.
    tail: Vec<u8>,
    quiesced: bool,
    committed: bool,
}

impl Outgoing {
    /// Starts the dirty log of `vgpu` and the stream (its header is the first
    /// [`Outgoing::take`]).
    pub fn start(host: Arc<GpuHost>, vgpu: Arc<Vgpu>) -> Result<Outgoing, Error> {
        let copy = VramCopy::start(&vgpu)?;
        let info = StreamInfo::new(vgpu.profile(), vgpu.vram_slice().size);
        let mut o = Outgoing {
            host,
            vgpu,
            copy: Some(copy),
            sw: None,
            tail: Vec::new(),
            quiesced: false,
            committed: false,
        };
        o.sw = Some(StreamWriter::new(Vec::new(), &info)?);
        Ok(o)
    }

    /// The vGPU being moved.
    pub fn vgpu(&self) -> &Arc<Vgpu> {
        &self.vgpu
    }

    /// The stream bytes produced since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        match self.sw.as_mut() {
            Some(sw) => std::mem::take(sw.get_mut()),
            None => std::mem::take(&mut self.tail),
        }
    }

    fn parts(&mut self) -> Result<(&mut VramCopy, &mut StreamWriter<Vec<u8>>), Error> {
        match (self.copy.as_mut(), self.sw.as_mut()) {
            (Some(c), Some(s)) => Ok((c, s)),
            _ => Err(Error::Stream(super::stream::StreamError::Truncated(
                "the migration's stream is already finished",
            ))),
        }
    }

    /// One round of VRAM pages while the VM runs.
    pub fn round(&mut self) -> Result<RoundStats, Error> {
        let vgpu = self.vgpu.clone();
        let (copy, sw) = self.parts()?;
        copy.round(&vgpu, &mut |b| sw.pages(b))
    }

    /// Stop-and-copy (the caller has paused the guest's vCPUs): quiesces the VM (waiting at
    /// most `max_wait_ns` on `clock` for its work on the GPU), sends the last pages and the
    /// device state and ends the stream. The VM stays quiesced; on error too (drop the session
    /// to resume it).
    pub fn stop(&mut self, clock: &dyn Clock, max_wait_ns: u64) -> Result<StopStats, Error> {
        self.quiesced = true;
        let q = self.host.quiesce(&self.vgpu, clock, max_wait_ns)?;
        let (host, vgpu) = (self.host.clone(), self.vgpu.clone());
        let (copy, sw) = self.parts()?;
        let round = copy.round(&vgpu, &mut |b| sw.pages(b))?;
        let dma_pages = copy.log().dma_reachable();
        let st = host.device_state(&vgpu)?;
        sw.device(&st)?;
        if let Some(sw) = self.sw.take() {
            self.tail = sw.finish()?.0;
        }
        Ok(StopStats {
            round,
            withdrawn: q.withdrawn as u64,
            dma_pages,
        })
    }

    /// The destination has the VM: end the dirty log and leave the VM quiesced for the caller
    /// to destroy (it must not run here again).
    pub fn commit(mut self) {
        self.committed = true;
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        if let Some(c) = self.copy.take() {
            c.stop(&self.vgpu);
        }
        if self.quiesced && !self.committed {
            if let Err(e) = self.host.resume(&self.vgpu) {
                log::warn!("resuming {} after its migration ended: {e}", self.vgpu.id());
            }
        }
    }
}
