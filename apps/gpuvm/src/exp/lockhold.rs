//! `gpuvm exp lockhold`: how long a neighbour can hold the host lock that every VM's exits take
//! (`gpuvm_harness::exp_lockhold`; numbers in docs/experiments.md).

use std::path::{Path, PathBuf};

use clap::Args;
use gpuvm_harness::exp_lockhold::{run_lockhold, LockholdOptions, LockholdReport};

use super::plot::{plot_err, COLORS};
use crate::table::{self, Table};

/// Options of `gpuvm exp lockhold`.
#[derive(Args, Debug)]
pub struct LockholdArgs {
    /// Rounds of the victim's workloads per scenario (each round runs every workload once).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Workload size of the victim.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    size: u32,
    /// Matrix dimension of the `mmul` neighbour's kernels.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(16..=2048))]
    mmul_n: u32,
    /// The clock: `real` (the engines run on the simulator's worker, beside the host lock, as
    /// under `serve` and the KVM VMM) or `sim` (deterministic: the engines run inline in the
    /// host's calls, within their work budget).
    #[arg(long, default_value = "real")]
    clock: gpuvm::clock::ClockKind,
    /// The host scheduling policy the simulator's engine worker asks for: `batch`
    /// (SCHED_BATCH: it does not preempt vCPU threads when it wakes), `idle` (SCHED_IDLE: it
    /// runs only on a core no other thread wants) or `normal`.
    #[arg(long, default_value = "batch")]
    worker_policy: gpuvm_sim::WorkerPolicy,
    /// Read each hold's thread CPU clock and schedstat, to split the longest hold into on a
    /// CPU / runnable / asleep. Off by default: the reads are system calls inside every hold,
    /// each a point where the kernel may switch the holder out, and on 2 cores they made the
    /// `mmul` row's longest hold exceed 2 ms in 13 of 15 runs against 5 of 15 without them
    /// (docs/benchmarks.md): a diagnosis, not the measure.
    #[arg(long)]
    thread_usage: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG bar chart of p50 / p99 / longest hold and the longest wait per scenario to
    /// FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// Runs the experiment; false if a victim workload did not verify.
pub fn run(a: &LockholdArgs) -> anyhow::Result<bool> {
    let r = run_lockhold(&LockholdOptions {
        rounds: a.rounds,
        size: a.size,
        mmul_n: a.mmul_n,
        clock: a.clock,
        worker_policy: a.worker_policy,
        thread_usage: a.thread_usage,
    });
    super::plot::emit(&r, a.json, render, a.svg.as_deref(), write_svg)?;
    Ok(r.scenarios.iter().all(|s| s.verified == s.workloads))
}

fn render(r: &LockholdReport) -> String {
    let mut t = Table::new([
        "neighbour",
        "victim verified",
        "neighbour ops",
        "lock holds",
        "p50 <=",
        "p99 <=",
        "longest",
        "on CPU",
        "runnable",
        "asleep",
        "most CPU in a hold",
        "longest wait",
        "taken at",
        "wall",
        "CPUs (worker)",
    ]);
    for s in &r.scenarios {
        t.row([
            s.name.clone(),
            match s.baseline_of {
                Some(_) => "no GPU".into(),
                None => format!("{}/{}", s.verified, s.workloads),
            },
            s.neighbour_ops.to_string(),
            s.holds.to_string(),
            table::ns(s.p50_bound_ns),
            table::ns(s.p99_bound_ns),
            table::ns(s.max_ns),
            s.max_usage
                .map(|u| table::ns(u.on_cpu_ns))
                .unwrap_or_default(),
            s.max_usage
                .map(|u| table::ns(u.runnable_ns))
                .unwrap_or_default(),
            s.max_usage
                .map(|u| table::ns(u.asleep_ns))
                .unwrap_or_default(),
            if s.max_on_cpu_ns == 0 && s.max_usage.is_none() {
                String::new()
            } else {
                table::ns(s.max_on_cpu_ns)
            },
            table::ns(s.max_wait_ns),
            s.max_at.clone().unwrap_or_default(),
            format!("{:.0} ms", s.wall_ms),
            {
                let cpus = |ns: u64| ns as f64 / (s.wall_ms * 1e6).max(1.0);
                format!(
                    "{:.2} ({:.2})",
                    cpus(s.cpu.process_ns),
                    cpus(s.cpu.engine_worker_ns)
                )
            },
        ]);
    }
    format!(
        "{}\nvictim: every workload at size {} x {} rounds; mmul neighbour: {}x{} kernels back to \
         back; pv-switch neighbour: 2048-op PDE-switch batches; baseline: {}. Hold times are \
         wall-clock; p50/p99 are log2 bucket bounds; the longest hold's time is split, for its holder, into on a CPU, \
         runnable without one (preempted, or woken and not yet run) and asleep (the kernel's \
         schedstat); the most CPU time any hold took is the device model's own longest work \
         under the lock; the longest wait is the longest any access waited for the lock (a \
         holder switched out while nobody wants the lock makes a long hold, not a long wait); CPUs: \
         the process's CPU time over the wall time (the engine worker's, or the baseline's \
         block thread's, in brackets: 0 where the thread is not the simulator's). Clock {}: the engines ran {} (worker policy {}).",
        t.render(),
        r.size,
        r.rounds,
        r.mmul_n,
        r.mmul_n,
        gpuvm_harness::exp_lockhold::baseline_shape(),
        match r.clock {
            gpuvm::clock::ClockKind::Real => "real",
            gpuvm::clock::ClockKind::Sim => "sim",
        },
        if r.engines == "worker" {
            "on the simulator's engine worker, beside the host lock"
        } else {
            "inline, in the host's calls (within their work budget)"
        },
        r.worker_policy
    )
}

/// One bar of a scenario.
type Measure = fn(&gpuvm_harness::LockholdScenario) -> u64;

fn write_svg(r: &LockholdReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let max = r
        .scenarios
        .iter()
        .map(|s| s.max_ns.max(s.p99_bound_ns).max(s.max_wait_ns))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 2.0;
    let n = r.scenarios.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Host-lock holds, and the longest wait, next to each neighbour (log scale)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, (100f64..max).log_scale())
        .map_err(plot_err)?;
    let names: Vec<String> = r.scenarios.iter().map(|s| s.name.clone()).collect();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| names.get(x.floor() as usize).cloned().unwrap_or_default())
        .y_desc("ns")
        .draw()
        .map_err(plot_err)?;
    let series: [(&str, Measure); 4] = [
        ("p50 bound", |s| s.p50_bound_ns),
        ("p99 bound", |s| s.p99_bound_ns),
        ("longest hold", |s| s.max_ns),
        ("longest wait", |s| s.max_wait_ns),
    ];
    for (k, (label, f)) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        chart
            .draw_series(r.scenarios.iter().enumerate().map(|(i, s)| {
                let x0 = i as f64 + 0.1 + k as f64 * 0.2;
                Rectangle::new(
                    [(x0, 100.0), (x0 + 0.17, (f(s).max(101)) as f64)],
                    color.filled(),
                )
            }))
            .map_err(plot_err)?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
