//! The `gpuvm` command as a user runs it: exit status, JSON shape, errors.

use std::process::Command;

fn gpuvm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(args)
        .output()
        .expect("run gpuvm")
}

#[test]
fn native_json_reports_every_workload_verified() {
    let out = gpuvm(&["native", "--json", "--size", "32"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let workloads = v["workloads"].as_array().expect("workloads array");
    let names: Vec<&str> = workloads
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "madd",
            "mmul",
            "fmadd",
            "fmmul",
            "memcpy_htod",
            "memcpy_dtoh",
            "loop"
        ]
    );
    for w in workloads {
        assert_eq!(w["verified"], true, "{w}");
        for field in ["bytes", "gpu_ns", "wall_ns", "mmio_reads", "mmio_writes"] {
            assert!(w[field].is_u64(), "{field} missing in {w}");
        }
        assert!(w["gpu_ns"].as_u64().unwrap() > 0, "{w}");
        assert!(w["mmio_writes"].as_u64().unwrap() > 0, "{w}");
    }
}

#[test]
fn native_with_the_simulated_clock_is_deterministic_in_gpu_time() {
    let run = || {
        let out = gpuvm(&[
            "native",
            "--json",
            "--size",
            "16",
            "--workload",
            "mmul",
            "--workload",
            "loop",
        ]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["gpu_ns"].as_u64().unwrap(),
                    w["mmio_writes"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn native_table_and_interrupt_fences() {
    let out = gpuvm(&["native", "--size", "16", "--irq", "--clock", "real"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("7/7 workloads verified"), "{text}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = gpuvm(&["native", "--workload", "nosuch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nosuch"), "{err}");
    let out = gpuvm(&["native", "--size", "0"]);
    assert!(!out.status.success());
}

#[test]
fn regs_json_is_the_sorted_region_table_with_policies() {
    let out = gpuvm(&["regs", "--json"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let regions = v.as_array().expect("a JSON array");
    assert!(regions.len() > 10, "{v}");
    let mut prev_end = 0u64;
    for r in regions {
        let offset = r["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("offset in {r}"));
        let size = r["size"].as_u64().unwrap_or_else(|| panic!("size in {r}"));
        let hex = r["offset_hex"].as_str().expect("offset_hex");
        assert_eq!(
            u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap(),
            offset,
            "{r}"
        );
        assert!(!r["name"].as_str().expect("name").is_empty(), "{r}");
        let policy = r["policy"].as_str().expect("policy");
        assert!(
            ["virtual", "shadowed", "forwarded", "denied"].contains(&policy),
            "{r}"
        );
        assert!(size > 0 && offset + size <= 32 << 20, "{r}");
        assert!(offset >= prev_end, "sorted and non-overlapping at {r}");
        prev_end = offset + size;
    }
    let find = |offset: u64| {
        regions
            .iter()
            .find(|r| r["offset"].as_u64() == Some(offset))
            .unwrap_or_else(|| panic!("no region at {offset:#x}"))
    };
    let boot0 = find(0x000000);
    assert_eq!(boot0["name"], "PMC.BOOT_0");
    assert_eq!(boot0["policy"], "virtual");
    let chan = find(0x003000);
    assert!(
        chan["name"].as_str().unwrap().contains("CHAN_TABLE"),
        "{chan}"
    );
    assert_eq!(chan["size"], 128 * 8);
    assert_eq!(chan["policy"], "shadowed");
    let pramin = find(0x700000);
    assert!(
        pramin["name"].as_str().unwrap().contains("PRAMIN"),
        "{pramin}"
    );
    assert_eq!(pramin["size"], 1 << 20);
    assert_eq!(pramin["policy"], "shadowed");
    let pgraph = find(0x400000);
    assert!(
        pgraph["name"].as_str().unwrap().contains("PGRAPH"),
        "{pgraph}"
    );
    // The per-VM virtual PGRAPH: absorbed, never forwarded.
    assert_eq!(pgraph["policy"], "virtual");
    assert_eq!(find(0x1f00000)["policy"], "virtual");
}

#[test]
fn regs_table_explains_deny_by_default() {
    let out = gpuvm(&["regs"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("PMC.BOOT_0"), "{text}");
    assert!(text.contains("Deny by default"), "{text}");
    assert!(text.contains("0xbad00100"), "{text}");
    for policy in ["virtual", "shadowed", "forwarded", "denied"] {
        assert!(text.contains(policy), "{policy} in {text}");
    }
}

#[test]
fn run_json_reports_every_vm_and_its_device_counters() {
    let out = gpuvm(&[
        "run", "--vms", "2", "--json", "--size", "32", "--shadow", "eager",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let vms = v["vms"].as_array().expect("vms array");
    assert_eq!(vms.len(), 2);
    for (i, vm) in vms.iter().enumerate() {
        assert_eq!(vm["vm"], i as u64, "{vm}");
        let workloads = vm["workloads"].as_array().expect("workloads array");
        assert_eq!(workloads.len(), 7);
        for w in workloads {
            assert_eq!(w["verified"], true, "{w}");
            for field in [
                "name",
                "bytes",
                "gpu_ns",
                "wall_ns",
                "mmio_reads",
                "mmio_writes",
            ] {
                assert!(!w[field].is_null(), "{field} missing in {w}");
            }
            assert!(w["gpu_ns"].as_u64().unwrap() > 0, "{w}");
        }
        let s = &vm["stats"];
        assert!(s["exits"]["bar0"]["writes"].as_u64().unwrap() > 0, "{s}");
        assert!(s["exits"]["bar3"]["writes"].as_u64().unwrap() > 0, "{s}");
        assert!(
            s["by_class"]["virtual"]["reads"].as_u64().unwrap() > 0,
            "{s}"
        );
        assert!(s["doorbells"].as_u64().unwrap() >= 8, "{s}");
        assert_eq!(s["violations"]["total"], 0, "{s}");
        assert!(s["shadow"]["rebuilds"].as_u64().unwrap() > 0, "{s}");
    }
    assert_eq!(v["shadow"], "eager");
    assert_eq!(v["host"]["vms"], 0, "every VM destroyed at the end");
}

#[test]
fn run_table_and_bad_arguments() {
    let out = gpuvm(&[
        "run",
        "--vms",
        "1",
        "--size",
        "16",
        "--workload",
        "loop",
        "--irq",
        "--shadow",
        "pv",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("1/1 workloads verified"), "{text}");
    assert!(text.contains("shadow page tables pv"), "{text}");
    let out = gpuvm(&["run", "--shadow", "fast"]);
    assert!(!out.status.success());
    let out = gpuvm(&["run", "--workload", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch"));
}

fn json_ok(args: &[&str]) -> serde_json::Value {
    let out = gpuvm(args);
    assert!(
        out.status.success(),
        "gpuvm {args:?}: stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

#[test]
fn exp_overhead_json_has_every_scheme_for_every_workload() {
    let v = json_ok(&[
        "exp",
        "overhead",
        "--json",
        "--size",
        "16",
        "--repeat",
        "1",
        "--workload",
        "madd",
        "--workload",
        "loop",
    ]);
    assert_eq!(v["backend"], "in-process");
    assert_eq!(v["exit_ns"], 25000);
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 2 * 5);
    for w in ["madd", "loop"] {
        let schemes: Vec<&str> = results
            .iter()
            .filter(|r| r["workload"] == w)
            .map(|r| r["scheme"].as_str().unwrap())
            .collect();
        assert_eq!(schemes, ["native", "fv-naive", "fv-lazy", "fv", "pv"]);
    }
    for r in results {
        assert_eq!(r["verified"], true, "{r}");
        assert!(r["wall_ns"].as_u64().unwrap() > 0, "{r}");
        assert!(r["relative_to_native"].as_f64().unwrap() > 0.0, "{r}");
        let exits = r["exits"].as_u64().unwrap();
        if r["scheme"] == "native" {
            assert_eq!(exits, 0);
            assert_eq!(r["relative_to_native"].as_f64().unwrap(), 1.0);
        } else {
            assert!(exits > 0, "{r}");
            assert_eq!(
                r["modeled_ns"].as_u64().unwrap(),
                r["wall_ns"].as_u64().unwrap() + exits * 25000
            );
        }
    }
    // Eager shadowing rebuilds; incremental updates entries; PV batches.
    let get = |w: &str, s: &str| {
        results
            .iter()
            .find(|r| r["workload"] == w && r["scheme"] == s)
            .unwrap()
            .clone()
    };
    assert!(
        get("madd", "fv-naive")["shadow"]["rebuilds"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(get("madd", "fv")["shadow"]["rebuilds"], 0);
    assert!(get("madd", "pv")["shadow"]["pv_batches"].as_u64().unwrap() > 0);
}

#[test]
fn exp_scale_json_reports_each_vm_count_verified() {
    let dir = std::env::temp_dir().join(format!("gpuvm-cli-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("scale.svg");
    let v = json_ok(&[
        "exp",
        "scale",
        "--vms",
        "1,2",
        "--size",
        "16",
        "--repeat",
        "1",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let points = v["points"].as_array().expect("points");
    let vms: Vec<u64> = points.iter().map(|p| p["vms"].as_u64().unwrap()).collect();
    assert_eq!(vms, [1, 2]);
    for p in points {
        assert_eq!(p["verified"], true, "{p}");
        for f in [
            "per_vm_wall_ns",
            "aggregate_wall_ns",
            "gpu_busy_ns",
            "exits",
        ] {
            assert!(p[f].as_u64().unwrap() > 0, "{f}: {p}");
        }
        assert!(p["utilization"].as_f64().is_some());
        // The engine worker's time by activity: it did the kernels' pieces under the
        // simulator's lock and computed their blocks beside it.
        let w = &p["engine_worker"];
        for f in ["locked_ns", "computing_ns"] {
            assert!(w[f].as_u64().unwrap() > 0, "{f}: {w}");
        }
        // Fast-path waits for holds happen on the VMs' threads inside the measured span: at
        // most the span once per VM.
        let h = &p["host_lock"];
        let vms = p["vms"].as_u64().unwrap();
        let span = p["aggregate_wall_ns"].as_u64().unwrap();
        assert!(h["fast_path_waits"].as_u64().is_some(), "{h}");
        assert!(
            h["fast_path_waited_ns"].as_u64().unwrap() <= vms * span,
            "{h}"
        );
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let _ = std::fs::remove_dir_all(&dir);
    // One trial: the scaling of the single run, paired with itself for the first count.
    let s = v["scaling"].as_array().expect("scaling");
    assert_eq!(v["trials"], 1);
    assert_eq!(s[0]["paired_ratios"], serde_json::json!([1.0]));
    let bad = gpuvm(&["exp", "scale", "--vms", "0"]);
    assert!(!bad.status.success());
}

#[test]
fn exp_scale_trials_alternate_the_counts_and_report_each_points_median_trial() {
    let v = json_ok(&[
        "exp", "scale", "--vms", "1,2", "--size", "16", "--repeat", "1", "--trials", "3", "--json",
    ]);
    assert_eq!(v["trials"], 3);
    let points = v["points"].as_array().expect("points");
    let scaling = v["scaling"].as_array().expect("scaling");
    assert_eq!(points.len(), 2);
    assert_eq!(scaling.len(), 2);
    for (p, s) in points.iter().zip(scaling) {
        assert_eq!(p["vms"], s["vms"]);
        assert_eq!(p["verified"], true, "{p}");
        let runs: Vec<u64> = s["aggregate_wall_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(runs.len(), 3);
        // The point is a measured trial, the median one.
        let mut sorted = runs.clone();
        sorted.sort_unstable();
        assert_eq!(p["aggregate_wall_ns"].as_u64().unwrap(), sorted[1]);
        assert_eq!(s["median_ns"].as_u64().unwrap(), sorted[1]);
        assert_eq!(s["min_ns"].as_u64().unwrap(), sorted[0]);
        assert_eq!(s["max_ns"].as_u64().unwrap(), sorted[2]);
        assert_eq!(s["paired_ratios"].as_array().unwrap().len(), 3);
    }
    // The first count against itself.
    assert_eq!(scaling[0]["ratio_of_medians"], 1.0);
    assert_eq!(scaling[0]["paired_at_most_2x"], 3);
    let bad = gpuvm(&["exp", "scale", "--trials", "0"]);
    assert!(!bad.status.success());
}

#[test]
fn exp_scale_unshared_runs_as_many_one_vm_stacks_beside_each_point() {
    let v = json_ok(&[
        "exp",
        "scale",
        "--vms",
        "1,3",
        "--size",
        "16",
        "--repeat",
        "1",
        "--trials",
        "2",
        "--unshared",
        "--json",
    ]);
    let points = v["points"].as_array().expect("points");
    let scaling = v["scaling"].as_array().expect("scaling");
    for (p, s) in points.iter().zip(scaling) {
        assert_eq!(p["verified"], true, "the unshared stacks verify too: {p}");
        let wall = p["unshared_wall_ns"].as_u64().expect("an unshared time");
        assert!(wall > 0, "{p}");
        let median = s["unshared_median_ns"].as_u64().expect("its median");
        assert!(median > 0);
        // Against the first count's median with the GPU shared.
        let ratio = s["unshared_ratio_of_medians"].as_f64().expect("a ratio");
        let base = scaling[0]["median_ns"].as_u64().unwrap() as f64;
        assert!((ratio - median as f64 / base).abs() < 1e-9, "{s}");
        // Shared over unshared, trial by trial: the median of the two trials' quotients (the
        // lower one of two).
        let words = |k: &str| -> Vec<f64> {
            s[k].as_array()
                .unwrap_or_else(|| panic!("{k}: {s}"))
                .iter()
                .map(|x| x.as_u64().expect("ns") as f64)
                .collect()
        };
        let (shared, alone) = (words("aggregate_wall_ns"), words("unshared_wall_ns"));
        assert_eq!((shared.len(), alone.len()), (2, 2));
        let quotients: Vec<f64> = shared.iter().zip(&alone).map(|(s, u)| s / u).collect();
        let lower = quotients[0].min(quotients[1]);
        let cost = s["median_shared_over_unshared"]
            .as_f64()
            .expect("shared over unshared");
        assert!((cost - lower).abs() < 1e-9, "{s}");
    }
    // The table shows the columns too, and KVM guests are refused a flag for in-process stacks.
    let out = gpuvm(&[
        "exp",
        "scale",
        "--vms",
        "1",
        "--size",
        "16",
        "--repeat",
        "1",
        "--unshared",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("unshared"));
    let bad = gpuvm(&["exp", "scale", "--kvm", "--unshared"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--unshared"));
}

#[test]
fn demo_json_four_vms_under_band_verified_with_a_plot() {
    let dir = std::env::temp_dir().join(format!("gpuvm-cli-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("demo.svg");
    let v = json_ok(&[
        "demo",
        "--json",
        "--size",
        "16",
        "--rounds",
        "1",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(v["scheduler"], "band");
    assert_eq!(v["all_verified"], true);
    let vms = v["vms"].as_array().expect("vms");
    assert_eq!(vms.len(), 4);
    let mut share = 0.0;
    for vm in vms {
        assert_eq!(vm["verified"], 7, "{vm}");
        assert!(vm["exits"].as_u64().unwrap() > 0);
        share += vm["gpu_share"].as_f64().unwrap();
    }
    assert!((share - 1.0).abs() < 1e-6, "{share}");
    assert_eq!(v["svg"], svg.to_str().unwrap());
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exp_isolation_compares_gdevs_band_with_the_adaptive_one() {
    // Guests that react in 500 µs: Gdev's fixed buffer misses, the adaptive one (default
    // BAND) holds the share at the cost of idle time (docs/scheduling.md §5).
    let v = json_ok(&[
        "exp",
        "isolation",
        "--vms",
        "2",
        "--duration",
        "1",
        "--think-us",
        "500",
        "--sched",
        "band-gdev,band",
        "--json",
    ]);
    assert_eq!(v["params"]["adaptive_wait"], true);
    let p = v["policies"].as_array().expect("policies");
    let names: Vec<&str> = p.iter().map(|p| p["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["band-gdev", "band"]);
    let err = |i: usize| p[i]["mean_error"].as_f64().unwrap();
    let util = |i: usize| p[i]["utilization"].as_f64().unwrap();
    assert!(err(0) > 0.3, "band-gdev {}", err(0));
    assert!(err(1) < 0.15, "band {}", err(1));
    assert!(util(1) < util(0));
    let bad = gpuvm(&["exp", "isolation", "--sched", "band,lottery"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("band-gdev"));
}

/// The soak with its vfio-user part: a client process drives a vGPU served in-process while
/// in-process VMs churn (killed mid-run included). The in-process checks must pass and no
/// client may fail; whether every client finished in time is timing and not asserted here
/// (docs/experiments.md "Soak" reports long runs).
#[test]
fn soak_with_vfio_user_clients_passes_its_checks() {
    let out = gpuvm(&[
        "soak",
        "--duration",
        "6",
        "--vms",
        "2",
        "--vfio-user-vms",
        "1",
        "--kill-one-in",
        "2",
        "--size",
        "32",
        "--sample-every",
        "0.5",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    for c in v["soak"]["checks"].as_array().expect("checks") {
        assert_eq!(c[1], true, "check failed: {}; report: {v}", c[0]);
    }
    let clients = &v["clients"];
    assert!(clients["started"].as_u64().unwrap() >= 1, "{clients}");
    assert_eq!(clients["failed"], 0, "{clients}");
    let killed: u64 = v["soak"]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["killed"].as_u64().unwrap())
        .sum();
    assert!(killed > 0, "lives were killed mid-run: {v}");
    assert!(bad_soak_arguments_are_refused());
}

fn bad_soak_arguments_are_refused() -> bool {
    let out = gpuvm(&["soak", "--duration", "0"]);
    out.status.code() == Some(2) && String::from_utf8_lossy(&out.stderr).contains("--duration")
}

#[test]
fn exp_lockhold_reports_every_scenario_and_a_baseline_like_the_mmul_row() {
    let v = json_ok(&[
        "exp", "lockhold", "--rounds", "1", "--size", "16", "--mmul-n", "64", "--json",
    ]);
    let names: Vec<&str> = v["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["alone", "mmul", "pv-switch", "eager-flush", "baseline"]
    );
    let row = |n: &str| {
        v["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == n)
            .unwrap()
            .clone()
    };
    let (mmul, base) = (row("mmul"), row("baseline"));
    assert_eq!(mmul["verified"], mmul["workloads"], "{mmul}");
    assert_eq!(base["baseline_of"], "mmul");
    assert!(base["holds"].as_u64().unwrap() > 0, "{base}");
    // It runs as long as the row it copies (a sleep of that length bounds it from below).
    assert!(base["wall_ms"].as_f64().unwrap() >= mmul["wall_ms"].as_f64().unwrap());
    // The usage reads are opt-in: without them the longest hold carries no split.
    assert!(mmul["max_usage"].is_null(), "{mmul}");
    // Every row says how long an access waited for the lock at most, beside the longest hold.
    for s in v["scenarios"].as_array().unwrap() {
        assert!(s["max_wait_ns"].is_u64(), "{s}");
    }
    let on = json_ok(&[
        "exp",
        "lockhold",
        "--rounds",
        "1",
        "--size",
        "16",
        "--mmul-n",
        "64",
        "--json",
        "--thread-usage",
        "--worker-policy",
        "idle",
    ]);
    assert_eq!(on["worker_policy"], "idle");
    let bad = gpuvm(&["exp", "lockhold", "--worker-policy", "fifo"]);
    assert!(!bad.status.success());
}
