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
