//! Resizing a VM's DMA window: the window moves only while nothing can use it, a full IOVA
//! space is a clear refusal that changes nothing, and other VMs' windows never move.

use std::sync::Arc;

use gf100::pfifo;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::host::{dma_window_for, GpuHost, HostConfig, HostError, MAX_DMA_WINDOW};
use crate::profile::{ShadowMode, VgpuProfile};
use crate::vgpu::tests::{guest_channel, wr};
use crate::vgpu::VgpuError;
use gpuvm_sim::{SimConfig, SimGpu};

const MIB: u64 = 1 << 20;
/// The IOVA space windows are carved from: `[1 MiB, 2^40)`.
const IOVA_SPACE: u64 = (1 << 40) - MIB;

fn host() -> GpuHost {
    GpuHost::new(
        Arc::new(SimGpu::new(SimConfig {
            vram_size: 1 << 30,
            ..SimConfig::default()
        })),
        HostConfig {
            hypervisor_vram: 64 * MIB,
            shadow_vram_per_vm: MIB,
            ..HostConfig::default()
        },
    )
    .unwrap()
}

fn profile() -> VgpuProfile {
    VgpuProfile {
        name: "t".into(),
        vram_mib: 64,
        channels: 2,
        weight: 1,
        shadow: ShadowMode::Lazy,
    }
}

fn ram(len: u64) -> GuestMemoryMmap {
    GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len as usize)]).unwrap()
}

#[test]
fn a_fresh_vgpu_grows_its_window_and_its_ram_then_fits() {
    let h = host();
    let others: Vec<_> = (0..3)
        .map(|_| h.create_vgpu_for_ram(&profile(), 8 * MIB).unwrap())
        .collect();
    let before: Vec<_> = others.iter().map(|o| h.dma_window(o).unwrap()).collect();
    let v = h.create_vgpu_for_ram(&profile(), 0).unwrap();
    assert_eq!(h.dma_window(&v).unwrap().1, MIB, "the smallest window");
    assert!(matches!(
        v.attach_guest_memory(ram(24 * MIB)),
        Err(VgpuError::RamTooLarge { window, .. }) if window == MIB
    ));
    let free = h.stats().iova_free;
    let (base, size) = h.resize_dma_window(&v, 24 * MIB).unwrap();
    assert_eq!(size, dma_window_for(24 * MIB));
    assert_eq!(size, 32 * MIB);
    assert_eq!(base % size, 0, "naturally aligned");
    assert_eq!(h.dma_window(&v).unwrap(), (base, size));
    assert_eq!(
        h.stats().iova_free,
        free + MIB - size,
        "the old window went back"
    );
    for (o, w) in others.iter().zip(&before) {
        assert_eq!(h.dma_window(o).unwrap(), *w, "another VM's window moved");
        assert!(!(w.0 < base + size && base < w.0 + w.1), "windows overlap");
    }
    v.attach_guest_memory(ram(24 * MIB)).unwrap();
    // The same size again is no change, even with RAM attached.
    assert_eq!(h.resize_dma_window(&v, 20 * MIB).unwrap(), (base, size));
    // A larger one while RAM is attached is refused, and nothing moved.
    let e = h.resize_dma_window(&v, 40 * MIB).unwrap_err();
    assert!(matches!(e, HostError::DmaWindowInUse { .. }), "{e}");
    assert!(e.to_string().contains("guest RAM is attached"), "{e}");
    assert_eq!(h.dma_window(&v).unwrap(), (base, size));
    // Detached, it grows again.
    v.detach_guest_memory().unwrap();
    assert_eq!(h.resize_dma_window(&v, 40 * MIB).unwrap().1, 64 * MIB);
    v.attach_guest_memory(ram(40 * MIB)).unwrap();
    // Destroying every VM gives the whole space back.
    drop(v);
    drop(others);
    assert_eq!(h.stats().iova_free, IOVA_SPACE);
}

#[test]
fn a_window_with_a_bound_channel_does_not_move_until_the_channel_is_gone() {
    let h = host();
    let v = h.create_vgpu_for_ram(&profile(), 0).unwrap();
    guest_channel(&v, 0, None);
    let w = h.dma_window(&v).unwrap();
    let e = h.resize_dma_window(&v, 4 * MIB).unwrap_err();
    assert!(
        matches!(e, HostError::DmaWindowInUse { .. }) && e.to_string().contains("bound"),
        "{e}"
    );
    assert_eq!(h.dma_window(&v).unwrap(), w);
    // Unbound and off the GPU (the host saw it at the next service), its shadows released.
    wr(&v, pfifo::chan_table(0), 0);
    h.poll();
    assert_eq!(h.resize_dma_window(&v, 4 * MIB).unwrap().1, 4 * MIB);
}

#[test]
fn a_full_iova_space_is_a_clear_refusal_that_changes_nothing() {
    let h = host();
    // The upper half of the IOVA space (the only 2^39-aligned window above 1 MiB) and one
    // 2^38 window: what is left has no free 2^38-aligned range.
    let big = h.create_vgpu_for_ram(&profile(), MAX_DMA_WINDOW).unwrap();
    let quarter = h.create_vgpu_for_ram(&profile(), 1 << 38).unwrap();
    let v = h.create_vgpu_for_ram(&profile(), 0).unwrap();
    let windows = [
        h.dma_window(&big).unwrap(),
        h.dma_window(&quarter).unwrap(),
        h.dma_window(&v).unwrap(),
    ];
    let free = h.stats().iova_free;
    let e = h.resize_dma_window(&v, (1 << 37) + 1).unwrap_err();
    match &e {
        HostError::NoLargerDmaWindow {
            window,
            current,
            vms,
            ..
        } => assert_eq!((*window, *current, *vms), (1 << 38, MIB, 3)),
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("no DMA window left") && msg.contains("0x4000000000"),
        "{msg}"
    );
    assert_eq!(h.stats().iova_free, free, "the allocator is unchanged");
    for (vm, w) in [&big, &quarter, &v].into_iter().zip(windows) {
        assert_eq!(h.dma_window(vm).unwrap(), w);
    }
    // What does fit is still granted, and no window beyond the largest exists.
    assert_eq!(h.resize_dma_window(&v, 1 << 30).unwrap().1, 1 << 30);
    assert!(matches!(
        h.resize_dma_window(&v, MAX_DMA_WINDOW + 1),
        Err(HostError::Config(_))
    ));
    assert!(matches!(
        h.resize_dma_window(&v, u64::MAX),
        Err(HostError::Config(_))
    ));
}

#[test]
fn a_vgpu_of_another_host_or_a_destroyed_one_is_refused() {
    let (a, b) = (host(), host());
    let v = b.create_vgpu(&profile()).unwrap();
    assert!(matches!(a.dma_window(&v), Err(HostError::NoSuchVm(_))));
    assert!(matches!(
        a.resize_dma_window(&v, MIB),
        Err(HostError::NoSuchVm(_))
    ));
    b.destroy_vgpu(&v).unwrap();
    assert!(matches!(
        b.resize_dma_window(&v, MIB),
        Err(HostError::NoSuchVm(_))
    ));
}
