//! `gpuvm exp migrate`: live migration of a vGPU between two simulated GPUs in one process,
//! with neighbours running on both. The moved VM's guest driver keeps running its workloads;
//! mid-stream its vCPU (the harness's `MovableVgpu`) is paused for the stop-and-copy round and
//! pointed at the vGPU the destination restored. The stream is a real byte stream: a Unix
//! socket pair, the source writing in this thread while the destination restores in another,
//! so the total time includes the transfer. With several `--slice-mib` values it is a downtime
//! study: one migration per slice size.

use std::io::{BufReader, BufWriter};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gpuvm::clock::{Clock, ClockKind};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::migrate::{self, LiveOptions, RoundStats};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use gpuvm_harness::hal::InProcessHal;
use gpuvm_harness::MovableVgpu;
use gpuvm_sim::{SimConfig, SimGpu};
use serde::Serialize;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::table::{self, Table};

const MIB: u64 = 1 << 20;
/// VRAM of each neighbour VM.
const NEIGHBOUR_MIB: u64 = 64;

/// Options of `gpuvm exp migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// VRAM slice of the moved VM, MiB; a comma-separated list runs one migration per size
    /// (the downtime study).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    slice_mib: Vec<u64>,
    /// VMs on the source GPU, the moved one included.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    vms: u32,
    /// VMs already on the destination GPU, running workloads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=8))]
    dest_vms: u32,
    /// Workloads every VM runs in turn, over and over (comma-separated names, or all).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    workload: Vec<String>,
    /// Problem size N of the workloads (the neighbours'; the moved VM's too unless
    /// --touch-pct is given).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    size: u32,
    /// Size the moved VM's workload so that its VRAM buffer is this percentage of its slice
    /// (memcpy_htod / memcpy_dtoh only: N*N*4 bytes); 0: use --size.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=90))]
    touch_pct: u32,
    /// Workloads the moved VM completes before the migration starts.
    #[arg(long, default_value_t = 3)]
    before: u32,
    /// Workloads it completes on the destination before the run ends.
    #[arg(long, default_value_t = 3)]
    after: u32,
    /// Pre-copy rounds at most (while the VM runs).
    #[arg(long, default_value_t = 8)]
    max_rounds: u32,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// Write an SVG plot of the moved VM's progress (workloads completed against wall time,
    /// the pause marked) to FILE; with several slice sizes also FILE's stem + `-sweep.svg`
    /// (downtime and total time against slice size).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// One workload the moved VM finished.
#[derive(Debug, Clone, Serialize)]
pub struct Done {
    /// Since the start of the point, ms.
    pub t_ms: f64,
    /// Verified.
    pub verified: bool,
    /// On the destination (after the switch).
    pub moved: bool,
}

/// A neighbour VM's run.
#[derive(Debug, Clone, Serialize)]
pub struct Neighbour {
    /// "source" or "destination".
    pub gpu: &'static str,
    /// Workloads verified.
    pub verified: u64,
    /// Workloads that failed or did not verify.
    pub failed: u64,
    /// The device model's violation counter.
    pub violations: u64,
}

/// One migration.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The moved VM's slice, MiB.
    pub slice_mib: u64,
    /// Its workload size.
    pub size: u32,
    /// Bytes of VRAM one of its workloads writes (its VRAM buffer), for the memcpy workloads.
    pub touched_bytes: u64,
    /// Pre-copy rounds, then the stop-and-copy round last.
    pub rounds: Vec<RoundStats>,
    /// Bytes of the stream.
    pub stream_bytes: u64,
    /// From the start of the migration until the guest runs on the destination, µs.
    pub total_us: u64,
    /// The guest paused: from its pause to its switch to the destination's vGPU (stop-and-copy,
    /// the destination's last records and device state), µs.
    pub downtime_us: u64,
    /// The source's share of it (quiesce to the end of the stream), µs.
    pub source_downtime_us: u64,
    /// From the pause until the source's `migrate_live` returned, µs.
    pub source_end_us: u64,
    /// From the pause until the destination's `restore` returned, µs.
    pub dest_end_us: u64,
    /// Submissions withdrawn while quiescing.
    pub withdrawn: u64,
    /// The moved VM's workloads verified before / after the switch, and failed.
    pub verified_before: u64,
    /// See `verified_before`.
    pub verified_after: u64,
    /// See `verified_before`.
    pub failed: u64,
    /// Violations of the moved VM on the source and the destination.
    pub violations: u64,
    /// The migration's error, if it failed (the VM then stays on the source).
    pub error: Option<String>,
    /// The moved VM's workloads in order.
    pub progress: Vec<Done>,
    /// When the guest was paused and switched, ms since the start of the point.
    pub pause_ms: f64,
    /// See `pause_ms`.
    pub resume_ms: f64,
    /// The neighbours.
    pub neighbours: Vec<Neighbour>,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateReport {
    /// VMs on the source, the moved one included.
    pub vms: u32,
    /// VMs on the destination before the move.
    pub dest_vms: u32,
    /// Workloads.
    pub workloads: Vec<String>,
    /// The neighbours' workload size.
    pub size: u32,
    /// One per slice size.
    pub points: Vec<Point>,
    /// Plots written.
    pub svg: Vec<String>,
}

/// Runs `gpuvm exp migrate`.
pub fn run(a: &MigrateArgs) -> anyhow::Result<bool> {
    let wl = super::workload_list(&a.workload)?;
    if a.touch_pct > 0
        && wl
            .iter()
            .any(|w| !matches!(w, Workload::MemcpyHtod | Workload::MemcpyDtoh))
    {
        anyhow::bail!("--touch-pct sizes memcpy_htod / memcpy_dtoh only (--workload memcpy_htod)");
    }
    for &s in &a.slice_mib {
        if !(64..=4096).contains(&s) {
            anyhow::bail!("--slice-mib {s}: 64 to 4096");
        }
    }
    let mut points = Vec::new();
    for &slice in &a.slice_mib {
        if !a.json {
            eprintln!("gpuvm exp migrate: {slice} MiB slice ...");
        }
        points.push(point(a, &wl, slice)?);
    }
    let mut r = MigrateReport {
        vms: a.vms,
        dest_vms: a.dest_vms,
        workloads: wl.iter().map(|w| w.name().to_string()).collect(),
        size: a.size,
        points,
        svg: Vec::new(),
    };
    if let Some(p) = &a.out {
        write_progress_svg(&r, p).with_context(|| format!("writing {}", p.display()))?;
        r.svg.push(p.display().to_string());
        if r.points.len() > 1 {
            let s = sweep_path(p);
            write_sweep_svg(&r, &s).with_context(|| format!("writing {}", s.display()))?;
            r.svg.push(s.display().to_string());
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", render(&r));
    }
    Ok(r.points.iter().all(ok))
}

fn ok(p: &Point) -> bool {
    p.error.is_none()
        && p.failed == 0
        && p.violations == 0
        && p.verified_after > 0
        && p.neighbours
            .iter()
            .all(|n| n.failed == 0 && n.violations == 0 && n.verified > 0)
}

fn sweep_path(p: &Path) -> PathBuf {
    let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("migrate");
    p.with_file_name(format!("{stem}-sweep.svg"))
}

fn new_host(clock: &Arc<dyn Clock>, vram_mib: u64) -> anyhow::Result<GpuHost> {
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: vram_mib.next_power_of_two() * MIB,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let h = GpuHost::new(
        gpu,
        HostConfig {
            // The simulator does a large copy in real CPU time (a 64 MiB memcpy can take
            // seconds on a loaded host), which the default 2 s hang watchdog would kill.
            watchdog_ns: 120_000_000_000,
            ..HostConfig::default()
        },
    )?;
    h.set_clock(clock.clone());
    Ok(h)
}

fn profile(name: &str, vram_mib: u64) -> VgpuProfile {
    VgpuProfile {
        name: name.into(),
        vram_mib,
        channels: 8,
        weight: 1,
        shadow: ShadowMode::Lazy,
    }
}

struct Vm {
    vgpu: Arc<Vgpu>,
    ram: GuestMemoryMmap,
    ram_bytes: u64,
    dev: MovableVgpu,
}

fn new_vm(h: &GpuHost, p: &VgpuProfile, ram_bytes: u64) -> anyhow::Result<Vm> {
    let vgpu = h.create_vgpu(p)?;
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram_bytes as usize)])?;
    vgpu.attach_guest_memory(ram.clone())?;
    let dev = MovableVgpu::new(vgpu.clone());
    Ok(Vm {
        vgpu,
        ram,
        ram_bytes,
        dev,
    })
}

/// What a guest thread reports at its end.
#[derive(Default)]
struct Tally {
    verified: u64,
    failed: u64,
}

/// Runs `wl` in turn at `size` until `stop`, calling `done(verified)` after each.
fn guest(
    vm: &Vm,
    clock: &Arc<dyn Clock>,
    wl: &[Workload],
    size: u32,
    stop: &AtomicBool,
    done: &mut dyn FnMut(bool),
) -> Tally {
    let hal = InProcessHal::with_device(
        vm.dev.clone(),
        clock.clone(),
        vm.ram.clone(),
        0,
        vm.ram_bytes,
    );
    let mut t = Tally::default();
    let mut drv = match Gpu::init(hal, DriverConfig::default()) {
        Ok(d) => d,
        Err(e) => {
            log::error!("driver bring-up: {e}");
            t.failed += 1;
            done(false);
            return t;
        }
    };
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let w = wl[i % wl.len()];
        i += 1;
        let ok = match workloads::run(&mut drv, w, size) {
            Ok(r) => r.verified,
            Err(e) => {
                log::error!("{w}: {e}");
                false
            }
        };
        if ok {
            t.verified += 1;
        } else {
            t.failed += 1;
        }
        done(ok);
    }
    t
}

fn point(a: &MigrateArgs, wl: &[Workload], slice_mib: u64) -> anyhow::Result<Point> {
    // The real clock: GPU time passes in real time, and so does the transfer.
    let clock = ClockKind::Real.create();
    let src_vram = slice_mib + u64::from(a.vms - 1) * NEIGHBOUR_MIB + 256;
    let dst_vram = slice_mib + u64::from(a.dest_vms) * NEIGHBOUR_MIB + 256;
    let (src, dst) = (new_host(&clock, src_vram)?, new_host(&clock, dst_vram)?);

    let size = if a.touch_pct > 0 {
        let bytes = slice_mib * MIB * u64::from(a.touch_pct) / 100;
        ((bytes / 4) as f64).sqrt() as u32
    } else {
        a.size
    };
    let touched = u64::from(size) * u64::from(size) * 4;
    // Guest RAM: its buffers (at most three of N*N*4 bytes in RAM) and the driver's own.
    let ram_bytes = (3 * touched).div_ceil(MIB) * MIB + 32 * MIB;
    let mover = new_vm(&src, &profile("mover", slice_mib), ram_bytes)?;
    let nb_ram = 3 * u64::from(a.size) * u64::from(a.size) * 4;
    let nb_ram = nb_ram.div_ceil(MIB) * MIB + 32 * MIB;
    let mut nbs = Vec::new();
    for _ in 1..a.vms {
        nbs.push((
            "source",
            new_vm(&src, &profile("neighbour", NEIGHBOUR_MIB), nb_ram)?,
        ));
    }
    for _ in 0..a.dest_vms {
        nbs.push((
            "destination",
            new_vm(&dst, &profile("neighbour", NEIGHBOUR_MIB), nb_ram)?,
        ));
    }

    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let progress: Mutex<Vec<Done>> = Mutex::new(Vec::new());
    let moved = AtomicBool::new(false);
    let count = |after: bool| {
        progress
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.verified && d.moved == after)
            .count() as u64
    };
    // Waits (polling: the guest threads report through `progress`) until `f` holds.
    let wait_for = |f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(600);
        while !f() && Instant::now() < deadline {
            // A guest workload takes milliseconds at least; checking every 2 ms is enough.
            std::thread::sleep(Duration::from_millis(2));
        }
    };

    let mut out = Point {
        slice_mib,
        size,
        touched_bytes: touched,
        rounds: Vec::new(),
        stream_bytes: 0,
        total_us: 0,
        downtime_us: 0,
        source_downtime_us: 0,
        source_end_us: 0,
        dest_end_us: 0,
        withdrawn: 0,
        verified_before: 0,
        verified_after: 0,
        failed: 0,
        violations: 0,
        error: None,
        progress: Vec::new(),
        pause_ms: 0.0,
        resume_ms: 0.0,
        neighbours: Vec::new(),
    };

    // Workloads each neighbour finished so far.
    let nb_done: Vec<AtomicU64> = nbs.iter().map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let nb_handles: Vec<_> = nbs
            .iter()
            .zip(&nb_done)
            .map(|((side, vm), n)| {
                let (clock, stop) = (&clock, &stop);
                let h = s.spawn(move || {
                    guest(vm, clock, wl, a.size, stop, &mut |_| {
                        n.fetch_add(1, Ordering::Relaxed);
                    })
                });
                (*side, vm, h)
            })
            .collect();
        let mover_h = {
            let (clock, stop, progress, moved, m) = (&clock, &stop, &progress, &moved, &mover);
            s.spawn(move || {
                guest(m, clock, wl, size, stop, &mut |ok| {
                    progress.lock().unwrap().push(Done {
                        t_ms: t0.elapsed().as_secs_f64() * 1e3,
                        verified: ok,
                        moved: moved.load(Ordering::Relaxed),
                    })
                })
            })
        };

        wait_for(&|| count(false) >= u64::from(a.before) || mover_h.is_finished());

        // The migration: the destination restores from one end of the socket while the
        // source writes to the other.
        let (tx, rx) = UnixStream::pair()?;
        let start = Instant::now();
        let ram = mover.ram.clone();
        let dst_ref = &dst;
        let dest = s.spawn(move || {
            let r = migrate::restore(dst_ref, BufReader::with_capacity(1 << 20, rx), Some(ram));
            (r, Instant::now())
        });
        let paused_at = Mutex::new(None::<Instant>);
        let (p, u) = (mover.dev.clone(), mover.dev.clone());
        let live = migrate::migrate_live(
            &src,
            &mover.vgpu,
            &*clock,
            LiveOptions {
                max_rounds: a.max_rounds,
                ..LiveOptions::default()
            },
            BufWriter::with_capacity(1 << 20, tx),
            &mut || {
                p.pause();
                *paused_at.lock().unwrap() = Some(Instant::now());
            },
            &mut || u.unpause(),
        );
        let source_done = Instant::now();
        let (restored, dest_done) = dest.join().expect("the destination thread");
        match (live, restored) {
            (Ok(st), Ok(v2)) => {
                // The guest's vCPU exits now go to the destination's vGPU.
                moved.store(true, Ordering::Relaxed);
                mover.dev.switch_to(v2.clone());
                let now = Instant::now();
                let paused = paused_at.lock().unwrap().unwrap_or(now);
                out.total_us = (now - start).as_micros() as u64;
                out.downtime_us = (now - paused).as_micros() as u64;
                out.pause_ms = (paused - t0).as_secs_f64() * 1e3;
                out.resume_ms = (now - t0).as_secs_f64() * 1e3;
                out.source_downtime_us = st.downtime_micros;
                out.source_end_us = (source_done - paused).as_micros() as u64;
                out.dest_end_us = (dest_done.max(paused) - paused).as_micros() as u64;
                out.withdrawn = st.withdrawn;
                out.stream_bytes = st.bytes;
                out.rounds = st.rounds;
                out.violations += mover.vgpu.stats().violations.total;
                src.destroy_vgpu(&mover.vgpu)?;
                // Until the moved VM ran `after` workloads there, and every neighbour two more
                // since the switch (so all of them ran through the migration).
                let marks: Vec<u64> = nb_done.iter().map(|n| n.load(Ordering::Relaxed)).collect();
                wait_for(&|| {
                    (count(true) >= u64::from(a.after) || mover_h.is_finished())
                        && nb_done
                            .iter()
                            .zip(&marks)
                            .all(|(n, &m)| n.load(Ordering::Relaxed) >= m + 2)
                });
                out.violations += v2.stats().violations.total;
            }
            (live, restored) => {
                // The source resumed (migrate_live's error path) or the destination refused:
                // then the source goes on, as if nothing happened.
                let e = match (live, restored) {
                    (Err(e), _) => format!("source: {e}"),
                    (Ok(_), Err(e)) => {
                        src.resume(&mover.vgpu)?;
                        mover.dev.unpause();
                        format!("destination: {e}")
                    }
                    _ => unreachable!(),
                };
                out.error = Some(e);
                wait_for(&|| {
                    count(false) >= u64::from(a.before + a.after) || mover_h.is_finished()
                });
                out.violations += mover.vgpu.stats().violations.total;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = mover_h.join().expect("the moved guest");
        for (side, vm, h) in nb_handles {
            let t = h.join().expect("a neighbour");
            out.neighbours.push(Neighbour {
                gpu: side,
                verified: t.verified,
                failed: t.failed,
                violations: vm.vgpu.stats().violations.total,
            });
        }
        Ok(())
    })?;
    out.progress = progress.into_inner().unwrap();
    out.verified_before = out
        .progress
        .iter()
        .filter(|d| d.verified && !d.moved)
        .count() as u64;
    out.verified_after = out
        .progress
        .iter()
        .filter(|d| d.verified && d.moved)
        .count() as u64;
    out.failed = out.progress.iter().filter(|d| !d.verified).count() as u64;
    Ok(out)
}

fn render(r: &MigrateReport) -> String {
    let mut out = format!(
        "gpuvm exp migrate: {} VM(s) on the source (the moved one included), {} on the destination; workloads {} (neighbours size {}); in-process, real clock, stream over a Unix socket pair\n\n",
        r.vms,
        r.dest_vms,
        r.workloads.join(","),
        r.size
    );
    let mut t = Table::new([
        "slice",
        "size",
        "rounds",
        "stream",
        "total",
        "downtime",
        "quiesce..stream end",
        "pause..source done",
        "pause..dest done",
        "moved VM before/after",
        "neighbours",
    ]);
    for p in &r.points {
        let nb_ok = p
            .neighbours
            .iter()
            .all(|n| n.failed == 0 && n.violations == 0);
        let nb_runs: u64 = p.neighbours.iter().map(|n| n.verified).sum();
        t.row([
            format!("{} MiB", p.slice_mib),
            p.size.to_string(),
            p.rounds.len().to_string(),
            table::bytes(p.stream_bytes),
            table::ns(p.total_us * 1000),
            table::ns(p.downtime_us * 1000),
            table::ns(p.source_downtime_us * 1000),
            table::ns(p.source_end_us * 1000),
            table::ns(p.dest_end_us * 1000),
            if p.failed == 0 && p.violations == 0 {
                format!("{}/{} verified", p.verified_before, p.verified_after)
            } else {
                format!(
                    "{}/{} verified, {} FAILED, {} violations",
                    p.verified_before, p.verified_after, p.failed, p.violations
                )
            },
            format!(
                "{} VMs, {} runs {}",
                p.neighbours.len(),
                nb_runs,
                if nb_ok { "verified" } else { "FAILED" }
            ),
        ]);
    }
    out += &t.render();
    for p in &r.points {
        out += &format!("\n{} MiB slice: rounds\n", p.slice_mib);
        if let Some(e) = &p.error {
            out += &format!("migration failed: {e}\n");
        }
        let mut t = Table::new([
            "round",
            "pages read",
            "pages sent",
            "bytes",
            "time",
            "guest",
        ]);
        for (i, rs) in p.rounds.iter().enumerate() {
            t.row([
                i.to_string(),
                rs.examined.to_string(),
                rs.sent.to_string(),
                table::bytes(rs.bytes),
                table::ns(rs.micros * 1000),
                if i + 1 == p.rounds.len() {
                    "paused".to_string()
                } else {
                    "running".to_string()
                },
            ]);
        }
        out += &t.render();
        for (i, n) in p.neighbours.iter().enumerate() {
            out += &format!(
                "neighbour {i} ({}): {} verified, {} failed, {} violations\n",
                n.gpu, n.verified, n.failed, n.violations
            );
        }
    }
    if !r.svg.is_empty() {
        out += &format!("\nplots: {}\n", r.svg.join(", "));
    }
    out
}

/// The moved VM's workloads completed against wall time, one line per slice size, the pause
/// shaded.
fn write_progress_svg(r: &MigrateReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(super::plot::plot_err)?;
    let x_max = r
        .points
        .iter()
        .flat_map(|p| p.progress.last().map(|d| d.t_ms))
        .fold(1.0f64, f64::max)
        / 1e3
        * 1.05;
    let y_max = r.points.iter().map(|p| p.progress.len()).max().unwrap_or(1) as f64 * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "moved VM: workloads completed against wall time (pause shaded)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(1.0))
        .map_err(super::plot::plot_err)?;
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc("workloads verified")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(super::plot::plot_err)?;
    for (i, p) in r.points.iter().enumerate() {
        let color = super::plot::COLORS[i % super::plot::COLORS.len()];
        if p.resume_ms > p.pause_ms {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(p.pause_ms / 1e3, 0.0), (p.resume_ms / 1e3, y_max)],
                    color.mix(0.25).filled(),
                )))
                .map_err(super::plot::plot_err)?;
        }
        let mut n = 0;
        let pts: Vec<(f64, f64)> = std::iter::once((0.0, 0.0))
            .chain(p.progress.iter().map(|d| {
                if d.verified {
                    n += 1;
                }
                (d.t_ms / 1e3, n as f64)
            }))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(super::plot::plot_err)?
            .label(format!(
                "{} MiB slice: downtime {:.1} ms",
                p.slice_mib,
                p.downtime_us as f64 / 1e3
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                p.progress
                    .iter()
                    .zip(pts.iter().skip(1))
                    .map(|(d, &(x, y))| {
                        if d.moved {
                            Circle::new((x, y), 3, color.filled())
                        } else {
                            Circle::new((x, y), 3, color.stroke_width(1))
                        }
                    }),
            )
            .map_err(super::plot::plot_err)?;
    }
    super::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(super::plot::plot_err)?;
    Ok(())
}

/// Downtime and total time against the slice size.
fn write_sweep_svg(r: &MigrateReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(super::plot::plot_err)?;
    let x_max = r.points.iter().map(|p| p.slice_mib).max().unwrap_or(1) as f64 * 1.05;
    let y_max = r
        .points
        .iter()
        .map(|p| p.total_us.max(p.downtime_us))
        .max()
        .unwrap_or(1) as f64
        / 1e3
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "live migration of a vGPU: time against slice size",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(0.001))
        .map_err(super::plot::plot_err)?;
    chart
        .configure_mesh()
        .x_desc("slice (MiB)")
        .y_desc("ms")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(super::plot::plot_err)?;
    type Metric = fn(&Point) -> u64;
    let series: [(&str, Metric); 2] = [
        ("total (start to running on the destination)", |p| {
            p.total_us
        }),
        ("downtime (guest paused)", |p| p.downtime_us),
    ];
    for (i, (name, f)) in series.iter().enumerate() {
        let color = super::plot::COLORS[i];
        let pts: Vec<(f64, f64)> = r
            .points
            .iter()
            .map(|p| (p.slice_mib as f64, f(p) as f64 / 1e3))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(super::plot::plot_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(super::plot::plot_err)?;
    }
    super::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(super::plot::plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: MigrateArgs,
    }

    #[test]
    fn a_small_migration_moves_the_vm_and_everything_verifies() {
        let cli = Cli::parse_from([
            "t",
            "--slice-mib",
            "64",
            "--vms",
            "2",
            "--dest-vms",
            "1",
            "--workload",
            "madd,memcpy_htod",
            "--size",
            "16",
            "--before",
            "2",
            "--after",
            "2",
        ]);
        let wl = crate::exp::workload_list(&cli.a.workload).unwrap();
        let p = point(&cli.a, &wl, 64).unwrap();
        assert_eq!(p.error, None);
        assert!(ok(&p), "{p:?}");
        assert!(p.verified_before >= 2 && p.verified_after >= 2, "{p:?}");
        assert!(p.rounds.len() >= 2 && p.stream_bytes > 0, "{p:?}");
        assert!(
            p.pause_ms <= p.resume_ms && p.downtime_us <= p.total_us,
            "{p:?}"
        );
        let r = MigrateReport {
            vms: 2,
            dest_vms: 1,
            workloads: vec![],
            size: 16,
            points: vec![p],
            svg: vec![],
        };
        let dir = std::env::temp_dir().join(format!("gpuvm-migexp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_progress_svg(&r, &dir.join("p.svg")).unwrap();
        write_sweep_svg(&r, &dir.join("s.svg")).unwrap();
        assert!(render(&r).contains("64 MiB"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
