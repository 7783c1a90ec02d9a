//! DMA windows on a real GF100: each VM's guest RAM is mapped in the IOMMU (VFIO type-1
//! container) at that VM's IOVA base, so the GPU's system-memory accesses of one VM can reach
//! that VM's RAM and nothing else (GPUvm's DMA isolation, done by the IOMMU instead of the
//! simulator's window table).
//!
//! This module validates a window before any ioctl (non-empty, no wrap, page-aligned, no
//! overlap, backed by guest memory), splits it where the guest memory is made of several host
//! mappings, maps each piece, undoes the pieces already mapped if one fails, and keeps a clone
//! of the guest memory with the window so the host mapping outlives the IOMMU mapping.

use std::collections::BTreeMap;

use vm_memory::{
    GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress,
};

use gpuvm_phys::addr::{Gpa, Iova};
use gpuvm_phys::DmaError;

use super::device::DeviceAccess;

/// The IOMMU page size VFIO type-1 maps in (x86: 4 KiB).
pub(super) const PAGE: u64 = 4096;

/// One IOMMU mapping of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub iova: u64,
    pub len: u64,
    /// Host virtual address (a pointer kept as an integer: the window owns the memory).
    pub host: usize,
}

/// One registered window.
#[derive(Debug)]
struct Window {
    len: u64,
    pieces: Vec<Piece>,
    /// Keeps the guest RAM mapped while the IOMMU maps it.
    _mem: GuestMemoryMmap,
}

/// The registered DMA windows, keyed by their first IOVA.
#[derive(Debug, Default)]
pub(super) struct DmaWindows {
    windows: BTreeMap<u64, Window>,
}

/// Splits guest range `[gpa, gpa + len)` of `mem` into host-contiguous pieces at `iova`.
fn plan(iova: Iova, len: u64, mem: &GuestMemoryMmap, gpa: Gpa) -> Result<Vec<Piece>, DmaError> {
    let not_backed = DmaError::NotBacked { gpa, len };
    let mut pieces = Vec::new();
    let mut done = 0u64;
    while done < len {
        let g = GuestAddress(gpa.raw() + done);
        let region = mem.find_region(g).ok_or(not_backed.clone())?;
        let off = g.0 - region.start_addr().0;
        let n = (region.len() - off).min(len - done);
        let host = region
            .get_host_address(MemoryRegionAddress(off))
            .map_err(|_| not_backed.clone())?;
        if !(host as u64).is_multiple_of(PAGE) {
            return Err(DmaError::Unaligned { iova, len });
        }
        pieces.push(Piece {
            iova: iova.raw() + done,
            len: n,
            host: host as usize,
        });
        done += n;
    }
    Ok(pieces)
}

impl DmaWindows {
    /// Maps `[iova, iova + len)` -> guest RAM `[gpa, gpa + len)` of `mem` in the IOMMU.
    pub(super) fn map(
        &mut self,
        dev: &dyn DeviceAccess,
        iova: Iova,
        len: u64,
        mem: GuestMemoryMmap,
        gpa: Gpa,
    ) -> Result<(), DmaError> {
        let end = DmaError::window_end(iova, len, gpa)?;
        if !(iova.raw() | len | gpa.raw()).is_multiple_of(PAGE) {
            return Err(DmaError::Unaligned { iova, len });
        }
        let before = self.windows.range(..end).next_back();
        if before.is_some_and(|(&start, w)| start + w.len > iova.raw()) {
            return Err(DmaError::Overlap { iova });
        }
        let pieces = plan(iova, len, &mem, gpa)?;
        for (i, p) in pieces.iter().enumerate() {
            // SAFETY: the host range is guest RAM of `mem`, a clone of which the window keeps
            // until the piece is unmapped (`unmap`, `unmap_all`).
            let r = unsafe { dev.dma_map(p.iova, p.len, p.host as *mut u8) };
            if let Err(e) = r {
                for q in &pieces[..i] {
                    if let Err(u) = dev.dma_unmap(q.iova, q.len) {
                        log::error!("undoing a failed DMA map: {u}");
                    }
                }
                return Err(DmaError::Iommu {
                    iova,
                    reason: e.to_string(),
                });
            }
        }
        self.windows.insert(
            iova.raw(),
            Window {
                len,
                pieces,
                _mem: mem,
            },
        );
        Ok(())
    }

    /// Unmaps the window starting at `iova`. The window is forgotten even if the IOMMU refused
    /// to unmap a piece; its guest memory is then kept (leaked) so the device can never reach
    /// freed memory.
    pub(super) fn unmap(&mut self, dev: &dyn DeviceAccess, iova: Iova) -> Result<(), DmaError> {
        let w = self
            .windows
            .remove(&iova.raw())
            .ok_or(DmaError::NoSuchWindow(iova))?;
        let mut failed = None;
        for p in &w.pieces {
            if let Err(e) = dev.dma_unmap(p.iova, p.len) {
                failed = Some(e.to_string());
            }
        }
        match failed {
            None => Ok(()),
            Some(reason) => {
                std::mem::forget(w);
                Err(DmaError::Iommu { iova, reason })
            }
        }
    }

    /// Unmaps every window (device teardown).
    pub(super) fn unmap_all(&mut self, dev: &dyn DeviceAccess) {
        let starts: Vec<u64> = self.windows.keys().copied().collect();
        for s in starts {
            if let Err(e) = self.unmap(dev, Iova(s)) {
                log::error!("DMA window teardown: {e}");
            }
        }
    }

    /// The IOMMU pieces of the window at `iova`.
    #[cfg(test)]
    pub(super) fn pieces(&self, iova: Iova) -> Option<&[Piece]> {
        self.windows.get(&iova.raw()).map(|w| w.pieces.as_slice())
    }

    /// Number of windows.
    pub(super) fn len(&self) -> usize {
        self.windows.len()
    }
}
