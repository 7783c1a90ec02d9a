//! `gpuvm nouveau`: unmodified Linux nouveau (User-Mode Linux) against a vGPU over vhost-user,
//! with a second VM running gpuvm's own driver on the same GPU.
//!
//! The UML kernel takes minutes to build (`scripts/uml/build.sh`, ~5.5 min alone on 2 cores,
//! far longer under load). This test uses the kernel when it is already built; it builds it
//! first only when `GPUVM_BUILD_UML=1` is set. Without a kernel it prints a line saying it is
//! skipped and why, and passes: CI never fails because the kernel is not built yet.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The cargo target directory this test binary lives in (target/debug/deps/nouveau-*).
fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

fn kernel() -> Option<PathBuf> {
    let target = target_dir();
    if std::env::var("GPUVM_BUILD_UML").as_deref() == Ok("1") {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/uml/build.sh");
        let st = Command::new("bash")
            .arg(script)
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("running scripts/uml/build.sh");
        assert!(st.success(), "scripts/uml/build.sh failed");
    }
    let k = target.join("uml/linux");
    let t = target.join("uml/rootfs/gpuvm-nvtest");
    (k.exists() && t.exists()).then_some(k)
}

#[test]
fn nouveau_runs_a_userspace_channel_with_acceleration_while_the_second_vm_verifies() {
    let Some(kernel) = kernel() else {
        println!(
            "SKIPPED: no UML kernel at {}/uml/linux: build it with scripts/uml/build.sh \
             (minutes; or set GPUVM_BUILD_UML=1 to let this test build it)",
            target_dir().display()
        );
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(["nouveau", "--json", "--timeout", "90", "--kernel"])
        .arg(&kernel)
        .output()
        .expect("running gpuvm nouveau");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let reached: Vec<&str> = v["rungs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["reached"].as_bool() == Some(true))
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    println!("rungs reached: {reached:?}");
    // Acceleration on: FIFO and GR through the virtual PGRAPH (h), the DRM device (i), and the
    // test program's channel doing semaphore work in VRAM and GART, verified (j).
    for id in ["a", "b", "c", "d", "e", "h", "i", "j"] {
        assert!(reached.contains(&id), "rung ({id}) not reached: {text}");
    }
    let n = &v["neighbour"];
    assert!(n["runs"].as_u64().unwrap() > 0, "the second VM ran: {text}");
    assert_eq!(
        n["runs"], n["verified"],
        "every second-VM run verified: {text}"
    );
    // UML still sends some accesses the transport refuses (docs/nouveau.md, "Known gaps"):
    // they are counted, not asserted away.
    println!("transport: {}", v["transport"]);
}
