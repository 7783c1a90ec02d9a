//! The narrow interface between the VFIO backend's logic and the kernel's VFIO API: what a
//! userspace driver does with a device fd and a container fd (region info / read / write / mmap,
//! IOMMU map and unmap, interrupt eventfds, reset). [`super::sys::VfioPci`] implements it with
//! the `vfio-ioctls` crate; the unit tests implement it over a simulated GF100, so everything
//! above the ioctls runs without a VFIO device.

use std::io;

use vmm_sys_util::eventfd::EventFd;

use gpuvm_phys::Bar;

use super::mapped::MappedBar;

/// What VFIO says of one BAR's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// Size in bytes (0: the BAR is not implemented).
    pub size: u64,
    /// Whether the whole region may be mmap()ed (VFIO `REGION_INFO_FLAG_MMAP` without a sparse
    /// mmap capability). Otherwise every access is a `pread`/`pwrite` on the device fd.
    pub mappable: bool,
}

/// The interrupt kinds of a PCI device under VFIO (`VFIO_PCI_*_IRQ_INDEX`; MSI-X is absent on a
/// GF100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum IrqKind {
    /// Legacy level-triggered INTx. vfio-pci masks the line when it fires; the user unmasks it
    /// once the device stopped asserting it.
    Intx,
    /// Message-signalled (edge). A GF100 sends the next MSI only after the driver re-arms it
    /// (`gf100::pmc::MSI_REARM`).
    Msi,
}

/// An error of the VFIO layer underneath (an ioctl that failed, with what was asked).
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct DeviceError {
    /// What was attempted.
    pub op: String,
    /// Why it failed.
    #[source]
    pub source: io::Error,
}

impl DeviceError {
    /// An error of operation `op`.
    pub fn new(op: impl Into<String>, source: io::Error) -> DeviceError {
        DeviceError {
            op: op.into(),
            source,
        }
    }
}

/// A PCI device behind VFIO, as far as the GF100 backend needs it.
pub trait DeviceAccess: Send + Sync {
    /// The region of `bar`.
    fn region(&self, bar: Bar) -> RegionInfo;

    /// Reads `data.len()` bytes of `bar` at `offset` with one access (pread on the device fd).
    fn region_read(&self, bar: Bar, offset: u64, data: &mut [u8]);

    /// Writes `data` to `bar` at `offset` with one access (pwrite on the device fd).
    fn region_write(&self, bar: Bar, offset: u64, data: &[u8]);

    /// Maps the whole region of `bar` into this process; `None` if it cannot be mapped (the
    /// backend then uses [`DeviceAccess::region_read`] / [`DeviceAccess::region_write`]).
    fn map_region(&self, bar: Bar) -> Option<MappedBar>;

    /// Makes host memory `[host, host + len)` reachable by the device at `[iova, iova + len)`
    /// (type-1 IOMMU map, read and write).
    ///
    /// # Safety
    ///
    /// The host range must stay mapped in this process until [`DeviceAccess::dma_unmap`] of the
    /// same range succeeded: the device may read and write it at any time until then.
    unsafe fn dma_map(&self, iova: u64, len: u64, host: *mut u8) -> Result<(), DeviceError>;

    /// Removes the IOMMU mapping `[iova, iova + len)` made by one [`DeviceAccess::dma_map`].
    fn dma_unmap(&self, iova: u64, len: u64) -> Result<(), DeviceError>;

    /// How many vectors of `kind` the device offers (0: none).
    fn irq_count(&self, kind: IrqKind) -> u32;

    /// Has the kernel signal `fd` whenever vector 0 of `kind` fires.
    fn enable_irq(&self, kind: IrqKind, fd: &EventFd) -> Result<(), DeviceError>;

    /// Stops signalling interrupts of `kind`.
    fn disable_irq(&self, kind: IrqKind) -> Result<(), DeviceError>;

    /// Unmasks INTx after the device stopped asserting it.
    fn unmask_intx(&self) -> Result<(), DeviceError>;

    /// Resets the device (function-level reset when VFIO offers one; a no-op otherwise).
    fn reset(&self);
}
