//! `gpuvm exp scale`: the same workload in more and more VMs at once (GPUvm's scale figure),
//! in-process. Every VM brings its driver up and creates its channel (a `loop` warm-up), then
//! all VMs wait at a barrier and run the workload `--repeat` times together: that part is
//! measured.
//!
//! With `--trials T` the whole list of VM counts is measured T times, one count after the other
//! in each trial (1, 16, 1, 16, ... for `--vms 1,16`), so that every count sees the machine's
//! load of the same moments. Each point is then the trial whose aggregate time is the median
//! (a measured run, every field of it from that run), and `scaling` gives each count's
//! aggregate over the trials (median, least, most) and its ratio to the first count's: the
//! ratio of the medians and the median of the ratios paired by trial. One run of a many-VM
//! point on a shared machine varies by ±30 %; the ratio the scale figure is read for needs
//! more than one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::profile::ShadowMode;
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_guest::workloads::Workload;
use gpuvm_harness::exp_overhead::{run_staged, StagedOptions};
use gpuvm_harness::mem::{slope, MemSample};
use gpuvm_harness::VirtOptions;
use serde::Serialize;

use crate::kvm::setup::VmSetup;
use crate::kvm::{abi, run_kvm, KvmOptions};
use crate::table::{self, Table};

/// Options of `gpuvm exp scale`.
#[derive(Args, Debug)]
pub struct ScaleArgs {
    /// VM counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    vms: Vec<u32>,
    /// The workload every VM runs.
    #[arg(long, default_value = "mmul")]
    workload: Workload,
    /// Times each VM runs it (measured).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=15))]
    repeat: u32,
    /// Problem size N.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=1024))]
    size: u32,
    /// Shadow mode: eager (fv-naive), lazy, incremental (fv) or pv.
    #[arg(long, default_value = "incremental")]
    shadow: ShadowMode,
    /// Scheduler: fifo, credit or band.
    #[arg(long, default_value = "fifo")]
    sched: Policy,
    /// Time base of the simulated GPU: `real` (default here: GPU time passes in real time, so
    /// utilisation = GPU busy / elapsed) or `sim`.
    #[arg(long, default_value = "real")]
    clock: ClockKind,
    /// Exit cost for the modeled per-VM time, ns.
    #[arg(long, value_name = "NS", default_value_t = super::overhead::DEFAULT_EXIT_NS)]
    exit_ns: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of time against VMs to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Run every VM as a real KVM guest (docs/kvm.md; real clock, every BAR access a real
    /// exit, so no modeled time). The guests meet at a start gate after the warm-up.
    #[arg(long)]
    kvm: bool,
    /// Measure the list of VM counts this many times, alternating the counts within each trial;
    /// each point is its median trial, and `scaling` compares the counts over all trials.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=101))]
    trials: u32,
    /// Also run, for each count N, N one-VM stacks at once, each with a simulated GPU of its
    /// own (its own engine worker): what the machine itself does to N such VMs without a GPU to
    /// share (`unshared_wall_ns`; in-process only).
    #[arg(long)]
    unshared: bool,
}

/// One VM count.
#[derive(Debug, Clone, Serialize)]
pub struct ScalePoint {
    /// VMs.
    pub vms: u32,
    /// Mean over VMs of each VM's measured wall time, ns.
    pub per_vm_wall_ns: u64,
    /// In-process: of that, the mean time a VM's driver spent waiting (for its fences above
    /// all, the device's polls included), ns — the rest is its own work and its exits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_vm_waited_ns: Option<u64>,
    /// Slowest VM's measured wall time, ns.
    pub max_vm_wall_ns: u64,
    /// Barrier to the last VM's end, ns.
    pub aggregate_wall_ns: u64,
    /// With --unshared: as many one-VM stacks as this point has VMs, run at once, each with a
    /// GPU of its own — the slowest one's barrier to its VM's end, ns (each stack times its own
    /// measured part; they start together and their warm-ups are alike, so the parts overlap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unshared_wall_ns: Option<u64>,
    /// per_vm_wall_ns + exits per VM x exit_ns.
    pub per_vm_modeled_ns: u64,
    /// GPU time of every VM's measured workloads, ns.
    pub gpu_busy_ns: u64,
    /// The GPU clock from the barrier to the end, ns.
    pub gpu_clock_span_ns: u64,
    /// gpu_busy_ns / gpu_clock_span_ns.
    pub utilization: f64,
    /// Exits of all VMs in the measured part.
    pub exits: u64,
    /// Workloads run (VMs x repeat).
    pub runs: u32,
    /// Every VM came up and verified every run.
    pub verified: bool,
    /// With --kvm: from the VMs' start to the gate (driver bring-up and the warm-up of all
    /// VMs), ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bring_up_ns: Option<u64>,
    /// In-process: host-lock write holds in the measured part (`gpuvm::host::LockHolds`): how
    /// many, their total and the longest, ns. The total over the aggregate wall time is the
    /// share of the run during which every other VM's slow-path access had to wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_lock: Option<HostLockUse>,
    /// In-process: CPU time in the measured part: the whole process's and the simulated GPU's
    /// engine worker's (one thread computes every engine operation; at ~100 % of the aggregate
    /// it bounds the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<gpuvm_harness::cpu::SpanCpu>,
    /// In-process: the engine worker's wall time in the measured part by activity — computing,
    /// under the simulator's lock, waiting for it, idle with nothing in flight, … (where it is
    /// idle, the GPU waited for the host to dispatch; where it is never idle, it bounds the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_worker: Option<gpuvm_sim::WorkerTimes>,
    /// In-process: this process's memory with every VM of the point alive and finished (before
    /// they are destroyed). `rss_anon` holds the device model and guest RAM, `rss_shmem` and
    /// `vram_resident` the simulated VRAM (`gpuvm_harness::mem`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem: Option<MemSample>,
}

/// Host-lock write holds over a point's measured part.
#[derive(Debug, Clone, Serialize)]
pub struct HostLockUse {
    /// Holds.
    pub holds: u64,
    /// Their total, ns.
    pub held_ns: u64,
    /// The longest, ns.
    pub max_ns: u64,
    /// Calls into the simulated GPU (from the host and the fast path) that found its lock
    /// taken — by the engine worker or another caller — and waited.
    pub sim_lock_waits: u64,
    /// How long they waited in all, ns.
    pub sim_lock_waited_ns: u64,
    /// Takers of the host lock (write holds) that found it held and waited.
    pub waits: u64,
    /// How long they waited in all, ns.
    pub waited_ns: u64,
    /// Fast-path accesses that found a hold in progress and waited for it to end.
    pub fast_path_waits: u64,
    /// How long they waited in all, ns.
    pub fast_path_waited_ns: u64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// "in-process" or "kvm".
    pub backend: &'static str,
    /// The workload.
    pub workload: String,
    /// Runs per VM.
    pub repeat: u32,
    /// Problem size.
    pub size: u32,
    /// Shadow mode.
    pub shadow: ShadowMode,
    /// Scheduler.
    pub scheduler: String,
    /// Clock.
    pub clock: ClockKind,
    /// Exit cost in the modeled time, ns.
    pub exit_ns: u64,
    /// One entry per VM count.
    pub points: Vec<ScalePoint>,
    /// Plot written, if any.
    pub svg: Option<String>,
    /// In-process: this process's memory before the first point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_start: Option<MemSample>,
    /// In-process: host memory per added VM excluding its VRAM, bytes — the least-squares
    /// slope of `rss_anon` against the VM count over the points (needs two VM counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_anon_per_vm: Option<f64>,
    /// The same for the simulated VRAM resident in memory, bytes per VM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vram_resident_per_vm: Option<f64>,
    /// Trials of the list of VM counts (`--trials`); each point is its median trial.
    pub trials: u32,
    /// Each VM count's aggregate time over the trials, against the first count's.
    pub scaling: Vec<Scaling>,
}

/// One VM count's aggregate wall time over the trials, against the first VM count of the list.
#[derive(Debug, Clone, Serialize)]
pub struct Scaling {
    /// VMs.
    pub vms: u32,
    /// Every trial's aggregate wall time, ns, in trial order.
    pub aggregate_wall_ns: Vec<u64>,
    /// Their median (the lower middle one for an even count), ns.
    pub median_ns: u64,
    /// The least, ns.
    pub min_ns: u64,
    /// The most, ns.
    pub max_ns: u64,
    /// This count's median over the first count's median.
    pub ratio_of_medians: f64,
    /// This count's aggregate over the first count's, trial by trial.
    pub paired_ratios: Vec<f64>,
    /// The median of `paired_ratios`.
    pub median_paired_ratio: f64,
    /// Trials whose paired ratio is at most 2 (the engines-and-locks bar for 16 VMs).
    pub paired_at_most_2x: u32,
    /// With --unshared: every trial's `ScalePoint::unshared_wall_ns`, ns, in trial order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unshared_wall_ns: Option<Vec<u64>>,
    /// With --unshared: their median, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unshared_median_ns: Option<u64>,
    /// With --unshared: that median over the first count's median (with one GPU shared): how
    /// much of `ratio_of_medians` the machine alone accounts for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unshared_ratio_of_medians: Option<f64>,
    /// With --unshared: the median over the trials of this count's aggregate with one GPU
    /// shared over its unshared stacks' time in the same trial — what sharing the GPU adds
    /// beyond what the machine does to that many VMs (`ratio_of_medians` is about this times
    /// `unshared_ratio_of_medians`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_shared_over_unshared: Option<f64>,
}

/// The index of the median of `v` (the lower middle one for an even length).
fn median_index(v: &[u64]) -> usize {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by_key(|&i| v[i]);
    idx.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

fn median_f64(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get((s.len().max(1) - 1) / 2).copied().unwrap_or(0.0)
}

/// Each count's aggregate times over the trials (`trials[t][i]`: trial t, VM count i),
/// against the first count's. Empty without trials; a trial short of a count counts 0 for it.
pub fn scaling(vms: &[u32], trials: &[Vec<u64>]) -> Vec<Scaling> {
    if trials.is_empty() {
        return Vec::new();
    }
    let column = |i: usize| -> Vec<u64> {
        trials
            .iter()
            .map(|t| t.get(i).copied().unwrap_or(0))
            .collect()
    };
    let base = column(0);
    let base_median = base.get(median_index(&base)).copied().unwrap_or(0);
    vms.iter()
        .enumerate()
        .map(|(i, &v)| {
            let col = column(i);
            let median_ns = col.get(median_index(&col)).copied().unwrap_or(0);
            let paired_ratios: Vec<f64> = col
                .iter()
                .zip(&base)
                .map(|(&x, &b)| x as f64 / b.max(1) as f64)
                .collect();
            Scaling {
                vms: v,
                median_ns,
                min_ns: col.iter().copied().min().unwrap_or(0),
                max_ns: col.iter().copied().max().unwrap_or(0),
                ratio_of_medians: median_ns as f64 / base_median.max(1) as f64,
                median_paired_ratio: median_f64(&paired_ratios),
                paired_at_most_2x: paired_ratios.iter().filter(|&&r| r <= 2.0).count() as u32,
                paired_ratios,
                aggregate_wall_ns: col,
                unshared_wall_ns: None,
                unshared_median_ns: None,
                unshared_ratio_of_medians: None,
                median_shared_over_unshared: None,
            }
        })
        .collect()
}

/// Measures one VM count.
pub fn point(a: &ScaleArgs, vms: u32) -> anyhow::Result<ScalePoint> {
    let mut list = vec![Workload::Loop];
    list.extend(std::iter::repeat_n(a.workload, a.repeat as usize));
    let r = run_staged(
        &StagedOptions {
            virt: VirtOptions {
                vms: vms as usize,
                size: a.size,
                clock: a.clock,
                shadow: a.shadow,
                workloads: list,
                ..VirtOptions::default()
            },
            policy: Some(a.sched),
            params: SchedParams::default(),
            weights: Vec::new(),
            barrier_after: Some(1),
        },
        &|_, _, _| {},
    )
    .with_context(|| format!("{vms} VMs"))?;
    // Per VM over its measured runs: wall time, exits, GPU time, time waiting.
    let measured = |vm: &gpuvm_harness::exp_overhead::StagedVm| -> (u64, u64, u64, u64) {
        vm.workloads
            .iter()
            .skip(1)
            .fold((0, 0, 0, 0), |(w, e, g, t), p| {
                (
                    w + p.run.wall_ns,
                    e + p.exits(),
                    g + p.run.gpu_ns,
                    t + p.waited_ns,
                )
            })
    };
    let per: Vec<(u64, u64, u64, u64)> = r.vms.iter().map(measured).collect();
    let n = per.len().max(1) as u64;
    let wall_sum: u64 = per.iter().map(|p| p.0).sum();
    let exits: u64 = per.iter().map(|p| p.1).sum();
    let gpu: u64 = per.iter().map(|p| p.2).sum();
    let waited: u64 = per.iter().map(|p| p.3).sum();
    let span = r.clock_span_ns.1.saturating_sub(r.clock_span_ns.0);
    Ok(ScalePoint {
        vms,
        per_vm_wall_ns: wall_sum / n,
        per_vm_waited_ns: Some(waited / n),
        max_vm_wall_ns: per.iter().map(|p| p.0).max().unwrap_or(0),
        aggregate_wall_ns: r.measured_wall_ns,
        unshared_wall_ns: None,
        per_vm_modeled_ns: wall_sum / n + exits / n * a.exit_ns,
        gpu_busy_ns: gpu,
        gpu_clock_span_ns: span,
        utilization: if span == 0 {
            0.0
        } else {
            gpu as f64 / span as f64
        },
        exits,
        runs: vms * a.repeat,
        verified: r.all_verified() && r.vms.len() == vms as usize,
        bring_up_ns: None,
        cpu: Some(r.measured_cpu),
        engine_worker: Some(r.measured_worker),
        host_lock: Some(HostLockUse {
            holds: r.measured_holds.count,
            held_ns: r.measured_holds.total_ns,
            max_ns: r.measured_holds.max_ns,
            sim_lock_waits: r.measured_sim_lock_waits.0,
            sim_lock_waited_ns: r.measured_sim_lock_waits.1,
            waits: r.measured_holds.waits,
            waited_ns: r.measured_holds.waited_ns,
            fast_path_waits: r.measured_holds.fast_waits,
            fast_path_waited_ns: r.measured_holds.fast_waited_ns,
        }),
        mem: Some(r.mem_loaded),
    })
}

/// `vms` one-VM stacks at once, each with a GPU of its own: the slowest one's measured wall
/// time, ns, and whether every one verified.
fn point_unshared(a: &ScaleArgs, vms: u32) -> anyhow::Result<(u64, bool)> {
    let points: Vec<anyhow::Result<ScalePoint>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..vms).map(|_| s.spawn(|| point(a, 1))).collect();
        runs.into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a one-VM stack panicked")))
            })
            .collect()
    });
    let mut slowest = 0;
    let mut verified = true;
    for p in points {
        let p = p.with_context(|| format!("{vms} unshared one-VM stacks"))?;
        slowest = slowest.max(p.aggregate_wall_ns);
        verified &= p.verified;
    }
    Ok((slowest, verified))
}

/// Runs the command.
pub fn run(a: &ScaleArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(!a.vms.is_empty(), "--vms needs at least one count");
    anyhow::ensure!(
        !(a.unshared && a.kvm),
        "--unshared runs in-process stacks; it does not go with --kvm"
    );
    for &v in &a.vms {
        anyhow::ensure!((1..=64).contains(&v), "--vms: {v} is not in 1..=64");
    }
    let mem_start = (!a.kvm).then(|| MemSample::now(None));
    // measured[i]: VM count i's point in every trial.
    let mut measured: Vec<Vec<ScalePoint>> = vec![Vec::new(); a.vms.len()];
    for t in 0..a.trials {
        for (i, &v) in a.vms.iter().enumerate() {
            if !a.json {
                match a.trials {
                    1 => eprintln!("gpuvm exp scale: {v} VMs ..."),
                    n => eprintln!("gpuvm exp scale: trial {}/{n}, {v} VMs ...", t + 1),
                }
            }
            let mut p = if a.kvm {
                point_kvm(v, a.workload, a.repeat, a.size, a.shadow, a.sched)
                    .with_context(|| format!("{v} KVM VMs"))?
            } else {
                point(a, v)?
            };
            if a.unshared {
                let (wall, verified) = point_unshared(a, v)?;
                p.unshared_wall_ns = Some(wall);
                p.verified &= verified;
            }
            measured[i].push(p);
        }
    }
    let by_trial: Vec<Vec<u64>> = (0..a.trials as usize)
        .map(|t| measured.iter().map(|m| m[t].aggregate_wall_ns).collect())
        .collect();
    let mut scaling = scaling(&a.vms, &by_trial);
    if a.unshared {
        let base = scaling.first().map_or(0, |s| s.median_ns);
        for (s, m) in scaling.iter_mut().zip(&measured) {
            let walls: Vec<u64> = m.iter().filter_map(|p| p.unshared_wall_ns).collect();
            let median = walls.get(median_index(&walls)).copied();
            s.unshared_median_ns = median;
            s.unshared_ratio_of_medians = median.map(|u| u as f64 / base.max(1) as f64);
            // Trial by trial: each trial measured the shared point and its unshared stacks
            // back to back, so a slow stretch of the machine weighs on both.
            let per_trial: Vec<f64> = m
                .iter()
                .filter_map(|p| {
                    p.unshared_wall_ns
                        .map(|u| p.aggregate_wall_ns as f64 / u.max(1) as f64)
                })
                .collect();
            s.median_shared_over_unshared = (!per_trial.is_empty()).then(|| median_f64(&per_trial));
            s.unshared_wall_ns = Some(walls);
        }
    }
    // A run whose VMs did not all verify is not hidden behind a median that did.
    let all_verified = measured.iter().flatten().all(|p| p.verified);
    let points: Vec<ScalePoint> = measured
        .into_iter()
        .map(|m| {
            let aggr: Vec<u64> = m.iter().map(|p| p.aggregate_wall_ns).collect();
            m[median_index(&aggr)].clone()
        })
        .collect();
    let mut report = ScaleReport {
        backend: if a.kvm { "kvm" } else { "in-process" },
        workload: a.workload.name().to_string(),
        repeat: a.repeat,
        size: a.size,
        shadow: a.shadow,
        scheduler: a.sched.name().to_string(),
        clock: if a.kvm { ClockKind::Real } else { a.clock },
        exit_ns: a.exit_ns,
        svg: None,
        mem_start,
        rss_anon_per_vm: per_vm(&points, |m| m.rss_anon),
        vram_resident_per_vm: per_vm(&points, |m| m.vram_resident),
        points,
        trials: a.trials,
        scaling,
    };
    if let Some(p) = &a.svg {
        write_svg(&report, p).with_context(|| format!("writing {}", p.display()))?;
        report.svg = Some(p.display().to_string());
    }
    let ok = all_verified;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(ok)
}

/// Least-squares slope of a memory figure against the VM count, bytes per VM.
fn per_vm(points: &[ScalePoint], f: fn(&MemSample) -> u64) -> Option<f64> {
    let xy: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| p.mem.as_ref().map(|m| (f64::from(p.vms), f(m) as f64)))
        .collect();
    slope(&xy)
}

/// The table. With KVM guests there is no modeled time (the exits are real) but a bring-up
/// column; otherwise the columns are the same.
pub fn render(r: &ScaleReport) -> String {
    let kvm = r.backend == "kvm";
    let mut out = if kvm {
        format!(
            "gpuvm exp scale --kvm: {} x{} per VM, size {}, shadow {}, {} scheduler, KVM guests on the real clock\nper VM = mean of each VM's measured wall time; aggregate = start gate to the last VM's end; bring-up = start to gate (all VMs)\n\n",
            r.workload, r.repeat, r.size, r.shadow, r.scheduler,
        )
    } else {
        format!(
            "gpuvm exp scale: {} x{} per VM, size {}, shadow {}, {} scheduler, {} clock, in-process\nper VM = mean of each VM's measured wall time; aggregate = barrier to the last VM's end; modeled = per VM + exits per VM x {}\n\n",
            r.workload,
            r.repeat,
            r.size,
            r.shadow,
            r.scheduler,
            match r.clock {
                ClockKind::Sim => "simulated",
                ClockKind::Real => "real",
            },
            table::ns(r.exit_ns)
        )
    };
    let mut head = vec!["VMs"];
    if kvm {
        head.push("bring-up");
    }
    head.extend(["per VM", "slowest VM", "aggregate"]);
    let unshared = r.points.iter().any(|p| p.unshared_wall_ns.is_some());
    if unshared {
        head.push("unshared");
    }
    if !kvm {
        head.push("per VM modeled");
    }
    head.extend([
        "GPU busy",
        "utilization",
        if kvm { "MMIO exits" } else { "exits" },
        "verified",
    ]);
    if !kvm {
        head.extend([
            "host lock held",
            "GPU lock waited",
            "cores used",
            "engine worker",
            "RssAnon",
            "VRAM resident",
        ]);
    }
    let mut t = Table::new(head);
    for p in &r.points {
        let mut row = vec![p.vms.to_string()];
        if kvm {
            row.push(table::ns(p.bring_up_ns.unwrap_or(0)));
        }
        row.extend([
            table::ns(p.per_vm_wall_ns),
            table::ns(p.max_vm_wall_ns),
            table::ns(p.aggregate_wall_ns),
        ]);
        if unshared {
            row.push(p.unshared_wall_ns.map_or_else(String::new, table::ns));
        }
        if !kvm {
            row.push(table::ns(p.per_vm_modeled_ns));
        }
        row.extend([
            table::ns(p.gpu_busy_ns),
            format!("{:.1} %", p.utilization * 100.0),
            p.exits.to_string(),
            if p.verified {
                format!("{}/{}", p.runs, p.runs)
            } else {
                "NO".to_string()
            },
        ]);
        if let Some(h) = &p.host_lock {
            row.push(format!(
                "{} ({:.0} %)",
                table::ns(h.held_ns),
                h.held_ns as f64 * 100.0 / p.aggregate_wall_ns.max(1) as f64
            ));
            row.push(table::ns(h.sim_lock_waited_ns));
        }
        if let Some(c) = &p.cpu {
            let agg = p.aggregate_wall_ns.max(1) as f64;
            row.push(format!("{:.1}", c.process_ns as f64 / agg));
            row.push(format!("{:.0} %", c.engine_worker_ns as f64 * 100.0 / agg));
        }
        if let Some(m) = &p.mem {
            row.push(mib(m.rss_anon as f64));
            row.push(mib(m.vram_resident as f64));
        }
        t.row(row);
    }
    out += &t.render();
    if let (Some(a), Some(v)) = (r.rss_anon_per_vm, r.vram_resident_per_vm) {
        out += &format!(
            "host memory per added VM (slope over the points): {} excluding VRAM (RssAnon: device model + guest RAM touched), {} of simulated VRAM\n",
            mib(a),
            mib(v)
        );
    }
    if r.trials > 1 {
        let first = r.scaling.first().map_or(0, |s| s.vms);
        out += &format!(
            "\nover {} trials (the counts alternated within each; each row above is its median trial), aggregate against {first} VM(s):\n",
            r.trials
        );
        let mut head = vec![
            "VMs",
            "median",
            "least",
            "most",
            "ratio of medians",
            "paired ratio, median",
            "paired ≤ 2x",
        ];
        if unshared {
            head.extend(["unshared, median", "unshared ratio", "shared / unshared"]);
        }
        let mut t = Table::new(head);
        for s in &r.scaling {
            let mut row = vec![
                s.vms.to_string(),
                table::ns(s.median_ns),
                table::ns(s.min_ns),
                table::ns(s.max_ns),
                format!("{:.2}", s.ratio_of_medians),
                format!("{:.2}", s.median_paired_ratio),
                format!("{}/{}", s.paired_at_most_2x, s.paired_ratios.len()),
            ];
            if unshared {
                row.push(s.unshared_median_ns.map_or_else(String::new, table::ns));
                for x in [s.unshared_ratio_of_medians, s.median_shared_over_unshared] {
                    row.push(x.map_or_else(String::new, |x| format!("{x:.2}")));
                }
            }
            t.row(row);
        }
        out += &t.render();
    }
    if let Some(p) = &r.svg {
        out += &format!("plot: {p}\n");
    }
    out
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / f64::from(1u32 << 20))
}

/// A value of a point to plot.
type Metric = fn(&ScalePoint) -> u64;

/// Lines of per-VM, aggregate and modeled time (ms) against VMs.
pub fn write_svg(r: &ScaleReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(super::plot::plot_err)?;
    let x_max = r.points.iter().map(|p| p.vms).max().unwrap_or(1) as f64;
    let series: [(&str, Metric); 3] = [
        ("per VM (wall)", |p| p.per_vm_wall_ns),
        ("aggregate (wall)", |p| p.aggregate_wall_ns),
        ("per VM modeled (wall + exits x cost)", |p| {
            p.per_vm_modeled_ns
        }),
    ];
    // Under KVM the exits are real: there is no modeled line.
    let series = &series[..if r.backend == "kvm" { 2 } else { 3 }];
    let y_max = r
        .points
        .iter()
        .flat_map(|p| series.iter().map(move |(_, f)| f(p)))
        .max()
        .unwrap_or(1) as f64
        / 1e6
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} x{} per VM, size {}, shadow {}: time against VMs ({})",
                r.workload, r.repeat, r.size, r.shadow, r.backend
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..x_max + 1.0, 0f64..y_max.max(0.001))
        .map_err(super::plot::plot_err)?;
    chart
        .configure_mesh()
        .x_desc("VMs")
        .y_desc("ms")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(super::plot::plot_err)?;
    for (i, (name, f)) in series.iter().enumerate() {
        let color = super::plot::COLORS[i];
        chart
            .draw_series(LineSeries::new(
                r.points.iter().map(|p| (p.vms as f64, f(p) as f64 / 1e6)),
                color.stroke_width(2),
            ))
            .map_err(super::plot::plot_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                r.points
                    .iter()
                    .map(|p| Circle::new((p.vms as f64, f(p) as f64 / 1e6), 3, color.filled())),
            )
            .map_err(super::plot::plot_err)?;
    }
    super::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(super::plot::plot_err)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// With --kvm
//
// `gpuvm exp scale --kvm`: GPUvm's scale figure with real KVM guests — the same workload in
// 1, 2, 4, ... KVM VMs at once on one simulated GF100 (real clock).
//
// Each VM brings its driver up and runs a `loop` warm-up that creates its channel, then waits
// at the start gate (`abi::PORT_GATE`) until every VM is there; the workload runs `repeat`
// times after it, and only that part is measured: per VM the sum of its runs' wall time
// (between the guest's phase markers, timestamped by the VMM), aggregate = from the gate's
// opening to the last VM's last phase marker, GPU busy = the VMs' channels' busy time in their
// runs, exits = the MMIO exits of the runs (coalesced writes included). Every exit is real, so
// there is no modeled time: `per_vm_modeled_ns` repeats the wall time.

/// Measures one VM count with real KVM guests (`--kvm`).
fn point_kvm(
    vms: u32,
    workload: Workload,
    repeat: u32,
    size: u32,
    shadow: ShadowMode,
    sched: Policy,
) -> anyhow::Result<ScalePoint> {
    let mut list = vec![Workload::Loop];
    list.extend(std::iter::repeat_n(workload, repeat as usize));
    let opts = KvmOptions {
        vms: vms as usize,
        size,
        shadow,
        workloads: list,
        echo_console: false,
        sched: Some(sched),
        setups: vec![
            VmSetup {
                gate: true,
                ..VmSetup::default()
            };
            vms as usize
        ],
        timeout: Duration::from_secs(600),
        ..KvmOptions::default()
    };
    let r = run_kvm(&opts)?;
    for v in &r.vms {
        if let Some(s) = &v.kvm.stopped {
            eprintln!("gpuvm: exp scale --kvm, {vms} VMs: {s}");
        }
    }
    let measured = |v: &crate::kvm::KvmVmReport| -> (u64, u64, u64) {
        v.workloads.iter().skip(1).fold((0, 0, 0), |(w, e, g), p| {
            (
                w + p.wall_ns,
                e + p.mmio_reads + p.mmio_writes,
                g + p.gpu_ns,
            )
        })
    };
    let per: Vec<(u64, u64, u64)> = r.vms.iter().map(measured).collect();
    let n = per.len().max(1) as u64;
    let wall_sum: u64 = per.iter().map(|p| p.0).sum();
    let gate = r.gate_open_ns.unwrap_or(0);
    let last_done = r
        .vms
        .iter()
        .filter_map(|v| {
            v.kvm
                .phases
                .iter()
                .rev()
                .find(|m| m.phase == abi::PHASE_DONE)
                .map(|m| m.at_ns)
        })
        .max()
        .unwrap_or(gate);
    let span = last_done.saturating_sub(gate);
    let gpu: u64 = per.iter().map(|p| p.2).sum();
    Ok(ScalePoint {
        vms,
        per_vm_wall_ns: wall_sum / n,
        per_vm_waited_ns: None,
        max_vm_wall_ns: per.iter().map(|p| p.0).max().unwrap_or(0),
        aggregate_wall_ns: span,
        unshared_wall_ns: None,
        per_vm_modeled_ns: wall_sum / n,
        gpu_busy_ns: gpu,
        gpu_clock_span_ns: span,
        utilization: if span == 0 {
            0.0
        } else {
            gpu as f64 / span as f64
        },
        exits: per.iter().map(|p| p.1).sum(),
        runs: vms * repeat,
        verified: r.all_verified() && r.vms.len() == vms as usize && r.gate_open_ns.is_some(),
        bring_up_ns: r.gate_open_ns,
        host_lock: None,
        cpu: None,
        engine_worker: None,
        mem: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_trial_is_the_lower_middle_one() {
        assert_eq!(median_index(&[30, 10, 20]), 2);
        // Even: the lower of the two middle ones.
        assert_eq!(median_index(&[40, 10, 30, 20]), 3);
        assert_eq!(median_index(&[7]), 0);
        assert_eq!(median_index(&[]), 0);
        assert!(scaling(&[1, 16], &[]).is_empty());
    }

    #[test]
    fn scaling_pairs_each_trial_with_the_first_counts_run_of_that_trial() {
        // Three trials of 1 and 16 VMs; the 16-VM point's ratio to one VM is 2.0, 2.5, 1.5
        // trial by trial.
        let trials = vec![vec![10, 20], vec![20, 50], vec![40, 60]];
        let s = scaling(&[1, 16], &trials);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].vms, 1);
        assert_eq!(s[0].paired_ratios, [1.0, 1.0, 1.0]);
        assert_eq!(s[0].ratio_of_medians, 1.0);
        let p = &s[1];
        assert_eq!(p.aggregate_wall_ns, [20, 50, 60]);
        assert_eq!((p.median_ns, p.min_ns, p.max_ns), (50, 20, 60));
        assert_eq!(p.paired_ratios, [2.0, 2.5, 1.5]);
        assert_eq!(p.median_paired_ratio, 2.0);
        assert_eq!(p.paired_at_most_2x, 2);
        // 50 over the one-VM median of 20.
        assert_eq!(p.ratio_of_medians, 2.5);
    }
}
