//! What the standalone binary's integration tests share: running the built `gpuvm`, parsing
//! its JSON, and the plain "SKIPPED" line of a test that needs /dev/kvm on a host without it.
#![allow(dead_code)] // each test file uses a different subset

pub mod vfio_guest;

use std::process::{Command, Output};

use serde_json::Value;

/// True if /dev/kvm can be opened; otherwise prints why `test` is skipped (on both streams, so
/// it shows with and without `--nocapture`).
pub fn kvm_available(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => true,
        Err(e) => {
            println!("SKIPPED: /dev/kvm not available ({e}): {test}");
            eprintln!("SKIPPED: /dev/kvm not available ({e}): {test}");
            false
        }
    }
}

/// Runs the built `gpuvm` with `args` to completion.
pub fn gpuvm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(args)
        .output()
        .expect("run gpuvm")
}

/// Standard output as JSON (panics with both streams if it is not).
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "invalid JSON ({e}); stdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
