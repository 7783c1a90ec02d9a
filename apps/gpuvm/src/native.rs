//! `gpuvm native`: the workload suite with the guest driver straight on the simulated GPU.

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm_guest::workloads::Workload;
use gpuvm_guest::FenceMode;
use gpuvm_harness::{run_native, NativeOptions, NativeReport};

use crate::table;

/// Options of `gpuvm native`.
#[derive(Args, Debug)]
pub struct NativeArgs {
    /// Print one JSON object (with a `workloads` array) instead of the table.
    #[arg(long)]
    json: bool,
    /// Problem size N: matrices are N x N (madd, mmul, fmadd, fmmul), memcpy moves N*N*4 bytes,
    /// loop runs N*N*64 iterations.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1024))]
    size: u32,
    /// Time base: `sim` is deterministic simulated time (fast), `real` follows the host clock.
    #[arg(long, default_value = "sim")]
    clock: ClockKind,
    /// Only run these workloads (repeatable): madd, mmul, fmadd, fmmul, memcpy_htod, memcpy_dtoh, loop.
    #[arg(long = "workload", value_name = "W")]
    workloads: Vec<Workload>,
    /// Wait for fences by interrupt (non-stall interrupt) instead of polling the semaphore.
    #[arg(long)]
    irq: bool,
    /// VRAM of the simulated GPU in MiB (allocated lazily).
    #[arg(long, default_value_t = 6144, value_parser = clap::value_parser!(u64).range(64..=65536))]
    vram_mib: u64,
}

/// Runs the command; `Ok(false)` if a workload did not verify.
pub fn run(args: &NativeArgs) -> anyhow::Result<bool> {
    let opts = NativeOptions {
        size: args.size,
        clock: args.clock,
        vram_size: args.vram_mib << 20,
        guest_ram: 0,
        workloads: if args.workloads.is_empty() {
            Workload::ALL.to_vec()
        } else {
            args.workloads.clone()
        },
        fence_mode: if args.irq {
            FenceMode::Interrupt
        } else {
            FenceMode::Poll
        },
    };
    let report = run_native(&opts).context("native run")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(report.all_verified())
}

fn render(r: &NativeReport) -> String {
    let ok = r.workloads.iter().filter(|w| w.verified).count();
    format!(
        "gpuvm native: guest driver on the simulated GF100 (Quadro 6000), size {}, {} clock\n\n{}\n{ok}/{} workloads verified; GPU busy {} in total, {} MMU faults, {} bad-register accesses\n",
        r.size,
        match r.clock {
            ClockKind::Sim => "simulated",
            ClockKind::Real => "real",
        },
        table::workload_table(std::iter::once(&r.init).chain(&r.workloads)),
        r.workloads.len(),
        table::ns(r.gpu.busy_ns),
        r.gpu.mmu_faults,
        r.gpu.bad_register_reads + r.gpu.bad_register_writes,
    )
}
