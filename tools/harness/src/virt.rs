//! "Virtual": the guest driver against [`Vgpu`]s — N VMs, each with its own guest RAM and its
//! own thread running the unchanged driver, all sharing one simulated GF100 through a
//! [`GpuHost`]. This is the in-process form of GPUvm's setup (every BAR access is an "exit" into
//! the device model, counted per VM), used by `gpuvm run`, the integration tests and the
//! experiments.
//!
//! [`VirtHal`] is the in-process HAL ([`crate::hal`]) on a [`Vgpu`]: BAR accesses go to
//! [`Vgpu::bar_read`] / [`Vgpu::bar_write`], DMA is the VM's guest RAM at GPA == bus address (the
//! device model relocates it into the VM's IOVA window), a delay lets the clock pass and polls the
//! host, and `wait_for_interrupt` sleeps on the VM's interrupt line, jumping a simulated clock
//! straight to the next event of the GPU or the scheduler (as [`crate::native::NativeHal`] does
//! for the bare GPU).

use std::sync::Arc;
use std::time::Instant;

use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, FenceMode, Gpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use gpuvm::clock::{Clock, ClockKind};
use gpuvm::host::{GpuHost, HostConfig, HostError, HostStats};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::{Vgpu, VgpuError, VgpuStats};
use gpuvm_sim::{SimConfig, SimGpu};

use crate::hal::{InProcessHal, MmioCounts};
use crate::native::WorkloadRun;

/// The driver's hardware abstraction on top of a virtual GPU.
pub type VirtHal = InProcessHal<Arc<Vgpu>>;

impl InProcessHal<Arc<Vgpu>> {
    /// Wraps `vgpu`, whose physical GPU runs on `clock`, with the VM's RAM `mem`, of which
    /// `[dma_base, dma_base + dma_size)` is handed to the driver for DMA. The caller attaches
    /// `mem` to the vGPU ([`Vgpu::attach_guest_memory`]). The VM's interrupt line is connected to
    /// a flag this HAL sleeps on.
    pub fn new(
        vgpu: Arc<Vgpu>,
        clock: Arc<dyn Clock>,
        mem: GuestMemoryMmap,
        dma_base: u64,
        dma_size: u64,
    ) -> VirtHal {
        InProcessHal::with_device(vgpu, clock, mem, dma_base, dma_size)
    }

    /// The vGPU.
    pub fn vgpu(&self) -> &Arc<Vgpu> {
        self.device()
    }
}

/// What to run on virtual GPUs.
#[derive(Debug, Clone)]
pub struct VirtOptions {
    /// Number of VMs.
    pub vms: usize,
    /// Problem size (see `gpuvm_guest::workloads`).
    pub size: u32,
    /// Simulated or real time.
    pub clock: ClockKind,
    /// Shadow page-table mode of every VM.
    pub shadow: ShadowMode,
    /// Workloads each VM runs, in order.
    pub workloads: Vec<Workload>,
    /// How the drivers wait for fences.
    pub fence_mode: FenceMode,
    /// VRAM slice per VM, MiB (0: an equal share of what the hypervisor leaves, at most 1 GiB).
    pub vram_mib: u64,
    /// Channels per VM (0: an equal share of 128, at most 16).
    pub channels: u32,
    /// VRAM of the simulated GPU, bytes.
    pub phys_vram: u64,
    /// Guest RAM per VM, bytes (0: derived from `size`).
    pub guest_ram: u64,
    /// Host settings.
    pub host: HostConfig,
    /// The rest of the driver configuration (`fence_mode` above wins).
    pub driver: DriverConfig,
    /// Record every VM's accesses into this trace session (`crate::trace`); `None`: no tracing.
    pub record: Option<Arc<gpuvm_trace::Session>>,
}

impl Default for VirtOptions {
    fn default() -> Self {
        VirtOptions {
            vms: 1,
            size: 64,
            clock: ClockKind::Sim,
            shadow: ShadowMode::Lazy,
            workloads: Workload::ALL.to_vec(),
            fence_mode: FenceMode::Poll,
            vram_mib: 0,
            channels: 0,
            phys_vram: 6 << 30,
            guest_ram: 0,
            host: HostConfig::default(),
            driver: DriverConfig::default(),
            record: None,
        }
    }
}

/// One VM's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VmReport {
    /// The VM's id.
    pub vm: u32,
    /// Driver bring-up.
    pub init: WorkloadRun,
    /// One entry per workload, in the shape `gpuvm native` reports.
    pub workloads: Vec<WorkloadRun>,
    /// The vGPU's counters at the end of the run.
    pub stats: VgpuStats,
}

impl VmReport {
    /// True if the driver came up and every workload verified.
    pub fn all_verified(&self) -> bool {
        self.init.verified && self.workloads.iter().all(|w| w.verified)
    }
}

/// The result of a virtual run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VirtReport {
    /// "sim" or "real".
    pub clock: ClockKind,
    /// Problem size.
    pub size: u32,
    /// Shadow mode.
    pub shadow: ShadowMode,
    /// One entry per VM.
    pub vms: Vec<VmReport>,
    /// Host counters after every VM was destroyed (free resources show that nothing leaked).
    pub host: HostStats,
}

impl VirtReport {
    /// True if every VM verified every workload.
    pub fn all_verified(&self) -> bool {
        self.vms.iter().all(VmReport::all_verified)
    }
}

/// Errors that stop a virtual run before the VMs start.
#[derive(Debug, thiserror::Error)]
pub enum VirtError {
    /// The host or a VM could not be created.
    #[error(transparent)]
    Host(#[from] HostError),
    /// Guest memory could not be attached.
    #[error(transparent)]
    Vgpu(#[from] VgpuError),
    /// Guest RAM could not be created.
    #[error("cannot allocate {0} bytes of guest RAM: {1}")]
    GuestRam(u64, String),
    /// Bad options.
    #[error("{0}")]
    Options(String),
}

/// Guest RAM large enough for the workloads at `size` (as the native harness sizes it).
fn guest_ram_for(size: u32) -> u64 {
    let matrix = (size as u64).pow(2) * 4;
    (matrix * 8 + (16 << 20)).next_multiple_of(2 << 20)
}

/// `cfg` with enough hypervisor VRAM for `vms` VMs' shadow reservations
/// ([`HostConfig::shadow_vram_per_vm`] each, plus 16 MiB for the host's own structures and the
/// shadow instance blocks): with the default 256 MiB and 8 MiB per VM, at most ~30 VMs fit, so
/// a run of more VMs takes more of the GPU's VRAM for the hypervisor (64 VMs: 528 MiB) rather
/// than shrinking any VM's reservation.
pub fn host_config_for(cfg: &HostConfig, vms: usize) -> HostConfig {
    let needed = (16 << 20) + (vms as u64).saturating_mul(cfg.shadow_vram_per_vm);
    HostConfig {
        hypervisor_vram: cfg.hypervisor_vram.max(needed.next_multiple_of(1 << 20)),
        ..cfg.clone()
    }
}

/// One profile per VM: VRAM and channels split equally unless given.
fn profiles(opts: &VirtOptions) -> Result<Vec<VgpuProfile>, VirtError> {
    if opts.vms == 0 || opts.vms > 128 {
        return Err(VirtError::Options(format!(
            "vms = {} must be 1..=128",
            opts.vms
        )));
    }
    let hyp = host_config_for(&opts.host, opts.vms).hypervisor_vram >> 20;
    let avail = (opts.phys_vram >> 20).saturating_sub(hyp);
    let vram_mib = if opts.vram_mib == 0 {
        (avail / opts.vms as u64).min(1024)
    } else {
        opts.vram_mib
    };
    let channels = if opts.channels == 0 {
        (128 / opts.vms as u32).min(16)
    } else {
        opts.channels
    };
    Ok((0..opts.vms)
        .map(|i| VgpuProfile {
            name: format!("vm{i}"),
            vram_mib,
            channels,
            weight: 1,
            shadow: opts.shadow,
        })
        .collect())
}

/// Runs the workloads in `opts.vms` VMs at once, each in its own thread, on one simulated GPU.
pub fn run_vms(opts: &VirtOptions) -> Result<VirtReport, VirtError> {
    let clock = opts.clock.create();
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: opts.phys_vram,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let phys: Arc<dyn PhysicalGpu> = sim.clone();
    let host = GpuHost::new(phys, host_config_for(&opts.host, opts.vms))?;
    host.set_clock(clock.clone());
    let ram = if opts.guest_ram == 0 {
        guest_ram_for(opts.size)
    } else {
        opts.guest_ram
    };
    let ram_len = usize::try_from(ram).map_err(|e| VirtError::GuestRam(ram, e.to_string()))?;
    let mut vms = Vec::new();
    for p in profiles(opts)? {
        let vgpu = host.create_vgpu_for_ram(&p, ram)?;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram_len)])
            .map_err(|e| VirtError::GuestRam(ram, e.to_string()))?;
        vgpu.attach_guest_memory(mem.clone())?;
        vms.push((vgpu, mem));
    }
    let cfg = DriverConfig {
        fence_mode: opts.fence_mode,
        ..opts.driver.clone()
    };
    let reports: Vec<VmReport> = std::thread::scope(|s| {
        let handles: Vec<_> = vms
            .iter()
            .enumerate()
            .map(|(index, (vgpu, mem))| {
                let (vgpu, mem, clock, sim, cfg) = (
                    vgpu.clone(),
                    mem.clone(),
                    clock.clone(),
                    sim.clone(),
                    cfg.clone(),
                );
                s.spawn(move || run_vm(index as u32, vgpu, mem, ram, clock, &sim, cfg, opts))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a VM thread panicked")))
            .collect()
    });
    for (vgpu, _) in &vms {
        host.destroy_vgpu(vgpu)?;
    }
    drop(vms);
    Ok(VirtReport {
        clock: opts.clock,
        size: opts.size,
        shadow: opts.shadow,
        vms: reports,
        host: host.stats(),
    })
}

/// One VM's thread: driver bring-up and the workloads.
#[allow(clippy::too_many_arguments)]
fn run_vm(
    index: u32,
    vgpu: Arc<Vgpu>,
    mem: GuestMemoryMmap,
    ram: u64,
    clock: Arc<dyn Clock>,
    sim: &SimGpu,
    cfg: DriverConfig,
    opts: &VirtOptions,
) -> VmReport {
    let hal = VirtHal::new(vgpu.clone(), clock.clone(), mem, 0, ram);
    match &opts.record {
        Some(s) => {
            let hal = crate::record::RecordingHal::new(hal, clock, s.clone(), index);
            drive(&vgpu, hal, sim, cfg, opts)
        }
        None => drive(&vgpu, hal, sim, cfg, opts),
    }
}

/// What the harness needs from a HAL besides the driver's traits.
pub trait HarnessHal: gpuvm_guest::Hal {
    /// BAR accesses so far.
    fn counts(&self) -> MmioCounts;
    /// Marks the start of a phase (recorded by tracing HALs).
    fn phase(&mut self, _name: &str) {}
}

impl HarnessHal for VirtHal {
    fn counts(&self) -> MmioCounts {
        InProcessHal::counts(self)
    }
}

impl HarnessHal for crate::record::RecordingHal<VirtHal> {
    fn counts(&self) -> MmioCounts {
        self.inner().counts()
    }
    fn phase(&mut self, name: &str) {
        self.mark(name)
    }
}

/// Driver bring-up and the workloads on `hal`.
fn drive<H: HarnessHal>(
    vgpu: &Arc<Vgpu>,
    mut hal: H,
    sim: &SimGpu,
    cfg: DriverConfig,
    opts: &VirtOptions,
) -> VmReport {
    let id = vgpu.id();
    let chans = vgpu.phys_channels();
    // One read of the partition's counters (one hold of the simulator's lock), as native's one
    // `stats()` read: a read per channel (128 at one VM) was harness work inside FV's measured
    // runs that native's did not have.
    let busy = || {
        sim.channels_busy_ns(chans.clone())
            .map_or(0, |v| v.iter().sum::<u64>())
    };
    hal.phase("init");
    let start = Meter::start(busy(), hal.counts());
    let mut drv = match Gpu::init(hal, cfg) {
        Ok(d) => d,
        Err(e) => {
            log::warn!("{id}: driver init failed: {e}");
            let init = start.failed("init", e.to_string(), &busy, MmioCounts::default());
            return VmReport {
                vm: id.0,
                init,
                workloads: Vec::new(),
                stats: vgpu.stats(),
            };
        }
    };
    let init = start.finish("init", 0, 0, true, None, &busy, drv.hal().counts());
    let mut runs = Vec::with_capacity(opts.workloads.len());
    for &w in &opts.workloads {
        drv.hal_mut().phase(w.name());
        let m = Meter::start(busy(), drv.hal().counts());
        let run = match workloads::run(&mut drv, w, opts.size) {
            Ok(r) => m.finish(
                w.name(),
                r.bytes,
                r.gpu_ns,
                r.verified,
                None,
                &busy,
                drv.hal().counts(),
            ),
            Err(e) => {
                log::warn!("{id}: workload {} failed: {e}", w.name());
                m.failed(w.name(), e.to_string(), &busy, drv.hal().counts())
            }
        };
        runs.push(run);
    }
    let _ = workloads::release_channel(&mut drv);
    VmReport {
        vm: id.0,
        init,
        workloads: runs,
        stats: vgpu.stats(),
    }
}

/// Measures one phase: wall time, the VM's GPU time and its BAR accesses.
struct Meter {
    wall: Instant,
    busy_ns: u64,
    counts: MmioCounts,
}

impl Meter {
    fn start(busy_ns: u64, counts: MmioCounts) -> Meter {
        Meter {
            wall: Instant::now(),
            busy_ns,
            counts,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        name: &str,
        bytes: u64,
        fence_gpu_ns: u64,
        verified: bool,
        error: Option<String>,
        busy: &dyn Fn() -> u64,
        counts: MmioCounts,
    ) -> WorkloadRun {
        // The clock first: the wall time is the phase's, not the GPU-time reads'.
        let wall_ns = self.wall.elapsed().as_nanos() as u64;
        WorkloadRun {
            name: name.to_string(),
            bytes,
            gpu_ns: busy().saturating_sub(self.busy_ns),
            fence_gpu_ns,
            wall_ns,
            mmio_reads: counts.reads.saturating_sub(self.counts.reads),
            mmio_writes: counts.writes.saturating_sub(self.counts.writes),
            verified,
            error,
        }
    }

    fn failed(
        &self,
        name: &str,
        error: String,
        busy: &dyn Fn() -> u64,
        counts: MmioCounts,
    ) -> WorkloadRun {
        self.finish(name, 0, 0, false, Some(error), busy, counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_share_vram_and_channels() {
        let p = profiles(&VirtOptions {
            vms: 8,
            ..VirtOptions::default()
        })
        .unwrap();
        assert_eq!(p.len(), 8);
        assert!(p.iter().all(|p| p.channels == 16 && p.vram_mib == 736));
        assert!(profiles(&VirtOptions {
            vms: 0,
            ..VirtOptions::default()
        })
        .is_err());
    }
}
