//! `gpuvm exp traps`: how trapped-access throughput grows with the number of VMs — the
//! engines-and-locks issue's measure of the host's locking.
//!
//! Per point (a VM count): a fresh host on the simulated GF100 with the real clock (engines on
//! the simulator's worker), that many VMs, each brought up by the guest driver with two
//! channels. Then `threads_per_vm` threads per VM hammer their VM's trapped registers for
//! `duration_ms`: reads of PMC BOOT_0, PMC INTR, PTIMER TIME_LOW, PFIFO INTR and PMC ENABLE in
//! turn, and every [`DOORBELL_EVERY`]th access a doorbell — the idle channel's GP_PUT written
//! again with its value (no new work, but a trapped write the host handles: an exit with an
//! effect). Two phases per point:
//!
//! - `idle`: nothing else runs;
//! - `gpu`: each VM's driver also runs `madd` (size 64) back to back on its other channel, so
//!   the GPU is busy and completions, interrupts and dispatch go on under the accesses.
//!
//! Reported per point and phase: accesses, accesses per second (all VMs), latency p50 / p99 /
//! max of one access (p50/p99 from every 8th access, max from all), the share the host did on
//! the fast path (`HostStats::fast_path_accesses`), the GPU work done; the speedup over the
//! phase's 1-VM point and the linear ideal. Wall-clock numbers of the machine it ran on: run
//! it on a many-core machine for the scaling figure (docs/benchmarks.md says which gave which).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gf100::{pfifo, pmc, ptimer};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use gpuvm::clock::{Clock, RealClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::Bar;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_sim::{SimConfig, SimGpu};

use crate::VirtHal;

/// One access in this many is a doorbell; the others are register reads.
pub const DOORBELL_EVERY: u64 = 8;

/// The registers the hammering threads read, in turn.
const READS: [u32; 5] = [
    pmc::BOOT_0,
    pmc::INTR_HOST,
    ptimer::TIME_LOW,
    pfifo::INTR,
    pmc::ENABLE,
];

/// Guest RAM per VM.
const RAM: u64 = 8 << 20;

/// Options of the experiment.
#[derive(Debug, Clone)]
pub struct TrapsOptions {
    /// VM counts, one point each.
    pub vms: Vec<usize>,
    /// Hammering threads per VM.
    pub threads_per_vm: usize,
    /// How long each phase of a point hammers, ms.
    pub duration_ms: u64,
    /// The host's fast path for VM-local register reads (`HostConfig::local_fast_path`).
    pub fast_path: bool,
}

impl Default for TrapsOptions {
    fn default() -> Self {
        TrapsOptions {
            vms: vec![1, 2, 4, 8, 16],
            threads_per_vm: 1,
            duration_ms: 300,
            fast_path: true,
        }
    }
}

/// One point of one phase.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrapsPoint {
    /// `idle` or `gpu`.
    pub phase: String,
    /// VMs.
    pub vms: usize,
    /// Hammering threads in all.
    pub threads: usize,
    /// Trapped accesses done.
    pub accesses: u64,
    /// Of those, doorbells.
    pub doorbells: u64,
    /// Accesses per second, all VMs together.
    pub accesses_per_s: f64,
    /// `accesses_per_s` over the phase's 1-VM point (or its first point).
    pub speedup: f64,
    /// The linear ideal: the first point's throughput times its VM-count ratio.
    pub ideal_per_s: f64,
    /// Median latency of one access (every 8th access timed), ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Longest access, ns.
    pub max_ns: u64,
    /// Share of the accesses the host did on its fast path (only their VM's lock).
    pub fast_path_share: f64,
    /// GPU workloads the drivers completed meanwhile (`gpu` phase), all verified or counted
    /// in `gpu_failures`.
    pub gpu_runs: u64,
    /// GPU workloads that failed or did not verify.
    pub gpu_failures: u64,
    /// Wall time of the phase, ms.
    pub wall_ms: f64,
}

/// The report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrapsReport {
    /// Hammering threads per VM.
    pub threads_per_vm: usize,
    /// Phase duration, ms.
    pub duration_ms: u64,
    /// One access in this many is a doorbell.
    pub doorbell_every: u64,
    /// Whether the host's fast path was on.
    pub fast_path: bool,
    /// CPUs available to the process.
    pub cpus: usize,
    /// Every point of both phases.
    pub points: Vec<TrapsPoint>,
}

/// Why the experiment could not run.
#[derive(Debug, thiserror::Error)]
pub enum TrapsError {
    /// Bad options.
    #[error("{0}")]
    Options(String),
    /// Setting a VM up failed.
    #[error("setting up VM {vm} of {vms}: {what}")]
    Setup {
        /// Which VM.
        vm: usize,
        /// Of how many.
        vms: usize,
        /// What failed.
        what: String,
    },
}

/// A VM of a point: its vGPU, the driver (moved into the `gpu` phase's thread and back; its
/// workloads create their channel, the VM's second) and the idle channel's doorbell.
struct Vm {
    vgpu: Arc<Vgpu>,
    drv: Option<Gpu<VirtHal>>,
    _idle: gpuvm_guest::Channel,
    doorbell: (u64, u32),
}

/// Runs every point, both phases.
pub fn run_traps(opts: &TrapsOptions) -> Result<TrapsReport, TrapsError> {
    if opts.vms.is_empty() || opts.vms.iter().any(|&n| n == 0 || n > 128) {
        return Err(TrapsError::Options(
            "--vms must list VM counts in 1..=128".into(),
        ));
    }
    if opts.threads_per_vm == 0 || opts.threads_per_vm > 16 {
        return Err(TrapsError::Options(
            "--threads-per-vm must be 1..=16".into(),
        ));
    }
    let mut points = Vec::new();
    for &n in &opts.vms {
        let (host, mut vms) = setup(n, opts.fast_path)?;
        for phase in ["idle", "gpu"] {
            points.push(hammer(&host, &mut vms, phase, opts));
        }
    }
    for phase in ["idle", "gpu"] {
        let first = points
            .iter()
            .find(|p| p.phase == phase)
            .map(|p| (p.vms, p.accesses_per_s));
        if let Some((v0, t0)) = first {
            for p in points.iter_mut().filter(|p| p.phase == phase) {
                p.speedup = p.accesses_per_s / t0.max(f64::MIN_POSITIVE);
                p.ideal_per_s = t0 * p.vms as f64 / v0 as f64;
            }
        }
    }
    Ok(TrapsReport {
        threads_per_vm: opts.threads_per_vm,
        duration_ms: opts.duration_ms,
        doorbell_every: DOORBELL_EVERY,
        fast_path: opts.fast_path,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        points,
    })
}

fn setup(n: usize, fast_path: bool) -> Result<(Arc<GpuHost>, Vec<Vm>), TrapsError> {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let sim = Arc::new(SimGpu::new(SimConfig {
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let err = |vm: usize, what: String| TrapsError::Setup { vm, vms: n, what };
    let cfg = HostConfig {
        local_fast_path: fast_path,
        ..crate::virt::host_config_for(&HostConfig::default(), n)
    };
    let host = GpuHost::new(sim, cfg).map_err(|e| err(0, e.to_string()))?;
    host.set_clock(clock.clone());
    let host = Arc::new(host);
    let mut vms = Vec::with_capacity(n);
    for i in 0..n {
        let vgpu = host
            .create_vgpu_for_ram(
                &VgpuProfile {
                    name: format!("vm{i}"),
                    vram_mib: 64,
                    channels: 2,
                    weight: 1,
                    shadow: ShadowMode::Lazy,
                },
                RAM,
            )
            .map_err(|e| err(i, e.to_string()))?;
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)])
            .map_err(|e| err(i, e.to_string()))?;
        vgpu.attach_guest_memory(ram.clone())
            .map_err(|e| err(i, e.to_string()))?;
        let hal = VirtHal::new(vgpu.clone(), clock.clone(), ram, 0, RAM);
        let mut drv = Gpu::init(hal, DriverConfig::default()).map_err(|e| err(i, e.to_string()))?;
        let idle = drv.channel_new().map_err(|e| err(i, e.to_string()))?;
        // The GPU phase's driver runs on a channel it keeps between runs: created here, by a
        // first run, so that creating it (tens of thousands of instance-memory writes, every
        // one an exit under the host lock) is not part of the phase. It was: from 4 VMs on,
        // the drivers spent the 300 ms creating their channels at once and finished one run.
        workloads::run(&mut drv, Workload::Madd, 64).map_err(|e| err(i, e.to_string()))?;
        let doorbell = drv.doorbell(&idle).map_err(|e| err(i, e.to_string()))?;
        vms.push(Vm {
            vgpu,
            drv: Some(drv),
            _idle: idle,
            doorbell,
        });
    }
    Ok((host, vms))
}

/// What one hammering thread measured.
struct Sample {
    accesses: u64,
    doorbells: u64,
    max_ns: u64,
    timed: Vec<u32>,
    /// When it started and stopped hammering (the phase's wall time is the span of all of
    /// them: with more threads than CPUs the main thread's own clock would start late).
    start: Instant,
    end: Instant,
}

fn hammer_thread(vgpu: &Vgpu, doorbell: (u64, u32), stop: &AtomicBool, seed: u64) -> Sample {
    let mut s = Sample {
        accesses: 0,
        doorbells: 0,
        max_ns: 0,
        timed: Vec::with_capacity(1 << 16),
        start: Instant::now(),
        end: Instant::now(),
    };
    let mut i = seed;
    let mut buf = [0u8; 4];
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let t = Instant::now();
            if i % DOORBELL_EVERY == DOORBELL_EVERY - 1 {
                vgpu.bar_write(Bar::Bar1, doorbell.0, &doorbell.1.to_le_bytes());
                s.doorbells += 1;
            } else {
                let reg = READS[(i % READS.len() as u64) as usize];
                vgpu.bar_read(Bar::Bar0, u64::from(reg), &mut buf);
            }
            let ns = t.elapsed().as_nanos() as u64;
            s.max_ns = s.max_ns.max(ns);
            if i.is_multiple_of(8) && s.timed.len() < (1 << 20) {
                s.timed.push(ns.min(u64::from(u32::MAX)) as u32);
            }
            i += 1;
            s.accesses += 1;
        }
    }
    s.end = Instant::now();
    s
}

fn hammer(host: &Arc<GpuHost>, vms: &mut [Vm], phase: &str, opts: &TrapsOptions) -> TrapsPoint {
    let n = vms.len();
    let threads = n * opts.threads_per_vm;
    let stop = Arc::new(AtomicBool::new(false));
    let gpu_runs = Arc::new(AtomicU64::new(0));
    let gpu_failures = Arc::new(AtomicU64::new(0));
    // Drivers running GPU work (gpu phase): they start before the hammering and end after it.
    let drivers: Vec<_> = if phase == "gpu" {
        vms.iter_mut()
            .filter_map(|vm| vm.drv.take())
            .map(|mut drv| {
                let (stop, runs, fails) = (stop.clone(), gpu_runs.clone(), gpu_failures.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match workloads::run(&mut drv, Workload::Madd, 64) {
                            Ok(r) if r.verified => runs.fetch_add(1, Ordering::Relaxed),
                            _ => fails.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                    drv
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let fast_before = host.stats().fast_path_accesses;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let mut handles = Vec::with_capacity(threads);
    for (v, vm) in vms.iter().enumerate() {
        for t in 0..opts.threads_per_vm {
            let (vgpu, doorbell) = (vm.vgpu.clone(), vm.doorbell);
            let (stop, barrier) = (stop.clone(), barrier.clone());
            let seed = (v * 7 + t * 3) as u64;
            handles.push(std::thread::spawn(move || {
                barrier.wait();
                hammer_thread(&vgpu, doorbell, &stop, seed)
            }));
        }
    }
    barrier.wait();
    std::thread::sleep(Duration::from_millis(opts.duration_ms));
    stop.store(true, Ordering::Relaxed);
    let samples: Vec<Sample> = handles.into_iter().filter_map(|h| h.join().ok()).collect();
    let wall = match (
        samples.iter().map(|s| s.start).min(),
        samples.iter().map(|s| s.end).max(),
    ) {
        (Some(a), Some(b)) => b.duration_since(a),
        _ => Duration::from_millis(opts.duration_ms),
    };
    for (vm, d) in vms.iter_mut().filter(|vm| vm.drv.is_none()).zip(drivers) {
        vm.drv = d.join().ok();
    }
    let fast = host.stats().fast_path_accesses - fast_before;
    let accesses: u64 = samples.iter().map(|s| s.accesses).sum();
    let mut timed: Vec<u32> = samples
        .iter()
        .flat_map(|s| s.timed.iter().copied())
        .collect();
    timed.sort_unstable();
    let q = |f: f64| -> u64 {
        if timed.is_empty() {
            0
        } else {
            u64::from(timed[((timed.len() - 1) as f64 * f).round() as usize])
        }
    };
    TrapsPoint {
        phase: phase.into(),
        vms: n,
        threads,
        accesses,
        doorbells: samples.iter().map(|s| s.doorbells).sum(),
        accesses_per_s: accesses as f64 / wall.as_secs_f64(),
        speedup: 0.0,
        ideal_per_s: 0.0,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        max_ns: samples.iter().map(|s| s.max_ns).max().unwrap_or(0),
        // The drivers' own accesses (gpu phase) may take the fast path too: capped at 1.
        fast_path_share: (fast as f64 / accesses.max(1) as f64).min(1.0),
        gpu_runs: gpu_runs.load(Ordering::Relaxed),
        gpu_failures: gpu_failures.load(Ordering::Relaxed),
        wall_ms: wall.as_secs_f64() * 1e3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_vms_hammer_both_phases_and_the_gpu_work_verifies() {
        let r = run_traps(&TrapsOptions {
            vms: vec![1, 2],
            threads_per_vm: 1,
            duration_ms: 60,
            fast_path: true,
        })
        .expect("runs");
        assert_eq!(r.points.len(), 4);
        for p in &r.points {
            assert!(p.accesses > 0, "{p:?}");
            assert!(p.doorbells > 0 && p.doorbells <= p.accesses / DOORBELL_EVERY + 1);
            assert!(p.p50_ns <= p.p99_ns && p.p99_ns <= p.max_ns, "{p:?}");
            assert_eq!(p.gpu_failures, 0, "{p:?}");
        }
        let idle1 = &r.points[0];
        assert_eq!((idle1.phase.as_str(), idle1.vms), ("idle", 1));
        assert!((idle1.speedup - 1.0).abs() < 1e-9);
        // The register reads of an idle host take the fast path.
        assert!(idle1.fast_path_share > 0.5, "{idle1:?}");
        assert!(r.points.iter().any(|p| p.phase == "gpu" && p.gpu_runs > 0));
        let off = run_traps(&TrapsOptions {
            vms: vec![1],
            duration_ms: 20,
            fast_path: false,
            ..TrapsOptions::default()
        })
        .expect("runs");
        assert!(off
            .points
            .iter()
            .all(|p| p.fast_path_share == 0.0 && p.accesses > 0));
        assert!(run_traps(&TrapsOptions {
            vms: vec![0],
            ..TrapsOptions::default()
        })
        .is_err());
    }
}
