//! `gpuvm exp traps`: trapped-access throughput against the number of VMs, with and without GPU
//! work (`gpuvm_harness::exp_traps`; numbers in docs/benchmarks.md).

use std::path::{Path, PathBuf};

use clap::Args;
use gpuvm_harness::exp_traps::{run_traps, TrapsOptions, TrapsPoint, TrapsReport};

use super::plot::{plot_err, COLORS};
use crate::table::{self, Table};

/// Options of `gpuvm exp traps`.
#[derive(Args, Debug)]
pub struct TrapsArgs {
    /// VM counts, comma-separated (1..=128 each).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    vms: Vec<usize>,
    /// Threads hammering each VM's registers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    threads_per_vm: u64,
    /// How long each phase of each point hammers, ms.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    duration_ms: u64,
    /// Turn the host's fast path for VM-local register reads off (every access then takes the
    /// host lock for writing, as before it existed): for a side-by-side comparison.
    #[arg(long)]
    no_fast_path: bool,
    /// Print one JSON object (`points[]` with `phase`, `vms`, `accesses_per_s`, `p50_ns`,
    /// `p99_ns`, `max_ns`, ...) instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG of throughput against VMs, both phases, with the linear ideal, to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// Runs the experiment; false if a GPU workload failed meanwhile.
pub fn run(a: &TrapsArgs) -> anyhow::Result<bool> {
    let r = run_traps(&TrapsOptions {
        vms: a.vms.clone(),
        threads_per_vm: a.threads_per_vm as usize,
        duration_ms: a.duration_ms,
        fast_path: !a.no_fast_path,
    })?;
    super::plot::emit(&r, a.json, render, a.svg.as_deref(), write_svg)?;
    Ok(r.points.iter().all(|p| p.gpu_failures == 0))
}

fn render(r: &TrapsReport) -> String {
    let mut t = Table::new([
        "phase",
        "VMs",
        "threads",
        "accesses/s",
        "x 1 VM",
        "ideal",
        "p50",
        "p99",
        "max",
        "fast path",
        "GPU runs",
    ]);
    for p in &r.points {
        t.row([
            p.phase.clone(),
            p.vms.to_string(),
            p.threads.to_string(),
            format!("{:.0}", p.accesses_per_s),
            format!("{:.2}", p.speedup),
            format!("{:.0}", p.ideal_per_s),
            table::ns(p.p50_ns),
            table::ns(p.p99_ns),
            table::ns(p.max_ns),
            format!("{:.0} %", p.fast_path_share * 100.0),
            p.gpu_runs.to_string(),
        ]);
    }
    format!(
        "{}\n{} thread(s) per VM, {} ms per phase, one access in {} a doorbell (the rest register \
         reads); idle: no GPU work, gpu: every VM's driver runs madd 64 meanwhile. {} CPUs; the \
         host's fast path {}.",
        t.render(),
        r.threads_per_vm,
        r.duration_ms,
        r.doorbell_every,
        r.cpus,
        if r.fast_path { "on" } else { "off" }
    )
}

fn write_svg(r: &TrapsReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let max_vms = r.points.iter().map(|p| p.vms).max().unwrap_or(1) as f64;
    let max_y = r
        .points
        .iter()
        .map(|p| p.accesses_per_s.max(p.ideal_per_s))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Trapped accesses per second against VMs ({} CPUs)", r.cpus),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..max_vms * 1.05, 0f64..max_y)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("VMs")
        .y_desc("accesses / s")
        .draw()
        .map_err(plot_err)?;
    let phase =
        |name: &str| -> Vec<&TrapsPoint> { r.points.iter().filter(|p| p.phase == name).collect() };
    for (k, name) in ["idle", "gpu"].iter().enumerate() {
        let pts = phase(name);
        let color = COLORS[k % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.vms as f64, p.accesses_per_s)),
                color.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(format!("measured, {name}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.vms as f64, p.accesses_per_s), 4, color.filled())),
            )
            .map_err(plot_err)?;
    }
    let ideal = phase("idle");
    chart
        .draw_series(LineSeries::new(
            ideal.iter().map(|p| (p.vms as f64, p.ideal_per_s)),
            BLACK.mix(0.5),
        ))
        .map_err(plot_err)?
        .label("linear ideal (idle)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.5)));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
