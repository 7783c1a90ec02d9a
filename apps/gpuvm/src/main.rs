//! `gpuvm`: the command-line front end of the gpuvm device model.
//!
//! Today it runs the guest driver's workload suite natively on the simulated GF100
//! (`gpuvm native`), prints the virtual GPU's register table (`gpuvm regs`) and runs the suite
//! in several VMs sharing the GPU through the device model (`gpuvm run`). Later subcommands add
//! the KVM VMM and the experiments.

mod calibrate;
mod control;
mod control_socket;
mod demo;
mod exp;
mod kvm;
mod metrics;
mod native;
mod nouveau;
mod regs;
mod run;
mod serve;
mod serve_migrate;
mod table;
mod top;
mod trace;

use clap::{Parser, Subcommand};

/// gpuvm — many VMs sharing one NVIDIA Fermi GPU through full virtualization (GPUvm-style).
///
/// Every command runs on the embedded simulated GF100 (a software Quadro 6000) unless told
/// otherwise. Set RUST_LOG=debug for a trace of what the device and driver do.
#[derive(Parser, Debug)]
#[command(name = "gpuvm", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every workload with the guest driver straight on the simulated GPU (no
    /// virtualization): the baseline that virtualized runs are compared to.
    ///
    /// Each workload (madd, mmul, fmadd, fmmul, memcpy_htod, memcpy_dtoh, loop) moves its inputs
    /// from guest RAM to VRAM with the copy engine, runs its kernel, copies the result back and
    /// checks it against a CPU reference. The table shows bytes, modeled GPU time, host wall
    /// time, BAR accesses and whether the result verified. Exit status 1 if any workload failed.
    Native(native::NativeArgs),
    /// Print the virtual GPU's BAR0 region table: offset, size, name and trap policy of every
    /// register or range the device model knows.
    ///
    /// Policies: `virtual` (emulated from per-VM state), `shadowed` (translated and validated,
    /// then applied), `forwarded` (passed to the GPU as is; read-only global state), `denied`
    /// (refused). Deny by default: an offset in no region reads 0xbad00100 and writes to it are
    /// dropped and counted, never forwarded to the physical GPU. `--json` prints an array of
    /// objects with `offset`, `offset_hex`, `size`, `name` and `policy`.
    Regs(regs::RegsArgs),
    /// Run the workloads in N VMs at once, each driving its own virtual GPU, all sharing one
    /// simulated GF100 through the device model (trapped MMIO, shadow page tables, shadow
    /// channels; in-process and with --kvm the host's FIFO scheduler, with --kvm --vfio-user
    /// SOCKET whatever policy that `gpuvm serve` runs, BAND by default).
    ///
    /// Each VM runs the unchanged guest driver in its own thread. Per VM the output shows every
    /// workload (as `gpuvm native` does) and the device model's counters: exits by BAR and by
    /// trap class, doorbells, shadow rebuilds, PTEs shadowed, MMU faults and violations.
    /// `--json` prints one object whose `vms` array holds, per VM, `vm`, `workloads` (the shape
    /// of `gpuvm native`) and `stats`. Exit status 1 if any workload failed.
    Run(run::RunArgs),
    /// Recorded MMIO traces: `gpuvm trace replay FILE... [--check]` replays them against a
    /// fresh device model on the simulated clock; `gpuvm trace inject FILE... --fault CLASS|all
    /// --seed S --count N [--json]` runs a fault-injection campaign with an invariant checker.
    /// Traces are recorded with `gpuvm run --record DIR` (format: docs/trace-format.md).
    Trace(trace::TraceArgs),
    /// Run one of GPUvm's experiments: `gpuvm exp isolation` (performance isolation under the
    /// FIFO, CREDIT and BAND schedulers), `gpuvm exp overhead` (every workload under native,
    /// fv-naive, fv-lazy, fv and pv), `gpuvm exp scale` (one workload in 1..N VMs), `gpuvm exp
    /// migrate` (a vGPU moved live between two GPUs). See
    /// docs/experiments.md.
    Exp(exp::ExpArgs),
    /// The cost of one MMIO exit on this host: a bare exit (no device work) next to the same
    /// exit into the vGPU (a BOOT_0 read), timed by one KVM guest in one run, plus a port-I/O
    /// exit and the device model's share measured in-process. `--json` prints `bare_exit_ns`,
    /// `vgpu_exit_ns`, `ratio`, `pio_exit_ns`, `inprocess_vgpu_read_ns`. Needs /dev/kvm.
    Calibrate(calibrate::CalibrateArgs),
    /// Four VMs share the simulated GPU under the BAND scheduler, each running every workload
    /// a few times; a live progress bar per VM (on a terminal), then a summary table (workloads
    /// verified, GPU share per VM, exits) and an SVG plot of each VM's GPU time over time.
    /// In-process by default (runs anywhere, a few seconds); `--kvm` uses real KVM guests.
    Demo(demo::DemoArgs),
    /// The vfio-user daemon (GPUvm's aggregator): one process owns the simulated GPU, the
    /// device model and the scheduler, and serves each VM's vGPU on its own Unix socket,
    /// `DIR/NAME.sock`; each VM's VMM is a separate process (`gpuvm run --kvm --vfio-user
    /// DIR/NAME.sock`, or another vfio-user client).
    ///
    /// VMs come from `--vms N` (vm0..vmN-1, one profile for all) or one `--vm NAME:PROFILE` per
    /// VM (a TOML vGPU profile: name, vram_mib, channels, weight, shadow, cap_pct). Regions: BAR0, BAR1,
    /// BAR3, BAR5 and configuration space, all trapped (no mmap areas); guest RAM from DMA_MAP
    /// file descriptors (memfds sealed against shrinking unless --allow-unsealed-dma, which
    /// Cloud Hypervisor needs; a client refused for this has its connection closed at its first
    /// DMA_MAP, with the flag named in the log); INTx
    /// through the eventfd given with SET_IRQS; DEVICE_RESET gives a fresh vGPU. A client
    /// that disconnects, crashes or sends malformed messages loses only its own vGPU (destroyed,
    /// VRAM scrubbed, a fresh one served on the same socket). Events go to standard error,
    /// timestamped and prefixed with the VM's name. SIGTERM or SIGINT: vGPUs destroyed,
    /// sockets and lock removed, exit 0.
    /// See docs/vfio-user.md.
    Serve(serve::ServeArgs),
    /// Boot unmodified Linux nouveau (User-Mode Linux from Debian's linux-source-6.12, built by
    /// scripts/uml/build.sh) against a vGPU served over vhost-user, with a second VM running
    /// gpuvm's own driver's workloads on the same GPU, and print the bring-up rungs reached
    /// (a: enumerated ... l: compute). `--json` adds the first failure's log lines and the
    /// BAR0 registers nouveau touched that the model does not implement. See docs/nouveau.md.
    Nouveau(nouveau::NouveauArgs),
    /// VMs with churn for a given time — in-process VMs created, run, destroyed, recreated and
    /// killed mid-run, and vfio-user client processes connecting, leaving and being killed
    /// mid-submission — then the checks: every completed workload verified, allocators back
    /// to baseline, RSS flat (slope reported), no VM starved, no unexpected violation. A
    /// progress bar on a terminal; `--json`, `--svg FILE`. Exit status 1 if a check failed.
    /// See docs/experiments.md "Soak".
    Soak(exp::soak::SoakArgs),
    /// Control a running `gpuvm serve`: list, add, remove, weight, cap, policy, stop
    /// (docs/serve.md). Prints a table or a sentence; `--json` prints the daemon's reply.
    Ctl(top::CtlArgs),
    /// Per-VM usage of a running `gpuvm serve`, once (`--json` for machines).
    Stat(top::StatArgs),
    /// Per-VM usage of a running `gpuvm serve`, live.
    Top(top::TopArgs),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Native(args) => native::run(&args),
        Command::Regs(args) => regs::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Exp(args) => exp::run(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Soak(args) => exp::soak::run(&args),
        Command::Nouveau(args) => nouveau::run(&args),
        Command::Ctl(args) => top::ctl(&args),
        Command::Stat(args) => top::stat(&args),
        Command::Top(args) => top::top(&args),
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("gpuvm: error: {e:#}");
            std::process::exit(2);
        }
    }
}
