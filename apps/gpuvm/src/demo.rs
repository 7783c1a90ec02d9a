//! `gpuvm demo`: four VMs share the simulated GF100 under BAND, each running every workload a
//! few times through its own vGPU; a live progress bar per VM (on a terminal), then a summary
//! table and an SVG plot of each VM's GPU time over time.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::profile::ShadowMode;
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_guest::workloads::Workload;
use gpuvm_harness::exp_overhead::{run_staged, StagedOptions};
use gpuvm_harness::VirtOptions;
use serde::Serialize;

use crate::table::{self, Table};

/// Options of `gpuvm demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// VMs.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    vms: u32,
    /// Times each VM runs the whole workload suite (with --kvm at most 2).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Problem size N (with --kvm, 16 is advised).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=512))]
    size: u32,
    /// Use real KVM guests (docs/kvm.md) instead of in-process VMs.
    #[arg(long)]
    kvm: bool,
    /// Print one JSON object instead of the progress and table.
    #[arg(long)]
    json: bool,
    /// Where to write the plot (default: plot.svg in a fresh directory gpuvm-demo-PID-N in the
    /// temporary directory, so runs never overwrite each other or a file planted there).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// One VM in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct DemoVm {
    /// VM id.
    pub vm: u32,
    /// Workloads verified.
    pub verified: u32,
    /// Workloads run.
    pub workloads: u32,
    /// GPU time of the VM, ns.
    pub gpu_ns: u64,
    /// Its share of all VMs' GPU time.
    pub gpu_share: f64,
    /// MMIO exits into its vGPU.
    pub exits: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Wall time of the VM, ns.
    pub wall_ns: u64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// "in-process" or "kvm".
    pub backend: &'static str,
    /// Scheduler.
    pub scheduler: &'static str,
    /// Problem size.
    pub size: u32,
    /// Per VM.
    pub vms: Vec<DemoVm>,
    /// Wall time of the whole demo, ns.
    pub wall_ns: u64,
    /// Every workload verified.
    pub all_verified: bool,
    /// The plot.
    pub svg: String,
    /// Per VM, (clock ns, cumulative GPU ns) after each phase (the plot's data).
    #[serde(skip)]
    pub series: Vec<Vec<(u64, u64)>>,
}

/// Runs the command.
pub fn run(a: &DemoArgs) -> anyhow::Result<bool> {
    let svg = match &a.svg {
        Some(p) => p.clone(),
        None => fresh_plot_path()?,
    };
    let wall = Instant::now();
    let mut report = if a.kvm {
        run_kvm(a)?
    } else {
        run_inprocess(a)?
    };
    report.wall_ns = wall.elapsed().as_nanos() as u64;
    write_svg(&report, &svg).with_context(|| format!("writing {}", svg.display()))?;
    report.svg = svg.display().to_string();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(report.all_verified)
}

/// `plot.svg` in a directory of its own under the temporary directory, created here
/// (`create_dir` fails rather than follow anything already there).
fn fresh_plot_path() -> anyhow::Result<PathBuf> {
    let tmp = std::env::temp_dir();
    for n in 0..1000u32 {
        let dir = tmp.join(format!("gpuvm-demo-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir.join("plot.svg")),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    anyhow::bail!(
        "no fresh directory for the plot in {}; give --svg FILE",
        tmp.display()
    )
}

fn suite(rounds: u32) -> Vec<Workload> {
    (0..rounds).flat_map(|_| Workload::ALL).collect()
}

fn run_inprocess(a: &DemoArgs) -> anyhow::Result<DemoReport> {
    let list = suite(a.rounds);
    let workloads = list.len();
    let total = workloads as u64 + 1;
    let n = a.vms as usize;
    let tty = !a.json && std::io::stdout().is_terminal();
    let multi = indicatif::MultiProgress::new();
    let bars: Vec<indicatif::ProgressBar> = if tty {
        (0..n)
            .map(|i| {
                let pb = multi.add(indicatif::ProgressBar::new(total));
                pb.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{prefix} [{bar:30}] {pos:>2}/{len} {msg}",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                pb.set_prefix(format!("vm{i}"));
                pb
            })
            .collect()
    } else {
        Vec::new()
    };
    if !a.json {
        println!(
            "gpuvm demo: {n} VMs share the simulated GF100 under BAND, each running the workload suite {} times (size {}), in-process",
            a.rounds, a.size
        );
    }
    let series = Mutex::new(vec![vec![(0u64, 0u64)]; n]);
    let plain = !a.json && !tty;
    let on_phase = |vm: usize, i: usize, p: &gpuvm_harness::exp_overhead::Phase| {
        {
            let mut s = series.lock().unwrap_or_else(|e| e.into_inner());
            let last = s[vm].last().map_or(0, |x| x.1);
            s[vm].push((p.end_clock_ns, last + p.run.gpu_ns));
        }
        let verdict = if p.run.verified { "verified" } else { "FAILED" };
        if let Some(pb) = bars.get(vm) {
            pb.set_position(i as u64 + 1);
            pb.set_message(format!("{} {verdict}", p.run.name));
        } else if plain {
            // Phase 0 is the driver's bring-up; the workloads are counted as the summary
            // counts them.
            let step = if i == 0 {
                "init] driver bring-up".to_string()
            } else {
                format!("{i:>2}/{workloads}] {}", p.run.name)
            };
            println!("vm{vm} [{step} {verdict}, GPU {}", table::ns(p.run.gpu_ns));
        }
    };
    let r = run_staged(
        &StagedOptions {
            virt: VirtOptions {
                vms: n,
                size: a.size,
                clock: ClockKind::Sim,
                shadow: ShadowMode::Incremental,
                workloads: list,
                ..VirtOptions::default()
            },
            policy: Some(Policy::Band),
            params: SchedParams::default(),
            weights: Vec::new(),
            barrier_after: None,
        },
        &on_phase,
    )
    .context("demo run")?;
    for pb in &bars {
        pb.finish();
    }
    let gpu: Vec<u64> = r
        .vms
        .iter()
        .map(|v| v.workloads.iter().map(|w| w.run.gpu_ns).sum::<u64>() + v.init.run.gpu_ns)
        .collect();
    let all: u64 = gpu.iter().sum::<u64>().max(1);
    let vms = r
        .vms
        .iter()
        .zip(&gpu)
        .map(|(v, &g)| DemoVm {
            vm: v.vm,
            verified: v.workloads.iter().filter(|w| w.run.verified).count() as u32,
            workloads: v.workloads.len() as u32,
            gpu_ns: g,
            gpu_share: g as f64 / all as f64,
            exits: v.stats.exits.bar0.total()
                + v.stats.exits.bar1.total()
                + v.stats.exits.bar3.total(),
            doorbells: v.stats.doorbells,
            wall_ns: v.init.run.wall_ns + v.workloads.iter().map(|w| w.run.wall_ns).sum::<u64>(),
        })
        .collect();
    Ok(DemoReport {
        backend: "in-process",
        scheduler: "band",
        size: a.size,
        vms,
        wall_ns: 0,
        all_verified: r.all_verified(),
        svg: String::new(),
        series: series.into_inner().unwrap_or_else(|e| e.into_inner()),
    })
}

fn run_kvm(a: &DemoArgs) -> anyhow::Result<DemoReport> {
    let list = suite(a.rounds.min(2));
    if !a.json {
        println!(
            "gpuvm demo --kvm: {} KVM VMs share the simulated GF100 under BAND, each running the workload suite {} times (size {}); guests run to completion, then the summary",
            a.vms,
            a.rounds.min(2),
            a.size
        );
    }
    let opts = crate::kvm::KvmOptions {
        vms: a.vms as usize,
        size: a.size,
        shadow: ShadowMode::Incremental,
        workloads: list,
        echo_console: false,
        sched: Some(Policy::Band),
        ..crate::kvm::KvmOptions::default()
    };
    let r = crate::kvm::run_kvm(&opts)?;
    let all: u64 = r
        .vms
        .iter()
        .flat_map(|v| std::iter::once(&v.init).chain(&v.workloads))
        .map(|w| w.gpu_ns)
        .sum::<u64>()
        .max(1);
    let mut series = Vec::new();
    let vms = r
        .vms
        .iter()
        .map(|v| {
            let mut t = 0;
            let mut g = 0;
            let mut s = vec![(0, 0)];
            for w in std::iter::once(&v.init).chain(&v.workloads) {
                t += w.wall_ns;
                g += w.gpu_ns;
                s.push((t, g));
            }
            series.push(s);
            DemoVm {
                vm: v.vm,
                verified: v.workloads.iter().filter(|w| w.verified).count() as u32,
                workloads: v.workloads.len() as u32,
                gpu_ns: g,
                gpu_share: g as f64 / all as f64,
                exits: v.kvm.exits.mmio_reads + v.kvm.exits.mmio_writes,
                doorbells: v.stats.doorbells,
                wall_ns: v.kvm.wall_ns,
            }
        })
        .collect();
    Ok(DemoReport {
        backend: "kvm",
        scheduler: "band",
        size: a.size,
        vms,
        wall_ns: 0,
        all_verified: r.all_verified(),
        svg: String::new(),
        series,
    })
}

/// The summary.
pub fn render(r: &DemoReport) -> String {
    let mut t = Table::new([
        "vm",
        "verified",
        "GPU time",
        "GPU share",
        "exits",
        "doorbells",
        "wall time",
    ]);
    for v in &r.vms {
        t.row([
            format!("vm{}", v.vm),
            format!("{}/{}", v.verified, v.workloads),
            table::ns(v.gpu_ns),
            format!("{:.1} %", v.gpu_share * 100.0),
            v.exits.to_string(),
            v.doorbells.to_string(),
            table::ns(v.wall_ns),
        ]);
    }
    let ok: u32 = r.vms.iter().map(|v| v.verified).sum();
    let total: u32 = r.vms.iter().map(|v| v.workloads).sum();
    format!(
        "\n{}\n{ok}/{total} workloads verified under {} ({}), {:.2} s; plot: {}\n",
        t.render(),
        r.scheduler.to_uppercase(),
        r.backend,
        r.wall_ns as f64 / 1e9,
        r.svg
    )
}

/// Cumulative GPU time per VM over time (modeled time in-process, each VM's own wall time
/// under KVM).
pub fn write_svg(r: &DemoReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(crate::exp::plot::plot_err)?;
    let x_max = r
        .series
        .iter()
        .flatten()
        .map(|p| p.0)
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1e6;
    let y_max = r
        .series
        .iter()
        .flatten()
        .map(|p| p.1)
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1e6
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "gpuvm demo: GPU time per VM under {} ({})",
                r.scheduler.to_uppercase(),
                r.backend
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(crate::exp::plot::plot_err)?;
    chart
        .configure_mesh()
        .x_desc(if r.backend == "kvm" {
            "VM wall time (ms)"
        } else {
            "modeled time (ms)"
        })
        .y_desc("cumulative GPU time (ms)")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(crate::exp::plot::plot_err)?;
    for (i, (s, v)) in r.series.iter().zip(&r.vms).enumerate() {
        let color = crate::exp::plot::COLORS[i % crate::exp::plot::COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.iter().map(|&(t, g)| (t as f64 / 1e6, g as f64 / 1e6)),
                color.stroke_width(2),
            ))
            .map_err(crate::exp::plot::plot_err)?
            .label(format!("vm{} ({:.1} %)", v.vm, v.gpu_share * 100.0))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    crate::exp::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(crate::exp::plot::plot_err)?;
    Ok(())
}
