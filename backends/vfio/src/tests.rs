//! Tests of the VFIO backend over a simulated GF100 served as VFIO regions (`fake`): register
//! and aperture access, PRAMIN-windowed VRAM access, DMA window bookkeeping, interrupt
//! plumbing, device lookup errors, and the guest driver's workloads run natively and through a
//! virtual GPU on top of the backend.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use gf100::{pbus, pfifo, pmc};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::fake::{run_hardware, RamBar, SimDevice};
use super::*;
use gpuvm_phys::addr::{Gpa, HostVram, Iova};
use gpuvm_phys::clock::{Clock, RealClock};
use gpuvm_phys::irq::IrqFlag;
use gpuvm_sim::{SimConfig, SimGpu};

const VRAM: u64 = 64 << 20;

fn sim() -> Arc<SimGpu> {
    Arc::new(SimGpu::new(SimConfig {
        vram_size: VRAM,
        ..SimConfig::default()
    }))
}

fn open(dev: SimDevice) -> VfioGpu<SimDevice> {
    VfioGpu::new(dev).unwrap()
}

fn ram(len: usize) -> GuestMemoryMmap {
    GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)]).unwrap()
}

#[test]
fn opens_a_fermi_and_sizes_its_vram() {
    let g = open(SimDevice::new(sim()));
    assert_eq!(g.vram_size(), VRAM);
    assert_eq!(g.read_reg(pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
    let st = g.vfio_stats();
    assert_eq!(st.irq_kind, Some(IrqKind::Msi), "MSI preferred");
    assert_eq!(
        st.mapped, [false; 3],
        "the simulator's regions are not mappable"
    );
}

#[test]
fn falls_back_to_intx_then_to_polling() {
    let mut d = SimDevice::new(sim());
    d.offered.remove(&IrqKind::Msi);
    assert_eq!(open(d).vfio_stats().irq_kind, Some(IrqKind::Intx));
    let mut d = SimDevice::new(sim());
    d.offered.clear();
    assert_eq!(open(d).vfio_stats().irq_kind, None);
}

#[test]
fn rejects_small_bars_and_other_chips() {
    let mut d = SimDevice::new(sim());
    d.sizes.insert(Bar::Bar1, 16 << 20);
    let e = VfioGpu::new(d).unwrap_err();
    assert!(matches!(e, OpenError::Bar { index: 1, .. }), "{e}");
    // A BAR0 of zeros: BOOT_0 reads 0.
    let mut d = SimDevice::new(sim());
    d.ram
        .insert(Bar::Bar0, RamBar::new(Bar::Bar0.size() as usize));
    let e = VfioGpu::new(d).unwrap_err();
    assert!(matches!(e, OpenError::NotFermi(0)), "{e}");
    assert!(e.to_string().contains("not a Fermi"));
}

#[test]
fn registers_pass_through_and_bad_ones_are_counted() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    g.write_reg(pfifo::INTR_EN, 0x1234);
    assert_eq!(s.read_reg(pfifo::INTR_EN), 0x1234);
    assert_eq!(g.read_reg(pfifo::INTR_EN), 0x1234);
    assert_eq!(g.read_reg(0x123450), gf100::BAD_REGISTER);
    assert_eq!(
        g.read_reg(pmc::BOOT_0 + 2),
        gf100::BAD_REGISTER,
        "unaligned"
    );
    let st = g.stats();
    assert_eq!(st.bad_register_reads, 2);
    assert_eq!((st.mmio_reads, st.mmio_writes), (3, 1));
}

#[test]
fn vram_goes_through_the_pramin_window() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    // Unaligned, across the 1 MiB window boundary.
    let data: Vec<u8> = (0..23u8).collect();
    let at = (1 << 20) - 9;
    g.write_vram(HostVram(at), &data);
    let mut direct = vec![0u8; 23];
    s.read_vram(HostVram(at), &mut direct);
    assert_eq!(direct, data);
    let mut back = vec![0u8; 23];
    g.read_vram(HostVram(at), &mut back);
    assert_eq!(back, data);
    // The neighbours of partial words were preserved.
    s.write_vram(HostVram(0x300000), &[0xaa; 8]);
    g.write_vram(HostVram(0x300003), &[1, 2]);
    let mut w = [0u8; 8];
    s.read_vram(HostVram(0x300000), &mut w);
    assert_eq!(w, [0xaa, 0xaa, 0xaa, 1, 2, 0xaa, 0xaa, 0xaa]);
    // The window moved only when needed: 0x0, 0x100000 for the first write, the same two for
    // the read, then 0x300000.
    let moves = g.vfio_stats().pramin_moves;
    g.read_vram(HostVram(0x300010), &mut w);
    assert_eq!(g.vfio_stats().pramin_moves, moves, "same window, no move");
    assert_eq!(
        s.read_reg(pbus::PMEM),
        pbus::pmem_encode(0x300000, gf100::Target::Vram)
    );
}

#[test]
fn vram_beyond_the_end_reads_zero_and_drops_writes() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    g.write_vram(HostVram(VRAM - 2), &[7, 7, 7, 7]);
    let mut b = [0xffu8; 4];
    g.read_vram(HostVram(VRAM - 2), &mut b);
    assert_eq!(b, [7, 7, 0, 0]);
    g.read_vram(HostVram(u64::MAX - 1), &mut b);
    assert_eq!(b, [0; 4]);
}

#[test]
fn fill_matches_the_simulator() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    s.write_vram(HostVram(0x10000), &[0x11; 64]);
    g.fill_vram(HostVram(0x10005), 37, 0x5a);
    let mut b = [0u8; 64];
    s.read_vram(HostVram(0x10000), &mut b);
    let mut want = [0x11u8; 64];
    want[5..42].fill(0x5a);
    assert_eq!(b, want);
    g.fill_vram(HostVram(0x10001), 2, 0x77);
    s.read_vram(HostVram(0x10000), &mut b[..4]);
    assert_eq!(&b[..4], &[0x11, 0x77, 0x77, 0x11]);
}

#[test]
fn a_pmem_write_from_above_keeps_the_window_coherent() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    s.write_vram(HostVram(0x500004), &[9, 8, 7, 6]);
    g.write_reg(pbus::PMEM, pbus::pmem_encode(0x500000, gf100::Target::Vram));
    assert_eq!(g.read_reg(pbus::PRAMIN_BASE + 4), 0x0607_0809);
    let moves = g.vfio_stats().pramin_moves;
    let mut b = [0u8; 4];
    g.read_vram(HostVram(0x500004), &mut b);
    assert_eq!(b, [9, 8, 7, 6]);
    assert_eq!(g.vfio_stats().pramin_moves, moves, "known window reused");
    // Moved elsewhere behind the cache's back by the host: the backend follows PMEM writes.
    g.write_reg(pbus::PMEM, pbus::pmem_encode(0x600000, gf100::Target::Vram));
    g.read_vram(HostVram(0x500004), &mut b);
    assert_eq!(b, [9, 8, 7, 6]);
}

#[test]
fn mapped_bars_use_volatile_access_to_the_mapping() {
    let mut d = SimDevice::new(sim());
    d.ram
        .insert(Bar::Bar1, RamBar::new(Bar::Bar1.size() as usize));
    let g = open(d);
    assert_eq!(g.vfio_stats().mapped, [false, true, false]);
    let before = g.device().region_accesses.load(Ordering::Relaxed);
    g.write_aperture(Bar::Bar1, 0x1000, &0x1122_3344_5566_7788u64.to_le_bytes());
    g.write_aperture(Bar::Bar1, 0x1009, &[0xab]);
    assert_eq!(
        g.device().region_accesses.load(Ordering::Relaxed),
        before,
        "no pread/pwrite for a mapped BAR"
    );
    // The device's own view (the memfd mapped separately) sees the stores.
    let mut b = [0u8; 10];
    g.device().ram[&Bar::Bar1].read(0x1000, &mut b);
    assert_eq!(b, [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0, 0xab]);
    let mut r = [0u8; 4];
    g.read_aperture(Bar::Bar1, 0x1004, &mut r);
    assert_eq!(u32::from_le_bytes(r), 0x1122_3344);
    // Outside the BAR: all-ones, dropped, counted.
    g.read_aperture(Bar::Bar1, Bar::Bar1.size() - 2, &mut r);
    assert_eq!(r, [0xff; 4]);
    g.write_aperture(Bar::Bar1, u64::MAX - 1, &r);
    assert_eq!(g.vfio_stats().out_of_bar, 2);
}

#[test]
fn unmapped_apertures_reach_the_gpu_through_the_region() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    let before = g.device().region_accesses.load(Ordering::Relaxed);
    let mut b = [0u8; 4];
    g.read_aperture(Bar::Bar3, 0, &mut b);
    assert_eq!(
        g.device().region_accesses.load(Ordering::Relaxed),
        before + 1
    );
    assert_eq!(g.stats().aperture_reads, 1);
}

#[test]
fn dma_windows_are_validated_before_any_ioctl() {
    let g = open(SimDevice::new(sim()));
    let mem = ram(1 << 20);
    let iommu = |g: &VfioGpu<SimDevice>| g.device().iommu.lock().unwrap().clone();
    assert_eq!(
        g.map_dma(Iova(0x1000), 0, mem.clone(), Gpa(0)),
        Err(DmaError::Empty {
            iova: Iova(0x1000),
            len: 0
        })
    );
    assert_eq!(
        g.map_dma(Iova(u64::MAX - 0xfff), 0x2000, mem.clone(), Gpa(0)),
        Err(DmaError::Empty {
            iova: Iova(u64::MAX - 0xfff),
            len: 0x2000
        })
    );
    assert_eq!(
        g.map_dma(Iova(0x1800), 0x1000, mem.clone(), Gpa(0)),
        Err(DmaError::Unaligned {
            iova: Iova(0x1800),
            len: 0x1000
        })
    );
    assert_eq!(
        g.map_dma(Iova(0x1000), 0x1000, mem.clone(), Gpa(0x800)),
        Err(DmaError::Unaligned {
            iova: Iova(0x1000),
            len: 0x1000
        })
    );
    assert_eq!(
        g.map_dma(Iova(1 << 30), 2 << 20, mem.clone(), Gpa(0)),
        Err(DmaError::NotBacked {
            gpa: Gpa(0),
            len: 2 << 20
        })
    );
    assert!(iommu(&g).is_empty(), "nothing reached the IOMMU");
    g.map_dma(Iova(1 << 30), 1 << 20, mem.clone(), Gpa(0))
        .unwrap();
    assert_eq!(
        g.map_dma(Iova((1 << 30) + 0x8000), 0x1000, mem.clone(), Gpa(0)),
        Err(DmaError::Overlap {
            iova: Iova((1 << 30) + 0x8000)
        })
    );
    assert_eq!(
        iommu(&g).into_iter().collect::<Vec<_>>(),
        vec![(1 << 30, 1 << 20)]
    );
    assert_eq!(g.unmap_dma(Iova(0)), Err(DmaError::NoSuchWindow(Iova(0))));
    g.unmap_dma(Iova(1 << 30)).unwrap();
    assert!(iommu(&g).is_empty());
    assert_eq!(g.vfio_stats().dma_windows, 0);
}

#[test]
fn a_window_over_several_host_mappings_is_mapped_piece_by_piece() {
    let g = open(SimDevice::new(sim()));
    // Two guest RAM regions, adjacent in guest-physical space, separate host mappings.
    let mem = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 0x10000),
        (GuestAddress(0x10000), 0x20000),
    ])
    .unwrap();
    g.map_dma(Iova(1 << 32), 0x18000, mem.clone(), Gpa(0x8000))
        .unwrap();
    let pieces: Vec<(u64, u64)> = lock(&g.dma)
        .pieces(Iova(1 << 32))
        .unwrap()
        .iter()
        .map(|p| (p.iova, p.len))
        .collect();
    assert_eq!(
        pieces,
        vec![(1 << 32, 0x8000), ((1 << 32) + 0x8000, 0x10000)]
    );
    assert_eq!(g.device().iommu.lock().unwrap().len(), 2);
    // The second piece fails at the IOMMU: the first is undone.
    g.device().fail_map_at.store(2, Ordering::Relaxed);
    let e = g
        .map_dma(Iova(1 << 33), 0x18000, mem, Gpa(0x8000))
        .unwrap_err();
    assert!(matches!(e, DmaError::Iommu { .. }), "{e}");
    assert!(e.to_string().contains("No space left"), "{e}");
    assert_eq!(
        g.device().iommu.lock().unwrap().len(),
        2,
        "only the first window"
    );
}

#[test]
fn the_gpu_reaches_guest_ram_through_the_iommu() {
    let s = sim();
    let g = open(SimDevice::new(s.clone()));
    let mem = ram(1 << 20);
    g.map_dma(Iova(1 << 36), 1 << 20, mem.clone(), Gpa(0))
        .unwrap();
    vm_memory::Bytes::write_slice(&mem, &[1, 2, 3, 4], GuestAddress(0x4000)).unwrap();
    // The simulator's DMA (as the GPU's system-memory reads) sees the guest's bytes at the IOVA.
    // Use the simulator's PRAMIN window on system memory (PMEM target 2 = coherent sysmem).
    s.write_reg(
        pbus::PMEM,
        pbus::pmem_encode(1 << 36, gf100::Target::SysCoherent),
    );
    assert_eq!(s.read_reg(pbus::PRAMIN_BASE + 0x4000), 0x0403_0201);
    drop(g);
    assert!(s.stats().dma_errors == 0);
    assert_eq!(
        s.read_reg(pbus::PRAMIN_BASE + 0x4000),
        u32::MAX,
        "unmapped when the device went"
    );
}

/// Raises a PFIFO runlist interrupt on the simulator (as in the simulator's own tests).
fn raise(g: &VfioGpu<SimDevice>) {
    g.write_reg(pfifo::INTR_EN, u32::MAX);
    g.write_reg(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
    g.write_reg(pfifo::RUNLIST_SUBMIT, 0);
}

fn ack(g: &VfioGpu<SimDevice>) {
    g.write_reg(pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
}

#[test]
fn msi_reaches_the_line_and_is_rearmed() {
    let g = open(SimDevice::new(sim()));
    let flag = Arc::new(IrqFlag::new());
    g.set_irq_line(flag.clone());
    raise(&g);
    assert_eq!(g.device().signals(), 1);
    // The waiter thread may already have counted the MSI during raise()'s last register write
    // (which then drives the line); the poll at the latest does.
    g.poll();
    assert!(flag.is_asserted());
    ack(&g);
    assert!(!flag.is_asserted());
    let st = g.vfio_stats().irq;
    assert_eq!((st.events, st.rearms, st.unmasks), (1, 1, 0));
    assert_eq!(g.device().rearms.load(Ordering::Relaxed), 1);
    // The next interrupt is delivered because the MSI was re-armed.
    g.write_reg(pfifo::RUNLIST_SUBMIT, 0);
    assert_eq!(g.device().signals(), 2);
    g.poll();
    assert!(flag.is_asserted());
    assert_eq!(flag.rising_edges(), 2);
}

#[test]
fn intx_is_unmasked_once_the_gpu_stops_asserting() {
    let mut d = SimDevice::new(sim());
    d.offered.remove(&IrqKind::Msi);
    let g = open(d);
    let flag = Arc::new(IrqFlag::new());
    g.set_irq_line(flag.clone());
    raise(&g);
    g.poll();
    assert!(flag.is_asserted());
    assert!(
        g.device().intx_masked(),
        "vfio-pci masked INTx when it fired"
    );
    // Still asserted: not unmasked (it would fire again at once).
    g.poll();
    assert!(g.device().intx_masked());
    ack(&g);
    assert!(!flag.is_asserted());
    assert!(!g.device().intx_masked());
    assert_eq!(g.vfio_stats().irq.unmasks, 1);
    g.write_reg(pfifo::RUNLIST_SUBMIT, 0);
    g.poll();
    assert!(flag.is_asserted());
    assert_eq!(g.device().signals(), 2);
}

#[test]
fn a_line_connected_late_gets_the_current_level() {
    let g = open(SimDevice::new(sim()));
    raise(&g);
    let flag = Arc::new(IrqFlag::new());
    g.set_irq_line(flag.clone());
    assert!(flag.is_asserted());
}

#[test]
fn without_interrupts_the_registers_are_polled() {
    let mut d = SimDevice::new(sim());
    d.offered.clear();
    let g = open(d);
    let flag = Arc::new(IrqFlag::new());
    g.set_irq_line(flag.clone());
    raise(&g);
    assert_eq!(g.device().signals(), 0, "no eventfd");
    g.poll();
    assert!(flag.is_asserted());
    ack(&g);
    g.poll();
    assert!(!flag.is_asserted());
}

/// The guest driver brought up and a workload run with the backend in between, natively and
/// through a virtual GPU; the simulated GPU runs on its own thread, as hardware does.
fn workload_rig() -> (
    Arc<SimGpu>,
    Arc<VfioGpu<SimDevice>>,
    Arc<dyn Clock>,
    super::fake::Hardware,
) {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let s = Arc::new(SimGpu::new(SimConfig {
        vram_size: 256 << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let g = Arc::new(open(SimDevice::new(s.clone())));
    let hw = run_hardware(s.clone());
    (s, g, clock, hw)
}

#[test]
fn native_workloads_run_through_the_backend() {
    use gpuvm_guest::workloads::{self, Workload};
    use gpuvm_guest::{DriverConfig, FenceMode, Gpu};
    let (_s, g, clock, _hw) = workload_rig();
    let ram_len = 16 << 20;
    let mem = ram(ram_len);
    g.map_dma(Iova(0), ram_len as u64, mem.clone(), Gpa(0))
        .unwrap();
    let hal = gpuvm_harness::NativeHal::new(g.clone(), clock, mem, 0, ram_len as u64);
    let cfg = DriverConfig {
        fence_mode: FenceMode::Interrupt,
        ..DriverConfig::default()
    };
    let mut drv = Gpu::init(hal, cfg).unwrap();
    for w in [Workload::Madd, Workload::MemcpyHtod, Workload::MemcpyDtoh] {
        let r = workloads::run(&mut drv, w, 32).unwrap();
        assert!(r.verified, "{w:?}");
    }
    // The waiter thread counts an MSI when it reads the eventfd, and the re-arm follows once
    // the driver has handled it (the line low again): the last MSI may still be in between
    // (this raced under load before).
    g.poll();
    let st = g.vfio_stats();
    assert!(st.irq.events > 0, "fences waited on MSIs: {st:?}");
    assert!(
        st.irq.rearms <= st.irq.events && st.irq.rearms + 1 >= st.irq.events,
        "every MSI but possibly the last (still being handled) re-armed: {st:?}"
    );
}

#[test]
fn a_virtual_gpu_runs_on_the_backend() {
    use gpuvm_guest::workloads::{self, Workload};
    use gpuvm_guest::{DriverConfig, FenceMode, Gpu};
    let (_s, g, clock, _hw) = workload_rig();
    let host = gpuvm::host::GpuHost::new(
        g.clone(),
        gpuvm::host::HostConfig {
            hypervisor_vram: 32 << 20,
            ..gpuvm::host::HostConfig::default()
        },
    )
    .unwrap();
    let profile = gpuvm::profile::VgpuProfile {
        name: "t".into(),
        vram_mib: 64,
        channels: 4,
        weight: 1,
        shadow: gpuvm::profile::ShadowMode::Lazy,
    };
    let vgpu = host.create_vgpu(&profile).unwrap();
    let ram_len = 16 << 20;
    let mem = ram(ram_len);
    vgpu.attach_guest_memory(mem.clone()).unwrap();
    assert_eq!(
        g.vfio_stats().dma_windows,
        1,
        "the VM's RAM is in the IOMMU"
    );
    let hal = gpuvm_harness::VirtHal::new(vgpu.clone(), clock, mem, 0, ram_len as u64);
    let cfg = DriverConfig {
        fence_mode: FenceMode::Interrupt,
        ..DriverConfig::default()
    };
    let mut drv = Gpu::init(hal, cfg).unwrap();
    for w in [Workload::Madd, Workload::MemcpyDtoh] {
        let r = workloads::run(&mut drv, w, 32).unwrap();
        assert!(r.verified, "{w:?}");
    }
    g.poll();
    let st = g.vfio_stats();
    assert!(
        st.pramin_moves > 0,
        "shadow structures written through PRAMIN"
    );
    assert!(st.irq.events > 0, "{st:?}");
    drop(drv);
    host.destroy_vgpu(&vgpu).unwrap();
    drop(vgpu);
    assert_eq!(
        g.vfio_stats().dma_windows,
        0,
        "the VM's window left the IOMMU"
    );
}

#[test]
fn open_names_what_is_missing() {
    let root = std::env::temp_dir().join(format!("gpuvm-vfio-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let paths = VfioPaths {
        pci_devices: root.join("sys"),
        dev_vfio: root.join("dev"),
    };
    let addr: PciAddress = "0000:01:00.0".parse().unwrap();
    let err = |p: &VfioPaths| preflight_err(addr, p);
    assert!(
        err(&paths).contains("VFIO is not available"),
        "{}",
        err(&paths)
    );
    std::fs::create_dir_all(&paths.dev_vfio).unwrap();
    std::fs::write(paths.dev_vfio.join("vfio"), "").unwrap();
    assert!(err(&paths).contains("no PCI device 0000:01:00.0"));
    let dev = paths.pci_devices.join("0000:01:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x8086\n").unwrap();
    assert!(err(&paths).contains("not NVIDIA"));
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    assert!(err(&paths).contains("bound to no driver"));
    std::os::unix::fs::symlink("../../drivers/nouveau", dev.join("driver")).unwrap();
    let e = err(&paths);
    assert!(
        e.contains("bound to nouveau, not to vfio-pci") && e.contains("driver_override"),
        "{e}"
    );
    std::fs::remove_file(dev.join("driver")).unwrap();
    std::os::unix::fs::symlink("../../drivers/vfio-pci", dev.join("driver")).unwrap();
    assert!(err(&paths).contains("no IOMMU group"));
    std::os::unix::fs::symlink("../../kernel/iommu_groups/17", dev.join("iommu_group")).unwrap();
    assert!(
        err(&paths).contains("/dev/17 does not exist") || err(&paths).contains("17 does not exist")
    );
    std::fs::write(paths.dev_vfio.join("17"), "").unwrap();
    assert_eq!(open::preflight(addr, &paths).unwrap(), (dev, 17));
    std::fs::remove_dir_all(&root).unwrap();
}

fn preflight_err(addr: PciAddress, p: &VfioPaths) -> String {
    open::preflight(addr, p).unwrap_err().to_string()
}

#[test]
fn pci_addresses_parse_strictly() {
    let a: PciAddress = "0000:0a:1f.7".parse().unwrap();
    assert_eq!((a.domain, a.bus, a.dev, a.func), (0, 0x0a, 0x1f, 7));
    assert_eq!(a.to_string(), "0000:0a:1f.7");
    assert_eq!(
        "01:00.0".parse::<PciAddress>().unwrap().to_string(),
        "0000:01:00.0"
    );
    for bad in [
        "",
        "01:00",
        "0000:01:20.0",
        "0000:01:00.8",
        "x:01:00.0",
        "00000:01:00.0",
        "1:2:3:4.0",
    ] {
        assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
    }
}
