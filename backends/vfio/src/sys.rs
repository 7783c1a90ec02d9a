//! The kernel side: [`DeviceAccess`] over a real vfio-pci device with the `vfio-ioctls` crate
//! (a type-1 IOMMU container holding the device's group, and the device fd). Only this file
//! issues VFIO ioctls and `mmap`; nothing in it runs on a machine without a VFIO device, so it
//! is kept to one call per method.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use vfio_bindings::bindings::vfio::{
    VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioRegionInfoCap};
use vmm_sys_util::eventfd::EventFd;

use gpuvm_phys::Bar;

use super::device::{DeviceAccess, DeviceError, IrqKind, RegionInfo};
use super::mapped::MappedBar;
use super::open::{preflight, OpenError, PciAddress, VfioPaths};

/// A PCI device opened through VFIO.
pub struct VfioPci {
    container: Arc<VfioContainer>,
    device: VfioDevice,
}

fn irq_index(kind: IrqKind) -> u32 {
    match kind {
        IrqKind::Intx => VFIO_PCI_INTX_IRQ_INDEX,
        IrqKind::Msi => VFIO_PCI_MSI_IRQ_INDEX,
    }
}

fn vfio_err(op: &str, e: vfio_ioctls::VfioError) -> DeviceError {
    DeviceError::new(op, io::Error::other(e.to_string()))
}

impl VfioPci {
    /// Opens the device at `addr` after [`preflight`]'s checks: a new container, its group,
    /// the device fd.
    pub fn open(addr: PciAddress, paths: &VfioPaths) -> Result<VfioPci, OpenError> {
        let (dir, _group) = preflight(addr, paths)?;
        Self::open_sysfs(&dir)
    }

    /// Opens the device whose sysfs directory is `dir` (no checks).
    pub fn open_sysfs(dir: &Path) -> Result<VfioPci, OpenError> {
        let container =
            Arc::new(VfioContainer::new(None).map_err(|e| OpenError::Vfio(e.to_string()))?);
        let device = VfioDevice::new(dir, container.clone(), false)
            .map_err(|e| OpenError::Vfio(format!("{}: {e}", dir.display())))?;
        Ok(VfioPci { container, device })
    }
}

impl DeviceAccess for VfioPci {
    fn region(&self, bar: Bar) -> RegionInfo {
        let index = u32::from(bar.index());
        let sparse = self
            .device
            .get_region_caps(index)
            .iter()
            .any(|c| matches!(c, VfioRegionInfoCap::SparseMmap(_)));
        RegionInfo {
            size: self.device.get_region_size(index),
            mappable: self.device.get_region_flags(index) & VFIO_REGION_INFO_FLAG_MMAP != 0
                && !sparse,
        }
    }

    fn region_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.device
            .region_read(u32::from(bar.index()), data, offset);
    }

    fn region_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.device
            .region_write(u32::from(bar.index()), data, offset);
    }

    fn map_region(&self, bar: Bar) -> Option<MappedBar> {
        let index = u32::from(bar.index());
        let len = usize::try_from(self.device.get_region_size(index)).ok()?;
        let offset = libc::off_t::try_from(self.device.get_region_offset(index)).ok()?;
        // SAFETY: a new shared mapping of the device fd at the region's offset; the kernel
        // checks the range. The result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.device.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            log::warn!("mmap of BAR{}: {}", bar.index(), io::Error::last_os_error());
            return None;
        }
        // SAFETY: `addr` is the start of the `len`-byte shared mapping just made.
        Some(unsafe { MappedBar::from_raw(addr.cast(), len) })
    }

    unsafe fn dma_map(&self, iova: u64, len: u64, host: *mut u8) -> Result<(), DeviceError> {
        let size = usize::try_from(len)
            .map_err(|_| DeviceError::new("DMA map", io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: forwarded from this method's contract.
        unsafe { self.container.vfio_dma_map(iova, size, host) }
            .map_err(|e| vfio_err(&format!("DMA map of {len:#x} bytes at IOVA {iova:#x}"), e))
    }

    fn dma_unmap(&self, iova: u64, len: u64) -> Result<(), DeviceError> {
        let size = usize::try_from(len)
            .map_err(|_| DeviceError::new("DMA unmap", io::ErrorKind::InvalidInput.into()))?;
        self.container
            .vfio_dma_unmap(iova, size)
            .map_err(|e| vfio_err(&format!("DMA unmap at IOVA {iova:#x}"), e))
    }

    fn irq_count(&self, kind: IrqKind) -> u32 {
        self.device
            .get_irq_info(irq_index(kind))
            .map_or(0, |i| i.count)
    }

    fn enable_irq(&self, kind: IrqKind, fd: &EventFd) -> Result<(), DeviceError> {
        self.device
            .enable_irq(irq_index(kind), vec![fd])
            .map_err(|e| vfio_err(&format!("enable {kind:?}"), e))
    }

    fn disable_irq(&self, kind: IrqKind) -> Result<(), DeviceError> {
        self.device
            .disable_irq(irq_index(kind))
            .map_err(|e| vfio_err(&format!("disable {kind:?}"), e))
    }

    fn unmask_intx(&self) -> Result<(), DeviceError> {
        self.device
            .unmask_irq(VFIO_PCI_INTX_IRQ_INDEX)
            .map_err(|e| vfio_err("unmask INTx", e))
    }

    fn reset(&self) {
        self.device.reset();
    }
}
