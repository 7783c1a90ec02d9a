//! `gpuvm soak`: VMs with churn on one simulated GPU for a given time, then the leak and
//! fairness checks (`gpuvm_harness::soak`).
//!
//! In-process VMs (`--vms`) are created, run, destroyed, recreated and sometimes killed
//! mid-run by the library. Next to them, an in-process vfio-user daemon (the one `gpuvm serve`
//! runs) serves `--vfio-user-vms` vGPUs, and for each a loop of client *processes* (this binary
//! again, `gpuvm soak --client SOCKET`) connects over the socket, maps a memfd as guest RAM and
//! runs the guest driver's workloads through REGION_READ/REGION_WRITE: one client in
//! `--kill-one-in` is SIGKILLed after it said it started submitting, one in `--kill-one-in`
//! disconnects right after driver bring-up, the rest run to completion and report whether
//! each workload verified. The daemon recycles the vGPU after every client.
//!
//! A progress bar (indicatif) on a terminal; `--json` prints the report; `--svg` plots RSS,
//! VMs alive and verified workloads over time. Exit status 1 if a check failed.

use std::io::{BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gpuvm::clock::{Clock, ClockKind, RealClock};
use gpuvm::irq::IrqLine;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm_guest::hal::Bar;
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, FenceMode, Gpu};
use gpuvm_harness::soak::{run_soak, SoakOptions, SoakReport, SoakRig};
use gpuvm_harness::{InProcessDevice, InProcessHal};
use gpuvm_vfio_user::{Daemon, DaemonConfig, VmSpec};
use serde::Serialize;

use crate::kvm::device::VgpuDevice;
use crate::kvm::remote::RemoteVgpu;

/// Options of `gpuvm soak`.
#[derive(Args, Debug)]
pub struct SoakArgs {
    /// In-process VMs alive at once (each one thread, living life after life).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=60))]
    vms: u32,
    /// vGPUs served over vfio-user, each driven by a loop of client processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=4))]
    vfio_user_vms: u32,
    /// How long to keep starting lives and clients, seconds.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Workloads of one life, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "mmul,memcpy_htod,madd")]
    workloads: Vec<Workload>,
    /// Problem size.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=256))]
    size: u32,
    /// One life (and one client) in this many is killed mid-run; as many clients disconnect
    /// after bring-up (0: neither).
    #[arg(long, default_value_t = 4)]
    kill_one_in: u32,
    /// Seed of the kill choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds between memory samples.
    #[arg(long, default_value_t = 1.0)]
    sample_every: f64,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of RSS, VMs and verified workloads over time to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Internal: run one vfio-user client against SOCKET and print its result as JSON.
    #[arg(long, value_name = "SOCKET", hide = true)]
    client: Option<PathBuf>,
}

/// What the vfio-user client processes did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientTotals {
    /// Client processes started.
    pub started: u64,
    /// Ran every workload, each verified.
    pub completed: u64,
    /// Workloads verified by them.
    pub verified: u64,
    /// SIGKILLed mid-submission.
    pub killed: u64,
    /// Disconnected right after bring-up.
    pub disconnected: u64,
    /// Still running when the run ended plus [`CLIENT_GRACE`], then killed (starved or hung).
    pub unfinished: u64,
    /// Failed otherwise (unexpected).
    pub failed: u64,
    /// What failed.
    pub failures: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SoakOutput {
    /// The in-process part and the checks.
    pub soak: SoakReport,
    /// The vfio-user clients.
    pub clients: ClientTotals,
    /// Every check passed, the clients' included.
    pub ok: bool,
    /// Plot written, if any.
    pub svg: Option<String>,
}

/// How long after the end of the run a client may take to finish before it is cut off.
const CLIENT_GRACE: Duration = Duration::from_secs(60);

/// A vGPU behind a vfio-user socket as an in-process device (the daemon polls the GPU).
struct Remote(RemoteVgpu);

impl InProcessDevice for Remote {
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.0.bar_read(bar, offset, data);
    }
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.0.bar_write(bar, offset, data);
    }
    fn poll(&self) {}
    fn next_event_ns(&self) -> Option<u64> {
        None
    }
    fn set_irq_line(&self, _line: Arc<dyn IrqLine>) {}
}

/// A client's device: the vGPU behind `socket` with 18 MiB of shared RAM attached,
/// enumerated first as an OS does (the daemon takes a connection whose first config access
/// writes PCI_COMMAND for a restore and refuses it, docs/vfio-user.md), then memory decoding
/// and bus mastering on, as firmware would leave them.
fn remote_hal(socket: &Path) -> anyhow::Result<InProcessHal<Remote>> {
    let remote = RemoteVgpu::connect(socket)?;
    let ram: u64 = 18 << 20;
    let mem = crate::kvm::shared_ram::memfd_ram(ram)?;
    remote.attach_ram(&mem)?;
    let mut id = [0u8; 4];
    remote.config_read(0, &mut id);
    remote.config_write(4, &6u16.to_le_bytes());
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    Ok(InProcessHal::with_device(
        Remote(remote),
        clock,
        mem,
        0,
        ram,
    ))
}

/// `gpuvm soak --client SOCKET`: one client's life. Prints `started` before the first
/// workload and a JSON line at the end.
fn client(a: &SoakArgs, socket: &Path) -> anyhow::Result<bool> {
    let hal = remote_hal(socket)?;
    let cfg = DriverConfig {
        fence_mode: FenceMode::Poll,
        ..DriverConfig::default()
    };
    let mut drv = Gpu::init(hal, cfg).map_err(|e| anyhow::anyhow!("driver init: {e}"))?;
    println!("started");
    let mut verified = 0;
    for &w in &a.workloads {
        match workloads::run(&mut drv, w, a.size) {
            Ok(r) if r.verified => verified += 1,
            Ok(_) => anyhow::bail!("{} did not verify", w.name()),
            Err(e) => anyhow::bail!("{}: {e}", w.name()),
        }
    }
    let _ = workloads::release_channel(&mut drv);
    if let Some(f) = drv.hal().device().0.failure() {
        anyhow::bail!("{f}");
    }
    println!("{}", serde_json::json!({ "verified": verified }));
    Ok(true)
}

/// The client loop of one vfio-user vGPU until `deadline`.
fn client_loop(
    a: &SoakArgs,
    socket: &Path,
    index: u64,
    deadline: Instant,
    totals: &Mutex<ClientTotals>,
) {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
            t.failed += 1;
            t.failures.push(format!("current_exe: {e}"));
            return;
        }
    };
    let workloads: Vec<&str> = a.workloads.iter().map(|w| w.name()).collect();
    let mut n = 0u64;
    let mut rng = a.seed.wrapping_add(index.wrapping_mul(0x9e37_79b9));
    while Instant::now() < deadline {
        n += 1;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = u64::from(a.kill_one_in.max(1));
        let (kill, leave) = if a.kill_one_in == 0 || n < 2 {
            (false, false)
        } else {
            (rng.is_multiple_of(k), rng % k == 1)
        };
        let mut cmd = Command::new(&exe);
        cmd.args(["soak", "--size", &a.size.to_string(), "--workloads"])
            .arg(workloads.join(","))
            .arg("--client")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if leave {
            // Disconnects right after bring-up: no workload at all.
            cmd.env("GPUVM_SOAK_CLIENT_LEAVE", "1");
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                t.failed += 1;
                t.failures.push(format!("spawning a client: {e}"));
                return;
            }
        };
        totals.lock().unwrap_or_else(|p| p.into_inner()).started += 1;
        // The client's lines arrive on a channel, so that a client that cannot finish (starved,
        // hung) is cut off at the end of the run instead of holding the soak open.
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let cutoff = deadline + CLIENT_GRACE;
        let recv = |rx: &std::sync::mpsc::Receiver<String>| {
            rx.recv_timeout(cutoff.saturating_duration_since(Instant::now()))
                .ok()
        };
        let first = recv(&rx);
        let outcome = if first.is_none() && Instant::now() >= cutoff {
            let _ = child.kill();
            let _ = child.wait();
            "unfinished".to_string()
        } else if kill && first.as_deref() == Some("started") {
            // Mid-submission: a few ms into the first workload.
            std::thread::sleep(Duration::from_millis(1 + rng % 20));
            let _ = child.kill();
            let _ = child.wait();
            "killed".to_string()
        } else {
            let mut last = None;
            while let Some(l) = recv(&rx) {
                last = Some(l);
            }
            if Instant::now() >= cutoff && child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
                "unfinished".to_string()
            } else {
                let status = child.wait();
                match (first.as_deref(), last, status) {
                    (Some("started"), Some(last), Ok(s)) if s.success() => last,
                    (Some("left"), _, Ok(s)) if s.success() => "left".to_string(),
                    (f, l, s) => format!("failed: first {f:?}, last {l:?}, status {s:?}"),
                }
            }
        };
        let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
        if outcome == "killed" {
            t.killed += 1;
        } else if outcome == "unfinished" {
            t.unfinished += 1;
        } else if outcome == "left" {
            t.disconnected += 1;
        } else if let Ok(v) = serde_json::from_str::<serde_json::Value>(&outcome) {
            let ver = v["verified"].as_u64().unwrap_or(0);
            t.verified += ver;
            if ver == a.workloads.len() as u64 {
                t.completed += 1;
            } else {
                t.failed += 1;
                t.failures.push(format!("client {n}: {ver} verified"));
            }
        } else {
            t.failed += 1;
            t.failures.push(format!("client {n}: {outcome}"));
        }
    }
}

/// Runs the command.
pub fn run(a: &SoakArgs) -> anyhow::Result<bool> {
    if let Some(socket) = &a.client {
        if std::env::var_os("GPUVM_SOAK_CLIENT_LEAVE").is_some() {
            return client_leave(socket);
        }
        return client(a, socket);
    }
    anyhow::ensure!(
        a.duration > 0.0 && a.duration <= 86_400.0,
        "--duration must be in (0, 86400] seconds"
    );
    anyhow::ensure!(a.sample_every > 0.0, "--sample-every must be positive");
    let total = (a.vms + a.vfio_user_vms) as usize;
    let rig = SoakRig::new(total, ClockKind::Real).context("creating the GPU")?;
    let opts = SoakOptions {
        slots: a.vms as usize,
        duration: Duration::from_secs_f64(a.duration),
        workloads: a.workloads.clone(),
        size: a.size,
        kill_one_in: a.kill_one_in,
        seed: a.seed,
        sample_every: Duration::from_secs_f64(a.sample_every),
        channels: (128 / total as u32).clamp(1, 4),
        ..SoakOptions::default()
    };
    let dir = std::env::temp_dir().join(format!("gpuvm-soak-{}", std::process::id()));
    let daemon = if a.vfio_user_vms > 0 {
        let vms = (0..a.vfio_user_vms)
            .map(|i| VmSpec {
                name: format!("u{i}"),
                profile: VgpuProfile {
                    name: format!("u{i}"),
                    vram_mib: opts.vram_mib,
                    channels: opts.channels,
                    weight: 1,
                    shadow: ShadowMode::Incremental,
                },
                cap_ppm: None,
            })
            .collect();
        Some(
            Daemon::start(
                rig.host.clone(),
                rig.clock.clone(),
                DaemonConfig {
                    socket_dir: dir.clone(),
                    vms,
                    require_sealed_dma: true,
                },
            )
            .context("starting the vfio-user daemon")?,
        )
    } else {
        None
    };
    let totals = Mutex::new(ClientTotals::default());
    let sockets = daemon.as_ref().map(|d| d.sockets()).unwrap_or_default();
    let companion = |deadline: Instant| {
        std::thread::scope(|s| {
            for (i, sock) in sockets.iter().enumerate() {
                let totals = &totals;
                s.spawn(move || client_loop(a, sock, i as u64, deadline, totals));
            }
        });
        // Every client is gone: wait until the daemon recycled each vGPU.
        if let Some(d) = &daemon {
            let until = Instant::now() + Duration::from_secs(10);
            while d.devices().iter().any(|v| v.has_client()) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new(opts.duration.as_secs().max(1));
        pb.set_style(
            indicatif::ProgressStyle::with_template("soak [{bar:40}] {pos}/{len} s {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        pb
    });
    let last = AtomicU64::new(0);
    let progress = |t: Duration, lives: u64, verified: u64, killed: u64| {
        if let Some(pb) = &bar {
            pb.set_position(t.as_secs());
            pb.set_message(format!(
                "{lives} lives, {verified} verified, {killed} killed"
            ));
        } else if !a.json && t.as_secs() >= last.load(Ordering::Relaxed) + 60 {
            last.store(t.as_secs(), Ordering::Relaxed);
            eprintln!(
                "gpuvm soak: {} s, {lives} lives, {verified} verified, {killed} killed",
                t.as_secs()
            );
        }
    };
    let report = run_soak(&rig, &opts, &companion, &progress).context("soak")?;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if let Some(d) = daemon {
        d.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let clients = totals.into_inner().unwrap_or_else(|p| p.into_inner());
    let ok = report.ok() && clients.failed == 0 && clients.unfinished == 0;
    let mut out = SoakOutput {
        soak: report,
        clients,
        ok,
        svg: None,
    };
    if let Some(p) = &a.svg {
        write_svg(&out.soak, p).with_context(|| format!("writing {}", p.display()))?;
        out.svg = Some(p.display().to_string());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(&out, a));
    }
    Ok(out.ok)
}

/// A client that connects, brings the driver up and leaves.
fn client_leave(socket: &Path) -> anyhow::Result<bool> {
    let hal = remote_hal(socket)?;
    Gpu::init(hal, DriverConfig::default()).map_err(|e| anyhow::anyhow!("driver init: {e}"))?;
    println!("left");
    Ok(true)
}

/// The summary.
fn render(o: &SoakOutput, a: &SoakArgs) -> String {
    let r = &o.soak;
    let lives: u64 = r.slots.iter().map(|s| s.lives).sum();
    let killed: u64 = r.slots.iter().map(|s| s.killed).sum();
    let verified: u64 = r.slots.iter().map(|s| s.verified).sum();
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let mut s =
        format!(
        "gpuvm soak: {:.0} s, {} in-process VM slots + {} vfio-user vGPUs, workloads {}, size {}\n",
        r.wall_ns as f64 / 1e9,
        a.vms,
        a.vfio_user_vms,
        a.workloads.iter().map(|w| w.name()).collect::<Vec<_>>().join(","),
        a.size
    );
    s += &format!(
        "in-process: {lives} lives ({killed} killed mid-run), {verified} workloads verified; shares {}\n",
        r.slots
            .iter()
            .map(|x| format!("{:.2}", x.share))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let c = &o.clients;
    s += &format!(
        "vfio-user clients: {} started, {} completed ({} workloads verified), {} killed mid-submission, {} disconnected after bring-up, {} unfinished at the end, {} failed\n",
        c.started, c.completed, c.verified, c.killed, c.disconnected, c.unfinished, c.failed
    );
    s += &format!(
        "RssAnon {:.1} -> {:.1} MiB; slope over the second half {:+.3} MiB/min ({:+.2} MiB over that half)\n",
        mib(r.rss_anon_first_last.0 as f64),
        mib(r.rss_anon_first_last.1 as f64),
        mib(r.rss_slope_per_min),
        mib(r.rss_growth_second_half)
    );
    for (name, ok) in &r.checks {
        s += &format!("  [{}] {name}\n", if *ok { "ok" } else { "FAILED" });
    }
    s += &format!(
        "  [{}] every vfio-user client completed, was killed or left as planned\n",
        if c.failed == 0 { "ok" } else { "FAILED" }
    );
    s += &format!(
        "  [{}] no vfio-user client starved: each finished within {} s of the end\n",
        if c.unfinished == 0 { "ok" } else { "FAILED" },
        CLIENT_GRACE.as_secs()
    );
    for u in r.unexpected.iter().chain(&c.failures).take(20) {
        s += &format!("  unexpected: {u}\n");
    }
    if let Some(p) = &o.svg {
        s += &format!("plot: {p}\n");
    }
    s
}

/// A value of a sample to plot.
type SampleValue = fn(&gpuvm_harness::soak::Sample) -> f64;

/// RSS (anonymous and VRAM) in MiB and VMs alive over time.
fn write_svg(r: &SoakReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(super::plot::plot_err)?;
    let x_max = r.samples.last().map_or(1, |s| s.t_ms) as f64 / 60_000.0;
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let y_max = r
        .samples
        .iter()
        .map(|s| mib(s.mem.rss_anon).max(mib(s.mem.rss_shmem)))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("gpuvm soak: host memory over time", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..x_max.max(0.01), 0f64..y_max)
        .map_err(super::plot::plot_err)?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("MiB")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(super::plot::plot_err)?;
    let series: [(&str, SampleValue); 3] = [
        ("RssAnon (device model + guest RAM), MiB", |s| {
            s.mem.rss_anon as f64 / f64::from(1u32 << 20)
        }),
        ("RssShmem (simulated VRAM), MiB", |s| {
            s.mem.rss_shmem as f64 / f64::from(1u32 << 20)
        }),
        ("VMs alive x 10", |s| s.vms as f64 * 10.0),
    ];
    for (i, (name, f)) in series.iter().enumerate() {
        let color = super::plot::COLORS[i];
        chart
            .draw_series(LineSeries::new(
                r.samples.iter().map(|s| (s.t_ms as f64 / 60_000.0, f(s))),
                color.stroke_width(2),
            ))
            .map_err(super::plot::plot_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    super::plot::draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(super::plot::plot_err)?;
    Ok(())
}
