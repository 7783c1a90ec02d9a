//! The standalone KVM VMM behind `gpuvm run --kvm`: N KVM VMs in one process, one thread and one
//! vCPU each, all sharing one simulated GF100 through one `GpuHost`.
//!
//! Each VM runs the bare-metal guest program of `guest/bin` (built by this
//! crate's build script and embedded here), which finds the vGPU on PCI, places its BARs and
//! drives it with the `gpuvm-guest` driver; every BAR access is a real MMIO exit that
//! [`mmio::BarWindows`] hands to the VM's `Vgpu`. The guest starts in 64-bit ring 3 (see
//! [`cpu`] and `docs/kvm.md`: on this machine KVM is PVM, where ring-0 guest code is
//! interpreted). Guest and VMM talk through the boot-parameter and results blocks and the ports
//! of [`abi`]: the guest reports each workload's result in the results block and marks phase
//! boundaries on a port, so wall time, GPU busy time and MMIO exits per phase are measured
//! here, on the VMM side.

#[path = "../../../../guest/bin/src/abi.rs"]
pub mod abi;
pub mod cli;
pub mod cpu;
pub mod device;
pub mod device_seam;
pub mod ecam;
pub mod isolation;
pub mod kick;
pub mod migratable;
pub mod migrate;
pub mod mmio;
pub mod passthrough;
pub mod pci;
pub mod pvh_boot;
#[cfg(test)]
mod pvh_note;
pub mod record;
pub mod remap;
pub mod remote;
pub mod scheme;
pub mod serial;
pub mod setup;
pub mod shared_ram;
pub mod snapshot;
pub mod vcpu_state;
pub mod vm;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpuvm::clock::{Clock, ClockKind, SimClock};
use gpuvm::host::{GpuHost, HostConfig, HostStats};
use gpuvm::irq::IrqLine;
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::{Vgpu, VgpuStats};
use gpuvm_guest::workloads::Workload;
use gpuvm_harness::WorkloadRun;
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_trace::record::TapRecorder;
use kvm_ioctls::{IoEventAddress, Kvm, VcpuExit, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::Bytes;
use vmm_sys_util::eventfd::EventFd;

use device::{LocalVgpu, VgpuDevice};
use mmio::BarWindows;
use passthrough::Passthrough;
use pci::PciBus;
use setup::{Gate, Sample, Sampler, VmSetup};

/// The guest program (an ELF64 executable linked at [`abi::LOAD_ADDR`]).
pub static GUEST_ELF: &[u8] = include_bytes!(env!("GPUVM_GUEST_ELF"));

/// IOAPIC pin the vGPU's interrupt is wired to (irqfd GSI).
pub const IRQ_GSI: u32 = 16;
/// IDT vector the guest assigns to it.
pub const IRQ_VECTOR: u32 = 0x40;

/// True if `/dev/kvm` is served by PVM (no VT-x/AMD-V; guest ring 0 is interpreted).
pub fn is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// Opens `/dev/kvm`, or says plainly why it cannot be used.
pub fn open_kvm() -> anyhow::Result<Kvm> {
    if !Path::new("/dev/kvm").exists() {
        anyhow::bail!(
            "/dev/kvm not available: this host has no KVM (load kvm_intel, kvm_amd or kvm_pvm)"
        );
    }
    let kvm = Kvm::new().map_err(|e| {
        anyhow::anyhow!(
            "/dev/kvm is present but unusable: {e} (permissions? the user needs read/write access)"
        )
    })?;
    let v = kvm.get_api_version();
    if v != 12 {
        anyhow::bail!("/dev/kvm speaks KVM API version {v}, expected 12");
    }
    Ok(kvm)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct KvmOptions {
    /// Number of VMs.
    pub vms: usize,
    /// Problem size.
    pub size: u32,
    /// Shadow page-table mode of every VM.
    pub shadow: ShadowMode,
    /// Workloads each VM runs, in order (at most [`abi::MAX_WORKLOADS`]).
    pub workloads: Vec<Workload>,
    /// Wait for fences by interrupt (irqfd into the in-kernel IOAPIC, a ring-3 IDT gate).
    pub fence_irq: bool,
    /// VRAM slice per VM, MiB (0: an equal share, at most 1 GiB).
    pub vram_mib: u64,
    /// Guest RAM per VM, bytes (0: derived from the size).
    pub guest_ram: u64,
    /// The guest's mode per VM (`abi::MODE_*`; VMs beyond the list run normally).
    pub modes: Vec<u32>,
    /// Print each VM's console lines on standard error, prefixed with its name.
    pub echo_console: bool,
    /// Time `n` exits of each kind in every guest before it starts (0: no calibration).
    pub calibrate: u32,
    /// A VM still running after this long is stopped (checked at its exits).
    pub timeout: Duration,
    /// Coalesce writes to BAR3 (not under BAR remap) and BAR0's PRAMIN window (see
    /// [`BarWindows::coalesce_zones`]).
    pub coalesce: bool,
    /// VRAM of the simulated GPU.
    pub phys_vram: u64,
    /// Scheduling policy of the host (`None`: its default, FIFO).
    pub sched: Option<gpuvm::sched::Policy>,
    /// Parameters of CREDIT and BAND.
    pub sched_params: gpuvm::sched::SchedParams,
    /// Per-VM differences (workloads, weight, fence mode, kernel stream); VMs beyond the list
    /// use the defaults above.
    pub setups: Vec<VmSetup>,
    /// Sample every VM's GPU time this often (and service the host); `None`: no sampler.
    pub sample_every: Option<Duration>,
    /// The guests enumerate PCI through the ECAM window instead of ports 0xCF8/0xCFC (the VMM
    /// decodes both either way).
    pub ecam: bool,
    /// Record each VM's MMIO trace into this directory (`record`): the host then runs on a
    /// simulated clock stepped to wall time at each access, with the default scheduler.
    pub record: Option<std::path::PathBuf>,
    /// The virtualization scheme (`None`: trap every BAR access, shadow mode `shadow`); see
    /// [`scheme::KvmScheme`].
    pub scheme: Option<scheme::KvmScheme>,
    /// Attach the (single) VM's vGPU through this vfio-user socket (`gpuvm serve`) instead of
    /// an in-process host (see [`remote`]).
    pub vfio_user: Option<std::path::PathBuf>,
    /// Start the guests through their PVH entry (32-bit, paging off, as Cloud Hypervisor does;
    /// the guest switches to ring 3 itself) instead of directly in ring 3 (see [`pvh_boot`]).
    /// Normal mode only: no hostile modes, streams, gate, calibration or ECAM.
    pub pvh: bool,
    /// Snapshot or migrate the (single) guest after some exits ([`snapshot`], [`migrate`]).
    pub outgoing: Option<Outgoing>,
    /// Start the guest from this snapshot directory instead of booting it.
    pub restore: Option<std::path::PathBuf>,
    /// Wait on this Unix socket for a guest migrating in, then run it.
    pub migrate_listen: Option<std::path::PathBuf>,
}

/// Where the guest goes when its time comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Pause after `after_exits` exits (of this process), write a snapshot into `dir`, end.
    Snapshot {
        /// The snapshot directory (new or empty).
        dir: std::path::PathBuf,
        /// Exits before the pause.
        after_exits: u64,
    },
    /// After `after_exits` exits, migrate live to the VMM listening on `socket`.
    Migrate {
        /// The destination's socket.
        socket: std::path::PathBuf,
        /// Exits before pre-copy starts.
        after_exits: u64,
    },
}

impl Outgoing {
    fn after_exits(&self) -> u64 {
        match self {
            Outgoing::Snapshot { after_exits, .. } | Outgoing::Migrate { after_exits, .. } => {
                *after_exits
            }
        }
    }
}

/// Where a guest that did not boot here came from.
#[derive(Debug)]
pub enum Incoming {
    /// A snapshot directory, manifest checked.
    Restore(Box<snapshot::Loaded>),
    /// A migration stream, HELLO checked.
    Migration(Box<migrate::Incoming>),
}

/// How the guest left this process.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Handoff {
    /// Written into a snapshot directory.
    Snapshot(snapshot::Written),
    /// Migrated to another VMM.
    Migration(migrate::SourceStats),
}

/// How the guest came into this process.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Restored {
    /// "snapshot DIR" or "migration SOCKET".
    pub from: String,
    /// From the first byte read to the guest ready to run, ns.
    pub load_ns: u64,
    /// What could not be put back exactly.
    pub notes: vcpu_state::RestoreNotes,
    /// The migration as the destination saw it.
    pub migration: Option<migrate::DestStats>,
}

impl KvmOptions {
    /// The shadow mode the vGPUs run in: the scheme's, else `shadow`.
    pub fn shadow_mode(&self) -> ShadowMode {
        self.scheme.and_then(|s| s.shadow()).unwrap_or(self.shadow)
    }
}

impl Default for KvmOptions {
    fn default() -> Self {
        KvmOptions {
            vms: 1,
            size: 16,
            shadow: ShadowMode::Lazy,
            workloads: vec![Workload::Madd],
            fence_irq: false,
            vram_mib: 0,
            guest_ram: 0,
            modes: Vec::new(),
            echo_console: true,
            calibrate: 0,
            timeout: Duration::from_secs(600),
            coalesce: true,
            phys_vram: 6 << 30,
            sched: None,
            sched_params: gpuvm::sched::SchedParams::default(),
            setups: Vec::new(),
            sample_every: None,
            ecam: false,
            record: None,
            scheme: None,
            vfio_user: None,
            pvh: false,
            outgoing: None,
            restore: None,
            migrate_listen: None,
        }
    }
}

/// Exit counts of one VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitCounts {
    /// MMIO reads dispatched to the vGPU.
    pub mmio_reads: u64,
    /// MMIO writes dispatched to the vGPU.
    pub mmio_writes: u64,
    /// Port I/O exits (serial, PCI configuration, exit and phase ports).
    pub pio: u64,
    /// Other exits (calibration MMIO, interrupted runs).
    pub other: u64,
    /// MMIO writes KVM queued in the coalesced ring (no exit of their own), included in
    /// `mmio_writes`.
    pub coalesced_writes: u64,
    /// MMIO exits in the ECAM window (configuration space), not included in `mmio_*`.
    pub ecam: u64,
}

/// Per-exit costs measured inside the guest's calibration loop (wall time between the phase
/// markers divided by the exits).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Calibration {
    /// Exits of each kind.
    pub exits: u32,
    /// A port-I/O exit the VMM ignores, ns.
    pub pio_exit_ns: u64,
    /// An MMIO read the VMM answers with zero (no device work), ns.
    pub bare_mmio_exit_ns: u64,
    /// An MMIO read of the vGPU's BOOT_0 (the device model's register path), ns.
    pub vgpu_mmio_exit_ns: u64,
}

/// What happened to one VM under KVM, besides the workload results.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KvmVmInfo {
    /// The value the guest wrote to the exit port (0 pass, 1 fail, 2 panic), if it got there.
    pub exit_code: Option<u32>,
    /// Why the VMM stopped the VM, if it did (a fault, an access outside the BARs, a timeout).
    pub stopped: Option<String>,
    /// Wall time from the first KVM_RUN to the end.
    pub wall_ns: u64,
    /// Exits by kind.
    pub exits: ExitCounts,
    /// Mean wall time per MMIO exit over the whole run (guest work included), ns.
    pub ns_per_mmio_exit: u64,
    /// The guest waited for fences by interrupt (it asked for it and the driver accepted).
    pub fence_irq: bool,
    /// Rising edges of the vGPU's line sent through irqfd.
    pub irqs_raised: u64,
    /// Interrupts the guest's handler counted.
    pub irqs_seen: u64,
    /// RFLAGS when the VM ended (with interrupts: shows whether IF is still set).
    pub final_rflags: u64,
    /// Local APIC state of the vGPU's vector when the VM ended (with interrupts).
    pub final_lapic: String,
    /// Exit costs, with `--calibrate`.
    pub calibration: Option<Calibration>,
    /// BAR remap counters (`--scheme fv` and `pv`).
    pub remap: Option<remap::RemapStats>,
    /// The guest's console output.
    pub console: Vec<String>,
    /// The guest's phase markers, ns after the run started (all VMs share the origin).
    pub phases: Vec<PhaseMark>,
    /// `MODE_STREAM`: kernels completed and submitted.
    pub kernels: u64,
    /// `MODE_STREAM`: kernels submitted.
    pub kernels_submitted: u64,
    /// The VM's weight in the scheduler.
    pub weight: u32,
    /// Set if the VM was stopped: its vGPU was destroyed at once, with this many of its
    /// submissions still queued or on the GPU.
    pub destroyed_in_flight: Option<u64>,
    /// The timeout kicked the vCPU out of `KVM_RUN` (it was spinning without exits).
    pub kicked: bool,
    /// The guest came from a snapshot or a migration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
    /// The guest left this process (snapshot written, or migrated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    /// A snapshot or migration that was asked for and failed; the guest went on here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff_error: Option<String>,
    /// The origin of the VM's phase times when it was restored (its start, shifted back by the
    /// time it had run before).
    #[serde(skip)]
    pub origin: Option<Instant>,
}

/// A phase marker the guest wrote, as the VMM timestamped it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PhaseMark {
    /// `abi::PHASE_*`, or 0 (init) / 1 + i (workload i).
    pub phase: u32,
    /// ns after the run started.
    pub at_ns: u64,
}

/// One VM's results: the shape of the in-process `gpuvm run` plus `kvm`.
#[derive(Debug, Clone, Serialize)]
pub struct KvmVmReport {
    /// The VM's id.
    pub vm: u32,
    /// Driver bring-up.
    pub init: WorkloadRun,
    /// One entry per workload.
    pub workloads: Vec<WorkloadRun>,
    /// The vGPU's counters at the end.
    pub stats: VgpuStats,
    /// KVM-side facts.
    pub kvm: KvmVmInfo,
}

impl KvmVmReport {
    /// True if the VM ran to its exit port, the driver came up and every workload verified.
    pub fn all_verified(&self) -> bool {
        if self.kvm.handoff.is_some() {
            // It continues elsewhere: success is that it left intact.
            return self.kvm.stopped.is_none();
        }
        self.kvm.handoff_error.is_none()
            && self.kvm.stopped.is_none()
            && self.kvm.exit_code == Some(abi::EXIT_PASS)
            && self.init.verified
            && self.workloads.iter().all(|w| w.verified)
    }
}

/// The result of a KVM run.
#[derive(Debug, Clone, Serialize)]
pub struct KvmReport {
    /// "kvm".
    pub backend: &'static str,
    /// `/dev/kvm` is PVM.
    pub pvm: bool,
    /// The privilege level guests run at.
    pub guest_ring: u8,
    /// Always "real": guests run in real time.
    pub clock: ClockKind,
    /// Problem size.
    pub size: u32,
    /// Shadow mode.
    pub shadow: ShadowMode,
    /// The scheme, if one was chosen (`native`, `fv-naive`, `fv`, `pv`).
    pub scheme: Option<scheme::KvmScheme>,
    /// One entry per VM.
    pub vms: Vec<KvmVmReport>,
    /// Host counters after every VM was destroyed.
    pub host: HostStats,
    /// When the start gate opened, ns after the run started.
    pub gate_open_ns: Option<u64>,
    /// GPU time per VM sampled over the run (with `sample_every`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<Sample>,
    /// The trace files written (with `record`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recorded: Vec<std::path::PathBuf>,
}

impl KvmReport {
    /// True if every VM verified every workload.
    pub fn all_verified(&self) -> bool {
        self.vms.iter().all(KvmVmReport::all_verified)
    }
}

/// Guest RAM layout of one VM: heap and DMA region sizes.
fn ram_layout(opts: &KvmOptions) -> (u64, u64, u64) {
    let matrix = (opts.size as u64).pow(2) * 4;
    if opts.guest_ram != 0 {
        let ram = opts.guest_ram.next_multiple_of(2 << 20).max(32 << 20);
        let heap = (ram - abi::HEAP_BASE) / 2;
        return (ram, heap, ram - abi::HEAP_BASE - heap);
    }
    let heap = (8 * matrix + (16 << 20)).next_multiple_of(2 << 20);
    let dma = (8 * matrix + (16 << 20)).next_multiple_of(2 << 20);
    (abi::HEAP_BASE + heap + dma, heap, dma)
}

/// Runs the workloads in `opts.vms` KVM VMs at once on one simulated GPU.
pub fn run_kvm(opts: &KvmOptions) -> anyhow::Result<KvmReport> {
    run_kvm_with(opts, None)
}

/// [`run_kvm`], VM 0 starting from `incoming` (a snapshot or a migration) instead of booting.
pub fn run_kvm_with(opts: &KvmOptions, incoming: Option<Incoming>) -> anyhow::Result<KvmReport> {
    let kvm = open_kvm()?;
    let handoff = incoming.is_some() || opts.outgoing.is_some();
    if handoff {
        snapshot::check_supported(opts)?;
    }
    if let Some(Outgoing::Snapshot { dir, .. }) = &opts.outgoing {
        // Said now rather than after the guest has run up to the snapshot.
        if let Ok(mut entries) = std::fs::read_dir(dir) {
            anyhow::ensure!(
                entries.next().is_none(),
                "--snapshot-to {}: the directory is not empty",
                dir.display()
            );
        }
    }
    if opts.vms == 0 || opts.vms > 64 {
        anyhow::bail!("vms = {} must be 1..=64", opts.vms);
    }
    if opts.workloads.len() > abi::MAX_WORKLOADS {
        anyhow::bail!("at most {} workloads per run", abi::MAX_WORKLOADS);
    }
    if opts.record.is_some() {
        anyhow::ensure!(
            opts.sample_every.is_none(),
            "--record cannot be combined with the GPU-time sampler (its host polls belong to no VM's trace)"
        );
        anyhow::ensure!(
            matches!(opts.sched, None | Some(gpuvm::sched::Policy::Fifo)),
            "--record needs the host's default scheduler (FIFO): `gpuvm trace replay` runs it"
        );
        anyhow::ensure!(
            !opts.scheme.is_some_and(|s| s.remaps()),
            "--record needs every BAR access to exit (BAR remap lets the guest write VRAM without the device model seeing it): use --scheme fv-naive or no --scheme"
        );
    }
    // Recording: a simulated clock that the recorders step to wall time at each access.
    let stepped = opts.record.as_ref().map(|_| Arc::new(SimClock::new()));
    let clock: Arc<dyn Clock> = match &stepped {
        Some(c) => c.clone(),
        None => ClockKind::Real.create(),
    };
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: opts.phys_vram,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    if opts.scheme == Some(scheme::KvmScheme::Native) {
        return run_native(&kvm, opts, sim);
    }
    let phys: Arc<dyn PhysicalGpu> = sim.clone();
    // Enough hypervisor VRAM for every VM's shadow reservation (64 VMs: 528 MiB), as the
    // in-process runs have.
    let hcfg = gpuvm_harness::virt::host_config_for(&HostConfig::default(), opts.vms);
    let hyp = hcfg.hypervisor_vram >> 20;
    let host = Arc::new(GpuHost::new(phys, hcfg).context("bringing up the GPU host")?);
    // VM 0 of a restore gets its vGPU from the snapshot or the migration stream.
    let restoring = incoming.is_some();
    if let Some(p) = opts.sched {
        host.set_scheduler(p.create(&opts.sched_params))
            .context("setting the scheduler")?;
    }
    let vram_mib = if opts.vram_mib == 0 {
        (((opts.phys_vram >> 20).saturating_sub(hyp)) / opts.vms as u64).min(1024)
    } else {
        opts.vram_mib
    };
    let channels = (128 / opts.vms as u32).min(16);
    let mut vgpus = Vec::new();
    let mut devs: Vec<Arc<dyn VgpuDevice>> = Vec::new();
    for i in 0..opts.vms {
        let p = VgpuProfile {
            name: format!("vm{i}"),
            vram_mib,
            channels,
            weight: opts.setups.get(i).map_or(1, |s| s.weight.max(1)),
            shadow: opts.shadow_mode(),
        };
        if restoring && i == 0 {
            devs.push(Arc::new(migratable::MigratableVgpu::to_restore(
                host.clone(),
                sim.clone(),
            )));
            continue;
        }
        // The DMA window sized from the guest's RAM (not the host's default 32 GiB), so that
        // 64 guests of tens of MiB fit in the 2^40-byte IOVA space.
        let v = host
            .create_vgpu_for_ram(&p, ram_layout(opts).0)
            .with_context(|| format!("creating the vGPU of vm{i}"))?;
        devs.push(if handoff {
            // The snapshot seam (see `migratable::MigratableVgpu`).
            Arc::new(migratable::MigratableVgpu::new(
                host.clone(),
                sim.clone(),
                v.clone(),
            ))
        } else {
            Arc::new(LocalVgpu::new(v.clone(), sim.clone()))
        });
        vgpus.push(v);
    }
    let gated = (0..opts.vms)
        .filter(|&i| {
            let mode = opts.modes.get(i).copied().unwrap_or(abi::MODE_NORMAL);
            opts.setups
                .get(i)
                .is_some_and(|s| s.gate || (mode == abi::MODE_NORMAL && s.stream.is_some()))
        })
        .count();
    let session = opts.record.as_ref().map(|_| {
        let note = format!(
            "kvm;workloads={};size={};fence={};vms={}",
            opts.workloads
                .iter()
                .map(|w| w.name())
                .collect::<Vec<_>>()
                .join(","),
            opts.size,
            if opts.fence_irq { "Interrupt" } else { "Poll" },
            opts.vms
        );
        gpuvm_trace::record::Session::new(opts.vms as u32, opts.phys_vram, host.config(), &note)
    });
    let start = Instant::now();
    let mut recorders = Vec::new();
    if let (Some(session), Some(clock)) = (&session, &stepped) {
        let guest_ram = ram_layout(opts).0;
        for (i, v) in vgpus.iter().enumerate() {
            let rec = TapRecorder::new(
                session.clone(),
                v,
                i as u32,
                guest_ram,
                clock.clone(),
                start,
            );
            if v.set_access_tap(rec.clone()).is_err() {
                anyhow::bail!("vm{i}: the vGPU already has an access tap");
            }
            recorders.push(rec);
        }
    }
    let ctx = RunCtx {
        host: Some(&*host),
        sim: Some(&sim),
        gate: Gate::new(gated),
        start,
        recorders,
        incoming: std::sync::Mutex::new(incoming),
    };
    let sampler = Sampler::new();
    let reports: Vec<KvmVmReport> = std::thread::scope(|s| {
        if let Some(every) = opts.sample_every {
            let (sampler, ctx, vgpus, host, sim) = (&sampler, &ctx, &vgpus, &host, &*sim);
            std::thread::Builder::new()
                .name("sampler".into())
                .spawn_scoped(s, move || sampler.run(every, ctx.start, host, sim, vgpus))
                .expect("spawning the sampler thread");
        }
        let handles: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(i, dev)| {
                let (kvm, ctx, dev) = (&kvm, &ctx, dev.clone());
                std::thread::Builder::new()
                    .name(format!("vm{i}"))
                    .spawn_scoped(s, move || run_vm(kvm, i, dev, ctx, opts))
                    .expect("spawning a VM thread")
            })
            .collect();
        let reports = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a VM thread panicked")))
            .collect();
        sampler.stop();
        reports
    });
    if opts.sample_every.is_some() {
        sampler.sample(ctx.start, &host, &sim, &vgpus);
    }
    for (d, r) in devs.iter().zip(&reports) {
        if let (None, Some(v)) = (r.kvm.destroyed_in_flight, d.vgpu()) {
            host.destroy_vgpu(v).context("destroying a vGPU")?;
        }
    }
    let recorded = match (&session, &opts.record) {
        (Some(s), Some(dir)) => s
            .write_dir(dir, false)
            .with_context(|| format!("writing traces to {}", dir.display()))?,
        _ => Vec::new(),
    };
    drop(vgpus);
    drop(devs);
    Ok(KvmReport {
        backend: "kvm",
        pvm: is_pvm(),
        guest_ring: 3,
        clock: ClockKind::Real,
        size: opts.size,
        shadow: opts.shadow_mode(),
        scheme: opts.scheme,
        vms: reports,
        host: host.stats(),
        gate_open_ns: ctx
            .gate
            .opened()
            .map(|t| t.saturating_duration_since(ctx.start).as_nanos() as u64),
        samples: sampler.take(),
        recorded,
    })
}

/// What the threads of one run share.
struct RunCtx<'a> {
    /// The shared host (`None` for the `native` scheme: the GPU is passed through).
    host: Option<&'a GpuHost>,
    /// The simulated GPU under the host (`None` when the device is elsewhere).
    sim: Option<&'a SimGpu>,
    gate: Gate,
    /// The origin of every VM's phase times and of the samples.
    start: Instant,
    /// One trace recorder per VM (with `record`; empty otherwise).
    recorders: Vec<Arc<TapRecorder>>,
    /// Where VM 0 comes from, if it does not boot (taken by its thread).
    incoming: std::sync::Mutex<Option<Incoming>>,
}

impl RunCtx<'_> {
    /// A context of one VM with no shared host in this process (`--scheme native`,
    /// `--vfio-user`): no gate, no recorders.
    fn detached() -> RunCtx<'static> {
        RunCtx {
            host: None,
            sim: None,
            gate: Gate::new(0),
            start: Instant::now(),
            recorders: Vec::new(),
            incoming: std::sync::Mutex::new(None),
        }
    }
}

/// The `native` scheme: one VM with the simulated GPU passed through ([`passthrough`]): no
/// host, no device model, no scheduler.
fn run_native(kvm: &Kvm, opts: &KvmOptions, sim: Arc<SimGpu>) -> anyhow::Result<KvmReport> {
    anyhow::ensure!(
        opts.vms == 1,
        "--scheme native runs exactly one VM (the GPU is passed through to it), not {}",
        opts.vms
    );
    anyhow::ensure!(
        opts.record.is_none(),
        "--record records the device model's accesses; --scheme native has none"
    );
    let dev: Arc<dyn VgpuDevice> = Arc::new(Passthrough::new(sim.clone()));
    let ctx = RunCtx::detached();
    let report = run_vm(kvm, 0, dev, &ctx, opts);
    Ok(KvmReport {
        backend: "kvm",
        pvm: is_pvm(),
        guest_ring: 3,
        clock: ClockKind::Real,
        size: opts.size,
        shadow: opts.shadow_mode(),
        scheme: opts.scheme,
        vms: vec![report],
        host: HostStats {
            vms: 1,
            gpu: sim.stats(),
            ..HostStats::default()
        },
        gate_open_ns: None,
        samples: Vec::new(),
        recorded: Vec::new(),
    })
}

/// The vGPU's interrupt line as an irqfd: a rising edge signals the eventfd, which KVM turns
/// into an edge on IOAPIC pin [`IRQ_GSI`].
struct IrqfdLine {
    evt: EventFd,
    level: AtomicBool,
    raised: AtomicU64,
}

impl IrqLine for IrqfdLine {
    fn set_level(&self, asserted: bool) {
        let was = self.level.swap(asserted, Ordering::SeqCst);
        if asserted && !was {
            self.raised.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = self.evt.write(1) {
                log::warn!("irqfd write failed: {e}");
            }
        }
    }
}

/// A phase marker: phase id, when, GPU busy so far, MMIO exits so far.
#[derive(Debug, Clone, Copy)]
struct Mark {
    phase: u32,
    at: Instant,
    busy_ns: u64,
    reads: u64,
    writes: u64,
}

/// One VM's thread: set up, run the vCPU until the guest reports through the exit port or is
/// stopped, collect the results.
fn run_vm(
    kvm: &Kvm,
    index: usize,
    dev: Arc<dyn VgpuDevice>,
    ctx: &RunCtx,
    opts: &KvmOptions,
) -> KvmVmReport {
    let name = format!("vm{index}");
    let mut info = KvmVmInfo {
        weight: dev.vgpu().map_or(1, |v| v.profile().weight),
        ..KvmVmInfo::default()
    };
    let mut marks = Vec::new();
    let mut ram = None;
    match run_vcpu(kvm, index, &dev, ctx, opts, &mut info, &mut marks, &mut ram) {
        Ok(()) => {}
        Err(e) => {
            let msg = format!("{name}: VM setup failed: {e:#}");
            eprintln!("gpuvm: {msg}");
            info.stopped = Some(msg);
        }
    }
    let stats = dev.stats();
    if let (true, Some(host), Some(v)) = (info.stopped.is_some(), ctx.host, dev.vgpu()) {
        // Contain it now, while the others run: its work in flight is dropped with it.
        info.destroyed_in_flight = Some(match ctx.recorders.get(index) {
            Some(rec) => {
                let mut n = 0;
                rec.destroy(|| n = destroy_stopped(host, v, &name));
                n
            }
            None => destroy_stopped(host, v, &name),
        });
    }
    if let Some(rec) = ctx.recorders.get(index) {
        rec.finish();
    }
    let names: Vec<&str> = match vm_mode(opts, index) {
        abi::MODE_STREAM => vec!["stream"],
        abi::MODE_STOP_FAULT | abi::MODE_STOP_SPIN => vec!["long kernel"],
        _ => vm_workloads(opts, index).iter().map(|w| w.name()).collect(),
    };
    let (init, workloads) = collect_results(ram.as_ref(), &marks, &names, &info);
    let origin = info.origin.unwrap_or(ctx.start);
    info.phases = marks
        .iter()
        .map(|m| PhaseMark {
            phase: m.phase,
            at_ns: m.at.saturating_duration_since(origin).as_nanos() as u64,
        })
        .collect();
    KvmVmReport {
        vm: dev.vm_id().unwrap_or(index as u32),
        init,
        workloads,
        stats,
        kvm: info,
    }
}

/// Destroys the vGPU of a VM the VMM stopped; returns how many of its submissions were still
/// queued or on the GPU.
fn destroy_stopped(host: &GpuHost, vgpu: &Vgpu, name: &str) -> u64 {
    let in_flight = host
        .sched_stats()
        .vms
        .iter()
        .find(|v| v.vm == vgpu.id())
        .map_or(0, |v| {
            v.dispatched.saturating_sub(v.retired) + v.queued as u64
        });
    match host.destroy_vgpu(vgpu) {
        Ok(()) => eprintln!(
            "gpuvm: {name}: vGPU destroyed with {in_flight} submission(s) in flight; the other VMs go on"
        ),
        Err(e) => eprintln!("gpuvm: {name}: destroying the vGPU failed: {e}"),
    }
    in_flight
}

/// The guest mode of VM `index`.
fn vm_mode(opts: &KvmOptions, index: usize) -> u32 {
    match opts.modes.get(index).copied().unwrap_or(abi::MODE_NORMAL) {
        abi::MODE_NORMAL if opts.setups.get(index).is_some_and(|s| s.stream.is_some()) => {
            abi::MODE_STREAM
        }
        m => m,
    }
}

/// Writes the boot-parameter block of the VMM's direct ring-3 start.
fn write_boot_params(
    gvm: &vm::GuestVm,
    vcpu: &VcpuFd,
    opts: &KvmOptions,
    index: usize,
    fence_irq: bool,
) -> anyhow::Result<()> {
    let setup = opts.setups.get(index).cloned().unwrap_or_default();
    let workloads = vm_workloads(opts, index);
    let (_, heap, dma) = ram_layout(opts);
    let tsc_khz = vcpu.get_tsc_khz().unwrap_or(0);
    let bp = |off: u64| abi::BOOT_PARAMS + off;
    gvm.write_u64(bp(abi::BP_MAGIC), abi::MAGIC)?;
    gvm.write_u32(bp(abi::BP_MODE), vm_mode(opts, index))?;
    gvm.write_u32(bp(abi::BP_SIZE), opts.size)?;
    gvm.write_u32(bp(abi::BP_FENCE_MODE), fence_irq as u32)?;
    gvm.write_u32(bp(abi::BP_NWORKLOADS), workloads.len() as u32)?;
    gvm.write_u32(bp(abi::BP_GATE), setup.gate as u32)?;
    gvm.write_u64(bp(abi::BP_ECAM), if opts.ecam { abi::ECAM_BASE } else { 0 })?;
    if let Some(st) = setup.stream {
        gvm.write_u64(bp(abi::BP_STREAM_ITERS), st.iterations)?;
        gvm.write_u32(bp(abi::BP_STREAM_OUTSTANDING), st.outstanding)?;
        gvm.write_u32(bp(abi::BP_STREAM_START_MS), st.start_ms)?;
        gvm.write_u32(bp(abi::BP_STREAM_MS), st.run_ms)?;
        gvm.write_u32(bp(abi::BP_STREAM_COUNT), st.count)?;
    }
    gvm.write_u64(bp(abi::BP_TSC_KHZ), tsc_khz as u64)?;
    gvm.write_u64(bp(abi::BP_HEAP_BASE), abi::HEAP_BASE)?;
    gvm.write_u64(bp(abi::BP_HEAP_SIZE), heap)?;
    gvm.write_u64(bp(abi::BP_DMA_BASE), abi::HEAP_BASE + heap)?;
    gvm.write_u64(bp(abi::BP_DMA_SIZE), dma)?;
    gvm.write_u64(bp(abi::BP_MMIO_BASE), abi::MMIO_HOLE)?;
    gvm.write_u32(bp(abi::BP_IRQ_VECTOR), IRQ_VECTOR)?;
    gvm.write_u32(bp(abi::BP_IRQ_GSI), IRQ_GSI)?;
    gvm.write_u32(bp(abi::BP_CALIBRATE), opts.calibrate)?;
    for (i, w) in workloads.iter().enumerate() {
        let idx = Workload::ALL.iter().position(|x| x == w).unwrap_or(0xff) as u32;
        gvm.mem
            .write_obj(
                idx as u8,
                vm_memory::GuestAddress(bp(abi::BP_WORKLOADS) + i as u64),
            )
            .context("writing boot parameters")?;
    }
    Ok(())
}

/// The PVH start ([`pvh_boot`]): the start info with a command line saying what the boot
/// parameters would (size, workloads, interrupt pin), the vCPU at the PVH entry.
fn pvh_setup(
    kvm: &Kvm,
    vcpu: &VcpuFd,
    gvm: &vm::GuestVm,
    opts: &KvmOptions,
    index: usize,
    ram: u64,
    fence_irq: bool,
) -> anyhow::Result<()> {
    let setup = opts.setups.get(index).cloned().unwrap_or_default();
    anyhow::ensure!(
        vm_mode(opts, index) == abi::MODE_NORMAL
            && setup.stream.is_none()
            && !setup.gate
            && opts.calibrate == 0
            && !opts.ecam,
        "--pvh runs the workloads only: no hostile modes, streams, gate, calibration or ECAM"
    );
    let names: Vec<&str> = vm_workloads(opts, index).iter().map(|w| w.name()).collect();
    let irq = if fence_irq {
        format!("intx:{IRQ_GSI}")
    } else {
        "poll".to_string()
    };
    let cmdline = format!(
        "size={} workloads={} irq={irq} tsc_khz={}",
        opts.size,
        names.join(","),
        vcpu.get_tsc_khz().unwrap_or(0)
    );
    pvh_boot::write_start_info(&gvm.mem, ram, &cmdline)?;
    pvh_boot::setup_vcpu(kvm, vcpu, pvh_boot::entry(GUEST_ELF)?)
}

/// The workloads of VM `index`.
fn vm_workloads(opts: &KvmOptions, index: usize) -> &[Workload] {
    opts.setups
        .get(index)
        .and_then(|s| s.workloads.as_deref())
        .unwrap_or(&opts.workloads)
}

/// A guest's state, read from where it came from and put into the new VM: everything but the
/// vGPU, which is restored once RAM and its interrupt are attached.
struct RestoredState {
    machine: snapshot::MachineState,
    vgpu_bytes: Vec<u8>,
    migration: Option<Box<migrate::Incoming>>,
    report: Restored,
    t0: Instant,
}

/// Loads RAM and puts the VM's and the vCPU's state back (a migration: receives the pre-copy
/// rounds and the state first; on failure the source is told why, so it resumes the guest).
fn restore_machine(
    gvm: &vm::GuestVm,
    vcpu: &VcpuFd,
    inc: Incoming,
) -> anyhow::Result<RestoredState> {
    let t0 = Instant::now();
    let put = |machine: &snapshot::MachineState| -> anyhow::Result<vcpu_state::RestoreNotes> {
        let state = machine.vcpus.first().context("the state has no vCPU")?;
        vcpu_state::restore_vm(&gvm.fd, &machine.vm)?;
        vcpu_state::restore_vcpu(&gvm.fd, vcpu, state)
    };
    match inc {
        Incoming::Restore(l) => {
            let l = *l;
            l.load_ram(&gvm.mem)?;
            let vgpu_bytes = l.vgpu_bytes()?;
            let notes = put(&l.manifest.machine)?;
            Ok(RestoredState {
                report: Restored {
                    from: format!("snapshot {}", l.dir.display()),
                    notes,
                    ..Restored::default()
                },
                machine: l.manifest.machine,
                vgpu_bytes,
                migration: None,
                t0,
            })
        }
        Incoming::Migration(m) => {
            let mut m = *m;
            let r = m
                .receive(&gvm.mem)
                .and_then(|(machine, vb)| Ok((put(&machine)?, machine, vb)));
            match r {
                Err(e) => {
                    m.refuse(&e);
                    Err(e)
                }
                Ok((notes, machine, vgpu_bytes)) => Ok(RestoredState {
                    report: Restored {
                        from: format!("migration {}", m.socket().display()),
                        notes,
                        ..Restored::default()
                    },
                    machine,
                    vgpu_bytes,
                    migration: Some(Box::new(m)),
                    t0,
                }),
            }
        }
    }
}

/// What the VMM keeps about the guest, for a snapshot.
fn vmm_state(
    uart: &serial::Uart,
    pci: &PciBus,
    ex: &ExitCounts,
    marks: &[Mark],
    start: Instant,
) -> snapshot::VmmState {
    snapshot::VmmState {
        serial: snapshot::SerialRegs::of(&uart.state()),
        console_partial: uart.writer().partial().to_vec(),
        console: uart.writer().lines.clone(),
        pci_address: pci.address(),
        exits: *ex,
        marks: marks
            .iter()
            .map(|m| snapshot::MarkState {
                phase: m.phase,
                at_ns: m.at.saturating_duration_since(start).as_nanos() as u64,
                busy_ns: m.busy_ns,
                reads: m.reads,
                writes: m.writes,
            })
            .collect(),
        elapsed_ns: start.elapsed().as_nanos() as u64,
    }
}

/// Captures everything but RAM; the vGPU first (it quiesces), unless `with_vgpu` is false (a
/// live migration: the migration thread sends the vGPU's stream and fills in its part). If
/// the rest fails after the vGPU was saved, the vGPU is resumed.
fn capture_machine(
    kvm: &Kvm,
    gvm: &vm::GuestVm,
    vcpu: &VcpuFd,
    vgpu: &dyn VgpuDevice,
    vmm: snapshot::VmmState,
    with_vgpu: bool,
) -> anyhow::Result<(snapshot::MachineState, Vec<u8>)> {
    let seam = vgpu
        .snapshot()
        .context("this vGPU has no snapshot support")?;
    let bytes = match with_vgpu {
        true => seam.save().context("the vGPU")?,
        false => Vec::new(),
    };
    let rest = vcpu_state::capture_vcpu(kvm, &gvm.fd, vcpu)
        .and_then(|c| Ok((vec![c], vcpu_state::capture_vm(&gvm.fd)?)));
    let (vcpus, vm) = match rest {
        Ok(x) => x,
        Err(e) => {
            seam.resume();
            return Err(e);
        }
    };
    Ok((
        snapshot::MachineState {
            vm,
            vcpus,
            vmm,
            vgpu: snapshot::device_info(seam, &bytes),
        },
        bytes,
    ))
}

#[allow(clippy::too_many_arguments)]
fn run_vcpu(
    kvm: &Kvm,
    index: usize,
    vgpu: &Arc<dyn VgpuDevice>,
    ctx: &RunCtx,
    opts: &KvmOptions,
    info: &mut KvmVmInfo,
    marks: &mut Vec<Mark>,
    ram_out: &mut Option<vm::GuestVm>,
) -> anyhow::Result<()> {
    let name = format!("vm{index}");
    let sim = ctx.sim;
    let setup = opts.setups.get(index).cloned().unwrap_or_default();
    let fence_irq = setup.fence_irq.unwrap_or(opts.fence_irq);
    let workloads = vm_workloads(opts, index);
    if workloads.len() > abi::MAX_WORKLOADS {
        anyhow::bail!("at most {} workloads per VM", abi::MAX_WORKLOADS);
    }
    let (ram, heap, _) = ram_layout(opts);
    let gvm = if vgpu.needs_shared_ram() {
        vm::GuestVm::with_memory(kvm, shared_ram::memfd_ram(ram)?)?
    } else {
        vm::GuestVm::new(kvm, ram)?
    };
    let mut vcpu = gvm.create_vcpu()?;
    let incoming = match index {
        0 => ctx
            .incoming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(),
        _ => None,
    };
    let mut restored = match incoming {
        None => {
            let entry = gvm.load_elf(GUEST_ELF)?;
            if opts.pvh {
                pvh_setup(kvm, &vcpu, &gvm, opts, index, ram, fence_irq)?;
            } else {
                cpu::write_system_tables(&gvm.mem)?;
                cpu::setup(kvm, &vcpu, entry, fence_irq)?;
                write_boot_params(&gvm, &vcpu, opts, index, fence_irq)?;
            }
            None
        }
        Some(inc) => Some(restore_machine(&gvm, &vcpu, inc)?),
    };
    if let Some(r) = restored.as_mut() {
        // The vGPU once RAM is back (its state names guest RAM: page tables, rings, the DMA
        // windows), before the vCPU runs.
        let res = vgpu
            .snapshot()
            .context("this vGPU has no snapshot support")
            .and_then(|seam| {
                snapshot::restore_device(seam, &r.machine.vgpu, &r.vgpu_bytes, &gvm.mem)
            });
        if let (Some(m), Err(e)) = (r.migration.as_mut(), &res) {
            m.refuse(e);
        }
        res.context("restoring the vGPU")?;
        r.vgpu_bytes = Vec::new();
    }

    vgpu.attach_ram(&gvm.mem)
        .context("attaching guest RAM to the vGPU")?;
    // With `record`: the guest's writes to its DMA region, found in KVM's dirty log.
    let mut ram_log = match ctx.recorders.get(index) {
        Some(rec) => Some((
            record::RamLog::start(&gvm, abi::HEAP_BASE + heap..ram, rec)?,
            rec.clone(),
        )),
        None => None,
    };
    let mut sync_ram = |gvm: &vm::GuestVm| -> Result<(), String> {
        match &mut ram_log {
            Some((log, rec)) => log
                .sync(gvm, rec)
                .map_err(|e| format!("{name}: recording guest RAM: {e:#}: VM stopped")),
            None => Ok(()),
        }
    };

    if fence_irq {
        let evt = EventFd::new(0).context("eventfd")?;
        gvm.fd.register_irqfd(&evt, IRQ_GSI).context("KVM_IRQFD")?;
        vgpu.connect_irq(evt)?;
    }

    let mut pci = PciBus::new(vgpu.clone());
    let mut uart = serial::uart(&name, opts.echo_console);
    let mut windows = BarWindows::default();
    let mut ex = ExitCounts::default();
    let mut start = Instant::now();
    if let Some(r) = restored.as_mut() {
        let v = &r.machine.vmm;
        pci.set_address(v.pci_address);
        uart = serial::restored_uart(
            &name,
            opts.echo_console,
            &v.serial.state(),
            &v.console_partial,
            &v.console,
        )?;
        ex = v.exits;
        start = start
            .checked_sub(Duration::from_nanos(v.elapsed_ns))
            .unwrap_or(start);
        *marks = v
            .marks
            .iter()
            .map(|m| Mark {
                phase: m.phase,
                at: start + Duration::from_nanos(m.at_ns),
                busy_ns: m.busy_ns,
                reads: m.reads,
                writes: m.writes,
            })
            .collect();
        info.origin = Some(start);
        let mut report = std::mem::take(&mut r.report);
        if let Some(m) = r.migration.as_mut() {
            report.migration = Some(m.loaded()?);
        }
        report.load_ns = r.t0.elapsed().as_nanos() as u64;
        if !report.notes.msrs_refused.is_empty() || report.notes.tsc_khz.is_some() {
            eprintln!(
                "gpuvm: {name}: restored with differences: {:?}",
                report.notes
            );
        }
        eprintln!(
            "gpuvm: {name}: restored from {} in {:.1} ms; the guest continues",
            report.from,
            report.load_ns as f64 / 1e6
        );
        info.restored = Some(report);
    }
    let timeout = setup.timeout.unwrap_or(opts.timeout);
    let deadline = Instant::now() + timeout;
    // Declared after `vcpu`, so dropped (disarmed) before it.
    let kicker = kick::Kicker::arm(&mut vcpu, deadline, setup.stall)?;
    let mut at_gate = false;
    let mark = |phase: u32, ex: &ExitCounts| Mark {
        phase,
        at: Instant::now(),
        busy_ns: vgpu.busy_ns(),
        reads: ex.mmio_reads,
        writes: ex.mmio_writes,
    };
    let mut zones: Vec<(u64, u64)> = Vec::new();
    let mut remap = opts
        .scheme
        .filter(|s| s.remaps())
        .and_then(|_| sim.and_then(|s| s.vram_backing()))
        .map(|vram| remap::Remap::new(kvm, vram));
    if opts.coalesce {
        vcpu.map_coalesced_mmio_ring()
            .context("mapping the coalesced MMIO ring")?;
    }
    // How the loop ended.
    enum End {
        Exit(u32),
        Stop(String),
        /// Snapshot written or migrated: the guest goes on elsewhere.
        HandedOff,
    }
    // Exits in this process (what `--snapshot-after-exits`/`--migrate-after-exits` count).
    let mut exits_here = 0u64;
    let mut handoff_tried = false;
    let mut source: Option<migrate::Source> = None;
    let spec = match &opts.outgoing {
        Some(_) => Some(snapshot::GuestSpec::of(opts)?),
        None => None,
    };
    let stop: End = loop {
        // A kick (timeout, or the migration asking for the stop) sets `immediate_exit`; it has
        // done its work once the checks below see why it was sent (each sender sets its
        // reason before it signals).
        vcpu.set_kvm_immediate_exit(0);
        if let (Some(out), Some(spec)) = (&opts.outgoing, &spec) {
            // A migration that failed before asking for the stop: the guest goes on here.
            if source
                .as_ref()
                .is_some_and(|s| !s.wants_stop() && s.finished())
            {
                if let Some(mut s) = source.take() {
                    let e = s.join().err().map_or_else(
                        || "the migration thread ended without a stop".to_string(),
                        |e| format!("{e:#}"),
                    );
                    handoff_failed(info, &gvm, &name, "migration", e);
                }
            }
            let due = !handoff_tried && exits_here >= out.after_exits();
            if let (Outgoing::Migrate { socket, .. }, true) = (out, due) {
                handoff_tried = true;
                let live = vgpu
                    .snapshot()
                    .context("this vGPU cannot be migrated live")
                    .and_then(|s| s.live());
                match live.and_then(|live| {
                    gvm.set_dirty_log(true)?;
                    migrate::Source::start(kvm, &gvm, socket, spec.clone(), live)
                }) {
                    Ok(s) => {
                        eprintln!(
                            "gpuvm: {name}: migrating to {} after {exits_here} exits (pre-copy)",
                            socket.display()
                        );
                        source = Some(s);
                    }
                    Err(e) => handoff_failed(info, &gvm, &name, "migration", format!("{e:#}")),
                }
            }
            let pause = match out {
                Outgoing::Snapshot { .. } => due,
                Outgoing::Migrate { .. } => source.as_ref().is_some_and(|s| s.wants_stop()),
            };
            if pause {
                handoff_tried = true;
                let paused = Instant::now();
                // Finish the pending exit, replay queued writes, then capture.
                let captured = vcpu_state::complete_pending_io(&mut vcpu)
                    .and_then(|()| {
                        if opts.coalesce {
                            drain_coalesced(
                                &mut vcpu,
                                &windows,
                                &**vgpu,
                                &mut ex,
                                remap.as_mut(),
                                &name,
                            )
                            .map_err(|e| anyhow::anyhow!(e))?;
                        }
                        Ok(())
                    })
                    .and_then(|()| {
                        let vmm = vmm_state(&uart, &pci, &ex, marks, start);
                        let with_vgpu = matches!(out, Outgoing::Snapshot { .. });
                        capture_machine(kvm, &gvm, &vcpu, &**vgpu, vmm, with_vgpu)
                    });
                match out {
                    Outgoing::Snapshot { dir, after_exits } => {
                        let written = captured.and_then(|(machine, bytes)| {
                            snapshot::write_dir(
                                dir,
                                spec.clone(),
                                format!("--snapshot-after-exits {after_exits}"),
                                machine,
                                &bytes,
                                &gvm.mem,
                            )
                        });
                        match written {
                            Ok(w) => {
                                eprintln!(
                                    "gpuvm: {name}: snapshot written to {} after {exits_here} exits ({} of {} RAM pages non-zero, {:.1} ms)",
                                    dir.display(),
                                    w.data_pages,
                                    w.ram_bytes / snapshot::PAGE,
                                    w.write_ns as f64 / 1e6
                                );
                                info.handoff = Some(Handoff::Snapshot(w));
                                break End::HandedOff;
                            }
                            Err(e) => {
                                if let Some(seam) = vgpu.snapshot() {
                                    seam.resume();
                                }
                                handoff_failed(
                                    info,
                                    &gvm,
                                    &name,
                                    "snapshot",
                                    format!("to {}: {e:#}", dir.display()),
                                )
                            }
                        }
                    }
                    Outgoing::Migrate { .. } => {
                        if let Some(mut s) = source.take() {
                            match s.hand_over(captured.map_err(|e| format!("{e:#}"))) {
                                Ok(mut st) => {
                                    st.downtime_ns = paused.elapsed().as_nanos() as u64;
                                    eprintln!(
                                        "gpuvm: {name}: migrated to {}: {} rounds, {} bytes, {:.1} ms in all, downtime {:.1} ms",
                                        st.socket.display(),
                                        st.rounds.len(),
                                        st.bytes,
                                        st.total_ns as f64 / 1e6,
                                        st.downtime_ns as f64 / 1e6
                                    );
                                    info.handoff = Some(Handoff::Migration(st));
                                    break End::HandedOff;
                                }
                                Err(e) => {
                                    handoff_failed(info, &gvm, &name, "migration", format!("{e:#}"))
                                }
                            }
                        }
                    }
                }
            }
        }
        if let Err(msg) = sync_ram(&gvm) {
            break End::Stop(msg);
        }
        if opts.coalesce {
            if let Err(msg) =
                drain_coalesced(&mut vcpu, &windows, &**vgpu, &mut ex, remap.as_mut(), &name)
            {
                break End::Stop(msg);
            }
        }
        if pci.take_dirty() {
            let new = BarWindows::from_config(&pci);
            if new != windows {
                windows = new;
                if opts.coalesce {
                    set_zones(&gvm.fd, &mut zones, windows.coalesce_zones(remap.is_some()));
                }
            }
        }
        if let (Some(r), Some(v)) = (remap.as_mut(), vgpu.vgpu()) {
            r.update(&gvm.fd, v, &windows);
        }
        if let Some(msg) = vgpu.failure() {
            break End::Stop(msg);
        }
        if let Some(stall) = setup
            .stall
            .filter(|&s| kicker.fired() && kicker.since_exit() > s)
        {
            break End::Stop(format!(
                "{name}: no exit for {stall:?} (kicked out of KVM_RUN: it was spinning without exits): VM stopped"
            ));
        }
        if Instant::now() > deadline {
            break End::Stop(format!(
                "{name}: still running after {:?}{}: VM stopped",
                timeout,
                match kicker.since_exit() {
                    // Only the kick brought it back: it was spinning without exits.
                    quiet if kicker.fired() && quiet >= Duration::from_millis(50) => format!(
                        " (kicked out of KVM_RUN: no exit for {} ms)",
                        quiet.as_millis()
                    ),
                    _ => String::new(),
                }
            ));
        }
        // What to do after the exit, once the vCPU's borrow has ended.
        enum After {
            Go,
            Exit(u32),
            Stop(String),
            Fault(&'static str),
            /// An MMIO read of `len` bytes at the address.
            Read(u64, usize),
            /// An MMIO write of the first `len` bytes.
            Write(u64, [u8; 8], usize),
        }
        let run = vcpu.run();
        if !matches!(&run, Err(e) if e.errno() == libc::EINTR) {
            // A kick's EINTR is not the guest's progress.
            kicker.exited();
            exits_here += 1;
        }
        let mut ram_err = match &run {
            Ok(VcpuExit::MmioRead(..)) | Ok(VcpuExit::MmioWrite(..)) => sync_ram(&gvm).err(),
            _ => None,
        };
        let after = match run {
            Ok(VcpuExit::IoOut(port, data)) => {
                ex.pio += 1;
                match port {
                    p if serial::PORTS.contains(&p) => {
                        let _ = uart.write((p - serial::PORT_BASE) as u8, data[0]);
                        After::Go
                    }
                    pci::PORT_ADDR..=0xcff => {
                        pci.io_write(port, data);
                        After::Go
                    }
                    abi::PORT_EXIT => After::Exit(le_u32(data)),
                    abi::PORT_PHASE => {
                        marks.push(mark(le_u32(data), &ex));
                        After::Go
                    }
                    _ => After::Go,
                }
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                ex.pio += 1;
                match port {
                    p if serial::PORTS.contains(&p) => {
                        data[0] = uart.read((p - serial::PORT_BASE) as u8);
                    }
                    pci::PORT_ADDR..=0xcff => pci.io_read(port, data),
                    abi::PORT_GATE => {
                        data.fill(0);
                        data[0] = ctx.gate.poll(&mut at_gate) as u8;
                    }
                    _ => data.fill(0xff),
                }
                After::Go
            }
            // With `record`, the guest's RAM writes go into the trace before the access.
            _ if ram_err.is_some() => After::Stop(ram_err.take().unwrap_or_default()),
            // Handled below, once the vCPU's borrow has ended and the coalesced ring is drained.
            Ok(VcpuExit::MmioRead(addr, data)) => After::Read(addr, data.len().min(8)),
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                let mut b = [0u8; 8];
                let n = data.len().min(8);
                b[..n].copy_from_slice(&data[..n]);
                After::Write(addr, b, n)
            }
            Ok(VcpuExit::Shutdown) => After::Fault("the guest faulted (KVM_EXIT_SHUTDOWN: an exception it cannot handle in ring 3)"),
            Ok(VcpuExit::Hlt) => After::Fault("the guest halted"),
            Ok(VcpuExit::InternalError) => After::Fault("KVM internal error (an instruction the hypervisor cannot emulate)"),
            Ok(VcpuExit::FailEntry(reason, _)) => After::Stop(format!(
                "{name}: KVM could not enter the guest (hardware entry failure {reason:#x}): VM stopped"
            )),
            Ok(VcpuExit::Intr) => {
                ex.other += 1;
                After::Go
            }
            Ok(other) => After::Stop(format!("{name}: unexpected exit {other:?}: VM stopped")),
            Err(e) if e.errno() == 4 || e.errno() == 11 => {
                ex.other += 1;
                After::Go
            }
            Err(e) => After::Stop(format!("{name}: KVM_RUN failed: {e}: VM stopped")),
        };
        // KVM queues coalesced writes without exiting: those in the ring now are stores the
        // guest made before this access, so they reach the device first (QEMU flushes the ring
        // before handling any MMIO exit for the same reason).
        if opts.coalesce && matches!(after, After::Read(..) | After::Write(..)) {
            if let Err(msg) =
                drain_coalesced(&mut vcpu, &windows, &**vgpu, &mut ex, remap.as_mut(), &name)
            {
                break End::Stop(msg);
            }
        }
        match after {
            After::Go => {}
            After::Read(addr, len) => {
                let mut buf = [0u8; 8];
                let data = &mut buf[..len];
                let done = if ecam::read(&pci, addr, data) {
                    ex.ecam += 1;
                    true
                } else if windows.read(&**vgpu, addr, data) {
                    ex.mmio_reads += 1;
                    true
                } else if addr & !0xfff == abi::NULL_MMIO {
                    ex.other += 1;
                    data.fill(0);
                    true
                } else {
                    false
                };
                if !done {
                    break End::Stop(format!(
                        "{name}: guest read {len} bytes at {addr:#x}, outside the vGPU's BARs ({}): VM stopped",
                        windows.describe()
                    ));
                }
                complete_mmio_read(&mut vcpu, data);
            }
            After::Write(addr, buf, len) => {
                let data = &buf[..len];
                if ecam::write(&mut pci, addr, data) {
                    ex.ecam += 1;
                } else if windows.write(&**vgpu, addr, data) {
                    ex.mmio_writes += 1;
                    if let Some(r) = remap.as_mut() {
                        r.note_write(addr);
                    }
                } else if addr & !0xfff == abi::NULL_MMIO {
                    ex.other += 1;
                } else {
                    break End::Stop(format!(
                        "{name}: guest wrote {len} bytes at {addr:#x}, outside the vGPU's BARs ({}): VM stopped",
                        windows.describe()
                    ));
                }
            }
            After::Exit(code) => break End::Exit(code),
            After::Stop(msg) => break End::Stop(msg),
            After::Fault(what) => {
                let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
                log::debug!("{name}: regs {:?}", vcpu.get_regs());
                log::debug!("{name}: sregs {:?}", vcpu.get_sregs());
                break End::Stop(format!("{name}: {what} at rip {rip:#x}: VM stopped"));
            }
        }
    };
    if opts.coalesce {
        if let Err(msg) =
            drain_coalesced(&mut vcpu, &windows, &**vgpu, &mut ex, remap.as_mut(), &name)
        {
            log::warn!("{msg}");
        }
    }
    let wall = start.elapsed();
    info.kicked = kicker.fired();
    drop(kicker);
    ctx.gate.leave(&mut at_gate);
    if let Some(mut r) = remap {
        r.clear(&gvm.fd);
        info.remap = Some(r.stats);
    }
    if fence_irq {
        info.final_rflags = vcpu.get_regs().map(|r| r.rflags).unwrap_or(0);
        if let Ok(lapic) = vcpu.get_lapic() {
            let reg = |off: usize| -> u32 {
                let b: Vec<u8> = lapic.regs[off..off + 4].iter().map(|&c| c as u8).collect();
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            let v = IRQ_VECTOR as usize;
            let bit = 1u32 << (v % 32);
            info.final_lapic = format!(
                "SVR {:#x}, ISR[{v:#x}] {}, IRR[{v:#x}] {}",
                reg(0xf0),
                reg(0x100 + (v / 32) * 0x10) & bit != 0,
                reg(0x200 + (v / 32) * 0x10) & bit != 0
            );
        }
    }
    uart.writer_mut().finish();
    if let Some(mut s) = source.take() {
        // The guest ended (or was stopped) while pre-copy ran.
        let e = match s.join() {
            Ok(_) => "the guest ended before the migration stopped it".to_string(),
            Err(e) => format!("{e:#}"),
        };
        handoff_failed(info, &gvm, &name, "migration", e);
    }
    let handed_off = matches!(stop, End::HandedOff);
    match stop {
        End::Exit(code) => info.exit_code = Some(code),
        End::Stop(msg) => {
            eprintln!("gpuvm: {msg}");
            info.stopped = Some(msg);
        }
        End::HandedOff => {}
    }
    if !handed_off && marks.last().is_none_or(|m| m.phase != abi::PHASE_DONE) {
        marks.push(mark(abi::PHASE_DONE, &ex));
    }
    info.wall_ns = wall.as_nanos() as u64;
    info.exits = ex;
    let mmio = ex.mmio_reads + ex.mmio_writes;
    info.ns_per_mmio_exit = info.wall_ns.checked_div(mmio).unwrap_or(0);
    info.fence_irq = gvm.read_u32(abi::RESULTS_HEADER + abi::H_FENCE_IRQ) == 1;
    info.irqs_seen = gvm.read_u64(abi::RESULTS_HEADER + abi::H_IRQS);
    info.kernels = gvm.read_u64(abi::RESULTS_HEADER + abi::H_KERNELS);
    info.kernels_submitted = gvm.read_u64(abi::RESULTS_HEADER + abi::H_SUBMITTED);
    info.irqs_raised = vgpu.irqs_raised();
    info.calibration = calibration(marks, opts.calibrate);
    info.console = std::mem::take(&mut uart.writer_mut().lines);
    *ram_out = Some(gvm);
    Ok(())
}

/// Records a snapshot or migration that failed; the guest goes on in this process.
fn handoff_failed(info: &mut KvmVmInfo, gvm: &vm::GuestVm, name: &str, what: &str, e: String) {
    if what == "migration" {
        if let Err(e) = gvm.set_dirty_log(false) {
            log::warn!("{name}: turning dirty logging off: {e:#}");
        }
    }
    let msg = format!("{name}: {what} failed: {e}; the guest goes on here");
    eprintln!("gpuvm: {msg}");
    info.handoff_error = Some(msg);
}

/// Answers an MMIO read exit after the exit's borrow of the vCPU ended (the coalesced ring had
/// to be drained first): the value goes where KVM_RUN returns it to the guest.
fn complete_mmio_read(vcpu: &mut VcpuFd, data: &[u8]) {
    let run = vcpu.get_kvm_run();
    // SAFETY: the last KVM_RUN returned KVM_EXIT_MMIO for a read (this is only called then), so
    // `mmio` is the active member of the exit union; `data` is at most 8 bytes, its array's size.
    let mmio = unsafe { &mut run.__bindgen_anon_1.mmio };
    let n = data.len().min(mmio.data.len());
    mmio.data[..n].copy_from_slice(&data[..n]);
}

/// Replays the writes KVM queued in the coalesced MMIO ring, in order, before anything else
/// the vCPU did is handled.
fn drain_coalesced(
    vcpu: &mut VcpuFd,
    windows: &BarWindows,
    vgpu: &dyn VgpuDevice,
    ex: &mut ExitCounts,
    mut remap: Option<&mut remap::Remap>,
    name: &str,
) -> Result<(), String> {
    loop {
        match vcpu.coalesced_mmio_read() {
            Ok(Some(e)) => {
                let len = (e.len as usize).min(e.data.len());
                if !windows.write(vgpu, e.phys_addr, &e.data[..len]) {
                    return Err(format!(
                        "{name}: guest wrote {len} bytes at {:#x}, outside the vGPU's BARs ({}): VM stopped",
                        e.phys_addr,
                        windows.describe()
                    ));
                }
                ex.mmio_writes += 1;
                ex.coalesced_writes += 1;
                if let Some(r) = remap.as_deref_mut() {
                    r.note_write(e.phys_addr);
                }
            }
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("{name}: reading the coalesced MMIO ring: {e}")),
        }
    }
}

/// Replaces the registered coalesced-MMIO zones with `new`.
fn set_zones(vm: &VmFd, zones: &mut Vec<(u64, u64)>, new: Vec<(u64, u64)>) {
    for &(addr, size) in zones.iter() {
        if let Err(e) = vm.unregister_coalesced_mmio(IoEventAddress::Mmio(addr), size as u32) {
            log::warn!("KVM_UNREGISTER_COALESCED_MMIO {addr:#x}+{size:#x}: {e}");
        }
    }
    zones.clear();
    for (addr, size) in new {
        match vm.register_coalesced_mmio(IoEventAddress::Mmio(addr), size as u32) {
            Ok(()) => zones.push((addr, size)),
            Err(e) => log::warn!("KVM_REGISTER_COALESCED_MMIO {addr:#x}+{size:#x}: {e}"),
        }
    }
}

fn le_u32(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    for (d, s) in b.iter_mut().zip(data) {
        *d = *s;
    }
    u32::from_le_bytes(b)
}

/// Per-exit costs from the calibration phase markers.
fn calibration(marks: &[Mark], n: u32) -> Option<Calibration> {
    if n == 0 {
        return None;
    }
    let at = |p: u32| marks.iter().find(|m| m.phase == p).map(|m| m.at);
    let per =
        |a: u32, b: u32| -> Option<u64> { Some((at(b)? - at(a)?).as_nanos() as u64 / n as u64) };
    Some(Calibration {
        exits: n,
        pio_exit_ns: per(abi::PHASE_CAL_PIO, abi::PHASE_CAL_NULL_MMIO)?,
        bare_mmio_exit_ns: per(abi::PHASE_CAL_NULL_MMIO, abi::PHASE_CAL_VGPU_MMIO)?,
        vgpu_mmio_exit_ns: per(abi::PHASE_CAL_VGPU_MMIO, abi::PHASE_CAL_END)?,
    })
}

/// Builds the init and workload entries from the guest's results block and the phase marks.
fn collect_results(
    gvm: Option<&vm::GuestVm>,
    marks: &[Mark],
    names: &[&str],
    info: &KvmVmInfo,
) -> (WorkloadRun, Vec<WorkloadRun>) {
    let not_run = |name: &str| WorkloadRun {
        name: name.to_string(),
        bytes: 0,
        gpu_ns: 0,
        fence_gpu_ns: 0,
        wall_ns: 0,
        mmio_reads: 0,
        mmio_writes: 0,
        verified: false,
        error: Some(match (&info.stopped, &info.handoff) {
            (Some(s), _) => format!("not run: {s}"),
            (None, Some(_)) => "not run here: the guest continues elsewhere".to_string(),
            (None, None) => "not run".to_string(),
        }),
    };
    let entry = |index: usize, name: &str| -> WorkloadRun {
        let Some(gvm) = gvm else {
            return not_run(name);
        };
        let base = abi::RESULTS + index as u64 * abi::RESULT_SIZE;
        let state = gvm.read_u32(base + abi::R_STATE);
        // The phase's extent: from its mark to the next one.
        let phase = index as u32;
        let span = marks
            .iter()
            .position(|m| m.phase == phase)
            .and_then(|i| Some((marks[i], *marks.get(i + 1)?)));
        let Some((a, b)) = span else {
            return not_run(name);
        };
        let err_len = (gvm.read_u32(base + abi::R_ERR_LEN) as u64).min(abi::R_ERR_MAX) as usize;
        let mut err = vec![0u8; err_len];
        let _ = vm_memory::Bytes::read_slice(
            &gvm.mem,
            &mut err,
            vm_memory::GuestAddress(base + abi::R_ERR),
        );
        let error = match state {
            abi::STATE_ERROR => Some(String::from_utf8_lossy(&err).into_owned()),
            abi::STATE_DONE => None,
            _ => Some(match (&info.stopped, &info.handoff) {
                (Some(s), _) => format!("did not finish: {s}"),
                (None, Some(_)) => "did not finish here: the guest continues elsewhere".to_string(),
                (None, None) => "did not finish".to_string(),
            }),
        };
        WorkloadRun {
            name: name.to_string(),
            bytes: gvm.read_u64(base + abi::R_BYTES),
            gpu_ns: b.busy_ns.saturating_sub(a.busy_ns),
            fence_gpu_ns: gvm.read_u64(base + abi::R_GPU_NS),
            wall_ns: (b.at - a.at).as_nanos() as u64,
            mmio_reads: b.reads - a.reads,
            mmio_writes: b.writes - a.writes,
            verified: state == abi::STATE_DONE && gvm.read_u32(base + abi::R_VERIFIED) == 1,
            error,
        }
    };
    let init = entry(0, "init");
    let workloads = names
        .iter()
        .enumerate()
        .map(|(i, w)| entry(1 + i, w))
        .collect();
    (init, workloads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_program_is_embedded() {
        assert_eq!(&GUEST_ELF[..4], b"\x7fELF");
    }

    #[test]
    fn ram_layout_fits_below_the_mmio_hole() {
        let (ram, heap, dma) = ram_layout(&KvmOptions {
            size: 1024,
            ..KvmOptions::default()
        });
        assert_eq!(ram, abi::HEAP_BASE + heap + dma);
        assert!(ram < abi::MMIO_HOLE);
        let (ram, heap, dma) = ram_layout(&KvmOptions {
            guest_ram: 100 << 20,
            ..KvmOptions::default()
        });
        assert_eq!(ram, abi::HEAP_BASE + heap + dma);
    }

    // The ABI blocks do not overlap.
    const _: () = {
        assert!(abi::BP_CALIBRATE >= abi::BP_WORKLOADS + abi::MAX_WORKLOADS as u64);
        assert!(abi::RESULTS_HEADER + abi::H_SUBMITTED + 8 <= abi::PML4_ADDR);
        assert!(
            abi::ECAM_BASE >= abi::MMIO_HOLE && abi::ECAM_BASE + abi::ECAM_SIZE <= abi::NULL_MMIO
        );
        assert!(abi::BOOT_PARAMS + 0x1000 <= abi::RESULTS);
    };
}
