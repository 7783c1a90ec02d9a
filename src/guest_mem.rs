//! A VM's memory as the device model sees it: its slice of the physical GPU's VRAM and its guest
//! RAM (reachable by the GPU through the VM's own DMA window). Every guest-supplied address goes
//! through here, so this is where "the guest can only reach its own memory" is enforced: a guest
//! VRAM address must lie in `[0, slice size)`, a system-memory address in the VM's RAM.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gf100::Target;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use crate::addr::{Gpa, GuestVram, HostVram, Iova};
use crate::phys::PhysicalGpu;

/// A guest-supplied address or range the VM does not own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A guest VRAM range beyond the VM's slice.
    #[error("guest VRAM range {addr}+{len:#x} is outside the VM's {slice:#x}-byte slice")]
    VramOutOfSlice {
        /// Start of the range.
        addr: GuestVram,
        /// Length of the range.
        len: u64,
        /// Size of the slice.
        slice: u64,
    },
    /// A system-memory range not entirely inside the VM's RAM.
    #[error("guest RAM range {gpa}+{len:#x} is not inside the VM's RAM")]
    SysramOutOfRam {
        /// Start of the range.
        gpa: Gpa,
        /// Length of the range.
        len: u64,
    },
    /// System memory named before the VM attached any guest RAM.
    #[error("system memory used but the VM has no guest RAM attached")]
    NoGuestRam,
    /// An invalid target encoding.
    #[error("invalid memory target")]
    InvalidTarget,
}

/// The VM's slice of physical VRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VramSlice {
    /// Where guest VRAM address 0 lives in physical VRAM.
    pub base: HostVram,
    /// Size of the slice (the VRAM size the guest sees).
    pub size: u64,
}

/// Test-only planted bug: when set, [`VramSlice::translate`] skips its bounds check (the
/// fault-injection campaign must then report isolation breaches; `tests/fault_injection.rs`).
#[doc(hidden)]
pub static PLANTED_BUG_NO_SLICE_CHECK: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

impl VramSlice {
    /// Translates a guest VRAM range to physical VRAM, if it lies entirely inside the slice.
    pub fn translate(&self, addr: GuestVram, len: u64) -> Result<HostVram, Violation> {
        let planted = PLANTED_BUG_NO_SLICE_CHECK.load(std::sync::atomic::Ordering::Relaxed);
        match addr.raw().checked_add(len) {
            Some(end) if end <= self.size || planted => Ok(self.base.offset(addr.raw())),
            _ => Err(Violation::VramOutOfSlice {
                addr,
                len,
                slice: self.size,
            }),
        }
    }

    /// The guest VRAM address of a physical VRAM address inside the slice.
    pub fn to_guest(&self, addr: HostVram) -> Option<GuestVram> {
        let off = addr.raw().checked_sub(self.base.raw())?;
        (off < self.size).then_some(GuestVram(off))
    }
}

/// The VM's RAM and the IOVA window at which the physical GPU reaches it (GPA `g` is at IOVA
/// `iova_base + g`).
#[derive(Debug, Clone)]
pub struct GuestRam {
    /// The memory.
    pub mem: GuestMemoryMmap,
    /// IOVA of guest-physical address 0.
    pub iova_base: Iova,
}

impl GuestRam {
    /// One past the last guest-physical address of the RAM.
    pub fn end(&self) -> u64 {
        self.mem.last_addr().raw_value() + 1
    }

    /// True if `[gpa, gpa + len)` lies inside one region of guest RAM.
    pub fn contains(&self, gpa: Gpa, len: u64) -> bool {
        let Some(end) = gpa.raw().checked_add(len) else {
            return false;
        };
        self.mem.iter().any(|r| {
            let start = r.start_addr().raw_value();
            gpa.raw() >= start && end <= start + r.len()
        })
    }

    /// The IOVA of a guest RAM range, if it lies inside guest RAM.
    pub fn to_iova(&self, gpa: Gpa, len: u64) -> Result<Iova, Violation> {
        if self.contains(gpa, len) {
            Ok(self.iova_base.offset(gpa.raw()))
        } else {
            Err(Violation::SysramOutOfRam { gpa, len })
        }
    }
}

/// Which pages of a VM's VRAM slice may have changed since a migration round last copied them
/// (the live-migration dirty log, `docs/migration.md`). Two sets of 4 KiB pages:
///
/// - **written by the host on the guest's behalf**: every guest write the device model
///   performs (PRAMIN, BAR1 and BAR3 apertures, fills), marked as it happens; a round takes
///   and clears it. Exact, because while the log exists no BAR page is mapped straight into
///   the guest (the direct-map plan is empty).
/// - **reachable by the GPU**: every VRAM page a shadow page-table entry has mapped since the
///   log began (read-only entries included). Never cleared: the GPU may write such a page at
///   any time, so each round compares their contents with what was last sent.
///
/// It also records the guest-RAM pages (by GPA) a shadow entry has mapped since the log began:
/// the GPU writes those by DMA, which a VMM's own dirty log (KVM's) does not see, so a VMM
/// migrating the guest's RAM must copy them again in its stop-and-copy round.
#[derive(Debug)]
pub struct DirtyLog {
    pages: u64,
    cpu: Vec<AtomicU64>,
    gpu: Vec<AtomicU64>,
    ram_pages: u64,
    dma: Vec<AtomicU64>,
}

impl DirtyLog {
    /// An empty log for a slice of `bytes` and guest RAM ending at GPA `ram_end`.
    pub fn new(bytes: u64, ram_end: u64) -> DirtyLog {
        let pages = bytes.div_ceil(PAGE);
        let words = pages.div_ceil(64) as usize;
        let ram_pages = ram_end.div_ceil(PAGE);
        DirtyLog {
            pages,
            cpu: (0..words).map(|_| AtomicU64::new(0)).collect(),
            gpu: (0..words).map(|_| AtomicU64::new(0)).collect(),
            ram_pages,
            dma: (0..ram_pages.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// A shadow page-table entry maps guest RAM `[gpa, gpa + len)`.
    pub(crate) fn dma_maps(&self, gpa: u64, len: u64) {
        if gpa < self.ram_pages * PAGE {
            Self::mark(&self.dma, self.ram_pages, gpa, len);
        }
    }

    /// The guest-RAM pages (GPA / 4096) the GPU can reach by DMA (mapped since the log began).
    pub fn dma_reachable(&self) -> Vec<u64> {
        Self::collect(&self.dma, false)
    }

    /// Pages of the slice.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    fn mark(bits: &[AtomicU64], pages: u64, addr: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = addr / PAGE;
        let last = (addr.saturating_add(len - 1) / PAGE).min(pages.saturating_sub(1));
        for p in first..=last {
            bits[(p / 64) as usize].fetch_or(1 << (p % 64), Ordering::Relaxed);
        }
    }

    /// The host wrote `[addr, addr + len)` of guest VRAM for the guest.
    pub(crate) fn cpu_wrote(&self, addr: u64, len: u64) {
        if addr < self.pages * PAGE {
            Self::mark(&self.cpu, self.pages, addr, len);
        }
    }

    /// A shadow page-table entry maps `[addr, addr + len)` of guest VRAM.
    pub(crate) fn gpu_maps(&self, addr: u64, len: u64) {
        if addr < self.pages * PAGE {
            Self::mark(&self.gpu, self.pages, addr, len);
        }
    }

    /// Marks every page as written by the host (a round that must copy the whole slice).
    pub fn mark_all_written(&self) {
        Self::mark(&self.cpu, self.pages, 0, self.pages * PAGE);
    }

    fn collect(bits: &[AtomicU64], take: bool) -> Vec<u64> {
        let mut out = Vec::new();
        for (i, w) in bits.iter().enumerate() {
            let v = if take {
                w.swap(0, Ordering::Relaxed)
            } else {
                w.load(Ordering::Relaxed)
            };
            let mut v = v;
            while v != 0 {
                let b = v.trailing_zeros() as u64;
                out.push(i as u64 * 64 + b);
                v &= v - 1;
            }
        }
        out
    }

    /// Takes (and clears) the pages the host wrote since the last call.
    pub fn take_written(&self) -> Vec<u64> {
        Self::collect(&self.cpu, true)
    }

    /// The pages the GPU can reach (mapped since the log began).
    pub fn gpu_reachable(&self) -> Vec<u64> {
        Self::collect(&self.gpu, false)
    }
}

/// Bytes of a page of the dirty log.
const PAGE: u64 = 4096;

/// A VM's memory, for reading and writing what the guest owns.
#[derive(Clone, Copy)]
pub struct GuestMem<'a> {
    /// The physical GPU (whose VRAM holds the slice).
    pub phys: &'a dyn PhysicalGpu,
    /// The VM's VRAM slice.
    pub slice: VramSlice,
    /// The VM's RAM, once attached.
    pub ram: Option<&'a GuestRam>,
    /// The migration dirty log, while one runs.
    pub log: Option<&'a DirtyLog>,
}

impl GuestMem<'_> {
    /// Reads `buf.len()` bytes of guest memory at `addr` in `target` (guest VRAM address or GPA).
    pub fn read(&self, target: Target, addr: u64, buf: &mut [u8]) -> Result<(), Violation> {
        let len = buf.len() as u64;
        match target {
            Target::Vram => {
                let host = self.slice.translate(GuestVram(addr), len)?;
                self.phys.read_vram(host, buf);
                Ok(())
            }
            Target::SysCoherent | Target::SysNonCoherent => {
                let ram = self.ram.ok_or(Violation::NoGuestRam)?;
                ram.to_iova(Gpa(addr), len)?;
                ram.mem
                    .read_slice(buf, GuestAddress(addr))
                    .map_err(|_| Violation::SysramOutOfRam {
                        gpa: Gpa(addr),
                        len,
                    })
            }
        }
    }

    /// Writes `data` to guest memory at `addr` in `target`.
    pub fn write(&self, target: Target, addr: u64, data: &[u8]) -> Result<(), Violation> {
        let len = data.len() as u64;
        match target {
            Target::Vram => {
                let host = self.slice.translate(GuestVram(addr), len)?;
                self.phys.write_vram(host, data);
                if let Some(log) = self.log {
                    log.cpu_wrote(addr, len);
                }
                Ok(())
            }
            Target::SysCoherent | Target::SysNonCoherent => {
                let ram = self.ram.ok_or(Violation::NoGuestRam)?;
                ram.to_iova(Gpa(addr), len)?;
                ram.mem.write_slice(data, GuestAddress(addr)).map_err(|_| {
                    Violation::SysramOutOfRam {
                        gpa: Gpa(addr),
                        len,
                    }
                })
            }
        }
    }

    /// Reads a little-endian u32.
    pub fn read_u32(&self, target: Target, addr: u64) -> Result<u32, Violation> {
        let mut b = [0u8; 4];
        self.read(target, addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Reads a little-endian u64.
    pub fn read_u64(&self, target: Target, addr: u64) -> Result<u64, Violation> {
        let mut b = [0u8; 8];
        self.read(target, addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Translates a guest page-table target address to what the physical GPU must be given:
    /// physical VRAM for `Vram`, an IOVA for system memory. Validates the whole range.
    pub fn to_phys(&self, target: Target, addr: u64, len: u64) -> Result<u64, Violation> {
        match target {
            Target::Vram => Ok(self.slice.translate(GuestVram(addr), len)?.raw()),
            Target::SysCoherent | Target::SysNonCoherent => Ok(self
                .ram
                .ok_or(Violation::NoGuestRam)?
                .to_iova(Gpa(addr), len)?
                .raw()),
        }
    }
}

/// The VM's memory: its VRAM slice and (once attached) its RAM with the IOVA window.
#[derive(Debug, Clone)]
pub(crate) struct VmMem {
    pub slice: VramSlice,
    pub ram: Option<GuestRam>,
    pub iova_base: Iova,
    /// The migration dirty log, while one runs.
    pub log: Option<Arc<DirtyLog>>,
}

impl VmMem {
    /// The memory view of a VM with this memory on `phys`.
    pub(crate) fn view<'a>(&'a self, phys: &'a dyn PhysicalGpu) -> GuestMem<'a> {
        GuestMem {
            phys,
            slice: self.slice,
            ram: self.ram.as_ref(),
            log: self.log.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuvm_sim::{SimConfig, SimGpu};

    fn ram() -> GuestRam {
        GuestRam {
            mem: GuestMemoryMmap::<()>::from_ranges(&[
                (GuestAddress(0), 1 << 20),
                (GuestAddress(4 << 20), 1 << 20),
            ])
            .unwrap(),
            iova_base: Iova(1 << 36),
        }
    }

    #[test]
    fn vram_stays_inside_the_slice() {
        let s = VramSlice {
            base: HostVram(0x1000_0000),
            size: 0x100_0000,
        };
        assert_eq!(
            s.translate(GuestVram(0x10), 0x10).unwrap(),
            HostVram(0x1000_0010)
        );
        assert_eq!(
            s.translate(GuestVram(0xff_fff0), 0x10).unwrap(),
            HostVram(0x10ff_fff0)
        );
        assert!(s.translate(GuestVram(0xff_fff8), 0x10).is_err());
        assert!(s.translate(GuestVram(u64::MAX - 4), 0x10).is_err());
        assert_eq!(s.to_guest(HostVram(0x1000_0020)), Some(GuestVram(0x20)));
        assert_eq!(s.to_guest(HostVram(0x1100_0000)), None);
    }

    #[test]
    fn sysram_must_be_inside_one_ram_region() {
        let r = ram();
        assert_eq!(
            r.to_iova(Gpa(0x1000), 0x1000).unwrap(),
            Iova((1 << 36) + 0x1000)
        );
        assert!(
            r.to_iova(Gpa((1 << 20) - 8), 16).is_err(),
            "crosses into the hole"
        );
        assert!(r.to_iova(Gpa(2 << 20), 4).is_err(), "in the hole");
        assert!(r.to_iova(Gpa(4 << 20), 4).is_ok());
    }

    #[test]
    fn reads_and_writes_reach_only_the_vm() {
        let gpu = SimGpu::new(SimConfig {
            vram_size: 64 << 20,
            ..SimConfig::default()
        });
        let r = ram();
        let m = GuestMem {
            phys: &gpu,
            slice: VramSlice {
                base: HostVram(16 << 20),
                size: 1 << 20,
            },
            ram: Some(&r),
            log: None,
        };
        m.write(Target::Vram, 0x100, &7u32.to_le_bytes()).unwrap();
        let mut b = [0u8; 4];
        gpu.read_vram(HostVram((16 << 20) + 0x100), &mut b);
        assert_eq!(u32::from_le_bytes(b), 7);
        assert_eq!(m.read_u32(Target::Vram, 0x100).unwrap(), 7);
        assert!(m.write(Target::Vram, 1 << 20, &[1]).is_err());
        m.write(Target::SysCoherent, 0x2000, &9u64.to_le_bytes())
            .unwrap();
        assert_eq!(m.read_u64(Target::SysNonCoherent, 0x2000).unwrap(), 9);
        assert!(m.read_u32(Target::SysCoherent, 3 << 20).is_err());
        let no_ram = GuestMem { ram: None, ..m };
        assert_eq!(
            no_ram.read_u32(Target::SysCoherent, 0),
            Err(Violation::NoGuestRam)
        );
    }
}
