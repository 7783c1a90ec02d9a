//! `gpuvm exp overhead`: every workload under the schemes of GPUvm's overhead figure —
//! `native` (the driver straight on the simulated GPU), `fv-naive` (vGPU, eager shadowing),
//! `fv-lazy` (vGPU, lazy shadowing), `fv` (vGPU, incremental shadowing) and `pv` (vGPU,
//! para-virtual page-table updates) — with time relative to native, exits and shadow work.
//!
//! In-process (the default) every BAR access is a call into the device model, not a VM exit:
//! wall time is then host CPU time of the simulator and the device model. The *modeled* time
//! adds what the exits would cost under KVM: wall + exits x the exit cost (`--exit-ns`,
//! default 25 µs; `--calibrate` measures it with `gpuvm calibrate`'s guest first).
//!
//! With `--kvm` every scheme runs in a real KVM guest (`crate::kvm::scheme`): `native` (the
//! simulated GPU passed through, no device model), `fv-naive` (every BAR access traps, eager
//! shadowing), `fv` (BAR remap + lazy shadowing) and `pv` (BAR remap + para-virtual page-table
//! updates); wall time includes every real exit, and the schemes take turns within each
//! repetition so that they are measured side by side under the same machine load.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::profile::ShadowMode;
use gpuvm::sched::SchedParams;
use gpuvm_guest::workloads::Workload;
use gpuvm_harness::exp_overhead::{run_staged, ShadowWork, StagedOptions};
use gpuvm_harness::{run_native, NativeOptions, VirtOptions};
use serde::Serialize;

use crate::table::{self, Table};

/// Exit cost used for the modeled time when none is measured: PVM ring-3 exits on this machine
/// (docs/kvm.md: 25 µs quiet, 30-60 µs under load).
pub const DEFAULT_EXIT_NS: u64 = 25_000;

/// Options of `gpuvm exp overhead`.
#[derive(Args, Debug)]
pub struct OverheadArgs {
    /// Problem size N (matrices N x N).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    size: u32,
    /// Workload (repeatable) or `all`.
    #[arg(long = "workload", value_name = "W", default_value = "all")]
    workloads: Vec<String>,
    /// Runs per scheme; the table shows each workload's median wall time.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// Exit cost for the modeled time, ns.
    #[arg(long, value_name = "NS", default_value_t = DEFAULT_EXIT_NS)]
    exit_ns: u64,
    /// Measure the exit cost first (as `gpuvm calibrate --count 2000`; needs /dev/kvm) and use
    /// it for the modeled time instead of --exit-ns.
    #[arg(long)]
    calibrate: bool,
    /// Run every scheme in a real KVM guest: native (GPU passed through), fv-naive (every BAR
    /// access traps, eager shadowing), fv (BAR remap, lazy shadowing), pv (BAR remap, PV page
    /// tables).
    #[arg(long)]
    kvm: bool,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// Write an SVG bar chart (time relative to native per workload and scheme) to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// A scheme of the overhead figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// The driver on the bare GPU.
    Native,
    /// A vGPU in the given shadow mode.
    Vgpu(&'static str, ShadowMode),
}

impl Scheme {
    /// The schemes run with `--kvm`, in the order reported (`fv` is BAR remap + lazy there).
    pub const KVM: [Scheme; 4] = [
        Scheme::Native,
        Scheme::Vgpu("fv-naive", ShadowMode::Eager),
        Scheme::Vgpu("fv", ShadowMode::Lazy),
        Scheme::Vgpu("pv", ShadowMode::Pv),
    ];

    /// The schemes of a run.
    pub fn list(kvm: bool) -> &'static [Scheme] {
        if kvm {
            &Scheme::KVM
        } else {
            &Scheme::ALL
        }
    }

    /// The KVM scheme of the same name.
    pub fn kvm(self) -> Option<crate::kvm::scheme::KvmScheme> {
        crate::kvm::scheme::KvmScheme::ALL
            .into_iter()
            .find(|k| k.name() == self.name())
    }

    /// Every scheme, in the order reported.
    pub const ALL: [Scheme; 5] = [
        Scheme::Native,
        Scheme::Vgpu("fv-naive", ShadowMode::Eager),
        Scheme::Vgpu("fv-lazy", ShadowMode::Lazy),
        Scheme::Vgpu("fv", ShadowMode::Incremental),
        Scheme::Vgpu("pv", ShadowMode::Pv),
    ];

    /// The scheme's name.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Native => "native",
            Scheme::Vgpu(n, _) => n,
        }
    }
}

/// One workload under one scheme.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadResult {
    /// Workload name.
    pub workload: String,
    /// Scheme name.
    pub scheme: &'static str,
    /// Shadow mode (`none` for native).
    pub shadow_mode: &'static str,
    /// Median wall time over the runs, ns (host time in-process; real time with --kvm).
    pub wall_ns: u64,
    /// wall_ns / native wall_ns.
    pub relative_to_native: f64,
    /// In-process: wall_ns + exits x exit_ns; with --kvm: wall_ns (already has the exits).
    pub modeled_ns: u64,
    /// modeled_ns / native modeled_ns.
    pub modeled_relative_to_native: f64,
    /// Exits into the device model (BAR accesses; 0 for native in-process). With --kvm: MMIO
    /// exits the VMM dispatched, coalesced writes included (native too: its BAR accesses exit
    /// to the simulated GPU).
    pub exits: u64,
    /// Modeled GPU time, ns.
    pub gpu_ns: u64,
    /// Shadow page-table work during the workload.
    pub shadow: ShadowWork,
    /// Verified in every run.
    pub verified: bool,
}

/// Bring-up (driver init and the first channel) under one scheme.
#[derive(Debug, Clone, Serialize)]
pub struct Bringup {
    /// Scheme name.
    pub scheme: &'static str,
    /// Wall time, ns (median).
    pub wall_ns: u64,
    /// Exits.
    pub exits: u64,
    /// Shadow work.
    pub shadow: ShadowWork,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadReport {
    /// "in-process" or "kvm".
    pub backend: &'static str,
    /// Problem size.
    pub size: u32,
    /// Runs per scheme.
    pub repeat: u32,
    /// Exit cost in the modeled time, ns.
    pub exit_ns: u64,
    /// "default", "option" or "calibrated".
    pub exit_ns_source: &'static str,
    /// One entry per workload and scheme.
    pub results: Vec<OverheadResult>,
    /// Bring-up per scheme (not in `results`).
    pub bringup: Vec<Bringup>,
    /// Plot written, if any.
    pub svg: Option<String>,
}

impl OverheadReport {
    /// True if every workload verified under every scheme.
    pub fn all_verified(&self) -> bool {
        self.results.iter().all(|r| r.verified)
    }
}

/// One measured workload of one run.
#[derive(Debug, Clone, Default)]
struct Sample {
    wall_ns: u64,
    exits: u64,
    gpu_ns: u64,
    shadow: ShadowWork,
    verified: bool,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// `runs[r][i]`: run r, workload i (index 0 = bring-up) -> the median per workload.
fn combine(runs: &[Vec<Sample>]) -> Vec<Sample> {
    let n = runs.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| {
            let first = runs[0][i].clone();
            Sample {
                wall_ns: median(runs.iter().map(|r| r[i].wall_ns).collect()),
                verified: runs.iter().all(|r| r[i].verified),
                ..first
            }
        })
        .collect()
}

/// Runs the schemes. The first workload of every run is a `loop` warm-up that creates the
/// channel; it is reported with bring-up.
pub fn measure(
    size: u32,
    workloads: &[Workload],
    repeat: u32,
    exit_ns: u64,
    kvm: bool,
    progress: &dyn Fn(Scheme, u32),
) -> anyhow::Result<(Vec<OverheadResult>, Vec<Bringup>)> {
    let mut list = vec![Workload::Loop];
    list.extend_from_slice(workloads);
    let schemes = Scheme::list(kvm);
    // Repetition-major: every scheme runs once per repetition, so they share the machine's load.
    let mut runs: Vec<Vec<Vec<Sample>>> = vec![Vec::new(); schemes.len()];
    for r in 0..repeat {
        for (i, &scheme) in schemes.iter().enumerate() {
            progress(scheme, r);
            runs[i].push(run_once(scheme, size, &list, kvm)?);
        }
    }
    let per_scheme: Vec<(Scheme, Vec<Sample>)> = schemes
        .iter()
        .zip(&runs)
        .map(|(&s, r)| (s, combine(r)))
        .collect();
    let native = per_scheme[0].1.clone();
    let modeled = |s: &Sample| {
        if kvm {
            s.wall_ns
        } else {
            s.wall_ns + s.exits * exit_ns
        }
    };
    let mut results = Vec::new();
    let mut bringup = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        for (scheme, samples) in &per_scheme {
            let s = &samples[2 + i];
            let n = &native[2 + i];
            // Native runs have no exits; its modeled time is its wall time.
            let nm = n.wall_ns.max(1);
            results.push(OverheadResult {
                workload: w.name().to_string(),
                scheme: scheme.name(),
                shadow_mode: match scheme {
                    Scheme::Native => "none",
                    Scheme::Vgpu(_, m) => m.name(),
                },
                wall_ns: s.wall_ns,
                relative_to_native: s.wall_ns as f64 / nm as f64,
                modeled_ns: modeled(s),
                modeled_relative_to_native: modeled(s) as f64 / nm as f64,
                exits: s.exits,
                gpu_ns: s.gpu_ns,
                shadow: s.shadow,
                verified: s.verified,
            });
        }
    }
    for (scheme, samples) in &per_scheme {
        bringup.push(Bringup {
            scheme: scheme.name(),
            wall_ns: samples[0].wall_ns + samples[1].wall_ns,
            exits: samples[0].exits + samples[1].exits,
            shadow: samples[0].shadow.plus(samples[1].shadow),
        });
    }
    Ok((results, bringup))
}

/// One run: bring-up, then each workload of `list`.
fn run_once(
    scheme: Scheme,
    size: u32,
    list: &[Workload],
    kvm: bool,
) -> anyhow::Result<Vec<Sample>> {
    match scheme {
        _ if kvm => run_kvm_once(scheme, size, list),
        Scheme::Native => {
            let opts = NativeOptions {
                size,
                clock: ClockKind::Sim,
                workloads: list.to_vec(),
                ..NativeOptions::default()
            };
            // On a thread of its own, as the vGPU schemes run their guest driver (one thread
            // per VM): both then start from a fresh thread's heap, not native from the main
            // thread's heap that the previous repetitions warmed.
            let r = std::thread::scope(|s| s.spawn(|| run_native(&opts)).join())
                .map_err(|_| anyhow::anyhow!("the native run's thread panicked"))?
                .context("native run")?;
            Ok(std::iter::once(&r.init)
                .chain(&r.workloads)
                .map(|w| Sample {
                    wall_ns: w.wall_ns,
                    exits: 0,
                    gpu_ns: w.gpu_ns,
                    shadow: ShadowWork::default(),
                    verified: w.verified,
                })
                .collect())
        }
        Scheme::Vgpu(name, mode) => {
            let r = run_staged(
                &StagedOptions {
                    virt: VirtOptions {
                        vms: 1,
                        size,
                        clock: ClockKind::Sim,
                        shadow: mode,
                        workloads: list.to_vec(),
                        ..VirtOptions::default()
                    },
                    policy: None,
                    params: SchedParams::default(),
                    weights: Vec::new(),
                    barrier_after: None,
                },
                &|_, _, _| {},
            )
            .with_context(|| format!("{name} run"))?;
            let vm = r.vms.first().context("no VM")?;
            Ok(std::iter::once(&vm.init)
                .chain(&vm.workloads)
                .map(|p| Sample {
                    wall_ns: p.run.wall_ns,
                    exits: p.exits(),
                    gpu_ns: p.run.gpu_ns,
                    shadow: p.shadow,
                    verified: p.run.verified,
                })
                .collect())
        }
    }
}

/// One run of `scheme` in a real KVM guest.
fn run_kvm_once(scheme: Scheme, size: u32, list: &[Workload]) -> anyhow::Result<Vec<Sample>> {
    let name = scheme.name();
    let k = scheme
        .kvm()
        .with_context(|| format!("{name} has no KVM counterpart"))?;
    let opts = crate::kvm::KvmOptions {
        vms: 1,
        size,
        scheme: Some(k),
        workloads: list.to_vec(),
        echo_console: false,
        ..crate::kvm::KvmOptions::default()
    };
    let r = crate::kvm::run_kvm(&opts).with_context(|| format!("{name} under KVM"))?;
    let vm = r.vms.first().context("no VM")?;
    let ok = vm.kvm.stopped.is_none();
    // Under KVM the shadow counters are only available for the whole run: shadow work is
    // reported with bring-up.
    let mut out: Vec<Sample> = std::iter::once(&vm.init)
        .chain(&vm.workloads)
        .map(|w| Sample {
            wall_ns: w.wall_ns,
            exits: w.mmio_reads + w.mmio_writes,
            gpu_ns: w.gpu_ns,
            shadow: ShadowWork::default(),
            verified: ok && w.verified,
        })
        .collect();
    let s = &vm.stats.shadow;
    out[0].shadow = ShadowWork {
        rebuilds: s.rebuilds,
        ptes_shadowed: s.ptes_shadowed,
        entry_updates: s.entry_updates,
        pv_batches: s.pv_batches,
    };
    Ok(out)
}

/// Runs the command.
pub fn run(a: &OverheadArgs) -> anyhow::Result<bool> {
    let workloads = super::workload_list(&a.workloads)?;
    if a.kvm {
        crate::kvm::open_kvm()?;
    }
    let (exit_ns, source) = if a.calibrate {
        let c = crate::calibrate::measure(2000)?;
        (c.vgpu_exit_ns, "calibrated")
    } else if a.exit_ns != DEFAULT_EXIT_NS {
        (a.exit_ns, "option")
    } else {
        (DEFAULT_EXIT_NS, "default")
    };
    let schemes = Scheme::list(a.kvm);
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new(u64::from(a.repeat) * schemes.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>12} [{bar:40}] {pos}/{len} runs, {elapsed}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        pb
    });
    let progress = |s: Scheme, r: u32| {
        if let Some(pb) = &bar {
            let i = schemes.iter().position(|x| *x == s).unwrap_or(0);
            pb.set_message(s.name());
            pb.set_position(u64::from(r) * schemes.len() as u64 + i as u64);
        }
    };
    let (results, bringup) = measure(a.size, &workloads, a.repeat, exit_ns, a.kvm, &progress)?;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let mut report = OverheadReport {
        backend: if a.kvm { "kvm" } else { "in-process" },
        size: a.size,
        repeat: a.repeat,
        exit_ns,
        exit_ns_source: source,
        results,
        bringup,
        svg: None,
    };
    if let Some(p) = &a.svg {
        write_svg(&report, p).with_context(|| format!("writing {}", p.display()))?;
        report.svg = Some(p.display().to_string());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(report.all_verified())
}

fn rel(x: f64) -> String {
    format!("{x:.2}x")
}

/// The tables.
pub fn render(r: &OverheadReport) -> String {
    let mut out = format!(
        "gpuvm exp overhead: size {}, {} ({} runs per scheme, median wall time)\n",
        r.size,
        if r.backend == "kvm" {
            "every scheme in a real KVM guest (native = GPU passed through)"
        } else {
            "in-process: wall = host time, no real exits"
        },
        r.repeat
    );
    if r.backend == "kvm" {
        out += "modeled = wall (real exits already included); exits count coalesced writes too\n\n";
    } else {
        out += &format!(
            "modeled = wall + exits x {} per exit ({})\n\n",
            table::ns(r.exit_ns),
            r.exit_ns_source
        );
    }
    let mut t = Table::new([
        "workload",
        "scheme",
        "wall",
        "wall/native",
        "modeled",
        "modeled/native",
        "exits",
        "rebuilds",
        "PTEs shadowed",
        "entry updates",
        "PV batches",
        "verified",
    ]);
    for x in &r.results {
        t.row([
            x.workload.clone(),
            x.scheme.to_string(),
            table::ns(x.wall_ns),
            rel(x.relative_to_native),
            table::ns(x.modeled_ns),
            rel(x.modeled_relative_to_native),
            x.exits.to_string(),
            x.shadow.rebuilds.to_string(),
            x.shadow.ptes_shadowed.to_string(),
            x.shadow.entry_updates.to_string(),
            x.shadow.pv_batches.to_string(),
            if x.verified { "yes" } else { "NO" }.to_string(),
        ]);
    }
    out += &t.render();
    let mut b = Table::new([
        "bring-up",
        "wall",
        "exits",
        "rebuilds",
        "PTEs shadowed",
        "entry updates",
        "PV batches",
    ]);
    for x in &r.bringup {
        b.row([
            x.scheme.to_string(),
            table::ns(x.wall_ns),
            x.exits.to_string(),
            x.shadow.rebuilds.to_string(),
            x.shadow.ptes_shadowed.to_string(),
            x.shadow.entry_updates.to_string(),
            x.shadow.pv_batches.to_string(),
        ]);
    }
    out += "\ndriver bring-up + first channel (a loop warm-up), per scheme\n";
    out += &b.render();
    let ok = r.results.iter().filter(|x| x.verified).count();
    out += &format!("\n{ok}/{} runs verified\n", r.results.len());
    if let Some(p) = &r.svg {
        out += &format!("plot: {p}\n");
    }
    out
}

/// A value of a result to plot.
type Metric = fn(&OverheadResult) -> f64;

/// Grouped bars: per workload one bar per scheme, two panels (wall and modeled time relative
/// to native, log scale).
pub fn write_svg(r: &OverheadReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let schemes: Vec<&str> = Scheme::list(r.backend == "kvm")
        .iter()
        .map(|s| s.name())
        .collect();
    let mut wl: Vec<&str> = Vec::new();
    for x in &r.results {
        if !wl.contains(&x.workload.as_str()) {
            wl.push(&x.workload);
        }
    }
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(super::plot::plot_err)?;
    let panels: [(&str, Metric); 2] = [
        ("wall time relative to native", |x| x.relative_to_native),
        (
            "modeled time (wall + exits x exit cost) relative to native",
            |x| x.modeled_relative_to_native,
        ),
    ];
    let y_max = r
        .results
        .iter()
        .map(|x| x.relative_to_native.max(x.modeled_relative_to_native))
        .fold(1.0f64, f64::max)
        * 2.0;
    for ((title, f), area) in panels.iter().zip(root.split_evenly((2, 1))) {
        let caption = if r.backend == "kvm" && title.starts_with("modeled") {
            "KVM: real exits (modeled = wall)".to_string()
        } else {
            format!("{title}, size {}", r.size)
        };
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..wl.len() as f64, (0.1f64..y_max).log_scale())
            .map_err(super::plot::plot_err)?;
        let names = wl.clone();
        chart
            .configure_mesh()
            .x_labels(wl.len() * 2 + 1)
            .x_label_formatter(&move |x: &f64| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 1e-6 {
                    names.get(i).map_or(String::new(), |s| s.to_string())
                } else {
                    String::new()
                }
            })
            .y_desc("x native")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(super::plot::plot_err)?;
        let bw = 0.8 / schemes.len() as f64;
        for (si, s) in schemes.iter().enumerate() {
            let color = super::plot::COLORS[si % super::plot::COLORS.len()];
            let bars: Vec<_> = r
                .results
                .iter()
                .filter(|x| x.scheme == *s)
                .filter_map(|x| {
                    let wi = wl.iter().position(|w| *w == x.workload)? as f64;
                    let x0 = wi + 0.1 + si as f64 * bw;
                    Some(Rectangle::new(
                        [(x0, 0.1), (x0 + bw * 0.9, f(x).max(0.1))],
                        color.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(super::plot::plot_err)?
                .label(*s)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        super::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present().map_err(super::plot::plot_err)?;
    Ok(())
}
