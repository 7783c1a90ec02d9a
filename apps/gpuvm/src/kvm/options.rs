//! What a KVM run is asked to do ([`KvmOptions`]: VMs, workloads, scheme, clock, snapshot and
//! migration requests) and where its guest goes when its time comes ([`Outgoing`]).

use std::time::Duration;

use gpuvm::profile::ShadowMode;
use gpuvm_guest::workloads::Workload;

use super::scheme;
use super::setup::VmSetup;

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
    /// Interrupt-driven guests first test their handler with a delivery nested right after its
    /// EOI (`abi::BP_IRQ_NEST`).
    pub irq_nest: bool,
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
    pub(super) fn after_exits(&self) -> u64 {
        match self {
            Outgoing::Snapshot { after_exits, .. } | Outgoing::Migrate { after_exits, .. } => {
                *after_exits
            }
        }
    }
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
            irq_nest: false,
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
