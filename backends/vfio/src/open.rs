//! Finding the GPU: the PCI address on the command line (`DOMAIN:BUS:DEV.FN`), and the checks
//! made before any VFIO ioctl so that a wrong setup gets a message saying what to do: VFIO not
//! loaded, no such device, not an NVIDIA device, not bound to vfio-pci, no IOMMU group node.
//! The paths (`/sys/bus/pci/devices`, `/dev/vfio`) are parameters so the tests can build each
//! broken setup in a temporary directory.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A PCI function address, `DOMAIN:BUS:DEV.FN` (hex; the domain may be left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number (0-31).
    pub dev: u8,
    /// Function number (0-7).
    pub func: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.dev, self.func
        )
    }
}

impl FromStr for PciAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!("'{s}' is not a PCI address (expected DOMAIN:BUS:DEV.FN, e.g. 0000:01:00.0)")
        };
        let (rest, func) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, dev) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad()),
        };
        let hex = |t: &str, max: u32| {
            u32::from_str_radix(t, 16)
                .ok()
                .filter(|&v| v <= max && !t.is_empty() && t.len() <= 4)
                .ok_or_else(bad)
        };
        Ok(PciAddress {
            domain: hex(domain, 0xffff)? as u16,
            bus: hex(bus, 0xff)? as u8,
            dev: hex(dev, 0x1f)? as u8,
            func: hex(func, 7)? as u8,
        })
    }
}

/// Where the kernel's PCI and VFIO interfaces live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioPaths {
    /// The directory of PCI devices in sysfs (`/sys/bus/pci/devices`).
    pub pci_devices: PathBuf,
    /// The VFIO device directory (`/dev/vfio`).
    pub dev_vfio: PathBuf,
}

impl Default for VfioPaths {
    fn default() -> Self {
        VfioPaths {
            pci_devices: PathBuf::from("/sys/bus/pci/devices"),
            dev_vfio: PathBuf::from("/dev/vfio"),
        }
    }
}

/// Why a GPU could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The GPU specification could not be parsed.
    #[error("{0}")]
    Spec(String),
    /// No VFIO container device.
    #[error("{0} does not exist: VFIO is not available (load it with `modprobe vfio-pci`; an IOMMU must be enabled, e.g. intel_iommu=on)")]
    NoVfio(PathBuf),
    /// No such PCI device.
    #[error("no PCI device {addr} ({path} does not exist)")]
    NoSuchDevice {
        /// The address asked for.
        addr: PciAddress,
        /// The sysfs path looked at.
        path: PathBuf,
    },
    /// The device is not NVIDIA's.
    #[error("PCI device {addr} has vendor id {vendor}, not NVIDIA's (0x10de)")]
    NotNvidia {
        /// The address.
        addr: PciAddress,
        /// The vendor id read from sysfs.
        vendor: String,
    },
    /// The device is bound to another driver, or to none.
    #[error("PCI device {addr} is {}, not to vfio-pci: unbind it and run `echo vfio-pci > /sys/bus/pci/devices/{addr}/driver_override; echo {addr} > /sys/bus/pci/drivers_probe`", match driver { Some(d) => format!("bound to {d}"), None => "bound to no driver".to_string() })]
    NotBoundToVfio {
        /// The address.
        addr: PciAddress,
        /// The driver it is bound to.
        driver: Option<String>,
    },
    /// The device has no IOMMU group.
    #[error("PCI device {addr} has no IOMMU group ({}/iommu_group missing): is the IOMMU on?", path.display())]
    NoIommuGroup {
        /// The address.
        addr: PciAddress,
        /// The device's sysfs directory.
        path: PathBuf,
    },
    /// The group's VFIO node is missing.
    #[error("VFIO group node {0} does not exist (is the device bound to vfio-pci?)")]
    NoGroupNode(PathBuf),
    /// A VFIO ioctl failed.
    #[error("VFIO: {0}")]
    Vfio(String),
    /// A BAR is missing or too small for a GF100.
    #[error("BAR{index} has {size:#x} bytes, a GF100 needs {want:#x}")]
    Bar {
        /// BAR index.
        index: u8,
        /// Its size.
        size: u64,
        /// The size a GF100 has.
        want: u64,
    },
    /// BOOT_0 does not name a Fermi.
    #[error("the device is not a Fermi GPU (BOOT_0 {0:#010x})")]
    NotFermi(u32),
    /// The memory controller reports no VRAM.
    #[error("the memory controller reports no VRAM")]
    NoVram,
    /// The interrupt eventfd could not be created.
    #[error("cannot create the interrupt eventfd: {0}")]
    EventFd(#[source] std::io::Error),
}

/// The last component of the symlink `path` points to.
fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// Checks that `addr` is an NVIDIA device bound to vfio-pci with a VFIO group node; returns the
/// device's sysfs directory and its IOMMU group number.
pub fn preflight(addr: PciAddress, paths: &VfioPaths) -> Result<(PathBuf, u32), OpenError> {
    let container = paths.dev_vfio.join("vfio");
    if !container.exists() {
        return Err(OpenError::NoVfio(container));
    }
    let dir = paths.pci_devices.join(addr.to_string());
    if !dir.exists() {
        return Err(OpenError::NoSuchDevice { addr, path: dir });
    }
    let vendor = std::fs::read_to_string(dir.join("vendor"))
        .unwrap_or_default()
        .trim()
        .to_string();
    if u16::from_str_radix(vendor.trim_start_matches("0x"), 16).ok() != Some(gf100::pci::VENDOR_ID)
    {
        return Err(OpenError::NotNvidia { addr, vendor });
    }
    let driver = link_name(&dir.join("driver"));
    if driver.as_deref() != Some("vfio-pci") {
        return Err(OpenError::NotBoundToVfio { addr, driver });
    }
    let group = link_name(&dir.join("iommu_group"))
        .and_then(|g| g.parse::<u32>().ok())
        .ok_or_else(|| OpenError::NoIommuGroup {
            addr,
            path: dir.clone(),
        })?;
    let node = paths.dev_vfio.join(group.to_string());
    if !node.exists() {
        return Err(OpenError::NoGroupNode(node));
    }
    Ok((dir, group))
}
