//! `gpuvm run --kvm`: output (the table, or JSON in the shape of the in-process `gpuvm run`
//! with a `kvm` object per VM).

use anyhow::Context;

use super::{
    migrate, remote, run_kvm, run_kvm_with, snapshot, Handoff, Incoming, KvmOptions, KvmReport,
    Outgoing,
};
use crate::table::{self, Table};

/// Runs the VMs and prints the report; `Ok(false)` if a workload did not verify or a VM was
/// stopped.
pub fn run(opts: &KvmOptions, json: bool) -> anyhow::Result<bool> {
    let report = if let Some(dir) = &opts.restore {
        // The guest's parameters come from the snapshot; the command line keeps the run's
        // control (timeout, console, coalescing, output).
        let loaded = snapshot::Loaded::open(dir)?;
        let mut opts = opts.clone();
        loaded
            .manifest
            .guest
            .apply(&mut opts)
            .with_context(|| format!("restoring {}", dir.display()))?;
        let inc = Some(Incoming::Restore(Box::new(loaded)));
        match &opts.vfio_user {
            Some(socket) => remote::run_remote(&opts, socket, inc)?,
            None => run_kvm_with(&opts, inc)?,
        }
    } else if let Some(socket) = &opts.migrate_listen {
        let mut inc = migrate::listen(socket, opts.timeout)?;
        let mut opts = opts.clone();
        if let Err(e) = inc.hello.guest.apply(&mut opts) {
            inc.refuse(&e);
            return Err(e.context("the migrating guest"));
        }
        let inc = Some(Incoming::Migration(Box::new(inc)));
        match &opts.vfio_user {
            Some(socket) => remote::run_remote(&opts, socket, inc)?,
            None => run_kvm_with(&opts, inc)?,
        }
    } else {
        match &opts.vfio_user {
            Some(socket) => remote::run_remote(opts, socket, None)?,
            None => run_kvm(opts)?,
        }
    };
    for f in &report.recorded {
        eprintln!("gpuvm: recorded {}", f.display());
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(report.all_verified())
}

/// The human-readable report.
pub fn render(r: &KvmReport) -> String {
    if r.backend == "kvm-vfio-user" {
        return render_remote(r);
    }
    let mut out = format!(
        "gpuvm run --kvm: {} KVM VMs ({}, guests in ring {}) sharing the simulated GF100, {}, size {}\n",
        r.vms.len(),
        if r.pvm { "PVM" } else { "hardware virtualization" },
        r.guest_ring,
        match r.scheme {
            Some(super::scheme::KvmScheme::Native) =>
                "scheme native (pass-through: no device model)".to_string(),
            Some(s) => format!("scheme {} (shadow page tables {})", s.name(), r.shadow),
            None => format!("shadow page tables {}", r.shadow),
        },
        r.size,
    );
    for vm in &r.vms {
        out += &format!(
            "\nvm{}\n{}",
            vm.vm,
            table::workload_table(std::iter::once(&vm.init).chain(&vm.workloads))
        );
        if let Some(s) = &vm.kvm.stopped {
            out += &format!("stopped: {s}\n");
        }
        out += &render_handoff(&vm.kvm);
        if let Some(m) = &vm.kvm.remap {
            out += &format!(
                "BAR remap: {} remaps, {} slots now (max {}, limit {}), {} pages mapped ({} read-only), {} over the slot limit, {} read-only pages trapping (no KVM_CAP_READONLY_MEM)\n",
                m.remaps,
                m.slots,
                m.max_slots,
                m.slot_limit,
                m.pages_mapped,
                m.pages_read_only,
                m.pages_over_slot_limit,
                m.pages_readonly_unsupported
            );
        }
        if let Some(c) = &vm.kvm.calibration {
            out += &format!(
                "exit cost ({} each): port I/O {}, bare MMIO {}, vGPU MMIO (BOOT_0) {}\n",
                c.exits,
                table::ns(c.pio_exit_ns),
                table::ns(c.bare_mmio_exit_ns),
                table::ns(c.vgpu_mmio_exit_ns)
            );
        }
    }
    let mut t = Table::new([
        "vm",
        "verified",
        "exit code",
        "wall time",
        "MMIO reads",
        "MMIO writes",
        "port I/O",
        "per MMIO exit",
        "fences by",
        "irqs raised",
        "irqs seen",
        "doorbells",
        "violations",
    ]);
    for vm in &r.vms {
        let ok = vm.workloads.iter().filter(|w| w.verified).count();
        let k = &vm.kvm;
        t.row([
            format!("vm{}", vm.vm),
            format!("{ok}/{}", vm.workloads.len()),
            match (&k.handoff, k.exit_code) {
                (Some(Handoff::Snapshot(_)), _) => "snapshot".to_string(),
                (Some(Handoff::Migration(_)), _) => "migrated".to_string(),
                (None, Some(c)) => c.to_string(),
                (None, None) => "stopped".to_string(),
            },
            table::ns(k.wall_ns),
            k.exits.mmio_reads.to_string(),
            k.exits.mmio_writes.to_string(),
            k.exits.pio.to_string(),
            table::ns(k.ns_per_mmio_exit),
            if k.fence_irq { "interrupt" } else { "polling" }.to_string(),
            k.irqs_raised.to_string(),
            k.irqs_seen.to_string(),
            vm.stats.doorbells.to_string(),
            vm.stats.violations.total.to_string(),
        ]);
    }
    let total: usize = r.vms.iter().map(|v| v.workloads.len()).sum();
    let ok: usize = r
        .vms
        .iter()
        .map(|v| v.workloads.iter().filter(|w| w.verified).count())
        .sum();
    out += &format!(
        "\nper VM (KVM exits; wall time is the vCPU's whole run)\n{}\n{ok}/{total} workloads verified; GPU busy {} in total\n",
        t.render(),
        table::ns(r.host.gpu.busy_ns),
    );
    out
}

/// Where the guest came from and where it went (snapshot, restore, migration).
fn render_handoff(k: &super::KvmVmInfo) -> String {
    let mut out = String::new();
    let ms = |ns: u64| format!("{:.1} ms", ns as f64 / 1e6);
    let rounds = |rs: &[migrate::Round]| {
        let mut t = Table::new(["round", "pages", "zero pages", "bytes", "time", "guest"]);
        for r in rs {
            t.row([
                r.round.to_string(),
                r.pages.to_string(),
                r.zero_pages.to_string(),
                r.bytes.to_string(),
                ms(r.ns),
                if r.stop_and_copy { "paused" } else { "running" }.to_string(),
            ]);
        }
        t.render()
    };
    if let Some(r) = &k.restored {
        out += &format!("restored from {} in {}\n", r.from, ms(r.load_ns));
        if let Some(m) = &r.migration {
            out += &format!(
                "migration received: {} rounds, {} bytes (vGPU stream {}), {} from HELLO to loaded (state loaded in {})\n{}",
                m.rounds.len(),
                m.bytes,
                m.vgpu_stream_bytes,
                ms(m.total_ns),
                ms(m.load_ns),
                rounds(&m.rounds)
            );
        }
    }
    match &k.handoff {
        Some(Handoff::Snapshot(w)) => {
            out += &format!(
                "snapshot written to {}: {} of {} RAM pages non-zero ({} bytes on disk), manifest {} bytes, {}\n",
                w.dir.display(),
                w.data_pages,
                w.ram_bytes / snapshot::PAGE,
                w.ram_file_disk_bytes,
                w.manifest_bytes,
                ms(w.write_ns)
            );
        }
        Some(Handoff::Migration(m)) => {
            out += &format!(
                "migrated to {}: {} rounds, {} bytes, total {}, downtime {} (of which RAM hash {}), state {} bytes\n{}",
                m.socket.display(),
                m.rounds.len(),
                m.bytes,
                ms(m.total_ns),
                ms(m.downtime_ns),
                ms(m.hash_ns),
                m.state_bytes,
                rounds(&m.rounds)
            );
            let mut t = Table::new(["VRAM round", "examined", "sent", "bytes", "time"]);
            for (i, r) in m.vram_rounds.iter().enumerate() {
                t.row([
                    i.to_string(),
                    r.examined.to_string(),
                    r.sent.to_string(),
                    r.bytes.to_string(),
                    ms(r.micros * 1000),
                ]);
            }
            out += &format!(
                "vGPU: stream {} bytes, {} DMA-reachable RAM pages resent in stop-and-copy, {} submissions withdrawn\n{}",
                m.vgpu_stream_bytes,
                m.dma_pages,
                m.withdrawn,
                t.render()
            );
        }
        None => {}
    }
    if let Some(e) = &k.handoff_error {
        out += &format!("{e}\n");
    }
    out
}

/// The report of a VM whose vGPU is served by `gpuvm serve`: the workloads and the exits; the
/// vGPU's counters and GPU time stay with the daemon.
fn render_remote(r: &KvmReport) -> String {
    let mut out = format!(
        "gpuvm run --kvm --vfio-user: one KVM VM ({}, guest in ring {}), its vGPU served over vfio-user, size {}\n",
        if r.pvm { "PVM" } else { "hardware virtualization" },
        r.guest_ring,
        r.size,
    );
    for vm in &r.vms {
        out += &table::workload_table(std::iter::once(&vm.init).chain(&vm.workloads));
        let k = &vm.kvm;
        if let Some(s) = &k.stopped {
            out += &format!("stopped: {s}\n");
        }
        if let Some(c) = &k.calibration {
            out += &format!(
                "exit cost ({} each): port I/O {}, bare MMIO {}, vGPU MMIO (BOOT_0, through the daemon) {}\n",
                c.exits,
                table::ns(c.pio_exit_ns),
                table::ns(c.bare_mmio_exit_ns),
                table::ns(c.vgpu_mmio_exit_ns)
            );
        }
        out += &format!(
            "{}/{} workloads verified; wall {}; {} MMIO reads, {} MMIO writes, {} port I/O; fences by {}, {} interrupts seen (GPU time and vGPU counters: see the daemon)\n",
            vm.workloads.iter().filter(|w| w.verified).count(),
            vm.workloads.len(),
            table::ns(k.wall_ns),
            k.exits.mmio_reads,
            k.exits.mmio_writes,
            k.exits.pio,
            if k.fence_irq { "interrupt" } else { "polling" },
            k.irqs_seen
        );
    }
    out
}

/// The `--kvm` options of `gpuvm run`.
#[derive(clap::Args, Debug, Default)]
pub struct KvmArgs {
    /// Run every VM as a real KVM guest: a bare-metal guest program (one vCPU, started in ring 3
    /// on PVM hosts) that finds the vGPU on PCI and drives it through real MMIO exits. Always
    /// uses the real clock. `--json` adds a `kvm` object per VM (exit code, exits, interrupts,
    /// console lines).
    #[arg(long)]
    pub kvm: bool,
    /// With --kvm: before its workloads, each guest times N exits of each kind (port I/O, bare
    /// MMIO, an MMIO read of the vGPU's BOOT_0); reported per VM.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "kvm")]
    pub calibrate: u32,
    /// With --kvm: stop a VM that is still running after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 600, requires = "kvm")]
    pub timeout: u64,
    /// With --kvm: let every BAR3 and PRAMIN write exit instead of queueing it in KVM's
    /// coalesced MMIO ring (slower; for measuring what coalescing saves).
    #[arg(long, requires = "kvm")]
    pub no_coalesce: bool,
    /// With --kvm: the virtualization scheme (GPUvm's overhead figure). `native`: one VM, its
    /// BAR accesses go straight to the simulated GPU (no device model, no shadowing, no
    /// scheduler); `fv-naive`: every BAR access traps, eager shadowing; `fv`: BAR remap (BAR1/BAR3
    /// pages the device model allows are KVM memory slots, no exits) + lazy shadowing; `pv`:
    /// BAR remap + para-virtual page-table updates. Overrides --shadow. Without it every BAR
    /// access traps and --shadow selects the shadow mode.
    #[arg(long, value_enum, requires = "kvm")]
    pub scheme: Option<super::scheme::KvmScheme>,
    /// With --kvm: do not print the guests' console lines on standard error.
    #[arg(long, requires = "kvm")]
    pub quiet_console: bool,
    /// With --kvm, for tests: run VM `I` as a hostile guest, `I=poke-outside` (reads outside its
    /// BARs), `I=config-garbage` (garbage over its configuration space, then uses its BARs),
    /// `I=stop-fault` (rings the doorbell for a 1.5 s kernel, then executes `hlt` in ring 3) or
    /// `I=stop-spin` (the same, then spins without exits until --timeout kicks it) or
    /// `I=ro-write` (after the first workload, writes into its bound channel's instance block
    /// through BAR3 and reads it back: a read-only BAR-remap slot under `--scheme fv`/`pv`).
    #[arg(long, value_name = "I=MODE", hide = true, requires = "kvm")]
    pub hostile: Vec<String>,
    /// With --kvm: VM `I` waits for its fences by interrupt (repeatable; the others poll unless
    /// --irq is given).
    #[arg(long, value_name = "I", requires = "kvm")]
    pub irq_vm: Vec<usize>,
    /// With --kvm, for tests: stop VM `I` after S seconds instead of --timeout.
    #[arg(long, value_name = "I=S", hide = true, requires = "kvm")]
    pub vm_timeout: Vec<String>,
    /// With --kvm, for tests: VM `I` runs no workloads but keeps the GPU busy for S seconds,
    /// with no gap — loop kernels of [`STREAM_KERNEL_NS`] of modeled GPU time, [`STREAM_QUEUED`]
    /// outstanding (retired ones replaced at once) — so that a VM killed during them still has
    /// work on the GPU when its connection or vGPU is torn down (a killed VMM's socket closes
    /// when the process is gone: 1.5 s after the event on a loaded machine).
    #[arg(long, value_name = "I=S", hide = true, requires = "kvm")]
    pub stream_for: Vec<String>,
    /// With --kvm: stop VM `I` when it has not exited for S seconds (a guest wedged in a loop
    /// without exits; its vCPU is kicked out of KVM_RUN by a signal).
    #[arg(long, value_name = "I=S", requires = "kvm")]
    pub stall_timeout: Vec<String>,
    /// With --kvm: the guests enumerate and program PCI configuration space through the
    /// memory-mapped ECAM window at 0xE0000000 (MMIO exits) instead of ports 0xCF8/0xCFC.
    #[arg(long, requires = "kvm")]
    pub ecam: bool,
    /// With --kvm, for tests: each guest that waits by interrupt first sends its vector to
    /// itself, and its handler sends it once more before its EOI — a delivery nested right
    /// after the EOI, as two close edges of the line cause; the console says how many the
    /// handler counted.
    #[arg(long, hide = true, requires = "kvm")]
    pub irq_nest: bool,
    /// With --kvm: run one VM (--vms does not apply) whose vGPU is served by `gpuvm serve` on
    /// the vfio-user socket SOCKET instead of in this process; guest RAM is shared with the
    /// daemon (a sealed memfd), the interrupt arrives through an irqfd the daemon signals.
    /// GPU time and the vGPU's counters are the daemon's and read zero here.
    #[arg(long, value_name = "SOCKET", requires = "kvm")]
    pub vfio_user: Option<std::path::PathBuf>,
    /// With --kvm: start the guests through their PVH entry (32-bit protected mode, paging off,
    /// the start info's command line), as Cloud Hypervisor does; the guest switches to ring 3
    /// itself. Workloads only (no --hostile, --calibrate, --ecam).
    #[arg(long, requires = "kvm")]
    pub pvh: bool,
    /// With --kvm (one VM): after --snapshot-after-exits exits, pause the guest at an exit
    /// boundary, quiesce the vGPU, write the guest (vCPU, irqchip, the VMM's devices, the
    /// vGPU's VRAM and device state, RAM) into DIR (new or empty) and end. If it fails, the
    /// guest goes on here. See docs/migration.md.
    #[arg(
        long,
        value_name = "DIR",
        requires = "kvm",
        conflicts_with = "migrate_to"
    )]
    pub snapshot_to: Option<std::path::PathBuf>,
    /// With --snapshot-to: the number of exits (of this process) before the snapshot.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "snapshot_to")]
    pub snapshot_after_exits: u64,
    /// With --kvm: start the guest from the snapshot in DIR instead of booting it; its
    /// parameters (size, workloads, RAM, fence mode, vGPU profile) come from the snapshot.
    #[arg(
        long,
        value_name = "DIR",
        requires = "kvm",
        conflicts_with = "migrate_listen"
    )]
    pub restore: Option<std::path::PathBuf>,
    /// With --kvm (one VM): after --migrate-after-exits exits, migrate the running guest to the
    /// VMM listening on the Unix socket SOCK (pre-copy of RAM with KVM's dirty log and of the
    /// vGPU's VRAM, then stop-and-copy with the vGPU quiesced). If it fails, the guest goes on
    /// here.
    #[arg(long, value_name = "SOCK", requires = "kvm")]
    pub migrate_to: Option<std::path::PathBuf>,
    /// With --migrate-to: the number of exits (of this process) before pre-copy starts.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "migrate_to")]
    pub migrate_after_exits: u64,
    /// With --kvm: wait on the Unix socket SOCK for one guest migrating in (--migrate-to),
    /// then run it to its end; its parameters come from the source.
    #[arg(long, value_name = "SOCK", requires = "kvm")]
    pub migrate_listen: Option<std::path::PathBuf>,
}

/// Loop iterations of a kernel that runs `ns` of modeled GPU time on the simulated GF100.
pub fn loop_iterations(ns: u64) -> u64 {
    let cost = gpuvm_sim::CostModel::default();
    let body = ns.saturating_sub(cost.kernel_launch_ns);
    (u128::from(body) * 1000 / u128::from(cost.loop_iteration_ps.max(1))) as u64
}

/// GPU time of the kernel a stop-mid-submission guest leaves in flight: long enough to be
/// running when its VM is stopped, shorter than the host's 2 s hang watchdog.
pub const STOP_KERNEL_NS: u64 = 1_500_000_000;

/// GPU time of each kernel of `--stream-for`: under half the host's 2 s hang watchdog, the
/// longest an operation may take to leave the GPU once the watchdog asks it off (kernels rung
/// together run as one dispatch, which is asked off after running half a watchdog).
pub const STREAM_KERNEL_NS: u64 = 900_000_000;

/// Kernels `--stream-for` keeps outstanding: at least 2.7 s of GPU work queued whenever the
/// guest has topped up.
pub const STREAM_QUEUED: u32 = 4;

impl KvmArgs {
    /// The run options.
    #[allow(clippy::too_many_arguments)]
    pub fn options(
        &self,
        vms: usize,
        size: u32,
        shadow: gpuvm::profile::ShadowMode,
        workloads: Vec<gpuvm_guest::workloads::Workload>,
        fence_irq: bool,
        vram_mib: u64,
        guest_ram: u64,
    ) -> anyhow::Result<KvmOptions> {
        let vms = if self.vfio_user.is_some() { 1 } else { vms };
        let mut modes = vec![super::abi::MODE_NORMAL; vms];
        let mut setups = vec![super::setup::VmSetup::default(); vms];
        for &i in &self.irq_vm {
            anyhow::ensure!(i < vms, "--irq-vm {i}: there are only {vms} VMs");
            setups[i].fence_irq = Some(true);
        }
        #[derive(Clone, Copy)]
        enum PerVm {
            Timeout,
            Stall,
            Stream,
        }
        for (t, what) in (self.vm_timeout.iter().map(|t| (t, PerVm::Timeout)))
            .chain(self.stall_timeout.iter().map(|t| (t, PerVm::Stall)))
            .chain(self.stream_for.iter().map(|t| (t, PerVm::Stream)))
        {
            let opt = match what {
                PerVm::Timeout => "--vm-timeout",
                PerVm::Stall => "--stall-timeout",
                PerVm::Stream => "--stream-for",
            };
            let parsed = t
                .split_once('=')
                .and_then(|(i, s)| Some((i.parse::<usize>().ok()?, s.parse::<f64>().ok()?)));
            let Some((i, secs)) = parsed.filter(|&(_, s)| s.is_finite() && s > 0.0 && s < 1e6)
            else {
                anyhow::bail!("{opt} '{t}': expected I=SECONDS");
            };
            anyhow::ensure!(i < vms, "{opt} '{t}': there are only {vms} VMs");
            let d = Some(std::time::Duration::from_secs_f64(secs));
            match what {
                PerVm::Timeout => setups[i].timeout = d,
                PerVm::Stall => setups[i].stall = d,
                PerVm::Stream => {
                    setups[i].stream = Some(super::setup::StreamPlan {
                        iterations: loop_iterations(STREAM_KERNEL_NS),
                        outstanding: STREAM_QUEUED,
                        start_ms: 0,
                        run_ms: (secs * 1e3).ceil() as u32,
                        count: 0,
                    })
                }
            }
        }
        for h in &self.hostile {
            let (i, mode) = h
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--hostile '{h}': expected I=MODE"))?;
            let i: usize = i
                .parse()
                .map_err(|_| anyhow::anyhow!("--hostile '{h}': bad VM index"))?;
            anyhow::ensure!(i < vms, "--hostile '{h}': there are only {vms} VMs");
            modes[i] = match mode {
                "poke-outside" => super::abi::MODE_POKE_OUTSIDE,
                "config-garbage" => super::abi::MODE_CONFIG_GARBAGE,
                "stop-fault" => super::abi::MODE_STOP_FAULT,
                "stop-spin" => super::abi::MODE_STOP_SPIN,
                "ro-write" => super::abi::MODE_RO_WRITE,
                _ => anyhow::bail!(
                    "--hostile '{h}': modes are poke-outside, config-garbage, stop-fault, stop-spin, ro-write"
                ),
            };
            if matches!(mode, "stop-fault" | "stop-spin") {
                setups[i].stream = Some(super::setup::StreamPlan {
                    iterations: loop_iterations(STOP_KERNEL_NS),
                    outstanding: 1,
                    start_ms: 0,
                    run_ms: 0,
                    count: 1,
                });
            }
        }
        Ok(KvmOptions {
            vms,
            size,
            shadow,
            workloads,
            fence_irq,
            vram_mib,
            guest_ram,
            modes,
            echo_console: !self.quiet_console,
            calibrate: self.calibrate,
            coalesce: !self.no_coalesce,
            scheme: self.scheme,
            timeout: std::time::Duration::from_secs(self.timeout),
            setups,
            ecam: self.ecam,
            irq_nest: self.irq_nest,
            vfio_user: self.vfio_user.clone(),
            pvh: self.pvh,
            outgoing: match (&self.snapshot_to, &self.migrate_to) {
                (Some(dir), _) => Some(Outgoing::Snapshot {
                    dir: dir.clone(),
                    after_exits: self.snapshot_after_exits,
                }),
                (None, Some(socket)) => Some(Outgoing::Migrate {
                    socket: socket.clone(),
                    after_exits: self.migrate_after_exits,
                }),
                (None, None) => None,
            },
            restore: self.restore.clone(),
            migrate_listen: self.migrate_listen.clone(),
            ..KvmOptions::default()
        })
    }
}
