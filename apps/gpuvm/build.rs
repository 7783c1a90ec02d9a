//! Builds the bare-metal KVM guest (`guest/bin`, its own workspace) with a nested
//! `cargo build --release --target x86_64-unknown-linux-gnu` and hands its ELF to the VMM as
//! `GPUVM_GUEST_ELF` (embedded with `include_bytes!`).
//!
//! The nested build gets a clean environment: the outer build's rustflags, target dir, target
//! and compiler wrappers (clippy's among them) must not leak into it. An explicit `--target`
//! keeps the guest's rustflags away from build scripts. The guest shares one target directory
//! per outer target directory (next to `debug/` and `release/`), so the dev and test profiles
//! of the outer build reuse one guest build.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let guest = manifest.join("../../guest/bin");
    for dir in [
        guest.join("src"),
        guest.join("Cargo.toml"),
        guest.join("build.rs"),
        guest.join("link.ld"),
        manifest.join("../../guest/driver/src"),
        manifest.join("../../guest/driver/Cargo.toml"),
        manifest.join("../../hw/gf100/src"),
        manifest.join("../../hw/gf100/Cargo.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let target_dir = guest_target_dir(&out);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&guest)
        .args(["build", "--release", "--target", TARGET, "--target-dir"])
        .arg(&target_dir);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTC_WRAPPER",
        "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
        "CARGO_PROFILE_RELEASE_PANIC",
        "CARGO_PROFILE_RELEASE_LTO",
        "CARGO_PROFILE_RELEASE_DEBUG",
    ] {
        cmd.env_remove(var);
    }
    // The guest's own flags: absolute addresses (it runs where the linker script puts it).
    cmd.env("CARGO_ENCODED_RUSTFLAGS", "-Crelocation-model=static");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo for the KVM guest: {e}"));
    assert!(
        status.success(),
        "building the KVM guest (guest/bin) failed: {status}"
    );
    let elf = target_dir
        .join(TARGET)
        .join("release")
        .join("gpuvm-guest-bin");
    assert!(
        elf.exists(),
        "the KVM guest was not built: {}",
        elf.display()
    );
    println!("cargo:rustc-env=GPUVM_GUEST_ELF={}", elf.display());
}

/// `<outer target dir>/gpuvm-guest-bin` when OUT_DIR has the usual
/// `<target dir>/<profile>/build/<pkg>-<hash>/out` shape (with or without a `<triple>/` level),
/// else a directory inside OUT_DIR.
fn guest_target_dir(out: &Path) -> PathBuf {
    let mut p = out;
    for _ in 0..4 {
        match p.parent() {
            Some(parent) => p = parent,
            None => return out.join("guest-target"),
        }
    }
    // `p` is the target dir, or `<target dir>/<triple>` for a cross build.
    if p.file_name().is_some_and(|n| n == TARGET) {
        if let Some(parent) = p.parent() {
            p = parent;
        }
    }
    if p.join("CACHEDIR.TAG").exists() || p.ends_with("target") {
        p.join("gpuvm-guest-bin")
    } else {
        out.join("guest-target")
    }
}
