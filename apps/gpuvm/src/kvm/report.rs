//! What a KVM run reports: per VM the exits by kind, the calibration, phase marks, console,
//! restore and handoff ([`KvmVmInfo`], [`KvmVmReport`]), and the whole run ([`KvmReport`]);
//! and how the guest's results block and phase marks become workload entries.

use std::time::Instant;

use gpuvm::clock::ClockKind;
use gpuvm::host::HostStats;
use gpuvm::profile::ShadowMode;
use gpuvm::vgpu::VgpuStats;
use gpuvm_harness::WorkloadRun;
use serde::{Deserialize, Serialize};

use super::setup::Sample;
use super::{abi, remap, scheme, vm};
use super::{Handoff, Mark, Restored};

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
    /// RIP and RSP when the VM ended: where a guest the VMM stopped was (a guest kicked out of
    /// a spin shows the loop; RSP on the interrupt stack, below `abi::IST_TOP`, shows it inside its
    /// interrupt handler). `None` if KVM would not give the registers.
    pub final_rip: Option<u64>,
    /// See `final_rip`.
    pub final_rsp: Option<u64>,
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

/// Per-exit costs from the calibration phase markers.
pub(super) fn calibration(marks: &[Mark], n: u32) -> Option<Calibration> {
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
pub(super) fn collect_results(
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
