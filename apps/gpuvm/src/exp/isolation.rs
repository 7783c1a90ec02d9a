//! `gpuvm exp isolation`: performance isolation of VMs with short and long kernels under the
//! FIFO, CREDIT and BAND schedulers (`gpuvm_harness::exp_isolation`; `docs/experiments.md`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_harness::exp_isolation::{
    run_isolation, IsolationOptions, IsolationReport, KernelKind, PolicyResult, Progress,
};

use crate::table::{self, Table};

use super::plot::{draw_legend, plot_err, COLORS};

/// Options of `gpuvm exp isolation`.
#[derive(Args, Debug)]
pub struct IsolationArgs {
    /// Scheduling policy: fifo, credit, band, band-gdev (BAND with Gdev's fixed time buffer,
    /// docs/scheduling.md §5), a comma-separated list of them, or all (fifo, credit, band);
    /// each in its own run.
    #[arg(long, default_value = "all")]
    sched: String,
    /// Number of VMs (the documented mixes are for 2, 4 and 8).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=16))]
    vms: u32,
    /// Modeled GPU time to run, in seconds (from the end of driver bring-up).
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Time base: `sim` is deterministic simulated time (fast), `real` follows the host clock.
    #[arg(long, default_value = "sim")]
    clock: ClockKind,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of each VM's share over time (one panel per policy) to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Sampling window of the time series, in milliseconds.
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Kernels a short-kernel VM keeps outstanding (1: it submits the next one when the last
    /// finished, as Gdev's LUD).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    short_outstanding: u32,
    /// Modeled GPU time of a short kernel, microseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    short_us: u64,
    /// Modeled GPU time of a long kernel, microseconds (below the host's 2 s hang watchdog).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    long_us: u64,
    /// Kernels a long-kernel VM keeps outstanding.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    long_outstanding: u32,
    /// A guest's reaction time in microseconds: after a fence signals, the VM submits again
    /// only this much later (the simulated guests otherwise react in no modeled time, so
    /// BAND's waits never idle the GPU).
    #[arg(long, default_value_t = 0)]
    think_us: u64,
    /// Scheduler parameters as TOML (`period_ns`, `credit_limit_ns`, `credit_bound`,
    /// `util_window_ns`, `wait_ns`, `wait_chances`, `arrival_yield`, `requeue_on_lost_wait`,
    /// `adaptive_wait`, `wait_max_ns`, `wait_margin_pct`, `wait_max_ratio`, `util_of_busy`;
    /// missing ones keep their defaults, see docs/scheduling.md).
    #[arg(long, value_name = "FILE")]
    params: Option<PathBuf>,
    /// Cap VM N at PCT percent of GPU time (`--cap 0=30`; repeat per VM). Applied under
    /// every policy (a cap is a ceiling whatever the policy); the report shows each capped VM's
    /// GPU time over elapsed time next to its cap.
    #[arg(long, value_name = "VM=PCT")]
    cap: Vec<String>,
    /// Hostile tenants in place of the long-kernel VMs: `parked` submits "acquire a semaphore,
    /// then a long kernel" on 4 channels and releases each from its CPU once the channel shows
    /// the acquire pending, so its kernels become runnable without a doorbell
    /// (docs/scheduling.md, "Time slices"). The table adds each VM's worst wait, preemptions
    /// and resumes.
    #[arg(long)]
    adversary: Option<gpuvm_harness::exp_isolation::Adversary>,
    /// The host's time slice in milliseconds (`HostConfig::timeslice_ns`; 0: none).
    #[arg(long, default_value_t = 10.0)]
    timeslice_ms: f64,
    /// Run every VM as a real KVM guest (docs/kvm.md) on the real clock: the same mix, each VM
    /// streaming its kernels for `--duration` seconds after a start gate; shares sampled from
    /// the VMM side every 2 ms. `--json` adds `backend: "kvm"` and a `kvm` array (per policy:
    /// verified, kernels and MMIO exits per VM, bring-up time).
    #[arg(long)]
    kvm: bool,
}

fn policies(name: &str) -> anyhow::Result<Vec<Policy>> {
    if name == "all" {
        return Ok(Policy::ALL.to_vec());
    }
    name.split(',')
        .map(|n| {
            n.trim().parse::<Policy>().map_err(|_| {
                anyhow::anyhow!(
                    "unknown scheduler '{n}' (expected fifo, credit, band, band-gdev, equal-share, fixed-share or all)"
                )
            })
        })
        .collect()
}

fn options(a: &IsolationArgs) -> anyhow::Result<IsolationOptions> {
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 86_400.0) {
        anyhow::bail!("--duration must be a positive number of seconds (at most a day)");
    }
    let params = match &a.params {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str::<SchedParams>(&text)
                .with_context(|| format!("parsing {}", p.display()))?
        }
        None => SchedParams::default(),
    };
    params
        .validate()
        .map_err(|e| anyhow::anyhow!("scheduler parameters: {e}"))?;
    Ok(IsolationOptions {
        policies: policies(&a.sched)?,
        vms: a.vms as usize,
        duration_ns: (a.duration * 1e9).round() as u64,
        clock: a.clock,
        window_ns: a.window_ms.max(1) * 1_000_000,
        params,
        short_outstanding: a.short_outstanding as usize,
        long_outstanding: a.long_outstanding as usize,
        think_ns: a.think_us.saturating_mul(1000),
        short_ns: a.short_us * 1000,
        long_ns: a.long_us * 1000,
        caps: a
            .cap
            .iter()
            .map(|c| {
                let (vm, p) = c
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--cap '{c}': expected VM=PCT"))?;
                let vm: u32 = vm
                    .parse()
                    .ok()
                    .filter(|&v| v < a.vms)
                    .ok_or_else(|| anyhow::anyhow!("--cap '{c}': VM must be 0..{}", a.vms))?;
                let p: f64 = p
                    .parse()
                    .ok()
                    .filter(|p: &f64| *p > 0.0 && *p <= 100.0)
                    .ok_or_else(|| anyhow::anyhow!("--cap '{c}': PCT must be in (0, 100]"))?;
                Ok((vm, (p * 10_000.0) as u32))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
        adversary: a.adversary,
        timeslice_ns: {
            if !(a.timeslice_ms.is_finite() && (0.0..=10_000.0).contains(&a.timeslice_ms)) {
                anyhow::bail!("--timeslice-ms must be 0..=10000");
            }
            (a.timeslice_ms * 1e6).round() as u64
        },
        ..IsolationOptions::default()
    })
}

pub(super) fn run(a: &IsolationArgs) -> anyhow::Result<bool> {
    let opts = options(a)?;
    if a.kvm {
        if opts.adversary.is_some() {
            anyhow::bail!("--adversary runs in-process only (drop --kvm)");
        }
        return isolation_kvm(a, &opts);
    }
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let total = opts.duration_ns / 1_000_000 * opts.policies.len() as u64;
        let pb = indicatif::ProgressBar::new(total);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>8} [{bar:40}] {pos}/{len} ms of modeled time, {elapsed}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        pb
    });
    let mut on_progress = |p: Progress| {
        if let Some(pb) = &bar {
            pb.set_message(p.policy.name());
            pb.set_position((p.index as u64 * p.total_ns + p.done_ns) / 1_000_000);
        }
    };
    let wall = std::time::Instant::now();
    let report = run_isolation(&opts, &mut on_progress).context("isolation experiment")?;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let wall = wall.elapsed();
    if let Some(path) = &a.svg {
        write_svg(&report, path).with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        if let (Some(path), Some(obj)) = (&a.svg, v.as_object_mut()) {
            obj.insert("svg".into(), path.display().to_string().into());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&report));
        println!("host time: {:.2} s", wall.as_secs_f64());
        if let Some(path) = &a.svg {
            println!("plot: {}", path.display());
        }
    }
    Ok(true)
}

/// `gpuvm exp isolation --kvm`.
fn isolation_kvm(a: &IsolationArgs, opts: &IsolationOptions) -> anyhow::Result<bool> {
    let n = opts.policies.len();
    // Progress: per policy, an estimate of bring-up (a few seconds) plus the duration.
    let per_policy = opts.duration_ns as f64 / 1e9 + 3.0;
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new((per_policy * n as f64 * 10.0) as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>8} [{bar:40}] {elapsed} of about {duration} (KVM guests, real time)",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        pb
    });
    let wall = std::time::Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let report = std::thread::scope(|s| {
        if let Some(pb) = &bar {
            let done = &done;
            s.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    pb.set_position((wall.elapsed().as_secs_f64() * 10.0) as u64);
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            });
        }
        let r = super::isolation_kvm::run(opts, 16, &mut |i| {
            if let Some(pb) = &bar {
                pb.set_message(opts.policies[i].name());
            }
        });
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    })
    .context("isolation experiment under KVM")?;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let wall = wall.elapsed();
    if let Some(path) = &a.svg {
        write_svg(&report.report, path).with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        if let (Some(path), Some(obj)) = (&a.svg, v.as_object_mut()) {
            obj.insert("svg".into(), path.display().to_string().into());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&report.report));
        let mut t = Table::new([
            "policy",
            "verified",
            "kernels per VM",
            "MMIO exits per kernel",
            "bring-up",
        ]);
        for k in &report.kvm {
            t.row([
                k.policy.name().to_string(),
                if k.verified { "yes" } else { "NO" }.to_string(),
                k.kernels
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                k.stream_exits
                    .iter()
                    .zip(&k.kernels)
                    .map(|(e, n)| format!("{:.1}", *e as f64 / (*n).max(1) as f64))
                    .collect::<Vec<_>>()
                    .join(", "),
                table::ns(k.bring_up_ns),
            ]);
        }
        println!("\nKVM guests (real clock)\n{}", t.render());
        println!("host time: {:.2} s", wall.as_secs_f64());
        if let Some(path) = &a.svg {
            println!("plot: {}", path.display());
        }
    }
    for k in &report.kvm {
        for s in k.stopped.iter().flatten() {
            eprintln!("gpuvm: {}: {s}", k.policy.name());
        }
    }
    Ok(report.all_verified())
}

fn kind(k: KernelKind, ns: u64) -> String {
    match k {
        KernelKind::Short => format!("short {}", table::ns(ns)),
        KernelKind::Long => format!("long {}", table::ns(ns)),
        KernelKind::Parked => format!("parked {}", table::ns(ns)),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// The tables of `gpuvm exp isolation`.
pub fn render(r: &IsolationReport) -> String {
    let from = r.policies.first().map_or(0, |p| p.measured_from_ns);
    let mut out = format!(
        "gpuvm exp isolation: {} VMs on the simulated GF100, {} s of GPU time ({} clock); shares measured from {:.3} s, when every VM runs\n\n",
        r.vms,
        r.duration_ns as f64 / 1e9,
        match r.clock {
            ClockKind::Sim => "simulated",
            ClockKind::Real => "real",
        },
        from as f64 / 1e9,
    );
    let mut t = Table::new([
        "policy", "vm", "kernels", "out", "weight", "starts", "target", "achieved", "error",
        "GPU time",
    ]);
    for p in &r.policies {
        for v in &p.vms {
            t.row([
                p.policy.name().to_string(),
                format!("vm{}", v.plan.vm),
                kind(v.plan.kind, v.plan.kernel_ns),
                v.plan.outstanding.to_string(),
                v.plan.weight.to_string(),
                format!("{:.2} s", v.plan.start_ns as f64 / 1e9),
                pct(v.target_share),
                pct(v.achieved_share),
                pct(v.error),
                table::ns(v.gpu_ns),
            ]);
        }
    }
    out += &t.render();
    out += "\n";
    out += &summary(&r.policies);
    let slice = r.policies.first().map_or(0, |p| p.timeslice_ns);
    out += &format!(
        "\nworst wait of one kernel beyond its own duration, in steady state (from one utilisation window after all VMs run) and over the whole run (time slice {}):\n",
        table::ns(slice)
    );
    let mut w = Table::new([
        "policy",
        "vm",
        "kernels",
        "worst wait",
        "in slices",
        "whole run",
        "preempted",
        "resumed",
        "killed",
    ]);
    for p in &r.policies {
        for v in &p.vms {
            w.row([
                p.policy.name().to_string(),
                format!("vm{}", v.plan.vm),
                kind(v.plan.kind, v.plan.kernel_ns),
                table::ns(v.worst_wait_ns),
                if slice > 0 {
                    format!("{:.2}", v.worst_wait_ns as f64 / slice as f64)
                } else {
                    "-".into()
                },
                table::ns(v.worst_wait_all_ns),
                v.preemptions.to_string(),
                v.resumes.to_string(),
                v.watchdog_kills.to_string(),
            ]);
        }
    }
    out += &w.render();
    out += "\n";
    for p in &r.policies {
        for v in &p.vms {
            if let Some(cap) = v.cap {
                out += &format!(
                    "{} vm{}: cap {}, GPU time {} of elapsed time (off by {})\n",
                    p.policy.name(),
                    v.plan.vm,
                    pct(cap),
                    pct(v.busy_fraction),
                    pct((v.busy_fraction - cap).abs())
                );
            }
        }
    }
    out
}

fn summary(ps: &[PolicyResult]) -> String {
    let mut t = Table::new([
        "policy",
        "mean error",
        "max error",
        "Jain index",
        "utilization",
        "waits (taken)",
        "demotions",
        "dispatched",
    ]);
    for p in ps {
        t.row([
            p.policy.name().to_string(),
            pct(p.mean_error),
            pct(p.max_error),
            format!("{:.4}", p.jain_index),
            pct(p.utilization),
            format!("{} ({})", p.waits, p.waits_taken),
            p.demotions.to_string(),
            p.dispatched.to_string(),
        ]);
    }
    t.render()
}

/// Plots each VM's share of each window over time, one panel per policy, with each VM's
/// target as a thin line (SVG; text is left to the viewer's fonts).
pub fn write_svg(r: &IsolationReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    let panels = r.policies.len().max(1);
    let height = 60 + 300 * panels as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (title, body) = root.split_vertically(40);
    title
        .titled(
            &format!(
                "GPU share per VM over time, {} VMs, {} ms windows",
                r.vms,
                r.window_ns / 1_000_000
            ),
            ("sans-serif", 22),
        )
        .map_err(plot_err)?;
    let t_max = r.duration_ns as f64 / 1e9;
    for (p, area) in r.policies.iter().zip(body.split_evenly((panels, 1))) {
        let mut chart = ChartBuilder::on(&area)
            .caption(
                format!(
                    "{}: mean error {:.1} %, max {:.1} %, Jain {:.3}",
                    p.policy.name(),
                    p.mean_error * 100.0,
                    p.max_error * 100.0,
                    p.jain_index
                ),
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..t_max, 0f64..1.0f64)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(match r.clock {
                ClockKind::Sim => "modeled time (s)",
                ClockKind::Real => "time (s)",
            })
            .y_desc("share of the window")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(plot_err)?;
        for (i, v) in p.vms.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    [(0.0, v.target_share), (t_max, v.target_share)],
                    color.mix(0.35).stroke_width(1),
                ))
                .map_err(plot_err)?;
            let points = p.series.t_ns.iter().zip(&p.series.shares[i]);
            chart
                .draw_series(LineSeries::new(
                    points.map(|(&t, &s)| (t as f64 / 1e9, s)),
                    color.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(format!(
                    "vm{} ({}, weight {})",
                    v.plan.vm,
                    kind(v.plan.kind, v.plan.kernel_ns),
                    v.plan.weight
                ))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_and_options() {
        assert_eq!(policies("all").unwrap(), Policy::ALL.to_vec());
        assert_eq!(policies("band").unwrap(), vec![Policy::Band]);
        let e = policies("lottery").unwrap_err().to_string();
        assert!(
            e.contains("expected fifo, credit, band, band-gdev, equal-share, fixed-share or all"),
            "{e}"
        );
        assert_eq!(
            policies("band-gdev,band").unwrap(),
            vec![Policy::BandGdev, Policy::Band]
        );
    }

    #[test]
    fn table_and_svg_of_a_short_run() {
        let opts = IsolationOptions {
            policies: vec![Policy::Fifo, Policy::Band],
            duration_ns: 600_000_000,
            ..IsolationOptions::default()
        };
        let r = run_isolation(&opts, &mut |_| {}).unwrap();
        let text = render(&r);
        assert!(text.contains("2 VMs"), "{text}");
        assert!(text.contains("short 500.0 us"), "{text}");
        assert!(text.contains("long 10.0 ms"), "{text}");
        assert!(text.contains("mean error"), "{text}");
        let path = std::env::temp_dir().join(format!("gpuvm-exp-{}.svg", std::process::id()));
        write_svg(&r, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        assert!(svg.contains("band: mean error"));
        assert!(svg.contains("vm1 (long 10.0 ms, weight 1)"));
        assert!(
            svg.matches("<polyline").count() >= 8,
            "lines for both VMs in both panels"
        );
    }
}
