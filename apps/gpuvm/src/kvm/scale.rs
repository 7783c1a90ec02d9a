//! `gpuvm exp scale --kvm`: GPUvm's scale figure with real KVM guests — the same workload in
//! 1, 2, 4, ... KVM VMs at once on one simulated GF100 (real clock).
//!
//! Each VM brings its driver up and runs a `loop` warm-up that creates its channel, then waits
//! at the start gate (`abi::PORT_GATE`) until every VM is there; the workload runs `repeat`
//! times after it, and only that part is measured: per VM the sum of its runs' wall time
//! (between the guest's phase markers, timestamped by the VMM), aggregate = from the gate's
//! opening to the last VM's last phase marker, GPU busy = the VMs' channels' busy time in their
//! runs, exits = the MMIO exits of the runs (coalesced writes included). Every exit is real, so
//! there is no modeled time: `per_vm_modeled_ns` repeats the wall time.

use std::time::Duration;

use gpuvm::profile::ShadowMode;
use gpuvm::sched::Policy;
use gpuvm_guest::workloads::Workload;

use super::abi;
use super::setup::VmSetup;
use super::{run_kvm, KvmOptions};
use crate::scale::ScalePoint;

/// Measures one VM count.
pub fn point(
    vms: u32,
    workload: Workload,
    repeat: u32,
    size: u32,
    shadow: ShadowMode,
    sched: Policy,
) -> anyhow::Result<ScalePoint> {
    let mut list = vec![Workload::Loop];
    list.extend(std::iter::repeat_n(workload, repeat as usize));
    let opts = KvmOptions {
        vms: vms as usize,
        size,
        shadow,
        workloads: list,
        echo_console: false,
        sched: Some(sched),
        setups: vec![
            VmSetup {
                gate: true,
                ..VmSetup::default()
            };
            vms as usize
        ],
        timeout: Duration::from_secs(600),
        ..KvmOptions::default()
    };
    let r = run_kvm(&opts)?;
    for v in &r.vms {
        if let Some(s) = &v.kvm.stopped {
            eprintln!("gpuvm: exp scale --kvm, {vms} VMs: {s}");
        }
    }
    let measured = |v: &super::KvmVmReport| -> (u64, u64, u64) {
        v.workloads.iter().skip(1).fold((0, 0, 0), |(w, e, g), p| {
            (
                w + p.wall_ns,
                e + p.mmio_reads + p.mmio_writes,
                g + p.gpu_ns,
            )
        })
    };
    let per: Vec<(u64, u64, u64)> = r.vms.iter().map(measured).collect();
    let n = per.len().max(1) as u64;
    let wall_sum: u64 = per.iter().map(|p| p.0).sum();
    let gate = r.gate_open_ns.unwrap_or(0);
    let last_done = r
        .vms
        .iter()
        .filter_map(|v| {
            v.kvm
                .phases
                .iter()
                .rev()
                .find(|m| m.phase == abi::PHASE_DONE)
                .map(|m| m.at_ns)
        })
        .max()
        .unwrap_or(gate);
    let span = last_done.saturating_sub(gate);
    let gpu: u64 = per.iter().map(|p| p.2).sum();
    Ok(ScalePoint {
        vms,
        per_vm_wall_ns: wall_sum / n,
        max_vm_wall_ns: per.iter().map(|p| p.0).max().unwrap_or(0),
        aggregate_wall_ns: span,
        per_vm_modeled_ns: wall_sum / n,
        gpu_busy_ns: gpu,
        gpu_clock_span_ns: span,
        utilization: if span == 0 {
            0.0
        } else {
            gpu as f64 / span as f64
        },
        exits: per.iter().map(|p| p.1).sum(),
        runs: vms * repeat,
        verified: r.all_verified() && r.vms.len() == vms as usize && r.gate_open_ns.is_some(),
        bring_up_ns: r.gate_open_ns,
        mem: None,
    })
}
