//! A host with virtual GPUs on a simulated GF100 (simulated clock), and VMs brought up by the
//! real guest driver through `VirtHal`: the rig of the isolation and watchdog tests.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use gpuvm_harness::VirtHal;
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Each VM's VRAM slice.
pub const SLICE: u64 = 64 << 20;
/// Each VM's guest RAM.
pub const RAM: u64 = 24 << 20;

/// A VM: its vGPU, its RAM and the guest driver on it.
pub struct Vm {
    pub vgpu: Arc<Vgpu>,
    pub ram: GuestMemoryMmap,
    pub drv: Gpu<VirtHal>,
}

/// One simulated GPU (512 MiB VRAM), its host, and the simulated clock both run on.
pub struct World {
    pub gpu: Arc<SimGpu>,
    pub host: GpuHost,
    pub clock: Arc<SimClock>,
}

/// A world whose host has a 32 MiB hypervisor region and `cfg`'s other settings, accounting on
/// the simulated clock.
pub fn world(cfg: HostConfig) -> World {
    let clock = Arc::new(SimClock::new());
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: 512 << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let host = GpuHost::new(
        gpu.clone(),
        HostConfig {
            hypervisor_vram: 32 << 20,
            ..cfg
        },
    )
    .unwrap();
    host.set_clock(clock.clone());
    World { gpu, host, clock }
}

impl World {
    /// A VM with a `SLICE` slice, 16 channels and `RAM` of guest RAM, its driver initialized
    /// with `timeout_ns` as its wait budget.
    pub fn vm_with(&self, name: &str, shadow: ShadowMode, timeout_ns: u64) -> Vm {
        let vgpu = self
            .host
            .create_vgpu(&VgpuProfile {
                name: name.into(),
                vram_mib: SLICE >> 20,
                channels: 16,
                weight: 1,
                shadow,
            })
            .unwrap();
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
        vgpu.attach_guest_memory(ram.clone()).unwrap();
        let clock: Arc<dyn Clock> = self.clock.clone();
        let hal = VirtHal::new(vgpu.clone(), clock, ram.clone(), 0, RAM);
        let drv = Gpu::init(
            hal,
            DriverConfig {
                timeout_ns,
                ..DriverConfig::default()
            },
        )
        .expect("driver init");
        Vm { vgpu, ram, drv }
    }

    /// Hash of a VM's whole VRAM slice and guest RAM.
    pub fn fingerprint(&self, vm: &Vm) -> u64 {
        let s = vm.vgpu.vram_slice();
        let mut v = vec![0u8; s.size as usize];
        self.gpu.read_vram(s.base, &mut v);
        let mut r = vec![0u8; RAM as usize];
        vm.ram.read_slice(&mut r, GuestAddress(0)).unwrap();
        let mut h = DefaultHasher::new();
        v.hash(&mut h);
        r.hash(&mut h);
        h.finish()
    }

    /// Lets 10 ms of simulated time pass in 100 polled steps.
    pub fn settle(&self) {
        for _ in 0..100 {
            self.clock.advance(100_000);
            self.host.poll();
        }
    }
}

/// Runs every workload at size 32 and asserts each verifies.
pub fn run_suite(vm: &mut Vm) {
    for w in Workload::ALL {
        let r = workloads::run(&mut vm.drv, w, 32).unwrap_or_else(|e| panic!("{w}: {e}"));
        assert!(r.verified, "{w}");
    }
}

/// Iterations of the loop kernel that take about `ns` of modeled PGRAPH time (from the cost
/// model the rig's GPU uses, so the tests follow it whatever it says).
pub fn loop_iterations_for(ns: u64) -> u64 {
    let cost = gpuvm_sim::CostModel::quadro_6000();
    let per = cost.loop_kernel(1 << 20).max(1);
    (u128::from(ns) * (1u128 << 20) / u128::from(per)) as u64
}

/// Lets `ns` of simulated time pass, polling the host every 100 us.
pub fn pass(w: &World, ns: u64) {
    for _ in 0..ns / 100_000 {
        w.clock.advance(100_000);
        w.host.poll();
    }
}
