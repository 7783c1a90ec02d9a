//! The ten-minute path for a VMM author: embed gpuvm's device model over the simulated GF100.
//!
//! 1. Build a physical GPU (here `gpuvm-sim`; a real card would be `gpuvm-vfio`) and a
//!    [`GpuHost`] over it: the host brings the GPU up and owns it.
//! 2. Create one vGPU from a TOML profile (what an operator writes).
//! 3. Attach the guest's RAM (a `vm-memory` mmap, what a rust-vmm VMM already has).
//! 4. Size the BARs through PCI configuration space, as a guest's firmware would.
//! 5. Read BOOT_0 through BAR0: the guest sees a Quadro 6000.
//!
//! Run it with `cargo run --example embed`. A VMM forwards its exits the same way: a config
//! access to [`Vgpu::config_read`] / [`Vgpu::config_write`], a BAR access to
//! [`Vgpu::bar_read`] / [`Vgpu::bar_write`], and connects an [`gpuvm::irq::IrqLine`] for the
//! interrupt (`docs/design.md`, "Embedding").

use std::sync::Arc;

use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::VgpuProfile;
use gpuvm::vgpu::Vgpu;
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const PROFILE: &str = r#"
name = "tenant-a"
vram_mib = 256
channels = 8
weight = 1
shadow = "lazy"
"#;

/// Sizes BAR `index` the way firmware does: write all-ones, read back the size mask, restore.
fn bar_size(v: &Vgpu, index: u16) -> u64 {
    let off = 0x10 + 4 * index;
    let read = |o: u16| {
        let mut b = [0u8; 4];
        v.config_read(o, &mut b);
        u32::from_le_bytes(b)
    };
    let lo0 = read(off);
    let is64 = lo0 & 0x6 == 0x4;
    v.config_write(off, &u32::MAX.to_le_bytes());
    let mut mask = u64::from(read(off) & !0xf);
    if is64 {
        let hi0 = read(off + 4);
        v.config_write(off + 4, &u32::MAX.to_le_bytes());
        mask |= u64::from(read(off + 4)) << 32;
        v.config_write(off + 4, &hi0.to_le_bytes());
    } else {
        mask |= 0xffff_ffff_0000_0000;
    }
    v.config_write(off, &lo0.to_le_bytes());
    (!mask).wrapping_add(1)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The physical GPU and the host that owns it.
    let phys: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        ..SimConfig::default()
    }));
    let host = GpuHost::new(phys, HostConfig::default())?;

    // 2. One vGPU from a TOML profile.
    let profile = VgpuProfile::from_toml(PROFILE)?;
    let vgpu = host.create_vgpu(&profile)?;

    // 3. The guest's RAM (64 MiB at guest physical address 0).
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)])?;
    vgpu.attach_guest_memory(ram)?;

    // 4. PCI identity and BAR sizes through configuration space.
    let mut id = [0u8; 4];
    vgpu.config_read(0, &mut id);
    println!(
        "PCI {:04x}:{:04x}",
        u16::from_le_bytes([id[0], id[1]]),
        u16::from_le_bytes([id[2], id[3]])
    );
    for (bar, index) in [(Bar::Bar0, 0), (Bar::Bar1, 1), (Bar::Bar3, 3)] {
        println!("{bar:?}: {} MiB", bar_size(&vgpu, index) >> 20);
    }

    // Memory decoding on, as the guest's firmware leaves it after assigning the BARs.
    let mut cmd = [0u8; 2];
    vgpu.config_read(0x04, &mut cmd);
    let cmd = u16::from_le_bytes(cmd) | 0x6;
    vgpu.config_write(0x04, &cmd.to_le_bytes());

    // 5. BOOT_0 through BAR0.
    let mut boot0 = [0u8; 4];
    vgpu.bar_read(Bar::Bar0, u64::from(gf100::pmc::BOOT_0), &mut boot0);
    let boot0 = u32::from_le_bytes(boot0);
    println!(
        "BOOT_0 = {boot0:#010x} (a Quadro 6000 reads {:#010x})",
        gf100::pmc::BOOT_0_QUADRO_6000
    );
    assert_eq!(boot0, gf100::pmc::BOOT_0_QUADRO_6000);

    println!("{} BAR accesses trapped", vgpu.stats().exits.total());
    host.destroy_vgpu(&vgpu)?;
    Ok(())
}

/// `cargo test` runs the example too (`test = true` in Cargo.toml), so it cannot rot.
#[test]
fn the_embedding_walkthrough_runs() {
    main().unwrap();
}
