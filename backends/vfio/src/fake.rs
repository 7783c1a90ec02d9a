//! Tests only: a "VFIO device" served by a simulated GF100, so that the VFIO backend's logic
//! runs without a VFIO device. BAR0 region accesses become the simulator's register accesses,
//! BAR1/BAR3 its aperture accesses; a BAR can instead be plain shared memory that the backend
//! really mmap()s (a memfd mapped twice), to exercise the volatile path. The IOMMU is modelled
//! like VFIO type 1 (page alignment, no overlap, unmap of whole mappings) and really translates:
//! each mapping becomes a DMA window of the simulator over the very host memory passed in.
//! Interrupts follow vfio-pci: the simulator's line signals the eventfd, INTx masks itself until
//! unmasked, MSI is sent on a rising edge while armed (re-armed by a PMC MSI_REARM write).
//! `run_hardware` lets the simulated GPU progress on its own, as real hardware does.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gf100::pmc;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;

use gpuvm_phys::addr::{Gpa, Iova};
use gpuvm_phys::irq::IrqLine;
use gpuvm_phys::{Bar, PhysicalGpu};
use gpuvm_sim::SimGpu;

use super::device::{DeviceAccess, DeviceError, IrqKind, RegionInfo};
use super::mapped::MappedBar;

/// A BAR backed by a memfd: the fake's view and mappings handed to the backend share it.
pub(super) struct RamBar {
    fd: std::fs::File,
    len: usize,
    view: MappedBar,
}

fn map_fd(fd: &std::fs::File, len: usize) -> io::Result<MappedBar> {
    use std::os::fd::AsRawFd;
    // SAFETY: a new shared mapping of a memfd of at least `len` bytes; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the mapping just made.
    Ok(unsafe { MappedBar::from_raw(p.cast(), len) })
}

impl RamBar {
    pub(super) fn new(len: usize) -> RamBar {
        // SAFETY: memfd_create with a valid C string; the fd is checked and then owned.
        let fd = unsafe { libc::memfd_create(c"fake-bar".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a new fd nobody else owns.
        let fd = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        fd.set_len(len as u64).unwrap();
        let view = map_fd(&fd, len).unwrap();
        RamBar { fd, len, view }
    }

    fn ptr(&self) -> *mut u8 {
        self.view.as_ptr()
    }

    pub(super) fn read(&self, offset: u64, data: &mut [u8]) {
        // SAFETY: bounds checked by the caller (the region size); shared memory, bytewise.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr().add(offset as usize),
                data.as_mut_ptr(),
                data.len(),
            )
        }
    }

    pub(super) fn write(&self, offset: u64, data: &[u8]) {
        // SAFETY: as in `read`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.ptr().add(offset as usize),
                data.len(),
            )
        }
    }
}

/// vfio-pci's interrupt behaviour, driven by the simulator's line.
#[derive(Default)]
pub(super) struct FakeIrq {
    state: Mutex<IrqState>,
}

#[derive(Default)]
struct IrqState {
    fd: Option<EventFd>,
    kind: Option<IrqKind>,
    asserted: bool,
    intx_masked: bool,
    msi_armed: bool,
    signals: u64,
}

impl IrqState {
    fn signal(&mut self) {
        if let Some(fd) = &self.fd {
            fd.write(1).unwrap();
            self.signals += 1;
        }
    }

    fn fire_if_due(&mut self) {
        if !self.asserted {
            return;
        }
        match self.kind {
            Some(IrqKind::Intx) if !self.intx_masked => {
                self.intx_masked = true;
                self.signal();
            }
            Some(IrqKind::Msi) if self.msi_armed => {
                self.msi_armed = false;
                self.signal();
            }
            _ => {}
        }
    }
}

impl IrqLine for FakeIrq {
    fn set_level(&self, asserted: bool) {
        let mut s = self.state.lock().unwrap();
        let rising = asserted && !s.asserted;
        s.asserted = asserted;
        if rising || s.kind == Some(IrqKind::Intx) {
            s.fire_if_due();
        }
    }
}

/// A VFIO device over a simulated GF100.
pub(super) struct SimDevice {
    pub gpu: Arc<SimGpu>,
    pub irq: Arc<FakeIrq>,
    /// BARs served from memory (and mappable) instead of the simulator.
    pub ram: HashMap<Bar, RamBar>,
    /// Region sizes, overridable to test the size check.
    pub sizes: HashMap<Bar, u64>,
    /// Vectors offered per kind.
    pub offered: HashMap<IrqKind, u32>,
    /// IOMMU mappings: IOVA -> length.
    pub iommu: Mutex<BTreeMap<u64, u64>>,
    /// Fail the n-th next `dma_map` (1 = the next one); 0: never.
    pub fail_map_at: AtomicU32,
    pub region_accesses: AtomicU64,
    pub rearms: AtomicU64,
    pub unmask_calls: AtomicU64,
}

impl SimDevice {
    /// A device over `gpu` offering one MSI and one INTx vector.
    pub(super) fn new(gpu: Arc<SimGpu>) -> SimDevice {
        let irq = Arc::new(FakeIrq::default());
        gpu.set_irq_line(irq.clone());
        SimDevice {
            gpu,
            irq,
            ram: HashMap::new(),
            sizes: [Bar::Bar0, Bar::Bar1, Bar::Bar3]
                .into_iter()
                .map(|b| (b, b.size()))
                .collect(),
            offered: [(IrqKind::Msi, 1), (IrqKind::Intx, 1)]
                .into_iter()
                .collect(),
            iommu: Mutex::new(BTreeMap::new()),
            fail_map_at: AtomicU32::new(0),
            region_accesses: AtomicU64::new(0),
            rearms: AtomicU64::new(0),
            unmask_calls: AtomicU64::new(0),
        }
    }

    /// Times the eventfd was signalled.
    pub(super) fn signals(&self) -> u64 {
        self.irq.state.lock().unwrap().signals
    }

    /// Whether INTx is masked at "vfio-pci".
    pub(super) fn intx_masked(&self) -> bool {
        self.irq.state.lock().unwrap().intx_masked
    }
}

fn errno(op: &str, e: i32) -> DeviceError {
    DeviceError::new(op, io::Error::from_raw_os_error(e))
}

impl DeviceAccess for SimDevice {
    fn region(&self, bar: Bar) -> RegionInfo {
        RegionInfo {
            size: self.sizes[&bar],
            mappable: self.ram.contains_key(&bar),
        }
    }

    fn region_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.region_accesses.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = self.ram.get(&bar) {
            return r.read(offset, data);
        }
        match bar {
            Bar::Bar0 if data.len() == 4 => {
                let v = self.gpu.read_reg(offset as u32);
                data.copy_from_slice(&v.to_le_bytes());
            }
            Bar::Bar0 => data.fill(0xff),
            _ => self.gpu.read_aperture(bar, offset, data),
        }
    }

    fn region_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.region_accesses.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = self.ram.get(&bar) {
            return r.write(offset, data);
        }
        match bar {
            Bar::Bar0 if data.len() == 4 => {
                let v = u32::from_le_bytes(data.try_into().unwrap());
                self.gpu.write_reg(offset as u32, v);
                if offset == u64::from(pmc::MSI_REARM) {
                    self.rearms.fetch_add(1, Ordering::Relaxed);
                    let mut s = self.irq.state.lock().unwrap();
                    s.msi_armed = true;
                    s.fire_if_due();
                }
            }
            Bar::Bar0 => {}
            _ => self.gpu.write_aperture(bar, offset, data),
        }
    }

    fn map_region(&self, bar: Bar) -> Option<MappedBar> {
        let r = self.ram.get(&bar)?;
        map_fd(&r.fd, r.len).ok()
    }

    unsafe fn dma_map(&self, iova: u64, len: u64, host: *mut u8) -> Result<(), DeviceError> {
        let n = self.fail_map_at.load(Ordering::Relaxed);
        if n > 0 {
            self.fail_map_at.store(n - 1, Ordering::Relaxed);
            if n == 1 {
                return Err(errno("DMA map", libc::ENOSPC));
            }
        }
        if !(iova | len | host as u64).is_multiple_of(4096) || len == 0 {
            return Err(errno("DMA map", libc::EINVAL));
        }
        let mut m = self.iommu.lock().unwrap();
        let overlaps = m
            .range(..iova + len)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > iova);
        if overlaps {
            return Err(errno("DMA map", libc::EEXIST));
        }
        // SAFETY: the caller guarantees the host range stays mapped until it is unmapped here.
        let region = unsafe {
            MmapRegion::build_raw(
                host,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            )
        }
        .map_err(|e| DeviceError::new("DMA map", io::Error::other(e.to_string())))?;
        let region = GuestRegionMmap::new(region, GuestAddress(iova))
            .map_err(|e| DeviceError::new("DMA map", io::Error::other(e.to_string())))?;
        let mem = GuestMemoryMmap::from_regions(vec![region])
            .map_err(|e| DeviceError::new("DMA map", io::Error::other(e.to_string())))?;
        self.gpu
            .map_dma(Iova(iova), len, mem, Gpa(iova))
            .map_err(|e| DeviceError::new("DMA map", io::Error::other(e.to_string())))?;
        m.insert(iova, len);
        Ok(())
    }

    fn dma_unmap(&self, iova: u64, len: u64) -> Result<(), DeviceError> {
        let mut m = self.iommu.lock().unwrap();
        if m.get(&iova) != Some(&len) {
            return Err(errno("DMA unmap", libc::EINVAL));
        }
        m.remove(&iova);
        self.gpu.unmap_dma(Iova(iova)).unwrap();
        Ok(())
    }

    fn irq_count(&self, kind: IrqKind) -> u32 {
        self.offered.get(&kind).copied().unwrap_or(0)
    }

    fn enable_irq(&self, kind: IrqKind, fd: &EventFd) -> Result<(), DeviceError> {
        let mut s = self.irq.state.lock().unwrap();
        s.fd = Some(fd.try_clone().unwrap());
        s.kind = Some(kind);
        s.msi_armed = true;
        s.intx_masked = false;
        s.fire_if_due();
        Ok(())
    }

    fn disable_irq(&self, _kind: IrqKind) -> Result<(), DeviceError> {
        let mut s = self.irq.state.lock().unwrap();
        s.fd = None;
        s.kind = None;
        Ok(())
    }

    fn unmask_intx(&self) -> Result<(), DeviceError> {
        self.unmask_calls.fetch_add(1, Ordering::Relaxed);
        let mut s = self.irq.state.lock().unwrap();
        if s.kind != Some(IrqKind::Intx) {
            return Err(errno("unmask INTx", libc::EINVAL));
        }
        s.intx_masked = false;
        s.fire_if_due();
        Ok(())
    }

    fn reset(&self) {}
}

/// The simulated GPU running by itself (as hardware does): polled every 50 µs until dropped.
pub(super) struct Hardware {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

pub(super) fn run_hardware(gpu: Arc<SimGpu>) -> Hardware {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            gpu.poll();
            std::thread::sleep(Duration::from_micros(50));
        }
    });
    Hardware {
        stop,
        thread: Some(thread),
    }
}

impl Drop for Hardware {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
