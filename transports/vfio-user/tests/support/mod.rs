//! What the in-process daemon tests share: a daemon on a simulated GF100 in a socket directory
//! of its own, VM specs, and sealed memfds for guest RAM.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use gpuvm::clock::ClockKind;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::VgpuProfile;
use gpuvm::sched::Policy;
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_vfio_user::{Daemon, DaemonConfig, VmSpec};

/// A VM named `name` with a `vram_mib` slice and `weight`.
pub fn spec(name: &str, vram_mib: u64, weight: u32) -> VmSpec {
    VmSpec {
        name: name.to_string(),
        profile: VgpuProfile {
            name: name.to_string(),
            vram_mib,
            weight,
            ..VgpuProfile::default()
        },
        cap_ppm: None,
    }
}

/// A daemon serving `vms` on a simulated GPU of `vram` bytes (real clock), its sockets in a
/// fresh directory named after `test`; with `policy`, that scheduler.
pub fn start(test: &str, vram: u64, policy: Option<Policy>, vms: Vec<VmSpec>) -> (Daemon, PathBuf) {
    let dir = std::env::temp_dir().join(format!("gpuvm-vfio-user-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let clock = ClockKind::Real.create();
    let phys: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: vram,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let host = Arc::new(GpuHost::new(phys, HostConfig::default()).unwrap());
    if let Some(p) = policy {
        host.set_scheduler(p.create(&Default::default())).unwrap();
        host.set_clock(clock.clone());
    }
    let d = Daemon::start(
        host,
        clock,
        DaemonConfig {
            socket_dir: dir.clone(),
            vms,
            require_sealed_dma: true,
        },
    )
    .unwrap();
    (d, dir)
}

/// A memfd of `len` bytes sealed against shrinking (as the daemon requires of DMA maps).
pub fn sealed_memfd(len: u64) -> File {
    // SAFETY: memfd_create with a NUL-terminated name returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    // SAFETY: adds a seal to our descriptor.
    assert_eq!(
        unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
        0
    );
    f
}
