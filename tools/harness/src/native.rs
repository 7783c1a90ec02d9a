//! "Native": the guest driver straight on the simulated GF100, no virtualization in between.
//!
//! [`NativeHal`] is the in-process HAL ([`crate::hal`]) on the bare [`PhysicalGpu`]: the driver's
//! `Mmio`/`Dma`/`Platform` traits with a guest RAM (`vm-memory`) mapped for DMA at IOVA == GPA,
//! every BAR access counted.
//! [`run_native`] brings the driver up and runs the workload suite, measuring each workload.

use std::sync::Arc;
use std::time::Instant;

use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, FenceMode, Gpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use gpuvm::addr::{Gpa, Iova};
use gpuvm::clock::{Clock, ClockKind};
use gpuvm::phys::PhysicalGpu;
use gpuvm_sim::{SimConfig, SimGpu};

use crate::hal::{BareGpu, InProcessHal};

pub use crate::hal::MmioCounts;

/// The driver's hardware abstraction on top of a physical (here: simulated) GPU.
pub type NativeHal = InProcessHal<BareGpu>;

impl InProcessHal<BareGpu> {
    /// Wraps `gpu`, whose clock is `clock`, with guest RAM `mem` of which `[dma_base, dma_base +
    /// dma_size)` is handed to the driver for DMA. The caller maps that range for the GPU.
    pub fn new(
        gpu: Arc<dyn PhysicalGpu>,
        clock: Arc<dyn Clock>,
        mem: GuestMemoryMmap,
        dma_base: u64,
        dma_size: u64,
    ) -> NativeHal {
        InProcessHal::with_device(BareGpu(gpu), clock, mem, dma_base, dma_size)
    }

    /// The GPU underneath.
    pub fn gpu(&self) -> &Arc<dyn PhysicalGpu> {
        &self.device().0
    }
}

/// What to run natively.
#[derive(Debug, Clone)]
pub struct NativeOptions {
    /// Problem size (matrix dimension; see `gpuvm_guest::workloads`).
    pub size: u32,
    /// Simulated or real time.
    pub clock: ClockKind,
    /// VRAM of the simulated GPU, bytes.
    pub vram_size: u64,
    /// Guest RAM, bytes (0 = derive from `size`).
    pub guest_ram: u64,
    /// Workloads to run, in order.
    pub workloads: Vec<Workload>,
    /// How the driver waits for fences.
    pub fence_mode: FenceMode,
}

impl Default for NativeOptions {
    fn default() -> Self {
        NativeOptions {
            size: 256,
            clock: ClockKind::Sim,
            vram_size: 6 << 30,
            guest_ram: 0,
            workloads: Workload::ALL.to_vec(),
            fence_mode: FenceMode::Poll,
        }
    }
}

/// One workload's measurements.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkloadRun {
    /// Workload name (`madd`, `mmul`, ...).
    pub name: String,
    /// Bytes of data the workload moved or computed on.
    pub bytes: u64,
    /// Modeled time the GPU was busy executing this workload, ns (GPU busy-time counter).
    pub gpu_ns: u64,
    /// GPU time between the driver's first and last fence timestamps, ns.
    pub fence_gpu_ns: u64,
    /// Host wall-clock time of the whole workload (setup, submission, wait, verification), ns.
    pub wall_ns: u64,
    /// BAR reads the driver issued.
    pub mmio_reads: u64,
    /// BAR writes the driver issued.
    pub mmio_writes: u64,
    /// The result matched the CPU reference.
    pub verified: bool,
    /// Why the workload failed, if it did.
    pub error: Option<String>,
}

/// The result of a native run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NativeReport {
    /// "sim" or "real".
    pub clock: ClockKind,
    /// Problem size.
    pub size: u32,
    /// Driver bring-up cost.
    pub init: WorkloadRun,
    /// One entry per workload.
    pub workloads: Vec<WorkloadRun>,
    /// GPU counters at the end.
    pub gpu: gpuvm::phys::GpuStats,
}

impl NativeReport {
    /// True if every workload verified.
    pub fn all_verified(&self) -> bool {
        self.workloads.iter().all(|w| w.verified)
    }
}

/// Errors that stop a native run before any workload runs.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// Guest RAM could not be created.
    #[error("cannot allocate {0} bytes of guest RAM: {1}")]
    GuestRam(u64, String),
    /// The DMA window could not be registered.
    #[error("cannot map guest RAM for DMA: {0}")]
    Dma(#[from] gpuvm::phys::DmaError),
    /// The driver failed to bring the GPU up.
    #[error("driver init failed: {0}")]
    Init(String),
}

/// Guest RAM large enough for the workloads at `size` (inputs, outputs and staging, with room).
fn guest_ram_for(size: u32) -> u64 {
    let matrix = (size as u64).pow(2) * 4;
    (matrix * 8 + (16 << 20)).next_multiple_of(2 << 20)
}

/// Runs the workload suite with the guest driver straight on a fresh simulated GF100.
pub fn run_native(opts: &NativeOptions) -> Result<NativeReport, NativeError> {
    let clock = opts.clock.create();
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: opts.vram_size,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let ram = if opts.guest_ram == 0 {
        guest_ram_for(opts.size)
    } else {
        opts.guest_ram
    };
    let ram_len = usize::try_from(ram).map_err(|e| NativeError::GuestRam(ram, e.to_string()))?;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram_len)])
        .map_err(|e| NativeError::GuestRam(ram, e.to_string()))?;
    gpu.map_dma(Iova(0), ram, mem.clone(), Gpa(0))?;

    let hal = NativeHal::new(gpu.clone(), clock.clone(), mem, 0, ram);
    let cfg = DriverConfig {
        fence_mode: opts.fence_mode,
        ..DriverConfig::default()
    };
    let mut meter = Meter::start(&gpu, hal.counts());
    let mut drv = Gpu::init(hal, cfg).map_err(|e| NativeError::Init(e.to_string()))?;
    let init = meter.finish("init", 0, 0, true, None, &gpu, drv.hal().counts());

    let mut runs = Vec::with_capacity(opts.workloads.len());
    for &w in &opts.workloads {
        meter = Meter::start(&gpu, drv.hal().counts());
        let run = match workloads::run(&mut drv, w, opts.size) {
            Ok(r) => meter.finish(
                w.name(),
                r.bytes,
                r.gpu_ns,
                r.verified,
                None,
                &gpu,
                drv.hal().counts(),
            ),
            Err(e) => {
                log::warn!("workload {} failed: {e}", w.name());
                meter.finish(
                    w.name(),
                    0,
                    0,
                    false,
                    Some(e.to_string()),
                    &gpu,
                    drv.hal().counts(),
                )
            }
        };
        runs.push(run);
    }
    Ok(NativeReport {
        clock: opts.clock,
        size: opts.size,
        init,
        workloads: runs,
        gpu: gpu.stats(),
    })
}

/// Measures one phase: wall time, GPU busy time and BAR accesses between start and finish.
struct Meter {
    wall: Instant,
    busy_ns: u64,
    counts: MmioCounts,
}

impl Meter {
    fn start(gpu: &Arc<dyn PhysicalGpu>, counts: MmioCounts) -> Meter {
        // The clock is read last here and first in `finish`: the wall time is the phase's
        // alone, not the statistics' reads.
        let busy_ns = gpu.stats().busy_ns;
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
        gpu: &Arc<dyn PhysicalGpu>,
        counts: MmioCounts,
    ) -> WorkloadRun {
        let wall_ns = self.wall.elapsed().as_nanos() as u64;
        WorkloadRun {
            name: name.to_string(),
            bytes,
            gpu_ns: gpu.stats().busy_ns - self.busy_ns,
            fence_gpu_ns,
            wall_ns,
            mmio_reads: counts.reads - self.counts.reads,
            mmio_writes: counts.writes - self.counts.writes,
            verified,
            error,
        }
    }
}
