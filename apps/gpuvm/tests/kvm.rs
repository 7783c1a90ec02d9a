//! End to end under KVM: `gpuvm run --kvm` starts real VMs whose bare-metal guest finds the
//! vGPU on PCI and drives it through real MMIO exits (docs/kvm.md). Without a usable /dev/kvm
//! every test prints "SKIPPED: /dev/kvm not available" and returns.

mod support;

use serde_json::Value;
use support::{gpuvm, json, kvm_available};

/// Checks that VM `vm` ran to its exit port with every workload verified through MMIO exits.
fn assert_vm_verified(vm: &Value, workloads: &[&str]) {
    assert_eq!(vm["kvm"]["exit_code"], 0, "{vm:#}");
    assert!(vm["kvm"]["stopped"].is_null(), "{vm:#}");
    assert_eq!(vm["init"]["verified"], true, "{vm:#}");
    let names: Vec<&str> = vm["workloads"]
        .as_array()
        .expect("workloads")
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, workloads);
    for w in vm["workloads"].as_array().unwrap() {
        assert_eq!(w["verified"], true, "{w}");
        assert!(w["error"].is_null(), "{w}");
        assert!(w["wall_ns"].as_u64().unwrap() > 0, "{w}");
        assert!(w["mmio_reads"].as_u64().unwrap() > 0, "{w}");
    }
    // The device model counted the exits the VMM dispatched.
    let exits = &vm["kvm"]["exits"];
    assert!(exits["mmio_reads"].as_u64().unwrap() > 0, "{exits}");
    assert!(exits["ecam"].is_u64(), "{exits}");
    assert!(exits["mmio_writes"].as_u64().unwrap() > 100_000, "{exits}");
    assert!(vm["stats"]["doorbells"].as_u64().unwrap() > 0, "{vm:#}");
    let console = vm["kvm"]["console"].as_array().unwrap();
    assert!(
        console
            .iter()
            .any(|l| l.as_str() == Some("PASS")
                || l.as_str().is_some_and(|l| l.starts_with("PASS "))),
        "{console:?}"
    );
    assert!(
        console
            .iter()
            .any(|l| l.as_str() == Some("pci 00:01.0 10de:06d8 class 030000")),
        "{console:?}"
    );
}

/// Checks that VM `vm`'s guest printed a line starting with `prefix` on its console.
fn assert_console_line(vm: &Value, prefix: &str) {
    let console = vm["kvm"]["console"].as_array().expect("console");
    assert!(
        console
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.starts_with(prefix))),
        "no console line starting with {prefix:?}: {console:?}"
    );
}

#[test]
fn two_kvm_vms_run_a_workload_each_through_real_mmio_exits() {
    if !kvm_available("two_kvm_vms_run_a_workload_each_through_real_mmio_exits") {
        return;
    }
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "2",
        "--workload",
        "madd",
        "--size",
        "16",
        "--json",
        "--quiet-console",
        "--calibrate",
        "200",
        "--timeout",
        "300",
    ]);
    let v = json(&out);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["backend"], "kvm");
    let vms = v["vms"].as_array().expect("vms");
    assert_eq!(vms.len(), 2);
    for vm in vms {
        assert_vm_verified(vm, &["madd"]);
        let cal = &vm["kvm"]["calibration"];
        for k in ["pio_exit_ns", "bare_mmio_exit_ns", "vgpu_mmio_exit_ns"] {
            assert!(cal[k].as_u64().unwrap() > 0, "{cal}");
        }
    }
    assert_ne!(vms[0]["vm"], vms[1]["vm"]);
}

#[test]
fn a_kvm_guest_waits_for_its_fences_by_interrupt() {
    if !kvm_available("a_kvm_guest_waits_for_its_fences_by_interrupt") {
        return;
    }
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "2",
        "--workload",
        "madd",
        "--workload",
        "loop",
        "--size",
        "16",
        "--irq",
        "--json",
        "--quiet-console",
        "--timeout",
        "300",
    ]);
    let v = json(&out);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for vm in v["vms"].as_array().unwrap() {
        assert_vm_verified(vm, &["madd", "loop"]);
        let k = &vm["kvm"];
        assert_eq!(k["fence_irq"], true, "{k}");
        let raised = k["irqs_raised"].as_u64().unwrap();
        let seen = k["irqs_seen"].as_u64().unwrap();
        assert!(raised >= 2, "{k}");
        // Edges sent through irqfd reached the guest's ring-3 handler (one raised while the
        // channel is torn down may arrive after the guest wrote its count).
        assert!(seen >= 1 && seen <= raised, "{k}");
    }
}

#[test]
fn a_kvm_guests_interrupt_handler_survives_a_delivery_nested_after_its_eoi() {
    if !kvm_available("a_kvm_guests_interrupt_handler_survives_a_delivery_nested_after_its_eoi") {
        return;
    }
    // The handler sends its vector to itself before its EOI, so the second delivery lands
    // between that EOI and the handler's `iretq` (two close edges of the line do the same). A
    // handler still on its interrupt stack there loops without exits (its frame overwritten by
    // the nested one's): the stall timeout would stop it (its JSON: RSP on that stack).
    // VM 1 waits by interrupt and runs the self-test; VM 0 polls and does not.
    let v = two_vms_madd_and_loop_vm1_by_irq(&["--irq-nest", "--stall-timeout", "1=20"]);
    let vm = &v["vms"][1];
    let k = &vm["kvm"];
    assert_console_line(vm, "irq nest: 2 interrupt(s) handled");
    // And the guest went on taking its fences by interrupt, every workload verified.
    assert_vm_verified(vm, &["madd", "loop"]);
    assert_eq!(k["fence_irq"], true, "{k}");
    assert!(k["irqs_seen"].as_u64().unwrap() >= 3, "{k}");
    assert_eq!(v["vms"][0]["kvm"]["irqs_seen"], 0, "{:#}", v["vms"][0]);
}

/// `gpuvm run --kvm` with `extra`: two VMs run madd and loop at size 16, VM 1 takes its fences
/// by interrupt; the run must succeed. Returns its JSON.
fn two_vms_madd_and_loop_vm1_by_irq(extra: &[&str]) -> Value {
    let mut args = vec!["run", "--kvm"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--vms",
        "2",
        "--workload",
        "madd",
        "--workload",
        "loop",
        "--size",
        "16",
        "--irq-vm",
        "1",
        "--json",
        "--quiet-console",
        "--timeout",
        "300",
    ]);
    let out = gpuvm(&args);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

#[test]
fn the_pvh_entry_switches_to_ring_3_by_itself_and_verifies() {
    if !kvm_available("the_pvh_entry_switches_to_ring_3_by_itself_and_verifies") {
        return;
    }
    // The image Cloud Hypervisor boots, started the way it starts it: 32-bit protected mode,
    // paging off, the command line in the PVH start info. VM 0 polls, VM 1 takes interrupts.
    let v = two_vms_madd_and_loop_vm1_by_irq(&["--pvh"]);
    let vms = v["vms"].as_array().expect("vms");
    assert_eq!(vms.len(), 2);
    for (i, vm) in vms.iter().enumerate() {
        assert_vm_verified(vm, &["madd", "loop"]);
        assert_console_line(vm, "gpuvm guest: PVH boot, now in ring 3");
        let k = &vm["kvm"];
        assert_eq!(k["fence_irq"], i == 1, "{k}");
        if i == 1 {
            assert!(k["irqs_seen"].as_u64().unwrap() >= 1, "{k}");
        }
    }
}

/// Runs two VMs, VM 1 hostile in `mode`; VM 1 must be stopped with `expect` in its message and
/// VM 0 must finish its workload.
fn hostile_is_contained(mode: &str, expect: &str) {
    let hostile = format!("1={mode}");
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "2",
        "--workload",
        "madd",
        "--size",
        "16",
        "--json",
        "--quiet-console",
        "--hostile",
        &hostile,
        "--timeout",
        "300",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the run must report the failure"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v = json(&out);
    let vms = v["vms"].as_array().unwrap();
    assert_vm_verified(&vms[0], &["madd"]);
    let stopped = vms[1]["kvm"]["stopped"]
        .as_str()
        .unwrap_or_else(|| panic!("vm1 not stopped: {:#}", vms[1]));
    assert!(stopped.contains(expect), "{stopped}");
    assert!(stopped.contains("VM stopped"), "{stopped}");
    assert!(stderr.contains(stopped), "the message is printed: {stderr}");
    assert_eq!(vms[1]["workloads"][0]["verified"], false);
    assert!(vms[1]["kvm"]["exit_code"].is_null());
}

#[test]
fn a_kvm_guest_poking_outside_its_bars_is_stopped_and_the_other_finishes() {
    if !kvm_available("a_kvm_guest_poking_outside_its_bars_is_stopped_and_the_other_finishes") {
        return;
    }
    hostile_is_contained(
        "poke-outside",
        "guest read 4 bytes at 0xf0000000, outside the vGPU's BARs",
    );
}

#[test]
fn a_kvm_guest_writing_garbage_to_config_space_is_stopped_and_the_other_finishes() {
    if !kvm_available(
        "a_kvm_guest_writing_garbage_to_config_space_is_stopped_and_the_other_finishes",
    ) {
        return;
    }
    hostile_is_contained("config-garbage", "outside the vGPU's BARs");
}

#[test]
fn a_kvm_guest_runs_with_every_write_exiting() {
    if !kvm_available("a_kvm_guest_runs_with_every_write_exiting") {
        return;
    }
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "1",
        "--workload",
        "loop",
        "--size",
        "16",
        "--no-coalesce",
        "--json",
        "--quiet-console",
        "--timeout",
        "300",
    ]);
    let v = json(&out);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vm = &v["vms"][0];
    assert_vm_verified(vm, &["loop"]);
    assert_eq!(vm["kvm"]["exits"]["coalesced_writes"], 0);
}

#[test]
fn calibrate_json_measures_bare_and_vgpu_exits() {
    if !kvm_available("calibrate_json_measures_bare_and_vgpu_exits") {
        let out = gpuvm(&["calibrate", "--json", "--count", "100"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/kvm"));
        return;
    }
    let out = gpuvm(&["calibrate", "--json", "--count", "200"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["count"], 200);
    let bare = v["bare_exit_ns"].as_u64().unwrap();
    let vgpu = v["vgpu_exit_ns"].as_u64().unwrap();
    assert!(bare > 0 && vgpu > 0, "{v}");
    assert!(v["pio_exit_ns"].as_u64().unwrap() > 0, "{v}");
    let ratio = v["ratio"].as_f64().unwrap();
    assert!((ratio - vgpu as f64 / bare as f64).abs() < 1e-9, "{v}");
}

/// Runs two VMs, VM 1 stopping dead in `mode` right after ringing the doorbell for a 1.5 s
/// kernel; returns the report. VM 0 must finish its workload, VM 1 must be stopped with
/// `expect` in its message and its vGPU destroyed at once, and the host must be left with no
/// VM, channel, VRAM, shadow memory or submission of either.
fn stopped_mid_submission_is_contained(mode: &str, extra: &[&str], expect: &str) -> Value {
    let hostile = format!("1={mode}");
    let mut args = vec![
        "run",
        "--kvm",
        "--vms",
        "2",
        "--workload",
        "madd",
        "--size",
        "16",
        "--json",
        "--quiet-console",
        "--hostile",
        &hostile,
        "--timeout",
        "300",
    ];
    args.extend_from_slice(extra);
    let out = gpuvm(&args);
    assert_eq!(out.status.code(), Some(1), "the run reports the stopped VM");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v = json(&out);
    let vms = v["vms"].as_array().unwrap();
    assert_vm_verified(&vms[0], &["madd"]);
    let k = &vms[1]["kvm"];
    let stopped = k["stopped"]
        .as_str()
        .unwrap_or_else(|| panic!("vm1 not stopped: {:#}", vms[1]));
    assert!(stopped.contains(expect), "{stopped}");
    assert!(stopped.contains("VM stopped"), "{stopped}");
    assert!(stderr.contains(stopped), "the message is printed: {stderr}");
    assert!(
        stderr.contains("vm1: vGPU destroyed with"),
        "the vGPU is destroyed when the VM stops: {stderr}"
    );
    assert!(k["destroyed_in_flight"].is_u64(), "{k}");
    assert!(k["exit_code"].is_null(), "{k}");
    // The guest got as far as the doorbell.
    assert!(
        vms[1]["stats"]["doorbells"].as_u64().unwrap() >= 1,
        "{:#}",
        vms[1]
    );
    assert_console_line(&vms[1], "hostile: doorbell rung");
    // Nothing leaked: every VM is gone with its channels, VRAM and shadow memory, and every
    // submission either completed or was aborted with its VM.
    let h = &v["host"];
    assert_eq!(h["vms"], 0, "{h}");
    assert_eq!(h["channels_free"], 128, "{h}");
    assert_eq!(h["vram_free"], h["vram_assignable"], "{h}");
    assert_eq!(h["hypervisor_vram_used"], h["hypervisor_vram_host"], "{h}");
    assert_eq!(h["inflight"], 0, "{h}");
    assert_eq!(h["queued"], 0, "{h}");
    assert_eq!(
        h["dispatched"].as_u64().unwrap(),
        h["completed"].as_u64().unwrap() + h["aborted"].as_u64().unwrap(),
        "{h}"
    );
    v
}

#[test]
fn a_kvm_guest_faulting_mid_submission_is_stopped_and_the_other_finishes() {
    if !kvm_available("a_kvm_guest_faulting_mid_submission_is_stopped_and_the_other_finishes") {
        return;
    }
    let v = stopped_mid_submission_is_contained(
        "stop-fault",
        &[],
        "the guest faulted (KVM_EXIT_SHUTDOWN",
    );
    assert_eq!(v["vms"][1]["kvm"]["kicked"], false);
}

#[test]
fn a_kvm_guest_spinning_without_exits_is_kicked_at_its_stall_timeout() {
    if !kvm_available("a_kvm_guest_spinning_without_exits_is_kicked_at_its_stall_timeout") {
        return;
    }
    let v = stopped_mid_submission_is_contained(
        "stop-spin",
        &["--stall-timeout", "1=2"],
        "no exit for 2s (kicked out of KVM_RUN: it was spinning without exits)",
    );
    let k = &v["vms"][1]["kvm"];
    assert_eq!(k["kicked"], true, "{k}");
    let console = k["console"].as_array().unwrap();
    // The guest named the loop it spins in; the VMM's report shows the vCPU stopped in it.
    let at = console
        .iter()
        .filter_map(|l| l.as_str()?.split("spinning without exits at 0x").nth(1))
        .find_map(|a| u64::from_str_radix(a.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no spin address on the console: {console:?}"));
    let rip = k["final_rip"].as_u64().unwrap_or_else(|| panic!("{k}"));
    assert!(
        (at..at + 16).contains(&rip),
        "rip {rip:#x}, loop at {at:#x}"
    );
    let rsp = k["final_rsp"].as_u64().unwrap();
    assert!(
        rsp < 0x60_0000,
        "on the program's stack, not the interrupt stack: {rsp:#x}"
    );
}

#[test]
fn one_kvm_vm_waits_by_interrupt_while_the_other_polls() {
    if !kvm_available("one_kvm_vm_waits_by_interrupt_while_the_other_polls") {
        return;
    }
    let v = two_vms_madd_and_loop_vm1_by_irq(&[]);
    let vms = v["vms"].as_array().unwrap();
    for vm in vms {
        assert_vm_verified(vm, &["madd", "loop"]);
    }
    let (poll, irq) = (&vms[0]["kvm"], &vms[1]["kvm"]);
    assert_eq!(poll["fence_irq"], false, "{poll}");
    assert_eq!(poll["irqs_raised"], 0, "{poll}");
    assert_eq!(poll["irqs_seen"], 0, "{poll}");
    assert_eq!(irq["fence_irq"], true, "{irq}");
    let raised = irq["irqs_raised"].as_u64().unwrap();
    let seen = irq["irqs_seen"].as_u64().unwrap();
    assert!(raised >= 2, "{irq}");
    assert!(seen >= 1 && seen <= raised, "{irq}");
    assert!(vms[1]["stats"]["nonstall_delivered"].as_u64().unwrap() >= 1);
}

#[test]
fn isolation_experiment_runs_in_kvm_guests() {
    if !kvm_available("isolation_experiment_runs_in_kvm_guests") {
        return;
    }
    let svg = std::env::temp_dir().join(format!("gpuvm-kvm-iso-{}.svg", std::process::id()));
    let out = gpuvm(&[
        "exp",
        "isolation",
        "--kvm",
        "--vms",
        "2",
        "--sched",
        "band",
        "--duration",
        "0.6",
        "--window-ms",
        "100",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["backend"], "kvm");
    assert_eq!(v["clock"], "real");
    let p = &v["policies"][0];
    assert_eq!(p["policy"], "band");
    let vms = p["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 2);
    assert_eq!(vms[0]["kind"], "short");
    assert_eq!(vms[1]["kind"], "long");
    let (mut target, mut achieved) = (0.0, 0.0);
    for vm in vms {
        // Every VM streamed kernels and was charged GPU time, as the sampler saw it.
        assert!(vm["kernels"].as_u64().unwrap() > 0, "{vm}");
        assert!(vm["total_gpu_ns"].as_u64().unwrap() > 0, "{vm}");
        target += vm["target_share"].as_f64().unwrap();
        achieved += vm["achieved_share"].as_f64().unwrap();
        let e = vm["error"].as_f64().unwrap();
        let d = vm["achieved_share"].as_f64().unwrap() - vm["target_share"].as_f64().unwrap();
        assert!((e - d.abs()).abs() < 1e-9, "{vm}");
    }
    assert!(
        (target - 1.0).abs() < 1e-9 && (achieved - 1.0).abs() < 1e-9,
        "{p}"
    );
    assert_eq!(
        p["series"]["t_ns"].as_array().unwrap().len(),
        6,
        "one point per window"
    );
    let a = &p["accounting"];
    assert_eq!(a["channel_busy_ns"], a["gpu_busy_ns"], "{a}");
    let k = &v["kvm"][0];
    assert_eq!(k["verified"], true, "{k}");
    assert!(k["samples"].as_u64().unwrap() > 0, "{k}");
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(svg_text.contains("band: mean error"));
}

#[test]
fn scale_experiment_runs_in_kvm_guests() {
    if !kvm_available("scale_experiment_runs_in_kvm_guests") {
        return;
    }
    let out = gpuvm(&[
        "exp",
        "scale",
        "--kvm",
        "--vms",
        "1,2",
        "--workload",
        "madd",
        "--repeat",
        "2",
        "--size",
        "16",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["backend"], "kvm");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, vms) in points.iter().zip([1u64, 2]) {
        assert_eq!(p["vms"], vms, "{p}");
        assert_eq!(p["verified"], true, "{p}");
        assert_eq!(p["runs"], vms * 2, "{p}");
        assert!(p["bring_up_ns"].as_u64().unwrap() > 0, "{p}");
        assert!(p["per_vm_wall_ns"].as_u64().unwrap() > 0, "{p}");
        assert!(
            p["max_vm_wall_ns"].as_u64() >= p["per_vm_wall_ns"].as_u64(),
            "{p}"
        );
        assert!(p["gpu_busy_ns"].as_u64().unwrap() > 0, "{p}");
        // The measured runs exit: every BAR access is a real MMIO exit.
        assert!(p["exits"].as_u64().unwrap() >= 20 * vms * 2, "{p}");
    }
}

#[test]
fn kvm_guests_enumerate_pci_through_the_ecam_window() {
    if !kvm_available("kvm_guests_enumerate_pci_through_the_ecam_window") {
        return;
    }
    // vm0 configures its vGPU through ECAM and runs; vm1 writes garbage over its configuration
    // space through ECAM and is stopped at its next BAR access, as with the ports.
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "2",
        "--workload",
        "madd",
        "--size",
        "16",
        "--ecam",
        "--hostile",
        "1=config-garbage",
        "--json",
        "--quiet-console",
        "--timeout",
        "300",
    ]);
    assert_eq!(out.status.code(), Some(1), "vm1 is stopped");
    let v = json(&out);
    let vms = v["vms"].as_array().unwrap();
    assert_vm_verified(&vms[0], &["madd"]);
    for vm in vms {
        let k = &vm["kvm"];
        // Enumeration, BAR sizing and placement, command register: dozens of ECAM accesses.
        assert!(k["exits"]["ecam"].as_u64().unwrap() >= 20, "{k}");
        let console = k["console"].as_array().unwrap();
        assert!(
            console
                .iter()
                .any(|l| l.as_str() == Some("pci: configuration through ECAM at 0xe0000000")),
            "{console:?}"
        );
    }
    let stopped = vms[1]["kvm"]["stopped"].as_str().unwrap();
    assert!(stopped.contains("outside the vGPU's BARs"), "{stopped}");
    // The garbage went through ECAM: 64 dwords on top of the normal configuration.
    assert!(
        vms[1]["kvm"]["exits"]["ecam"].as_u64().unwrap()
            >= vms[0]["kvm"]["exits"]["ecam"].as_u64().unwrap() + 64
    );
}

/// `run --kvm --record`: two real guests (one waiting by interrupt, one polling) are recorded,
/// and `trace replay --check` reproduces every read they made, bit for bit, on a fresh host;
/// a trace with one recorded read changed is reported as a divergence (the check can fail).
#[test]
fn a_kvm_run_is_recorded_and_replays_exactly() {
    if !kvm_available("a_kvm_run_is_recorded_and_replays_exactly") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpuvm-kvm-record-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "2",
        "--workload",
        "madd",
        "--size",
        "16",
        "--irq-vm",
        "1",
        "--quiet-console",
        "--record",
        d,
        "--json",
    ]);
    let v = json(&out);
    for vm in v["vms"].as_array().unwrap() {
        assert_vm_verified(vm, &["madd"]);
    }
    assert_eq!(v["vms"][1]["kvm"]["fence_irq"], true, "{v}");
    let files: Vec<String> = (0..2)
        .map(|i| {
            dir.join(format!("vm{i}.mmiotrace"))
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(v["recorded"].as_array().map(Vec::len), Some(2), "{v}");

    let mut args = vec!["trace", "replay", "--check", "--json"];
    args.extend(files.iter().map(String::as_str));
    let r = json(&gpuvm(&args));
    assert_eq!(r["total_divergences"], 0, "{r}");
    for vm in r["vms"].as_array().unwrap() {
        assert!(vm["reads"].as_u64().unwrap() > 50, "{vm}");
        assert_eq!(vm["mismatches"], 0, "{vm}");
    }
    assert_eq!(r["leaks"].as_array().map(Vec::len), Some(0), "{r}");

    // Change the value of vm0's last register read: replay must notice.
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let last_read = lines
        .iter()
        .rposition(|l| {
            l.starts_with("R 4 ") && l.split(' ').nth(4).is_some_and(|a| a.starts_with("0xf0"))
        })
        .expect("a BAR0 read in the trace");
    let mut f: Vec<String> = lines[last_read].split(' ').map(str::to_string).collect();
    let old = u64::from_str_radix(f[5].trim_start_matches("0x"), 16).unwrap();
    f[5] = format!("{:#x}", old ^ 0x1);
    lines[last_read] = f.join(" ");
    let bad = dir.join("vm0-tampered.mmiotrace");
    std::fs::write(&bad, lines.join("\n") + "\n").unwrap();
    let r = json(&gpuvm(&[
        "trace",
        "replay",
        "--check",
        "--json",
        bad.to_str().unwrap(),
        &files[1],
    ]));
    assert!(r["total_divergences"].as_u64().unwrap() >= 1, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}
