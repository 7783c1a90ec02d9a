//! The schemes of GPUvm's overhead figure under KVM (`gpuvm run --kvm --scheme ...`,
//! docs/kvm.md "Schemes and BAR remap"): BAR remap removes BAR1/BAR3 exits without changing
//! what the guest computes, native runs the guest on the bare (simulated) GPU, and isolation
//! holds with guest pages mapped straight onto VRAM. Without a usable /dev/kvm every test prints
//! "SKIPPED: /dev/kvm not available" and returns. Counts are compared, never times.

mod support;

use serde_json::Value;
use support::{gpuvm, json, kvm_available};

const WORKLOADS: [&str; 4] = ["madd", "mmul", "memcpy_htod", "loop"];

/// One VM under `scheme` running [`WORKLOADS`]; the VM's report.
fn run_scheme(scheme: &str, extra: &[&str]) -> (Value, Value) {
    let mut args = vec![
        "run",
        "--kvm",
        "--vms",
        "1",
        "--size",
        "16",
        "--scheme",
        scheme,
        "--quiet-console",
        "--timeout",
        "300",
        "--json",
    ];
    for w in WORKLOADS {
        args.extend(["--workload", w]);
    }
    args.extend_from_slice(extra);
    let out = gpuvm(&args);
    let r = json(&out);
    assert!(
        out.status.success(),
        "{scheme}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vm = r["vms"][0].clone();
    assert_eq!(vm["kvm"]["exit_code"], 0, "{scheme}: {vm:#}");
    assert_eq!(vm["init"]["verified"], true, "{scheme}: {vm:#}");
    for w in vm["workloads"].as_array().unwrap() {
        assert_eq!(w["verified"], true, "{scheme}: {w}");
    }
    (r, vm)
}

fn aperture_exits(vm: &Value) -> u64 {
    let e = &vm["stats"]["exits"];
    ["bar1", "bar3"]
        .iter()
        .map(|b| e[b]["reads"].as_u64().unwrap() + e[b]["writes"].as_u64().unwrap())
        .sum()
}

#[test]
fn bar_remap_verifies_and_exits_less_than_fv_naive() {
    if !kvm_available("bar_remap_verifies_and_exits_less_than_fv_naive") {
        return;
    }
    let (naive_r, naive) = run_scheme("fv-naive", &[]);
    let (fv_r, fv) = run_scheme("fv", &[]);
    assert_eq!(naive_r["scheme"], "fv-naive");
    assert_eq!(naive_r["shadow"], "eager");
    assert_eq!(fv_r["shadow"], "lazy");
    assert!(naive["kvm"]["remap"].is_null(), "fv-naive traps everything");
    let remap = &fv["kvm"]["remap"];
    assert!(remap["pages_mapped"].as_u64().unwrap() > 0, "{remap}");
    assert!(remap["remaps"].as_u64().unwrap() > 0, "{remap}");
    assert_eq!(remap["slot_errors"], 0, "{remap}");
    // The device model saw strictly fewer BAR1/BAR3 accesses: the mapped pages no longer exit.
    let (a, b) = (aperture_exits(&naive), aperture_exits(&fv));
    assert!(b < a, "BAR1/BAR3 exits: fv {b}, fv-naive {a}");
    // And every workload took fewer MMIO exits (same guest program, same accesses).
    for (wn, wf) in naive["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .zip(fv["workloads"].as_array().unwrap())
    {
        let exits =
            |w: &Value| w["mmio_reads"].as_u64().unwrap() + w["mmio_writes"].as_u64().unwrap();
        assert!(
            exits(wf) < exits(wn),
            "{}: fv {} exits, fv-naive {}",
            wn["name"],
            exits(wf),
            exits(wn)
        );
    }
    // The results are the same: identical bytes moved per workload.
    for (wn, wf) in naive["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .zip(fv["workloads"].as_array().unwrap())
    {
        assert_eq!(wn["bytes"], wf["bytes"]);
    }
}

#[test]
fn pv_scheme_remaps_and_uses_the_paravirtual_interface() {
    if !kvm_available("pv_scheme_remaps_and_uses_the_paravirtual_interface") {
        return;
    }
    let (r, vm) = run_scheme("pv", &[]);
    assert_eq!(r["shadow"], "pv");
    assert!(
        vm["stats"]["shadow"]["pv_batches"].as_u64().unwrap() > 0,
        "{vm:#}"
    );
    assert!(vm["kvm"]["remap"]["pages_mapped"].as_u64().unwrap() > 0);
}

#[test]
fn native_runs_the_guest_on_the_bare_gpu() {
    if !kvm_available("native_runs_the_guest_on_the_bare_gpu") {
        return;
    }
    let (r, vm) = run_scheme("native", &[]);
    assert_eq!(r["scheme"], "native");
    // No device model: its counters stay empty, and the GPU did the work.
    assert_eq!(vm["stats"]["doorbells"], 0, "{vm:#}");
    assert!(vm["kvm"]["exits"]["mmio_reads"].as_u64().unwrap() > 0);
    assert!(
        r["host"]["gpu"]["engine_ops"].as_u64().unwrap() > 0,
        "{r:#}"
    );
    // Exactly one VM.
    let out = gpuvm(&[
        "run",
        "--kvm",
        "--vms",
        "2",
        "--scheme",
        "native",
        "--quiet-console",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exactly one VM"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hostile_guests_are_still_stopped_under_bar_remap() {
    if !kvm_available("hostile_guests_are_still_stopped_under_bar_remap") {
        return;
    }
    // poke-outside: reads outside the BARs. config-garbage: garbage over configuration space
    // moves or disables the BARs, so the remap slots at the old addresses must be gone and the
    // guest's next access there exits and stops it (a stale slot would let it run on).
    for mode in ["poke-outside", "config-garbage"] {
        let hostile = format!("0={mode}");
        let out = gpuvm(&[
            "run",
            "--kvm",
            "--vms",
            "2",
            "--size",
            "16",
            "--workload",
            "madd",
            "--scheme",
            "fv",
            "--hostile",
            &hostile,
            "--quiet-console",
            "--timeout",
            "300",
            "--json",
        ]);
        let r = json(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{mode}: the hostile VM fails the run"
        );
        let vms = r["vms"].as_array().unwrap();
        let stopped = vms[0]["kvm"]["stopped"].as_str().unwrap_or("");
        assert!(
            stopped.contains("outside the vGPU's BARs"),
            "{mode}: {stopped}"
        );
        assert!(vms[0]["kvm"]["exit_code"].is_null(), "{mode}");
        assert_eq!(vms[1]["kvm"]["exit_code"], 0, "{mode}: {:#}", vms[1]);
        assert_eq!(vms[1]["workloads"][0]["verified"], true, "{mode}");
        assert!(vms[1]["kvm"]["remap"]["pages_mapped"].as_u64().unwrap() > 0);
        assert_eq!(vms[1]["stats"]["violations"]["total"], 0, "{mode}");
    }
}

#[test]
fn exp_overhead_kvm_runs_every_scheme_in_a_real_guest() {
    if !kvm_available("exp_overhead_kvm_runs_every_scheme_in_a_real_guest") {
        return;
    }
    let out = gpuvm(&[
        "exp",
        "overhead",
        "--kvm",
        "--json",
        "--size",
        "16",
        "--repeat",
        "1",
        "--workload",
        "madd",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["backend"], "kvm");
    let results = v["results"].as_array().expect("results");
    let schemes: Vec<&str> = results
        .iter()
        .map(|r| r["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(schemes, ["native", "fv-naive", "fv", "pv"]);
    for r in results {
        assert_eq!(r["workload"], "madd");
        assert_eq!(r["verified"], true, "{r}");
        assert!(r["wall_ns"].as_u64().unwrap() > 0, "{r}");
        assert!(r["relative_to_native"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["exits"].as_u64().unwrap() > 0, "{r}");
    }
    assert_eq!(results[0]["relative_to_native"].as_f64().unwrap(), 1.0);
    let exits = |i: usize| results[i]["exits"].as_u64().unwrap();
    assert!(
        exits(2) < exits(1),
        "fv {} exits, fv-naive {}",
        exits(2),
        exits(1)
    );
    assert!(
        exits(3) < exits(1),
        "pv {} exits, fv-naive {}",
        exits(3),
        exits(1)
    );
    let bringup = v["bringup"].as_array().unwrap();
    assert!(
        bringup[1]["shadow"]["rebuilds"].as_u64().unwrap() > 0,
        "eager rebuilds"
    );
    assert!(bringup[3]["shadow"]["pv_batches"].as_u64().unwrap() > 0);
}
