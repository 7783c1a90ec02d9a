//! `gpuvm calibrate`: what one MMIO exit costs on this host. One KVM guest times `--count`
//! exits of each kind in one run (before its driver comes up): a port-I/O exit the VMM
//! ignores, a bare MMIO exit the VMM answers with zeros (no device work), and an MMIO read of
//! the vGPU's BOOT_0 (the same exit plus the device model's register path). For comparison the
//! device model's share is also timed in-process, without any exit.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm_guest::hal::Bar;
use gpuvm_sim::{SimConfig, SimGpu};
use serde::Serialize;

use crate::kvm::{self, KvmOptions};
use crate::table::{self, Table};

/// Options of `gpuvm calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Exits of each kind the guest times.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(10..=10_000_000))]
    count: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// What `gpuvm calibrate` measured.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationReport {
    /// Exits of each kind.
    pub count: u32,
    /// `/dev/kvm` is PVM.
    pub pvm: bool,
    /// The guest's privilege level.
    pub guest_ring: u8,
    /// A bare MMIO exit (answered with zeros, no device work), ns.
    pub bare_exit_ns: u64,
    /// The same exit into the vGPU (a read of BOOT_0), ns.
    pub vgpu_exit_ns: u64,
    /// vgpu_exit_ns / bare_exit_ns.
    pub ratio: f64,
    /// A port-I/O exit, ns.
    pub pio_exit_ns: u64,
    /// The device model's BOOT_0 read called in-process (no exit), ns.
    pub inprocess_vgpu_read_ns: u64,
}

/// Measures the exit costs with one KVM guest.
pub fn measure(count: u32) -> anyhow::Result<CalibrationReport> {
    kvm::open_kvm()?;
    let opts = KvmOptions {
        vms: 1,
        size: 16,
        workloads: Vec::new(),
        calibrate: count,
        echo_console: false,
        ..KvmOptions::default()
    };
    let r = kvm::run_kvm(&opts).context("calibration guest")?;
    let vm = r.vms.first().context("no VM")?;
    if let Some(s) = &vm.kvm.stopped {
        anyhow::bail!("the calibration guest was stopped: {s}");
    }
    let c = vm
        .kvm
        .calibration
        .context("the guest reported no calibration phases")?;
    Ok(CalibrationReport {
        count,
        pvm: r.pvm,
        guest_ring: r.guest_ring,
        bare_exit_ns: c.bare_mmio_exit_ns,
        vgpu_exit_ns: c.vgpu_mmio_exit_ns,
        ratio: c.vgpu_mmio_exit_ns as f64 / c.bare_mmio_exit_ns.max(1) as f64,
        pio_exit_ns: c.pio_exit_ns,
        inprocess_vgpu_read_ns: inprocess_read_ns(count.max(100_000))?,
    })
}

/// Mean cost of `Vgpu::bar_read` of BOOT_0 called directly, ns.
fn inprocess_read_ns(n: u32) -> anyhow::Result<u64> {
    let sim: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig::default()));
    let host = GpuHost::new(sim, HostConfig::default())?;
    let vgpu = host.create_vgpu(&VgpuProfile {
        name: "cal".into(),
        vram_mib: 64,
        channels: 1,
        weight: 1,
        shadow: ShadowMode::Lazy,
    })?;
    let mut b = [0u8; 4];
    let t = Instant::now();
    for _ in 0..n {
        vgpu.bar_read(Bar::Bar0, 0, &mut b);
        std::hint::black_box(&b);
    }
    let ns = t.elapsed().as_nanos() as u64 / n as u64;
    host.destroy_vgpu(&vgpu)?;
    Ok(ns)
}

/// Runs the command.
pub fn run(args: &CalibrateArgs) -> anyhow::Result<bool> {
    let r = measure(args.count)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(true);
    }
    println!(
        "gpuvm calibrate: {} exits of each kind in one KVM guest ({}, ring {})\n",
        r.count,
        if r.pvm {
            "PVM"
        } else {
            "hardware virtualization"
        },
        r.guest_ring
    );
    let mut t = Table::new(["exit", "cost"]);
    t.row([
        "port I/O (ignored by the VMM)".to_string(),
        table::ns(r.pio_exit_ns),
    ]);
    t.row([
        "bare MMIO (no device work)".to_string(),
        table::ns(r.bare_exit_ns),
    ]);
    t.row([
        "MMIO into the vGPU (BOOT_0 read)".to_string(),
        table::ns(r.vgpu_exit_ns),
    ]);
    t.row([
        "device model alone (in-process, no exit)".to_string(),
        table::ns(r.inprocess_vgpu_read_ns),
    ]);
    print!("{}", t.render());
    println!("\nratio vGPU / bare exit: {:.3}", r.ratio);
    Ok(true)
}
