//! A staged form of [`crate::virt::run_vms`] for the overhead, scale and demo experiments:
//! the same guest driver on [`VirtHal`]s sharing one simulated GF100, but with a chosen
//! scheduling policy and weights, the vGPU's counters snapshotted after every phase (so that
//! shadow work can be attributed to one workload), an optional barrier so that every VM starts
//! its measured phases together, and a progress callback per finished phase.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use gpuvm::clock::Clock;
use gpuvm::host::{GpuHost, HostStats, LockHolds};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::VgpuProfile;
use gpuvm::sched::{Policy, SchedParams};
use gpuvm::shadow_pt::ShadowStats;
use gpuvm::vgpu::{Vgpu, VgpuStats};
use gpuvm_sim::{SimConfig, SimGpu};

use crate::cpu::SpanCpu;
use crate::native::{MmioCounts, WorkloadRun};
use crate::virt::{VirtError, VirtHal, VirtOptions};

/// What to run: the VMs of [`VirtOptions`] plus scheduling and staging.
#[derive(Debug, Clone)]
pub struct StagedOptions {
    /// VMs, size, clock, shadow mode, workloads (in order), fence mode, ...
    pub virt: VirtOptions,
    /// Scheduling policy (`None`: the host's default, FIFO).
    pub policy: Option<Policy>,
    /// Scheduler parameters.
    pub params: SchedParams,
    /// Weight per VM (missing: 1).
    pub weights: Vec<u32>,
    /// Every VM waits for all the others after this many workloads (the first ones are then a
    /// warm-up: channel creation and first-touch work), before the measured ones.
    pub barrier_after: Option<usize>,
}

/// Shadow page-table work done in one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShadowWork {
    /// Full rebuilds of a shadow address space.
    pub rebuilds: u64,
    /// Shadow PTEs written by whole-table walks.
    pub ptes_shadowed: u64,
    /// Single shadow entries updated (incremental writes, PV ops).
    pub entry_updates: u64,
    /// PV batches applied.
    pub pv_batches: u64,
}

impl ShadowWork {
    /// The work between two snapshots of a VM's counters.
    pub fn between(a: &ShadowStats, b: &ShadowStats) -> ShadowWork {
        ShadowWork {
            rebuilds: b.rebuilds.saturating_sub(a.rebuilds),
            ptes_shadowed: b.ptes_shadowed.saturating_sub(a.ptes_shadowed),
            entry_updates: b.entry_updates.saturating_sub(a.entry_updates),
            pv_batches: b.pv_batches.saturating_sub(a.pv_batches),
        }
    }

    /// Sum of two.
    pub fn plus(self, o: ShadowWork) -> ShadowWork {
        ShadowWork {
            rebuilds: self.rebuilds + o.rebuilds,
            ptes_shadowed: self.ptes_shadowed + o.ptes_shadowed,
            entry_updates: self.entry_updates + o.entry_updates,
            pv_batches: self.pv_batches + o.pv_batches,
        }
    }
}

/// One phase (bring-up or a workload) of one VM.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    /// Wall time, GPU time, BAR accesses (= exits into the device model), verdict.
    #[serde(flatten)]
    pub run: WorkloadRun,
    /// Shadow page-table work during the phase.
    pub shadow: ShadowWork,
    /// The GPU's clock (modeled time with the simulated clock) when the phase ended, ns.
    pub end_clock_ns: u64,
    /// Host time the driver spent waiting in the phase (for its fences above all), ns.
    pub waited_ns: u64,
}

impl Phase {
    /// BAR accesses of the phase: each one an exit into the device model.
    pub fn exits(&self) -> u64 {
        self.run.mmio_reads + self.run.mmio_writes
    }
}

/// One VM's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StagedVm {
    /// The VM's id.
    pub vm: u32,
    /// Its weight.
    pub weight: u32,
    /// Driver bring-up.
    pub init: Phase,
    /// One entry per workload of [`VirtOptions::workloads`].
    pub workloads: Vec<Phase>,
    /// The vGPU's counters at the end.
    pub stats: VgpuStats,
}

impl StagedVm {
    /// True if the driver came up and every workload verified.
    pub fn all_verified(&self) -> bool {
        self.init.run.verified && self.workloads.iter().all(|w| w.run.verified)
    }
}

/// The result of a staged run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StagedReport {
    /// The policy's name.
    pub scheduler: String,
    /// One entry per VM.
    pub vms: Vec<StagedVm>,
    /// Wall time of the whole run (VM creation to the last VM's end), ns.
    pub wall_ns: u64,
    /// The GPU clock at the barrier (or the start) and at the end, ns.
    pub clock_span_ns: (u64, u64),
    /// Wall time from the barrier (or the start) to the last VM's end, ns.
    pub measured_wall_ns: u64,
    /// Host-lock write holds from the barrier (or the start) to the last VM's end.
    pub measured_holds: LockHolds,
    /// CPU time from the barrier (or the start) to the last VM's end.
    pub measured_cpu: SpanCpu,
    /// Calls into the simulated GPU that waited for its lock, and how long in all (ns), from
    /// the barrier (or the start) to the last VM's end (`SimGpu::lock_waits`).
    pub measured_sim_lock_waits: (u64, u64),
    /// Where the simulated GPU's engine worker's wall time went from the barrier (or the start)
    /// to the last VM's end (`SimGpu::worker_times`).
    pub measured_worker: gpuvm_sim::WorkerTimes,
    /// Host counters after every VM was destroyed.
    pub host: HostStats,
    /// Host memory right after every VM finished (threads joined, VMs not yet destroyed).
    pub mem_loaded: crate::mem::MemSample,
}

impl StagedReport {
    /// True if every VM verified every workload.
    pub fn all_verified(&self) -> bool {
        self.vms.iter().all(StagedVm::all_verified)
    }
}

/// A finished phase, for progress reports: VM index, phase index (0 = bring-up, 1 + i =
/// workload i), the phase.
pub type OnPhase<'a> = dyn Fn(usize, usize, &Phase) + Sync + 'a;

/// Runs the VMs, each in its own thread.
pub fn run_staged(opts: &StagedOptions, on_phase: &OnPhase) -> Result<StagedReport, VirtError> {
    let v = &opts.virt;
    if v.vms == 0 || v.vms > 64 {
        return Err(VirtError::Options(format!(
            "vms = {} must be 1..=64",
            v.vms
        )));
    }
    let wall = Instant::now();
    let clock = v.clock.create();
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: v.phys_vram,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let phys: Arc<dyn PhysicalGpu> = sim.clone();
    let host_cfg = crate::virt::host_config_for(&v.host, v.vms);
    let host = GpuHost::new(phys, host_cfg.clone())?;
    host.set_clock(clock.clone());
    if let Some(p) = opts.policy {
        host.set_scheduler(p.create(&opts.params))?;
    }
    let ram = if v.guest_ram == 0 {
        ((v.size as u64).pow(2) * 4 * 8 + (16 << 20)).next_multiple_of(2 << 20)
    } else {
        v.guest_ram
    };
    let ram_len = usize::try_from(ram).map_err(|e| VirtError::GuestRam(ram, e.to_string()))?;
    let avail = (v.phys_vram >> 20).saturating_sub(host_cfg.hypervisor_vram >> 20);
    let vram_mib = if v.vram_mib == 0 {
        (avail / v.vms as u64).min(1024)
    } else {
        v.vram_mib
    };
    let mut vms = Vec::new();
    for i in 0..v.vms {
        let weight = opts.weights.get(i).copied().unwrap_or(1).max(1);
        let vgpu = host.create_vgpu_for_ram(
            &VgpuProfile {
                name: format!("vm{i}"),
                vram_mib,
                channels: (128 / v.vms as u32).min(16),
                weight,
                shadow: v.shadow,
            },
            ram,
        )?;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram_len)])
            .map_err(|e| VirtError::GuestRam(ram, e.to_string()))?;
        vgpu.attach_guest_memory(mem.clone())?;
        vms.push((vgpu, mem, weight));
    }
    let cfg = DriverConfig {
        fence_mode: v.fence_mode,
        ..v.driver.clone()
    };
    let barrier = Barrier::new(v.vms);
    let mark = std::sync::Mutex::new(None::<SpanMark>);
    let reports: Vec<StagedVm> = std::thread::scope(|s| {
        let handles: Vec<_> = vms
            .iter()
            .enumerate()
            .map(|(i, (vgpu, mem, weight))| {
                let ctx = Ctx {
                    index: i,
                    weight: *weight,
                    vgpu: vgpu.clone(),
                    mem: mem.clone(),
                    ram,
                    clock: clock.clone(),
                    sim: &sim,
                    cfg: cfg.clone(),
                    opts,
                    barrier: &barrier,
                    mark: &mark,
                    host: &host,
                    on_phase,
                };
                s.spawn(move || drive(ctx))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a VM thread panicked")))
            .collect()
    });
    // The measured span ends with the last VM's thread, before the memory sample and the VMs'
    // destruction (which are not the workload's).
    let end = SpanMark::now(&*clock, &host, &sim);
    let mem_loaded = crate::mem::MemSample::now(Some(&sim));
    for (vgpu, _, _) in &vms {
        host.destroy_vgpu(vgpu)?;
    }
    drop(vms);
    let from = mark.into_inner().unwrap_or(None).unwrap_or(SpanMark {
        at: wall,
        clock: 0,
        holds: LockHolds::default(),
        cpu: SpanCpu::default(),
        sim_waits: (0, 0),
        worker: Default::default(),
    });
    Ok(StagedReport {
        scheduler: opts.policy.unwrap_or(Policy::Fifo).name().to_string(),
        vms: reports,
        wall_ns: wall.elapsed().as_nanos() as u64,
        clock_span_ns: (from.clock, end.clock),
        measured_wall_ns: end.at.saturating_duration_since(from.at).as_nanos() as u64,
        measured_holds: end.holds.since(&from.holds),
        measured_cpu: end.cpu.since(&from.cpu),
        measured_sim_lock_waits: (
            end.sim_waits.0.saturating_sub(from.sim_waits.0),
            end.sim_waits.1.saturating_sub(from.sim_waits.1),
        ),
        measured_worker: end.worker.since(&from.worker),
        host: host.stats(),
        mem_loaded,
    })
}

/// Where a run stood at the start or the end of its measured part.
struct SpanMark {
    at: Instant,
    clock: u64,
    holds: LockHolds,
    cpu: SpanCpu,
    sim_waits: (u64, u64),
    worker: gpuvm_sim::WorkerTimes,
}

impl SpanMark {
    fn now(clock: &dyn Clock, host: &GpuHost, sim: &SimGpu) -> SpanMark {
        SpanMark {
            at: Instant::now(),
            clock: clock.now_ns(),
            holds: host.stats().lock_holds,
            cpu: SpanCpu::now(),
            sim_waits: sim.lock_waits(),
            worker: sim.worker_times(),
        }
    }
}

struct Ctx<'a> {
    index: usize,
    weight: u32,
    vgpu: Arc<Vgpu>,
    mem: GuestMemoryMmap,
    ram: u64,
    clock: Arc<dyn Clock>,
    sim: &'a SimGpu,
    cfg: DriverConfig,
    opts: &'a StagedOptions,
    barrier: &'a Barrier,
    mark: &'a std::sync::Mutex<Option<SpanMark>>,
    host: &'a GpuHost,
    on_phase: &'a OnPhase<'a>,
}

fn drive(c: Ctx<'_>) -> StagedVm {
    let hal = VirtHal::new(c.vgpu.clone(), c.clock.clone(), c.mem.clone(), 0, c.ram);
    let chans = c.vgpu.phys_channels();
    // One read of the partition's counters (one hold of the simulator's lock) and the VM's
    // shadow counters under its own lock: between the runs of a measured span, harness reads
    // that took the host lock (a vGPU's `stats()`) and the simulator's lock once per channel
    // made the VMs of a many-VM run queue for both.
    let busy = || {
        c.sim
            .channels_busy_ns(chans.clone())
            .map_or(0, |v| v.iter().sum::<u64>())
    };
    // The clock is read last at the start of a phase and first at its end, so that a phase's
    // wall time is the workload's alone, not the snapshots' (a vGPU's `stats()` is an access of
    // its own), as `native::Meter` does for the bare GPU.
    let snap = |counts: MmioCounts| {
        let (busy, shadow) = (busy(), c.vgpu.stats_local().shadow);
        (Instant::now(), busy, counts, shadow)
    };
    let phase = |name: &str,
                 start: &(Instant, u64, MmioCounts, ShadowStats),
                 counts: MmioCounts,
                 res: Result<(u64, u64, bool), String>| {
        let wall_ns = start.0.elapsed().as_nanos() as u64;
        let (bytes, fence, verified, error) = match res {
            Ok((b, f, v)) => (b, f, v, None),
            Err(e) => (0, 0, false, Some(e)),
        };
        Phase {
            run: WorkloadRun {
                name: name.to_string(),
                bytes,
                gpu_ns: busy().saturating_sub(start.1),
                fence_gpu_ns: fence,
                wall_ns,
                mmio_reads: counts.reads.saturating_sub(start.2.reads),
                mmio_writes: counts.writes.saturating_sub(start.2.writes),
                verified,
                error,
            },
            shadow: ShadowWork::between(&start.3, &c.vgpu.stats_local().shadow),
            end_clock_ns: c.clock.now_ns(),
            waited_ns: 0,
        }
    };
    let workloads: &[Workload] = &c.opts.virt.workloads;
    let s0 = snap(MmioCounts::default());
    let mut drv = match Gpu::init(hal, c.cfg.clone()) {
        Ok(d) => d,
        Err(e) => {
            let init = phase("init", &s0, MmioCounts::default(), Err(e.to_string()));
            (c.on_phase)(c.index, 0, &init);
            // Keep the barrier's count right for the others.
            if c.opts.barrier_after.is_some() {
                c.barrier.wait();
            }
            return StagedVm {
                vm: c.vgpu.id().0,
                weight: c.weight,
                init,
                workloads: Vec::new(),
                stats: c.vgpu.stats(),
            };
        }
    };
    let init = phase("init", &s0, drv.hal().counts(), Ok((0, 0, true)));
    (c.on_phase)(c.index, 0, &init);
    let mut runs = Vec::with_capacity(workloads.len());
    for (i, &w) in workloads.iter().enumerate() {
        if c.opts.barrier_after == Some(i) {
            if c.barrier.wait().is_leader() {
                *c.mark.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(SpanMark::now(&*c.clock, c.host, c.sim));
            }
            c.barrier.wait();
        }
        let s = snap(drv.hal().counts());
        let waited = drv.hal().waited_ns();
        let res = workloads::run(&mut drv, w, c.opts.virt.size)
            .map(|r| (r.bytes, r.gpu_ns, r.verified))
            .map_err(|e| e.to_string());
        let mut p = phase(w.name(), &s, drv.hal().counts(), res);
        p.waited_ns = drv.hal().waited_ns() - waited;
        (c.on_phase)(c.index, 1 + i, &p);
        runs.push(p);
    }
    if c.opts.barrier_after.is_some_and(|b| b >= workloads.len()) {
        c.barrier.wait();
        c.barrier.wait();
    }
    let _ = workloads::release_channel(&mut drv);
    StagedVm {
        vm: c.vgpu.id().0,
        weight: c.weight,
        init,
        workloads: runs,
        stats: c.vgpu.stats(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuvm::profile::ShadowMode;

    #[test]
    fn staged_run_attributes_shadow_work_and_verifies() {
        let opts = StagedOptions {
            virt: VirtOptions {
                vms: 2,
                size: 16,
                shadow: ShadowMode::Incremental,
                workloads: vec![Workload::Loop, Workload::Madd],
                ..VirtOptions::default()
            },
            policy: Some(Policy::Band),
            params: SchedParams::default(),
            weights: vec![1, 2],
            barrier_after: Some(1),
        };
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let r = run_staged(&opts, &|_, _, _| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
        assert!(r.all_verified());
        assert_eq!(seen.into_inner(), 2 * 3);
        assert_eq!(r.scheduler, "band");
        assert_eq!(r.vms[1].weight, 2);
        for vm in &r.vms {
            assert!(vm.init.exits() > 0);
            assert!(vm.workloads.iter().all(|w| w.exits() > 0));
            // Every workload waits for its fence, and its waits are part of its wall time.
            assert!(vm
                .workloads
                .iter()
                .all(|w| w.waited_ns > 0 && w.waited_ns <= w.run.wall_ns));
        }
        assert!(r.clock_span_ns.1 >= r.clock_span_ns.0);
    }
}
