//! DMA windows sized from the RAM the clients map (the daemon's default): 64 VMs fit on one
//! host where fixed 32 GiB windows stop at 31; a map that needs more than can be granted is
//! refused, and neither the refused VM's earlier maps nor any other VM's window changes; a
//! guest that has bound a channel cannot move its window; a device reset re-creates the vGPU
//! with the window the maps need.

mod support;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gf100::mmu::{self, Pde};
use gf100::{inst, pbus, pfifo, Target};
use gpuvm::clock::ClockKind;
use gpuvm::host::{GpuHost, HostConfig, MAX_DMA_WINDOW};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::VgpuProfile;
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_vfio_user::wire::{cmd, RawClient};
use gpuvm_vfio_user::{Daemon, DaemonConfig, DmaWindows, SocketAccess, VmDevice, VmSpec};

const MIB: u64 = 1 << 20;
/// The IOVA space windows are carved from: `[1 MiB, 2^40)`.
const IOVA_SPACE: u64 = (1 << 40) - MIB;

/// A daemon of `n` VMs (64 MiB of VRAM, 2 channels each) on a host with room for 64 of them,
/// sizing windows as `windows` says.
fn daemon(test: &str, n: usize, windows: DmaWindows) -> (std::io::Result<Daemon>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("gpuvm-windows-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clock = ClockKind::Real.create();
    let phys: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 5 << 30,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let host = Arc::new(
        GpuHost::new(
            phys,
            HostConfig {
                hypervisor_vram: 128 * MIB,
                shadow_vram_per_vm: MIB,
                ..HostConfig::default()
            },
        )
        .unwrap(),
    );
    host.set_clock(clock.clone());
    let vms = (0..n)
        .map(|i| VmSpec {
            name: format!("vm{i}"),
            profile: VgpuProfile {
                name: format!("vm{i}"),
                vram_mib: 64,
                channels: 2,
                ..VgpuProfile::default()
            },
            cap_ppm: None,
        })
        .collect();
    let d = Daemon::start_with(
        host,
        clock,
        DaemonConfig {
            socket_dir: dir.clone(),
            vms,
            require_sealed_dma: true,
        },
        SocketAccess::default(),
        windows,
    );
    (d, dir)
}

fn sock(dir: &Path, vm: &str) -> PathBuf {
    dir.join(format!("{vm}.sock"))
}

/// The window of a VM's current vGPU: (IOVA base, size).
fn window(dev: &VmDevice) -> (u64, u64) {
    dev.host().dma_window(&dev.vgpu().unwrap()).unwrap()
}

fn map(c: &mut RawClient, file: &File, address: u64, size: u64) -> bool {
    !c.dma_map(0, address, size, Some(file.as_raw_fd()))
        .unwrap()
        .is_error()
}

fn boot0(c: &mut RawClient) -> u32 {
    let (r, b) = c.region_read(0, 0, 4).unwrap();
    assert!(!r.is_error());
    u32::from_le_bytes(b[16..20].try_into().unwrap())
}

fn disjoint(ws: &[(u64, u64)]) -> bool {
    ws.iter().enumerate().all(|(i, a)| {
        ws[i + 1..]
            .iter()
            .all(|b| a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0)
    })
}

#[test]
fn sixty_four_vms_map_their_ram_where_fixed_windows_stop_at_31() {
    // Fixed 32 GiB windows: the 32nd VM is refused at start.
    let (fixed, dir) = daemon("fixed", 64, DmaWindows::Fixed);
    let e = fixed.err().expect("64 fixed 32 GiB windows cannot fit");
    assert!(e.to_string().contains("VM 'vm31'"), "{e}");
    assert!(e.to_string().contains("no DMA window left"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    // Sized from the RAM: 64 VMs, each client maps 64 MiB of RAM (in two maps, the second
    // growing the window again).
    let (d, dir) = daemon("from-ram", 64, DmaWindows::default());
    let d = d.unwrap();
    let devs = d.devices();
    assert_eq!(devs.len(), 64);
    assert!(devs.iter().all(|dev| window(dev).1 == MIB), "the smallest");
    let mut clients = Vec::new();
    for dev in &devs {
        let ram = support::sealed_memfd(64 * MIB);
        let mut c = RawClient::connect_negotiated(&sock(&dir, dev.name())).unwrap();
        assert!(map(&mut c, &ram, 0, 16 * MIB), "{}", dev.name());
        assert_eq!(window(dev).1, 16 * MIB);
        let more = support::sealed_memfd(48 * MIB);
        assert!(map(&mut c, &more, 16 * MIB, 48 * MIB), "{}", dev.name());
        assert_eq!(window(dev).1, 64 * MIB, "{}", dev.name());
        assert_eq!(
            dev.ram().map(|m| vm_memory::GuestMemory::num_regions(&m)),
            Some(2)
        );
        clients.push((c, ram, more));
    }
    let ws: Vec<_> = devs.iter().map(|dev| window(dev)).collect();
    assert!(disjoint(&ws));
    assert_eq!(
        d.host().stats().iova_free,
        IOVA_SPACE - 64 * 64 * MIB,
        "each VM holds a window of its RAM's size, nothing else is held"
    );
    // Every client still talks to its own vGPU.
    let id = boot0(&mut clients[0].0);
    assert_ne!(id, u32::MAX);
    assert!(clients.iter_mut().all(|(c, _, _)| boot0(c) == id));
    assert!(devs.iter().all(|dev| dev.rejected() == 0));
    drop(clients);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_map_beyond_what_can_be_granted_is_refused_and_nothing_else_changes() {
    let (d, dir) = daemon(
        "full",
        3,
        DmaWindows::FromRam {
            max: MAX_DMA_WINDOW,
        },
    );
    let d = d.unwrap();
    let devs = d.devices();
    let page = support::sealed_memfd(4096);
    // A takes the upper half of the IOVA space (one page at the top of a 2^39 window), B a
    // quarter below it.
    let mut a = RawClient::connect_negotiated(&sock(&dir, "vm0")).unwrap();
    assert!(map(&mut a, &page, MAX_DMA_WINDOW - 4096, 4096));
    let mut b = RawClient::connect_negotiated(&sock(&dir, "vm1")).unwrap();
    assert!(map(&mut b, &page, (1 << 38) - 4096, 4096));
    // C maps 16 MiB, then a page that would need another 2^38 window: no aligned range is
    // left.
    let mut c = RawClient::connect_negotiated(&sock(&dir, "vm2")).unwrap();
    let ram = support::sealed_memfd(16 * MIB);
    assert!(map(&mut c, &ram, 0, 16 * MIB));
    let before: Vec<_> = devs.iter().map(|dev| window(dev)).collect();
    assert_eq!(
        before.iter().map(|w| w.1).collect::<Vec<_>>(),
        [MAX_DMA_WINDOW, 1 << 38, 16 * MIB]
    );
    let ids: Vec<_> = devs.iter().map(|dev| dev.vgpu().unwrap().id()).collect();
    let free = d.host().stats().iova_free;
    assert!(!map(&mut c, &page, (1 << 38) - 8192, 4096), "no room");
    // Beyond the largest window, wrapping, empty: refused before the host is asked.
    assert!(
        !map(&mut c, &page, MAX_DMA_WINDOW, 4096),
        "beyond the largest"
    );
    assert!(!map(&mut c, &page, u64::MAX - 4095, 4096), "wraps");
    assert!(!map(&mut c, &page, 1 << 50, 0), "empty");
    assert_eq!(devs[2].rejected(), 4);
    // Nothing moved: windows, vGPUs, the allocator; C keeps its RAM, and every client works.
    assert_eq!(
        devs.iter().map(|dev| window(dev)).collect::<Vec<_>>(),
        before
    );
    assert_eq!(
        devs.iter()
            .map(|dev| dev.vgpu().unwrap().id())
            .collect::<Vec<_>>(),
        ids
    );
    assert_eq!(d.host().stats().iova_free, free);
    let c_ram = devs[2].ram().expect("C's earlier map is still attached");
    assert_eq!(vm_memory::GuestMemory::last_addr(&c_ram).0 + 1, 16 * MIB);
    assert_eq!(devs[0].rejected() + devs[1].rejected(), 0);
    let id = boot0(&mut a);
    assert_eq!(boot0(&mut b), id);
    assert_eq!(boot0(&mut c), id);
    // What fits is still granted to C.
    assert!(map(&mut c, &page, (1 << 30) - 4096, 4096));
    assert_eq!(window(&devs[2]).1, 1 << 30);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn wr(c: &mut RawClient, off: u32, val: u32) {
    assert!(!c
        .region_write(0, u64::from(off), &val.to_le_bytes())
        .unwrap()
        .is_error());
}

fn pramin_wr64(c: &mut RawClient, addr: u64, val: u64) {
    for (i, w) in [val as u32, (val >> 32) as u32].into_iter().enumerate() {
        let a = addr + 4 * i as u64;
        wr(
            c,
            pbus::PMEM,
            pbus::pmem_encode(a & !0xf_ffff, Target::Vram),
        );
        wr(c, pbus::PRAMIN_BASE + (a & 0xf_ffff) as u32, w);
    }
}

#[test]
fn a_guest_with_a_bound_channel_cannot_move_its_window_and_a_reset_sizes_the_new_vgpu() {
    let (d, dir) = daemon("bound", 2, DmaWindows::default());
    let d = d.unwrap();
    let devs = d.devices();
    let mut c = RawClient::connect_negotiated(&sock(&dir, "vm0")).unwrap();
    let mut other = RawClient::connect_negotiated(&sock(&dir, "vm1")).unwrap();
    let ram = support::sealed_memfd(8 * MIB);
    assert!(map(&mut c, &ram, 0, 8 * MIB));
    assert!(map(&mut other, &ram, 0, 4 * MIB));
    let other_window = window(&devs[1]);
    // A booting guest: reads configuration space, enables memory decoding, binds channel 0
    // (page directory with an empty table, instance block, channel table entry).
    assert!(!c.region_read(7, 0, 4).unwrap().0.is_error());
    assert!(!c
        .region_write(7, 4, &6u16.to_le_bytes())
        .unwrap()
        .is_error());
    let (inst_a, pd, pt, userd_a) = (0x1_0000, 0x2_0000, 0x10_0000, 0x3_0000);
    let pde = Pde::small_table(pt, Target::Vram);
    pramin_wr64(&mut c, pd, pde.encode());
    pramin_wr64(
        &mut c,
        inst_a + inst::RAMFC_USERD_LO,
        inst::userd_encode(userd_a, Target::Vram),
    );
    pramin_wr64(
        &mut c,
        inst_a + inst::PDB_LO,
        inst::pdb_encode(pd, Target::Vram),
    );
    pramin_wr64(&mut c, inst_a + inst::LIMIT_LO, mmu::VA_LIMIT - 1);
    wr(
        &mut c,
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(0x4_0000),
    );
    wr(
        &mut c,
        pfifo::chan_table(0),
        pfifo::chan_encode(inst_a, Target::Vram),
    );
    // More RAM within the window is fine; beyond it the window would have to move.
    let w = window(&devs[0]);
    assert_eq!(w.1, 8 * MIB);
    let more = support::sealed_memfd(8 * MIB);
    assert!(
        !map(&mut c, &more, 8 * MIB, 8 * MIB),
        "the window cannot grow"
    );
    assert_eq!(window(&devs[0]), w);
    assert_eq!(devs[0].rejected(), 1);
    let ram_end = |dev: &VmDevice| {
        dev.ram()
            .map(|m| vm_memory::GuestMemory::last_addr(&m).0 + 1)
    };
    assert_eq!(
        ram_end(&devs[0]),
        Some(8 * MIB),
        "the earlier map stays attached"
    );
    // A device reset: a fresh vGPU, created with the window the maps need (the same here),
    // which the client can then grow before it binds anything.
    let old = devs[0].vgpu().unwrap().id();
    let (r, _) = c.request(cmd::DEVICE_RESET, &[], None, &[]).unwrap();
    assert!(!r.is_error());
    assert_ne!(devs[0].vgpu().unwrap().id(), old);
    assert_eq!(window(&devs[0]).1, 8 * MIB);
    assert_eq!(ram_end(&devs[0]), Some(8 * MIB));
    assert!(
        map(&mut c, &more, 8 * MIB, 8 * MIB),
        "nothing bound on the fresh vGPU"
    );
    assert_eq!(window(&devs[0]).1, 16 * MIB);
    assert_eq!(window(&devs[1]), other_window);
    assert_eq!(devs[1].rejected(), 0);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
