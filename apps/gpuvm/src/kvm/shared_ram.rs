//! Guest RAM another process can map: one memfd (sealed against shrinking and growing, so the
//! process it is shared with can rely on its size), mapped `MAP_SHARED` by vm-memory. The
//! vfio-user path hands the memfd to `gpuvm serve` with DMA_MAP, which maps the same pages.

use std::fs::File;
use std::os::fd::FromRawFd;

use anyhow::Context;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

/// `len` bytes of RAM at GPA 0, backed by a sealed memfd.
pub fn memfd_ram(len: u64) -> anyhow::Result<GuestMemoryMmap> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags and returns a new descriptor
    // or -1.
    let fd = unsafe {
        libc::memfd_create(
            c"gpuvm-guest-ram".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).context("sizing the guest RAM memfd")?;
    // SAFETY: F_ADD_SEALS on a descriptor we own.
    let sealed = unsafe {
        libc::fcntl(
            fd,
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    };
    if sealed < 0 {
        return Err(std::io::Error::last_os_error()).context("sealing the guest RAM memfd");
    }
    let size = usize::try_from(len).context("guest RAM size")?;
    GuestMemoryMmap::<()>::from_ranges_with_files(&[(
        GuestAddress(0),
        size,
        Some(FileOffset::new(file, 0)),
    )])
    .with_context(|| format!("mapping {} MiB of shared guest RAM", len >> 20))
}
